// Shared by lab 13's public and grading tests: model shapes and a measured step.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checkpointing.hpp"
#include "dtl/harness/checks.hpp"  // defines: gpt_config, device
#include "dtl/memory.hpp"
#include "dtl/runtime.hpp"

namespace dtl::lab13::testing {

// A course GPT with the given layers, width, heads, vocabulary and context; dropout on.
inline GPTConfig config(int64_t layers, int64_t d, int64_t heads, int64_t vocab, int64_t seq_len,
                        double dropout = 0.1) {
  return dtl::testing::gpt_config(layers, d, heads, vocab, seq_len, dropout);
}

inline std::string name(const GPTConfig& c, int64_t B, int64_t T) {
  return "L=" + std::to_string(c.n_layer) + " d=" + std::to_string(c.d_model) +
         " H=" + std::to_string(c.n_head) + " V=" + std::to_string(c.vocab_size) +
         " B=" + std::to_string(B) + " T=" + std::to_string(T) +
         " dropout=" + std::to_string(c.dropout);
}

// The Runtime's device: Task 1's tests run there (on CUDA, the checkpoint must replay the CUDA
// generator too).
inline torch::TensorOptions dev() {
  return torch::TensorOptions().device(dtl::testing::device());
}

// The tracker counts CPU memory only: on a GPU runtime the measuring tests have nothing to read.
inline bool on_cpu() { return dtl::Runtime::get().device().is_cpu(); }

// An ActivationMemory from the code under test, both fields observed (dtl/harness/observe.hpp):
// assert on this copy.
inline ActivationMemory observed(const ActivationMemory& a, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
  using dtl::testing::observe;
  const auto src = dtl::testing::Source::kComputed;
  ActivationMemory o;
  o.saved = observe(a.saved, "ActivationMemory.saved", src, file, line);
  o.peak = observe(a.peak, "ActivationMemory.peak", src, file, line);
  return o;
}

// Both figures are the student's process's (its gpt_loss ran): MEASURED. The loss is a result
// (observed as computed): memory figures alone would pass a gpt_loss that computes nothing.
struct MeasuredStep {
  int64_t saved = 0;  // live bytes at the end of forward, above those before it
  int64_t peak = 0;   // the tracker's peak during forward + backward, above the same
  double loss = 0;    // gpt_loss's value
};

// The same step's loss without any checkpointing: the model's own loss on the same tokens and
// dropout seed (the oracle of measure_step's `loss`).
inline double plain_step_loss(const GPTConfig& cfg, int64_t B, int64_t T) {
  torch::manual_seed(1);
  torch::Tensor tokens = torch::randint(cfg.vocab_size, {B, T + 1}, torch::kInt64);
  GPT model(cfg);
  model->train();
  return model->loss(tokens).item<double>();
}

// One forward (gpt_loss under `policy`) and backward of a fresh model(cfg) in train mode, with
// the gradients allocated beforehand (as from the second step of training on), dropout seeded.
inline MeasuredStep measure_step(const GPTConfig& cfg, int64_t B, int64_t T, Policy policy,
                                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  dtl::memory::install();
  torch::manual_seed(1);
  torch::Tensor tokens = torch::randint(cfg.vocab_size, {B, T + 1}, torch::kInt64);
  GPT model(cfg);
  model->train();
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  dtl::memory::reset_peak();
  MeasuredStep m;
  torch::Tensor loss = gpt_loss(model, tokens, policy);
  m.saved = static_cast<int64_t>(dtl::memory::current_bytes()) - before;
  loss.backward();
  m.peak = static_cast<int64_t>(dtl::memory::peak_bytes()) - before;
  using dtl::testing::observe;
  const auto src = dtl::testing::Source::kMeasured;
  m.saved = observe(m.saved, "the bytes forward kept", src, file, line);
  m.peak = observe(m.peak, "the step's peak bytes", src, file, line);
  m.loss = observe(loss.item<double>(), "gpt_loss's value", dtl::testing::Source::kComputed, file,
                   line);
  return m;
}

}  // namespace dtl::lab13::testing
