// Lab 07 benchmark: the flat ring (the built-in Comm::all_reduce, which the network emulator
// charges at the ring's cost on the bottleneck link) against your hierarchical all-reduce;
// float32 sum, in place, 1 KiB to 64 MiB (x4 steps). Meant to run under a two-node emulated
// network:
//
//   ./lab bench 07 -n 4 -- --net eth-2node                 your code (~2 min: 64 MiB of flat
//                                                          ring over 25 GbE, x1000, is 32 s)
//   ./lab bench 07 -n 4 --solutions -- --net eth-2node     the reference
//   ./lab bench 07 -n 4 -- --net "eth-2node;time_scale=100" --benchmark_filter='/16777216'
//
// Counters as nccl-tests reports them: algbw_GBps = S / t, busbw_GBps = algbw x 2(n-1)/n, with
// t the mean iteration time (max over ranks each). Nodes: ranks_per_node from the emulator spec
// (eth-2node: 2 nodes, so 2 ranks per node at -n 4); without --net, 2 ranks per node when that
// divides the world, else all ranks on one node. Fixed iteration counts (ranks must agree), few
// at large sizes: under the emulator the time of an iteration hardly varies.
#include "dtl/harness/bench.hpp"

#include <benchmark/benchmark.h>

#include <functional>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/net.hpp"
#include "dtl/runtime.hpp"
#include "topology.hpp"

namespace {

// One Comm for every benchmark, created on first use (every rank runs every benchmark in the
// same order, so every rank creates it at the same point).
dtl::Comm& comm() {
  static std::shared_ptr<dtl::Comm> c = dtl::world().dup();
  return *c;
}

int ranks_per_node() {
  const int n = comm().size();
  if (dtl::net::enabled()) return dtl::lab07::emulated_topology(n).ranks_per_node;
  return n % 2 == 0 ? 2 : n;
}

using AllReduceFn = std::function<void(const torch::Tensor&)>;

void run_all_reduce(benchmark::State& state, const AllReduceFn& all_reduce) {
  dtl::bench::run_all_reduce(state, comm(), all_reduce, dtl::net::enabled());
}

void BM_FlatRing(benchmark::State& state) {
  run_all_reduce(state, [](const torch::Tensor& t) { comm().all_reduce(t); });
}

void BM_Hierarchical(benchmark::State& state) {
  run_all_reduce(state, [](const torch::Tensor& t) {
    dtl::lab07::hierarchical_all_reduce(comm(), ranks_per_node(), t);
  });
}

const bool registered = [] {
  for (int64_t bytes = 1 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
    const int iters = bytes < (4 << 20) ? 5 : bytes < (64 << 20) ? 2 : 1;
    for (auto [name, fn] : {std::pair{"BM_FlatRing", &BM_FlatRing},
                            std::pair{"BM_Hierarchical", &BM_Hierarchical}})
      benchmark::RegisterBenchmark(name, fn)
          ->Arg(bytes)
          ->Iterations(iters)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
