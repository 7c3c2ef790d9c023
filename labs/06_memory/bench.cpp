// Lab 06 benchmark: the cost of one float32 AdamW training step of a small GPT with the
// tracking allocator installed (your measure), with the measured peak as a counter. Memory is
// not a speed figure a student's choices change, so the grader has no performance points here;
// the benchmark shows that counting every allocation costs little.
//
//   ./lab bench 06
//   ./lab bench 06 --solutions
#include <benchmark/benchmark.h>

#include "dtl/error.hpp"
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"
#include "memory.hpp"

namespace {

void BM_MeasuredStep(benchmark::State& state) {
  dtl::lab06::GPTConfig cfg;
  cfg.n_layer = 2;
  cfg.d_model = 64;
  cfg.n_head = 4;
  cfg.vocab_size = 256;
  cfg.seq_len = state.range(0);
  dtl::memory::install();
  torch::Tensor tokens = torch::randint(cfg.vocab_size, {8, cfg.seq_len + 1}, torch::kInt64);
  dtl::lab06::GPT model(cfg);
  auto optimizer = dtl::make_adamw(*model);
  dtl::lab06::Measured m;
  try {
    m = dtl::lab06::measure(model, *optimizer, tokens);  // warm-up and not-implemented probe
  } catch (const dtl::NotImplemented& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) m = dtl::lab06::measure(model, *optimizer, tokens);
  state.counters["peak_MiB"] = double(m.peak) / (1 << 20);
}
BENCHMARK(BM_MeasuredStep)->Arg(32)->Arg(128)->Iterations(20)->Unit(benchmark::kMillisecond);

}  // namespace
