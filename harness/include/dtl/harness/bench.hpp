// dtl/harness/bench.hpp — defines: bench::Iteration, bench::set_bandwidth_counters,
// bench::run_all_reduce.
//
// Google Benchmark under MPI. Every rank runs every benchmark; only rank 0 reports (the bench
// main installs a silent reporter elsewhere). Ranks must agree on how many iterations run, or
// a collective is left unmatched and the job hangs. Two rules guarantee it:
//   1. register benchmarks with ->UseManualTime(), and
//   2. time each iteration with bench::Iteration, which sets the iteration time to the max over
//      ranks, so Google Benchmark's adaptive iteration count sees identical numbers everywhere.
// Fixed ->Iterations(N) is also fine and the most predictable.
//
//   static void BM_allreduce(benchmark::State& state) {
//     for (auto _ : state) {
//       dtl::bench::Iteration it(state);   // barrier, start clock
//       comm.all_reduce(t);
//     }                                    // stop clock, max over ranks, SetIterationTime
//   }
//   BENCHMARK(BM_allreduce)->UseManualTime();
#pragma once

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>

#include "dtl/comm.hpp"

namespace dtl::bench {

class Iteration {
 public:
  explicit Iteration(benchmark::State& state);
  ~Iteration();
  Iteration(const Iteration&) = delete;
  Iteration& operator=(const Iteration&) = delete;

 private:
  benchmark::State& state_;
  double start_;
};

// Mean of the iteration times bench::Iteration reported for `state` (max over ranks each).
double mean_iteration_seconds(const benchmark::State& state);

// Adds nccl-tests counters for a collective of `bytes` per op with bus factor `factor`:
// algbw = bytes / time, busbw = algbw x factor (GB/s, 1e9), time = mean iteration time.
// Call after the timing loop.
void set_bandwidth_counters(benchmark::State& state, double bytes, double bus_factor);

// The all-reduce benchmark of labs 03 and 07: times all_reduce(t) (a sum) on a float32 tensor
// of state.range(0) bytes and sets nccl-tests' all-reduce counters for `comm`. The input is
// rank-dependent and restored outside the timed region; the result of every timed call is
// compared exactly with the sum, and a wrong one fails the benchmark on every rank
// (SkipWithError "wrong result"), so nothing is timed that did not do the work. One untimed call
// first, on the tensor itself (first touch of its pages) or, with small_warm_up, on one element
// (under the emulator, so the large sizes' emulated seconds are not paid twice); a dtl::Error
// there (e.g. "not implemented") skips the benchmark on every rank alike, so no rank is left
// waiting.
// check_wire_bytes: also require the Comm's stats to show at least the bytes an all-reduce
// must move (2 (n-1)/n of the data per rank and call), for all-reduces that run on `comm` itself.
void run_all_reduce(benchmark::State& state, Comm& comm,
                    const std::function<void(const torch::Tensor&)>& all_reduce,
                    bool small_warm_up = false, bool check_wire_bytes = false);

}  // namespace dtl::bench
