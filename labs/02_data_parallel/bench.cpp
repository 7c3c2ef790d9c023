// lab 02 benchmark: one synchronous data-parallel step, with its compute / communication split
// as counters. Run it without and with the emulated network to see which part a network moves:
//
//   ./lab bench 02 -n 4
//   ./lab bench 02 -n 4 -- --net pcie
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include "data_parallel.hpp"
#include "dtl/data.hpp"          // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/optim.hpp"         // defines: make_adamw
#include "dtl/perf.hpp"          // defines: max_over_ranks
#include "dtl/runtime.hpp"       // defines: world()

namespace {

// BM_DPStep/<d_model>: 2 layers, 4 heads, seq 32, vocab 128, global batch 16.
void BM_DPStep(benchmark::State& state) {
  dtl::model::GPTConfig cfg;
  cfg.vocab_size = 128;
  cfg.seq_len = 32;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.d_model = state.range(0);
  const int64_t batch = 16;
  dtl::model::GPT model(cfg);
  auto optimizer = dtl::make_adamw(*model);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 1);
  dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();  // gradient traffic only
  dtl::lab02::dp_train_step(model, *optimizer, sampler.global_batch_at(0), *comm);  // warm-up

  double compute = 0, comm_time = 0, optimizer_time = 0;
  int64_t step = 1;
  for (auto _ : state) {
    const torch::Tensor global = sampler.global_batch_at(step++);  // data prep: not timed
    dtl::lab02::StepStats st;
    {
      dtl::bench::Iteration it(state);
      st = dtl::lab02::dp_train_step(model, *optimizer, global, *comm);
    }
    // The slowest rank's numbers (collective: every rank calls, every iteration).
    compute += dtl::max_over_ranks(st.compute_seconds);
    comm_time += dtl::max_over_ranks(st.comm_seconds);
    optimizer_time += dtl::max_over_ranks(st.optimizer_seconds);
  }
  using benchmark::Counter;
  const double iters = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] =
      Counter(static_cast<double>(batch * cfg.seq_len), Counter::kIsIterationInvariantRate);
  state.counters["compute_ms"] = compute / iters * 1e3;
  state.counters["comm_ms"] = comm_time / iters * 1e3;
  state.counters["optimizer_ms"] = optimizer_time / iters * 1e3;
  state.counters["comm_fraction"] = comm_time / (compute + comm_time + optimizer_time);
}
BENCHMARK(BM_DPStep)->Arg(64)->Arg(128)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
