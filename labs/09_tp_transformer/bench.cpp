// lab 09 benchmark: forward + backward of the tensor-parallel GPT at tp = the number of ranks,
// for two widths. Each rank multiplies 1/tp of every weight matrix; the price is 2 all-reduces
// of the activations per block each way. Every timed step's loss is checked against the serial
// GPT's (computed once), so nothing is timed that did not do the work.
//
//   ./lab bench 09 -n 4                   your model
//   ./lab bench 09 -n 4 --net nvlink      tp over an emulated NVLink
//   ./lab bench 09 -n 4 --net ib-2node    tp across two emulated nodes
//   ./lab bench 09 -n 4 --solutions       the reference
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include <cmath>

#include "dtl/error.hpp"
#include "dtl/model.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "tp_transformer.hpp"

namespace {

void BM_TensorParallelGPTStep(benchmark::State& state) {
  dtl::model::GPTConfig cfg;
  cfg.n_layer = 2;
  cfg.d_model = state.range(0);
  cfg.n_head = 12;  // with d 192/384 and vocab 768: divisible by tp 1-4
  cfg.vocab_size = 768;
  cfg.seq_len = 64;
  const int64_t batch = 4;
  const torch::Device device = dtl::Runtime::get().device();
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();
  dtl::model::GPT serial(cfg);
  serial->to(device);
  torch::Generator gen = at::detail::createCPUGenerator(7);  // the same tokens on every rank
  const torch::Tensor tokens =
      torch::randint(cfg.vocab_size, {batch, cfg.seq_len + 1}, gen, torch::kInt64).to(device);
  const double expected = serial->loss(tokens).item<double>();
  try {
    dtl::lab09::TensorParallelGPT gpt(*serial, *comm);
    gpt->loss(tokens).backward();  // warm-up: first-touch allocations, BLAS start-up
    bool wrong = false;
    for (auto _ : state) {
      dtl::bench::Iteration it(state);
      const torch::Tensor loss = gpt->loss(tokens);
      loss.backward();
      wrong = wrong || std::abs(loss.item<double>() - expected) > 1e-4 * std::abs(expected);
    }
    if (dtl::max_over_ranks(wrong ? 1.0 : 0.0) > 0)
      state.SkipWithError("wrong result: the loss differs from the serial GPT's");
  } catch (const dtl::NotImplemented& e) {
    state.SkipWithError(e.what());  // every rank throws alike: nobody waits
  }
  state.counters["tp"] = comm->size();
  state.counters["tokens"] = static_cast<double>(batch * cfg.seq_len);
}

BENCHMARK(BM_TensorParallelGPTStep)
    ->Arg(192)
    ->Arg(384)
    ->Iterations(8)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
