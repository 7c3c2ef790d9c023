// lab 01 benchmark: tokens/s of lab01::train_step and its MFU against this machine's measured
// fp32 matmul peak, for two model widths.
//
//   ./lab bench 01 -n 1            (every rank runs its own replica when -n > 1)
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include "dtl/data.hpp"          // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/perf.hpp"          // defines: max_over_ranks, measure_matmul_flops
#include "dtl/timer.hpp"         // defines: DeviceTimer
#include "why_distributed.hpp"

namespace {

using dtl::lab01::GPTConfig;

// Measured once per process, on first use: the MFU denominator.
double peak_flops() {
  static const double peak = dtl::measure_matmul_flops();
  return peak;
}

// BM_TrainStep/<d_model>: 2 layers, 4 heads, seq 32, vocab 64, batch 16.
void BM_TrainStep(benchmark::State& state) {
  GPTConfig cfg;
  cfg.vocab_size = 64;
  cfg.seq_len = 32;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.d_model = state.range(0);
  const int64_t batch = 16;
  dtl::lab01::GPT model(cfg);
  auto optimizer = dtl::make_adamw(*model);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 1);
  dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);
  const double peak = peak_flops();
  dtl::lab01::train_step(model, *optimizer, sampler.global_batch_at(0));  // warm-up

  int64_t step = 1;
  double seconds = 0;  // the same per-iteration times Google Benchmark sees, summed
  for (auto _ : state) {
    const torch::Tensor tokens = sampler.global_batch_at(step++);  // data prep: not timed
    dtl::bench::Iteration it(state);
    dtl::DeviceTimer t;
    dtl::lab01::train_step(model, *optimizer, tokens);
    seconds += dtl::max_over_ranks(t.seconds());
  }
  const double tokens_per_s =
      static_cast<double>(state.iterations() * batch * cfg.seq_len) / seconds;
  state.counters["tokens_per_s"] = tokens_per_s;
  state.counters["MFU"] = dtl::lab01::mfu(tokens_per_s, cfg, peak);
  state.counters["peak_GFLOPs"] = peak / 1e9;
}
BENCHMARK(BM_TrainStep)->Arg(64)->Arg(128)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
