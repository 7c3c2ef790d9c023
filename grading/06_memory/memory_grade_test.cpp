// Grading-only tests of lab 06 (hidden until the due date; ./lab grade 06 runs them).
//
// Beyond the public tests: untied heads, no biases and a custom d_ff measured exactly, over two
// steps; SGD's peaks (no optimizer state); configurations where attention's T^2, the vocabulary
// or the optimizer step dominates the first and the steady-state peak; the closed forms at
// Llama 2 7B scale in bf16, both peaks included; every bad input word; the table's rows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "memory.hpp"
#include "tests/memory_test_util.hpp"

namespace {

using dtl::lab06::Breakdown;
using dtl::lab06::GPT;
using dtl::lab06::GPTConfig;
using dtl::lab06::Measured;
using dtl::lab06::OptimizerKind;
using dtl::lab06::Precision;
using dtl::lab06::TwoSteps;
using dtl::testing::error_of;
using ::testing::HasSubstr;

bool on_cpu() { return dtl::Runtime::get().device().is_cpu(); }

using dtl::lab06::testing::config;
using dtl::lab06::testing::measured;
using dtl::lab06::testing::observed;

struct Step {
  int64_t baseline = 0;  // baseline and m: the figures of the student's process (MEASURED)
  TwoSteps m;
  int64_t saved = 0;  // live bytes forward + loss left behind, on a fresh common model (oracle)
};

Step measure_step(const GPTConfig& cfg, int64_t B, int64_t T, OptimizerKind opt) {
  dtl::memory::install();
  torch::Tensor batch = torch::randint(cfg.vocab_size, {B, T + 1}, torch::kInt64);
  Step s;
  {
    GPT model(cfg);
    const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
    torch::Tensor loss = model->loss(batch);
    s.saved = static_cast<int64_t>(dtl::memory::current_bytes()) - before;
  }
  s.baseline = MEASURED(static_cast<int64_t>(dtl::memory::current_bytes()));
  GPT model(cfg);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (opt == OptimizerKind::kAdamW)
    optimizer = dtl::make_adamw(*model);
  else
    optimizer =
        std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(1e-2));
  s.m = measured(dtl::lab06::measure_two_steps(model, *optimizer, batch));
  return s;
}

// Byte counts as integers: gtest prints a failing predicate's arguments, and as doubles two
// different counts both read 1.25829e+07.
bool within(int64_t measured, int64_t predicted, double tol) {
  return std::abs(static_cast<double>(measured - predicted)) <= tol * static_cast<double>(predicted);
}

TEST(GradeState, UntiedNoBiasCustomFfIsExactForBothOptimizers) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  GPTConfig c = config(3, 48, 3, 96, 24);
  c.tied_head = false;
  c.bias = false;
  c.d_ff = 72;
  {
    GPT model(c);
    EXPECT_EQ(OBSERVE(dtl::lab06::parameter_count(c)), dtl::model::num_parameters(*model));
  }
  for (OptimizerKind o : {OptimizerKind::kSGD, OptimizerKind::kAdamW}) {
    const Step s = measure_step(c, 2, 24, o);
    const Breakdown b = observed(dtl::lab06::estimate(c, 2, 24, Precision::kFP32, o));
    EXPECT_EQ(s.m.first.before - s.baseline, b.params) << to_string(o);
    EXPECT_GE(s.m.first.after - s.baseline, b.state()) << to_string(o);
    EXPECT_LE(s.m.first.after - s.baseline, b.state() + 1024) << to_string(o);
    EXPECT_EQ(s.m.second.before, s.m.first.after) << to_string(o);
    EXPECT_GE(s.m.second.after - s.baseline, b.state()) << to_string(o);
    EXPECT_LE(s.m.second.after - s.baseline, b.state() + 1024) << to_string(o);
    // The whole state under everything the second forward saved.
    EXPECT_GE(s.m.second.peak - s.baseline, b.state() + s.saved) << to_string(o);
  }
}

TEST(GradeEstimate, ActivationsAndPeakWhereEachTermDominates) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  struct Case {
    const char* what;
    GPTConfig cfg;
    int64_t B, T;
    OptimizerKind opt;
  };
  GPTConfig untied = config(2, 32, 2, 128, 32);
  untied.tied_head = false;
  const std::vector<Case> cases = {
      {"attention T^2 (8 heads, T 128)", config(1, 32, 8, 64, 128), 2, 128, OptimizerKind::kAdamW},
      {"vocabulary (V 1024)", config(1, 32, 2, 1024, 16), 8, 16, OptimizerKind::kAdamW},
      {"optimizer step (B 1, T 4)", config(2, 64, 4, 512, 16), 1, 4, OptimizerKind::kAdamW},
      {"SGD, no state", config(2, 32, 2, 64, 32), 4, 32, OptimizerKind::kSGD},
      {"untied head", untied, 4, 32, OptimizerKind::kAdamW},
      {"T below the context", config(3, 32, 4, 64, 64), 4, 40, OptimizerKind::kAdamW},
  };
  for (const Case& k : cases) {
    const Breakdown b = observed(dtl::lab06::estimate(k.cfg, k.B, k.T, Precision::kFP32, k.opt));
    const Step s = measure_step(k.cfg, k.B, k.T, k.opt);
    EXPECT_PRED3(within, s.saved, b.activations + b.logits, 0.15)
        << k.what << ": activations measured " << s.saved << ", predicted "
        << b.activations + b.logits;
    EXPECT_PRED3(within, s.m.first.peak - s.baseline, b.peak, 0.15)
        << k.what << ": peak measured " << s.m.first.peak - s.baseline << ", predicted " << b.peak;
    EXPECT_PRED3(within, s.m.second.peak - s.baseline, b.steady_peak, 0.15)
        << k.what << ": steady peak measured " << s.m.second.peak - s.baseline << ", predicted "
        << b.steady_peak;
  }
}

