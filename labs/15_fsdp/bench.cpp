// Lab 15 benchmark: one training step (zero_grad, forward, backward, step) under each sharding
// strategy, with the bytes a rank sends and the parameter bytes it gathers as counters.
// FULL_SHARD gathers every unit twice per step; SHARD_GRAD_OP once; NO_SHARD never (it
// all-reduces, as DDP does); HYBRID_SHARD gathers inside a node. With shared memory as the
// network the differences are small; under an emulated cluster they are not:
//
//   ./lab bench 15                                   2 ranks
//   ./lab bench 15 -n 4 -- --net eth-2node           4 ranks as 2 nodes joined by Ethernet
//   ./lab bench 15 --solutions
//
// Every timed step is checked: after it, the parameters must equal (to float tolerance) those
// of single-process AdamW with weight decay on the global batch after as many steps, computed
// up front; anything else fails the benchmark ("wrong result").
#include "dtl/harness/bench.hpp"       // defines: bench::Iteration
#include "dtl/harness/trajectory.hpp"  // defines: bench::SerialTrajectory

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/runtime.hpp"
#include "demo_config.hpp"  // defines: demo::demo_config, demo::demo_adamw, demo::strategies
#include "fsdp.hpp"

namespace {

using dtl::lab15::GPT;
using dtl::lab15::GPTConfig;

constexpr int kSteps = 8;
constexpr int64_t kRowsPerRank = 4;

// The serial run every timed step is checked against, computed once for every benchmark.
dtl::bench::SerialTrajectory& fixture() {
  static dtl::bench::SerialTrajectory f(dtl::lab15::demo::demo_config(), dtl::lab15::demo::demo_adamw(),
                                        kSteps, kRowsPerRank, 15);
  return f;
}

// Arg: 0 FULL_SHARD, 1 SHARD_GRAD_OP, 2 NO_SHARD, 3 HYBRID_SHARD (nodes of 2 ranks when the
// world is even, else of 1). Prefetch on in both directions.
void BM_Step(benchmark::State& state) {
  auto& f = fixture();
  const int world = f.comm->size();
  dtl::lab15::FSDPConfig fc =
      dtl::lab15::demo::strategies(world % 2 == 0 ? 2 : 1)[static_cast<size_t>(state.range(0))];
  fc.forward_prefetch = true;
  state.SetLabel(dtl::lab15::to_string(fc.strategy));
  try {
    GPT model(f.cfg);
    model->to(f.comm->device());
    dtl::lab15::FullyShardedDataParallel fsdp(model, *f.comm, fc, dtl::lab15::demo::demo_adamw());
    auto reset = [&] {
      fsdp.shard_comm().reset_stats();
      if (fsdp.replicate_comm()) fsdp.replicate_comm()->reset_stats();
    };
    auto sent = [&] {
      double b = fsdp.shard_comm().stats().total_wire_bytes();
      if (fsdp.replicate_comm()) b += fsdp.replicate_comm()->stats().total_wire_bytes();
      return b;
    };
    reset();
    int s = 0;
    for (auto _ : state) {
      {
        dtl::bench::Iteration it(state);
        fsdp.zero_grad();
        fsdp.loss(f.rows(s)).backward();
        fsdp.step();
      }
      const double bytes = sent();
      const torch::Tensor got = fsdp.full_parameters();
      reset();  // full_parameters' gathers are not the step's
      if (!f.matches(got, s)) {
        state.SkipWithError(fmt::format("wrong result: {} parameters after step {} differ from "
                                        "single-process AdamW's", dtl::lab15::to_string(fc.strategy),
                                        s + 1).c_str());
        return;
      }
      state.counters["sent_MiB"] = bytes / (1 << 20);
      ++s;
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
}

BENCHMARK(BM_Step)->DenseRange(0, 3)->Iterations(kSteps)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
