// Rank-consistent Google Benchmark iterations and nccl-tests style bandwidth counters.
#include "dtl/harness/bench.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/perf.hpp"
#include "dtl/timer.hpp"

namespace dtl::bench {

// The iteration times reported so far, so counters can be plain numbers (GB/s) rather than
// Google Benchmark's "per second" rates with SI prefixes. A run's own times are the last
// state.iterations() entries (Google Benchmark runs a function several times while it sizes
// the iteration count).
static std::vector<double> g_times;

Iteration::Iteration(benchmark::State& state) : state_(state) {
  dtl::control_barrier();
  start_ = now_seconds();
}

Iteration::~Iteration() {
  // Every rank reports the slowest rank's time, so every rank's adaptive iteration count agrees.
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
                    const std::function<void(const torch::Tensor&)>& all_reduce, bool small_warm_up) {
  const int64_t bytes = state.range(0);
  torch::Tensor t = torch::zeros({bytes / 4});
  try {
    all_reduce(small_warm_up ? torch::zeros({1}) : t);
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    Iteration it(state);  // barrier, start; stop and take the max over ranks
    all_reduce(t);
  }
  set_bandwidth_counters(state, static_cast<double>(bytes), bus_factor(OpType::AllReduce, comm.size()));
}

}  // namespace dtl::bench