TEST(GradeEstimate, Llama2SevenBInBf16) {
  const GPTConfig c = GPTConfig::llama2_7b_like();
  // Closed form: embeddings V d + S d, an untied head V d, per layer 4 d^2 (attention) +
  // 2 d f (MLP) + 4 d (two LayerNorms), the final LayerNorm 2 d. No biases.
  const int64_t d = 4096, f = 16512, V = 32000, S = 4096, L = 32;
  const int64_t N = 2 * V * d + S * d + L * (4 * d * d + 2 * d * f + 4 * d) + 2 * d;
  EXPECT_EQ(OBSERVE(dtl::lab06::parameter_count(c)), N);
  const Breakdown b =
      observed(dtl::lab06::estimate(c, 1, 4096, Precision::kMixedBF16, OptimizerKind::kAdamW));
  EXPECT_EQ(b.params, 2 * N);
  EXPECT_EQ(b.grads, 2 * N);
  EXPECT_EQ(b.master, 4 * N);
  EXPECT_EQ(b.optimizer, 8 * N);
  EXPECT_EQ(b.state(), 16 * N);  // ~108 GB: the state alone does not fit an 80 GB GPU
  const int64_t per_layer = 2 * (4096 * (8 * d + 2 * f) + 32LL * 4096 * 4096);
  EXPECT_EQ(OBSERVE(dtl::lab06::activation_bytes_per_layer(c, 1, 4096, Precision::kMixedBF16)),
            per_layer);
  EXPECT_EQ(b.activations, L * per_layer + 2 * 2 * 4096 * d);
  EXPECT_EQ(b.logits, 2 * 4096 * V);
  // The marks: backward's start (the loss's two [T, V] gradients), the attention backward (two
  // [H, T, T]), AdamW's two temporaries of the largest parameter, the [V, d] embedding.
  const int64_t acts = L * per_layer + 2 * 2 * 4096 * d;
  const int64_t backward_start = acts + 2 * 4096 * V + 2 * 2 * 4096 * V;
  const int64_t attention = acts + 2 * 2 * 32LL * 4096 * 4096;
  const int64_t step_temp = 2 * 4 * V * d;
  EXPECT_EQ(b.peak, std::max({6 * N + backward_start, 6 * N + attention, 16 * N + step_temp}));
  EXPECT_EQ(b.steady_peak, 16 * N + std::max({backward_start, attention, step_temp}));
}

TEST(GradeEstimate, EveryBadInputWord) {
  const GPTConfig c = GPTConfig::tiny();
  const auto P = Precision::kFP32;
  EXPECT_THAT(error_of([&] { dtl::lab06::activation_bytes_per_layer(c, -1, 8, P); }),
              HasSubstr("batch"));
  EXPECT_THAT(error_of([&] { dtl::lab06::activation_bytes_per_layer(c, 1, 17, P); }),
              HasSubstr("seq"));
  GPTConfig bad = c;
  bad.n_head = 3;
  EXPECT_THAT(error_of([&] { dtl::lab06::estimate(bad, 1, 8, P, OptimizerKind::kSGD); }),
              HasSubstr("n_head"));
}

TEST(GradeTable, RowsAndMeasuredColumns) {
  const GPTConfig c = config(2, 32, 2, 64, 16);
  const Breakdown b = dtl::lab06::estimate(c, 2, 16, Precision::kMixedBF16, OptimizerKind::kAdamW);
  const std::string t = OBSERVE(dtl::lab06::breakdown_table(b));
  for (const char* row :
       {"params", "grads", "master", "optimizer", "activations", "peak", "steady"})
    EXPECT_THAT(t, HasSubstr(row));
  const Breakdown o = observed(b);
  EXPECT_THAT(t, HasSubstr(dtl::memory::format_bytes(double(o.master))));
  EXPECT_THAT(t, HasSubstr(dtl::memory::format_bytes(double(o.steady_peak))));
  Measured m;
  m.before = 500 + b.params;
  m.after = 500 + b.state();
  m.peak = 500 + b.peak / 2;
  EXPECT_THAT(OBSERVE(dtl::lab06::breakdown_table(b, &m, 500)), HasSubstr("0.500"));
  Measured second = m;
  second.peak = 500 + b.steady_peak / 4;  // the steady peak's measured bytes: ratio 0.250
  const std::string both = OBSERVE(dtl::lab06::breakdown_table(b, &m, 500, &second));
  EXPECT_THAT(both, HasSubstr("0.500"));
  EXPECT_THAT(both, HasSubstr("0.250"));
}

TEST(GradeLimit, TheOutOfMemoryMessageCarriesTheBreakdown) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  const GPTConfig c = config(2, 32, 2, 256, 32);
  // The student's prediction sets the limit: observed, so the driver checks it too.
  const Breakdown b =
      observed(dtl::lab06::estimate(c, 8, 32, Precision::kFP32, OptimizerKind::kAdamW));
  dtl::memory::install();
  const auto base = static_cast<int64_t>(dtl::memory::current_bytes());
  dtl::memory::set_limit(static_cast<size_t>(base + b.peak * 9 / 10));
  std::string msg;
  try {
    measure_step(c, 8, 32, OptimizerKind::kAdamW);
  } catch (const dtl::OutOfMemory& e) {
    msg = e.what();
  }
  dtl::memory::set_limit(0);
  msg = MEASURED(msg);  // the student's process ran out of memory, or did not
  EXPECT_THAT(msg, HasSubstr("limit")) << "no dtl::OutOfMemory at 90% of the predicted peak";
  EXPECT_THAT(msg, HasSubstr("peak"));
}

}  // namespace
