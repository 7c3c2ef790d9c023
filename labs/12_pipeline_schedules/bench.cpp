// lab 12 benchmark: one training step of the course GPT under each schedule at p = the number of
// ranks, m = 2p micro-batches, with emulated compute (forward 20 ms, backward 40 ms per stage,
// slept, so that ranks sharing cores still see uniform work). Counters: the measured bubble and
// the simulated one. Every step's loss is checked against serial training's on the same batch.
//
//   ./lab bench 12 -n 4                your executor
//   ./lab bench 12 -n 4 --solutions    the reference
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include <cmath>

#include "dtl/data.hpp"
#include "dtl/error.hpp"
#include "dtl/optim.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "pipeline_schedules.hpp"

namespace {

// schedule: 0 GPipe, 1 1F1B, 2 interleaved (v = 2).
void BM_ScheduleStep(benchmark::State& state) {
  dtl::Comm& world = dtl::world();
  const int p = world.size(), kind = static_cast<int>(state.range(0)), v = kind == 2 ? 2 : 1;
  const int64_t m = 2 * p;
  dtl::model::GPTConfig cfg = dtl::model::GPTConfig::tiny();
  cfg.n_layer = 2 * p;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 3);
  const torch::Tensor global =
      dtl::data::GlobalBatchSampler(corpus, 2 * m, cfg.seq_len).global_batch_at(0);
  // The serial loss of that batch with the initial weights: what every step must report.
  const double expected = dtl::model::GPT(cfg)->loss(global).item<double>();
  double bubble = 0, simulated = 0;
  try {
    const dtl::lab12::Schedule s = kind == 0   ? dtl::lab12::gpipe(p, m)
                                   : kind == 1 ? dtl::lab12::one_f_one_b(p, m)
                                               : dtl::lab12::interleaved(p, m, v);
    simulated = dtl::lab12::simulate(s, v, {10.0, 20.0, 0.0}).bubble;
    const std::vector<dtl::Range> parts = dtl::lab11::even_parts(cfg, p * v);
    dtl::lab12::PipelineLinks links(world);
    bool wrong = false;
    for (auto _ : state) {
      // A fresh model each step (untimed): the loss of the step is then the serial one.
      state.PauseTiming();
      dtl::lab12::ModelChunks chunks(cfg, world, v, parts);
      torch::optim::SGD opt(chunks.module().parameters(), 0.0);
      world.barrier();
      state.ResumeTiming();
      dtl::bench::Iteration it(state);
      const dtl::lab12::StepResult res = dtl::lab12::execute(
          s, chunks, links, opt, global.to(dtl::Runtime::get().device()), {0.020, 0.040});
      bubble = dtl::lab12::measured_bubble(res, world);
      wrong = wrong || std::abs(res.loss - expected) > 1e-4 * std::abs(expected);
    }
    if (dtl::max_over_ranks(wrong ? 1.0 : 0.0) > 0)
      state.SkipWithError("wrong result: the loss differs from serial training's");
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // every rank throws alike: nobody waits
  }
  state.counters["bubble"] = bubble;
  state.counters["simulated"] = simulated;
}

BENCHMARK(BM_ScheduleStep)
    ->ArgName("schedule")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
