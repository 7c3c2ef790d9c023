// lab 11 benchmark: one fill-drain step at p = the number of ranks, for m = 1, 2, 4, 8
// micro-batches of a fixed global batch. More micro-batches shrink the bubble (p-1)/(m+p-1)
// but make each matmul smaller; on a real cluster the first wins until the second bites.
//
//   ./lab bench 11 -n 4             your pipeline
//   ./lab bench 11 -n 4 --solutions the reference
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include "dtl/data.hpp"
#include "dtl/error.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "pipeline.hpp"

namespace {

void BM_FillDrain(benchmark::State& state) {
  dtl::model::GPTConfig cfg;
  cfg.n_layer = 6;
  cfg.d_model = 128;
  cfg.seq_len = 64;
  cfg.vocab_size = 512;
  const int64_t micro = state.range(0), batch = 16;
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();
  std::unique_ptr<dtl::lab11::PipelineStage> stage;
  std::unique_ptr<torch::optim::Optimizer> opt;
  try {
    stage = std::make_unique<dtl::lab11::PipelineStage>(
        cfg, *comm, dtl::lab11::partition(dtl::lab11::unit_costs(cfg), comm->size()));
    opt = dtl::make_adamw(stage->module());
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 1);
    dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);
    dtl::lab11::fill_drain_step(*stage, *opt, sampler.global_batch_at(0), micro);  // warm-up
    int64_t step = 1;
    for (auto _ : state) {
      const torch::Tensor global = sampler.global_batch_at(step++);
      dtl::bench::Iteration it(state);
      dtl::lab11::fill_drain_step(*stage, *opt, global, micro);
    }
  } catch (const dtl::NotImplemented& e) {
    state.SkipWithError(e.what());  // every rank throws alike: nobody waits
  }
}

BENCHMARK(BM_FillDrain)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Iterations(4)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
