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
  // Drawn once per process and size, then kept: Google Benchmark calls this function again for
  // every repetition, and drawing 16 MiB of random integers and reducing the expected sum took
  // two thirds of a repetition at the grader's size. That fixed cost diluted the grader's
  // whole-process timing (perf.hpp): a ring 3x slower than the reference read as 0.68x. Reusing
  // the input across repetitions gives a submission nothing new: every timed call of a
  // repetition already sees the same input (it is restored after each call).
  struct Cached {
    int64_t numel = -1;
    int world = 0;
    torch::Device device = torch::kCPU;
    torch::Tensor input, expected;
  };
  static Cached& cache = *new Cached;  // never destroyed: no tensor outlives its device at exit
  const torch::Device device = Runtime::get().device();
  if (cache.numel != numel || cache.world != comm.size() || cache.device != device) {
    uint64_t seed = 0;
    if (comm.rank() == 0) seed = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, Runtime::get().control_comm());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(comm.rank()));
    const torch::Tensor drawn = torch::randint(0, 7, {numel}, gen, torch::kFloat32);
    torch::Tensor expected = drawn.clone();  // a copy: the all-reduce below is in place
    MPI_Allreduce(MPI_IN_PLACE, expected.data_ptr(), static_cast<int>(numel), MPI_FLOAT, MPI_SUM,
                  Runtime::get().control_comm());
    cache = {numel, comm.size(), device, drawn.to(device), expected.to(device)};
  }
  const torch::Tensor& input = cache.input;
  const torch::Tensor& expected = cache.expected;
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
  // Every rank must end with every other rank's contribution, so each element crosses the wire
  // at least 2 (n-1) times in all (the one-way gossip bound: n-1 messages to gather it, n-1 to
  // spread it; the ring meets it, 2 (n-1)/n of the data per rank). Summed over ranks, not per
  // rank: recursive doubling at n = 3 sends a third less than that from one rank and more from
  // another. A result that arrives with fewer bytes on the wire did not come through this Comm.
  const double moved = sum_over_ranks(comm.stats().total_wire_bytes() - wire_before);
  const double least = static_cast<double>(state.iterations()) * static_cast<double>(numel * 4) *
                       bus_factor(OpType::AllReduce, comm.size()) * comm.size();
  const bool too_little = check_wire_bytes && moved < 0.999 * least;
  // Every rank learns whether any rank saw a wrong result, so all of them report alike.
  if (dtl::max_over_ranks(wrong ? 1.0 : 0.0) > 0) {
    state.SkipWithError("wrong result: the all-reduce under test did not produce the sum");
    return;
  }
  if (dtl::max_over_ranks(too_little ? 1.0 : 0.0) > 0) {
    state.SkipWithError("wrong result: the all-reduce moved fewer bytes through the Comm than an "
                        "all-reduce must (2 (n-1) times the data, summed over the ranks)");
    return;
  }
  set_bandwidth_counters(state, static_cast<double>(numel * 4), bus_factor(OpType::AllReduce, comm.size()));
}

}  // namespace dtl::bench
