// Rank-consistent Google Benchmark iterations and nccl-tests style bandwidth counters.
#include "dtl/harness/bench.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <mpi.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"

namespace dtl::bench {

// The iteration times reported so far, so counters can be plain numbers (GB/s) rather than
// Google Benchmark's "per second" rates with SI prefixes. A run's own times are the last
// state.iterations() entries (Google Benchmark runs a function several times while it sizes
// the iteration count).
static std::vector<double> g_times;

// The device is synchronised at both ends (a no-op on CPU): on CUDA an iteration's time is its
// kernels' time, not the time to queue them.
Iteration::Iteration(benchmark::State& state) : state_(state) {
  dtl::synchronize_device();
  dtl::control_barrier();
  start_ = now_seconds();
}

Iteration::~Iteration() {
  // Every rank reports the slowest rank's time, so every rank's adaptive iteration count agrees.
  dtl::synchronize_device();
  double t = dtl::max_over_ranks(now_seconds() - start_);
  state_.SetIterationTime(t);
  if (g_times.size() > (1u << 22)) g_times.erase(g_times.begin(), g_times.end() - (1u << 20));
  g_times.push_back(t);
}

double mean_iteration_seconds(const benchmark::State& state) {
  const size_t n = std::min(g_times.size(), static_cast<size_t>(state.iterations()));
  if (n == 0) return 0;
  return std::accumulate(g_times.end() - static_cast<std::ptrdiff_t>(n), g_times.end(), 0.0) /
         static_cast<double>(n);
}

void set_bandwidth_counters(benchmark::State& state, double bytes, double bus_factor) {
  const double t = mean_iteration_seconds(state);
  const double algbw = t > 0 ? bytes / t / 1e9 : 0;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * bus_factor;
}

void run_all_reduce(benchmark::State& state, Comm& comm,
                    const std::function<void(const torch::Tensor&)>& all_reduce, bool small_warm_up,
                    bool check_wire_bytes) {
  DTL_CHECK(comm.size() == Runtime::get().world_size(),
            "bench::run_all_reduce: the benchmark's Comm must span the world");
  const int64_t numel = state.range(0) / 4;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(Runtime::get().device());
  // Small random integers: every partial sum is exact in float32 whatever the order, so the
  // result of every timed call can be checked exactly. They are drawn from a seed rank 0 takes
  // from the OS at run time and sends over the runtime's control channel, and the expected sum
  // is computed through that channel too: no submission can know the other ranks' inputs
  // without communicating, so one that skips the work, or does it only at the benchmark's size,
  // fails the check instead of winning.
  uint64_t seed = 0;
  if (comm.rank() == 0) seed = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, Runtime::get().control_comm());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(comm.rank()));
  const torch::Tensor input = torch::randint(0, 7, {numel}, gen, torch::kFloat32).to(opts.device());
  torch::Tensor expected = input.cpu().clone();  // a copy: the all-reduce below is in place
  MPI_Allreduce(MPI_IN_PLACE, expected.data_ptr(), static_cast<int>(numel), MPI_FLOAT, MPI_SUM,
                Runtime::get().control_comm());
  expected = expected.to(opts.device());
  torch::Tensor t = input.clone();
  try {
    all_reduce(small_warm_up ? torch::ones({1}, opts) : t);
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  t.copy_(input);
  bool wrong = false;
  const double wire_before = comm.stats().total_wire_bytes();
  for (auto _ : state) {
    {
      Iteration it(state);  // barrier, start; stop and take the max over ranks
      all_reduce(t);
    }
    // Untimed (manual time covers only the block above): check, then restore the input.
    if (!wrong && !torch::equal(t, expected)) wrong = true;
    t.copy_(input);
  }
  // An all-reduce moves at least 2 (n-1)/n of the data per rank (the ring's figure): a result
  // that arrives with fewer bytes on the wire did not come through this Comm.
  const double moved = comm.stats().total_wire_bytes() - wire_before;
  const double least = static_cast<double>(state.iterations()) * static_cast<double>(numel * 4) *
                       bus_factor(OpType::AllReduce, comm.size());
  const bool too_little = check_wire_bytes && moved < 0.999 * least;
  // Every rank learns whether any rank saw a wrong result, so all of them report alike.
  if (dtl::max_over_ranks(wrong ? 1.0 : 0.0) > 0) {
    state.SkipWithError("wrong result: the all-reduce under test did not produce the sum");
    return;
  }
  if (dtl::max_over_ranks(too_little ? 1.0 : 0.0) > 0) {
    state.SkipWithError("wrong result: the all-reduce moved fewer bytes through the Comm than an "
                        "all-reduce must (2 (n-1)/n of the data per rank)");
    return;
  }
  set_bandwidth_counters(state, static_cast<double>(numel * 4), bus_factor(OpType::AllReduce, comm.size()));
}

}  // namespace dtl::bench
