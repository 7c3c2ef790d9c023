// Rank-consistent Google Benchmark iterations and nccl-tests style bandwidth counters.
#include "dtl/harness/bench.hpp"

#include "dtl/harness/perf.hpp"
#include "dtl/timer.hpp"

namespace dtl::bench {

Iteration::Iteration(benchmark::State& state) : state_(state) {
  testing::control_barrier();
  start_ = now_seconds();
}

Iteration::~Iteration() {
  // Every rank reports the slowest rank's time, so every rank's adaptive iteration count agrees.
  state_.SetIterationTime(testing::max_over_ranks(now_seconds() - start_));
}

void set_bandwidth_counters(benchmark::State& state, double bytes, double bus_factor) {
  using benchmark::Counter;
  // kIsIterationInvariantRate: value x iterations / time = bytes per second over the run.
  state.counters["algbw_GBps"] = Counter(bytes / 1e9, Counter::kIsIterationInvariantRate);
  state.counters["busbw_GBps"] = Counter(bytes * bus_factor / 1e9, Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

}  // namespace dtl::bench
