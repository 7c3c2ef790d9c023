// Lab 19 benchmark: how long laying out a large cluster takes (every dp group of 4096 ranks: pure
// arithmetic), and building every group's sub-Comm over the ranks of this job (collective).
//
//   ./lab bench 19 -n 4
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include "dtl/error.hpp"
#include "dtl/runtime.hpp"
#include "parallel_state.hpp"

namespace {

// tp 8, pp 16, cp 2 over 4096 ranks: 16 dp groups of 256... every group checked to hold 16 ranks.
void BM_RankGroups(benchmark::State& state) {
  try {
    const dtl::lab19::RankGenerator g(8, 1, 16, 16, 2);
    for (auto _ : state) {
      dtl::bench::Iteration it(state);
      const auto groups = g.get_ranks("dp");
      if (groups.size() != 256 || groups[0].size() != 16) {
        state.SkipWithError("wrong result: 4096 ranks at tp 8, cp 2, pp 16 have 256 dp groups of 16");
        return;
      }
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_RankGroups)->Iterations(20)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_ParallelState(benchmark::State& state) {
  try {
    dtl::lab19::ParallelConfig c;
    c.tp = dtl::world().size() % 2 == 0 ? 2 : 1;
    for (auto _ : state) {
      dtl::bench::Iteration it(state);
      dtl::lab19::ParallelState ps(dtl::world(), c);
      if (ps.comm("tp").size() != c.tp) {
        state.SkipWithError("wrong result: the tp communicator's size");
        return;
      }
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_ParallelState)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
