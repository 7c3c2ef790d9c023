// Lab 14 benchmark: one training step (zero_grad, forward, backward, step) at each ZeRO stage,
// with the bytes a rank holds and sends as counters. Stage 3 gathers every unit twice and
// allocates and frees its buffers each time: how much slower than stage 2 is it here, where
// the network is shared memory? (Try ./lab bench 14 -n 2 -- with DTL_NET=ib-2node.)
//
//   ./lab bench 14
//   ./lab bench 14 --solutions
//
// Every timed step is checked: after it, the parameters must equal (to float tolerance) those
// of single-process AdamW on the global batch after as many steps, computed up front; anything
// else fails the benchmark ("wrong result").
#include "dtl/harness/bench.hpp"       // defines: bench::Iteration
#include "dtl/harness/trajectory.hpp"  // defines: bench::SerialTrajectory

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/memory.hpp"
#include "dtl/runtime.hpp"
#include "demo_config.hpp"  // defines: demo::demo_config, demo::demo_adamw
#include "zero.hpp"

namespace {

using dtl::lab14::GPT;
using dtl::lab14::GPTConfig;

constexpr int kSteps = 8;
constexpr int64_t kRowsPerRank = 4;

// The serial run every timed step is checked against, computed once for every benchmark.
dtl::bench::SerialTrajectory& fixture() {
  static dtl::bench::SerialTrajectory f(dtl::lab14::demo::demo_config(), dtl::lab14::demo::demo_adamw(),
                                        kSteps, kRowsPerRank, 14);
  return f;
}

void BM_Stage(benchmark::State& state) {
  auto& f = fixture();
  const int stage = static_cast<int>(state.range(0));
  dtl::memory::install();  // the held_MiB counter
  try {
    const auto before = static_cast<double>(dtl::memory::current_bytes(f.comm->device()));
    GPT model(f.cfg);
    model->to(f.comm->device());
    dtl::lab14::ZeroOptimizer zero(model, *f.comm, stage, dtl::lab14::demo::demo_adamw());
    f.comm->reset_stats();
    double held = 0;
    int s = 0;
    for (auto _ : state) {
      {
        dtl::bench::Iteration it(state);
        zero.zero_grad();
        zero.loss(f.rows(s)).backward();
        zero.step();
      }
      held = static_cast<double>(dtl::memory::current_bytes(f.comm->device())) - before;
      const double sent = f.comm->stats().total_wire_bytes();
      const torch::Tensor got = zero.full_parameters();
      f.comm->reset_stats();  // full_parameters' gathers (stage 3) are not the step's
      if (!f.matches(got, s)) {
        state.SkipWithError(fmt::format("wrong result: stage {} parameters after step {} differ "
                                        "from single-process AdamW's", stage, s + 1).c_str());
        return;
      }
      state.counters["sent_MiB"] = sent / (1 << 20);
      ++s;
    }
    state.counters["held_MiB"] = held / (1 << 20);
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
}

BENCHMARK(BM_Stage)->Arg(1)->Arg(2)->Arg(3)->Iterations(kSteps)->UseManualTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
