// dtl/perf.hpp — defines: median, Measurement, measure, max_over_ranks, sum_over_ranks,
// control_barrier, synchronize_device, measure_matmul_flops.
//
// Timing a distributed step, one way for tests, benchmarks and demos alike: all ranks start
// together (a barrier on the Runtime's private control channel, so timing never shows up in a
// Comm's stats), an iteration lasts as long as its slowest rank (a step is done when every
// rank is), and the summary is the median over iterations (robust on a noisy shared machine).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtl {

// Median of `values` (mean of the two middle ones for an even count); 0 for none.
double median(std::vector<double> values);

struct Measurement {
  std::vector<double> seconds;  // per iteration, max over ranks
  double median = 0, min = 0, max = 0, mean = 0;
  std::string to_string() const;  // "median 1.23 ms (min 1.10, max 1.50, 20 iters)"
};

// Runs fn `warmup` times untimed, then `iters` times timed. Collective: every rank calls it
// with the same counts. On CUDA the device is synchronised before each clock read, so queued
// kernels count in the iteration that queued them.
Measurement measure(const std::function<void()>& fn, int warmup = 2, int iters = 10);

// Max / sum over ranks of a local value, over the control channel (not counted in Comm stats).
double max_over_ranks(double local);
double sum_over_ranks(double local);
// Barrier over the control channel.
void control_barrier();
// Waits for every queued kernel of this rank's device (no-op on CPU): call before reading a
// clock that should include GPU work.
void synchronize_device();

// This process's achievable dense float32 matmul rate in FLOP/s, measured: for each size n,
// the median over `reps` timed n x n x n products (2 n^3 FLOPs each, after one warm-up); the
// result is the best size's median. The "peak" MFU is measured against on a CPU: the best this
// process does on the operation that dominates training, not a datasheet number (on a GPU one
// uses the datasheet's bf16 tensor-core peak, e.g. 312 TFLOP/s for an A100).
double measure_matmul_flops(const std::vector<int64_t>& sizes = {256, 512, 1024}, int reps = 5);

}  // namespace dtl
