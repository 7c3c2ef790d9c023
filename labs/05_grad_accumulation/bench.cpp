// lab 05 benchmark: the time of one optimizer step at a FIXED global batch (32 sequences of 64
// tokens) as the accumulation steps grow, 1, 2, 4, 8 micro-batches per step (micro = 32 /
// (world x accum)). The arithmetic is the same at every setting and, with no_sync, so is the
// communication (one all-reduce per DDP bucket per step): what accumulation costs is smaller
// matrix products run one after the other, and what it buys (activation memory of one
// micro-batch) the benchmark does not show. No performance points: the lab is about
// correctness.
//
//   ./lab bench 05 -n 2
//   ./lab bench 05 -n 2 -- --benchmark_filter='/4$'    accum 4 only
//
// Counters: all_reduces (per step, on the DDP Comm), micro_batches, tokens_per_s.
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include "ddp.hpp"
#include "demo_config.hpp"  // defines: demo_config, kDemoBucketBytes
#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::NotImplemented
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/runtime.hpp"  // defines: Runtime, world()
#include "grad_accumulation.hpp"

namespace {

constexpr int64_t kGlobalBatch = 32;

void BM_AccumStep(benchmark::State& state) {
  const int64_t accum = state.range(0);
  const dtl::model::GPTConfig cfg = dtl::lab05::demo_config();
  const torch::Device device = dtl::Runtime::get().device();
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();  // gradient traffic only
  if (kGlobalBatch < comm->size() * accum) {             // the same decision on every rank
    state.SkipWithError("global batch 32 too small for world x accum");
    return;
  }
  dtl::model::GPT model(cfg);
  model->to(device);
  dtl::lab04::DDPOptions o;
  o.first_bucket_bytes = o.bucket_cap_bytes = dtl::lab05::kDemoBucketBytes;
  dtl::lab04::DistributedDataParallel ddp(model.ptr(), *comm, o);
  auto optimizer = dtl::make_adamw(*model);
  dtl::lab05::AccumulationOptions options;
  options.accum_steps = accum;
  options.schedule.base_batch = kGlobalBatch;
  options.schedule.total_steps = 100;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 1);
  dtl::data::GlobalBatchSampler sampler(corpus, kGlobalBatch, cfg.seq_len);
  std::unique_ptr<dtl::lab05::AccumulationTrainer> trainer;
  try {
    trainer = std::make_unique<dtl::lab05::AccumulationTrainer>(model, ddp, *optimizer, options);
    trainer->step(sampler.global_batch_at(0).to(device));  // warm-up: allocator, Adam state
  } catch (const dtl::NotImplemented& e) {                 // every rank throws alike: nobody waits
    state.SkipWithError(e.what());
    return;
  }
  comm->reset_stats();
  int64_t step = 1;
  for (auto _ : state) {
    const torch::Tensor tokens = sampler.global_batch_at(step++).to(device);  // not timed
    dtl::bench::Iteration it(state);
    trainer->step(tokens);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["all_reduces"] =
      static_cast<double>(comm->stats()[dtl::OpType::AllReduce].count) / iters;
  state.counters["micro_batches"] = static_cast<double>(accum);
  state.counters["tokens_per_s"] =
      kGlobalBatch * cfg.seq_len / dtl::bench::mean_iteration_seconds(state);
}

// Fixed iteration counts: every rank runs the same number of collectives.
BENCHMARK(BM_AccumStep)
    ->ArgName("accum")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
