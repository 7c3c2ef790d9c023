// Lab 13 benchmark: what recomputation costs. One training step's forward + backward of a
// small GPT (dropout on) under each policy, and a forward alone, with the tracker's peak as a
// counter. Full checkpointing should add about one forward: (t_full - t_none) / t_forward ~ 1,
// selective only the attention core's share of one.
//
//   ./lab bench 13
//   ./lab bench 13 --solutions
//
// Every timed step is checked: its loss and gradients must equal, bit for bit, those of the
// plain model->loss computed once up front; anything else fails the benchmark ("wrong result").
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "checkpointing.hpp"
#include "demo_config.hpp"  // defines: demo::demo_config, demo::flat_grads
#include "dtl/error.hpp"
#include "dtl/memory.hpp"

namespace {

using dtl::lab13::Policy;

constexpr int64_t kBatch = 8;
constexpr uint64_t kDropoutSeed = 13;

struct Fixture {
  dtl::lab13::GPT model{nullptr};
  torch::Tensor tokens;
  torch::Tensor want_loss, want_grads;  // plain model->loss: the ground truth of every step

  Fixture() {
    dtl::memory::install();
    const auto cfg = dtl::lab13::demo::demo_config();
    model = dtl::lab13::GPT(cfg);
    model->train();
    tokens = torch::randint(cfg.vocab_size, {kBatch, cfg.seq_len + 1},
                            torch::TensorOptions().dtype(torch::kInt64));
    // The gradients exist from here on, as in training after the first step: backward adds into
    // them, so the tracker's peak counts activations, not the gradients' first allocation.
    for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
    torch::manual_seed(kDropoutSeed);
    want_loss = model->loss(tokens);
    want_loss.backward();
    want_grads = dtl::lab13::demo::flat_grads(model);
    want_loss = want_loss.detach();
  }
  void zero_grads() {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.mutable_grad().zero_();
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void run_step(benchmark::State& state, Policy policy) {
  Fixture& f = fixture();
  try {
    double peak = 0;
    for (auto _ : state) {
      f.zero_grads();
      torch::manual_seed(kDropoutSeed);  // the same dropout masks as the ground truth
      dtl::memory::reset_peak();
      const auto before = double(dtl::memory::current_bytes());
      torch::Tensor loss;
      {
        dtl::bench::Iteration it(state);
        loss = dtl::lab13::gpt_loss(f.model, f.tokens, policy);
        loss.backward();
      }
      peak = double(dtl::memory::peak_bytes()) - before;
      if (!torch::equal(loss.detach(), f.want_loss) ||
          !torch::equal(dtl::lab13::demo::flat_grads(f.model), f.want_grads)) {
        state.SkipWithError(fmt::format("wrong result: the loss or gradients under policy {} "
                                        "differ from model->loss's",
                                        dtl::lab13::to_string(policy))
                                .c_str());
        return;
      }
    }
    state.counters["peak_MiB"] = peak / (1 << 20);
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
}

void BM_StepNone(benchmark::State& state) { run_step(state, Policy::kNone); }
void BM_StepSelective(benchmark::State& state) { run_step(state, Policy::kSelective); }
void BM_StepFull(benchmark::State& state) { run_step(state, Policy::kFull); }

// The forward alone (autograd on, as in training): the unit full checkpointing should cost.
void BM_Forward(benchmark::State& state) {
  Fixture& f = fixture();
  for (auto _ : state) {
    torch::manual_seed(kDropoutSeed);
    torch::Tensor loss;
    {
      dtl::bench::Iteration it(state);
      loss = f.model->loss(f.tokens);
    }
    if (!torch::equal(loss.detach(), f.want_loss)) {
      state.SkipWithError("wrong result: the forward's loss changed");
      return;
    }
  }
}

// Interleaved registration order does not interleave runs; the grader interleaves student and
// reference runs itself. Fixed iteration counts keep the run short and predictable.
BENCHMARK(BM_Forward)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepNone)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepSelective)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepFull)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
