// Public tests of lab 06, run at world sizes 1 and 2 (./lab test 06). Lab 06 is single-process
// in spirit: every rank builds its own model and measures itself with the tracking allocator.
//
// Oracles: model::num_parameters of a built model for the parameter count; bytes per element
// for the state (ZeRO's 16 bytes per parameter for mixed-precision AdamW); the tracker's live
// bytes after a step for params + grads + optimizer state (exact, up to a small fixed slack);
// the tracker's live bytes after forward and its peak for activations and peak (within 15%);
// dtl::OutOfMemory under a memory limit below the predicted peak.
#include "memory.hpp"
#include "memory_test_util.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"

namespace {

using dtl::lab06::Breakdown;
using dtl::lab06::GPT;
using dtl::lab06::GPTConfig;
using dtl::lab06::Measured;
using dtl::lab06::OptimizerKind;
using dtl::lab06::Precision;
using dtl::testing::error_of;
using ::testing::HasSubstr;

using dtl::lab06::testing::config;
using dtl::lab06::testing::measured;
using dtl::lab06::testing::observed;

std::string name(const GPTConfig& c, int64_t B, int64_t T) {
  return "L=" + std::to_string(c.n_layer) + " d=" + std::to_string(c.d_model) +
         " H=" + std::to_string(c.n_head) + " V=" + std::to_string(c.vocab_size) +
         " B=" + std::to_string(B) + " T=" + std::to_string(T);
}

// The tracker counts CPU memory only: on a GPU runtime the measuring tests have nothing to read.
bool on_cpu() { return dtl::Runtime::get().device().is_cpu(); }

// One fresh model measured through one step. baseline = live bytes before the model was built
// (the batch already exists), so everything above it is the model's. Both are the figures of the
// process the step ran in (MEASURED): only their differences mean anything.
struct StepRun {
  int64_t baseline = 0;
  Measured m;
};
StepRun run_step(const GPTConfig& cfg, int64_t B, int64_t T, OptimizerKind opt) {
  dtl::memory::install();
  torch::Tensor batch = torch::randint(cfg.vocab_size, {B, T + 1}, torch::kInt64);
  StepRun r;
  r.baseline = MEASURED(static_cast<int64_t>(dtl::memory::current_bytes()));
  GPT model(cfg);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (opt == OptimizerKind::kAdamW) {
    optimizer = dtl::make_adamw(*model);
  } else {
    optimizer =
        std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(1e-2));
  }
  r.m = measured(dtl::lab06::measure(model, *optimizer, batch));
  return r;
}

// Live bytes that one forward + loss leaves behind (what autograd saved for backward).
int64_t measured_saved(const GPTConfig& cfg, int64_t B, int64_t T) {
  dtl::memory::install();
  torch::Tensor batch = torch::randint(cfg.vocab_size, {B, T + 1}, torch::kInt64);
  GPT model(cfg);
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  torch::Tensor loss = model->loss(batch);
  return static_cast<int64_t>(dtl::memory::current_bytes()) - before;
}

// Six configurations: batch, sequence, depth, width and vocabulary each varied.
struct Case {
  GPTConfig cfg;
  int64_t B, T;
};
std::vector<Case> six_cases() {
  return {{config(2, 32, 2, 64, 16), 4, 16}, {config(2, 32, 2, 64, 16), 16, 16},
          {config(2, 32, 2, 64, 64), 4, 64}, {config(4, 32, 2, 64, 32), 4, 32},
          {config(2, 64, 4, 64, 32), 4, 32}, {config(2, 32, 2, 256, 32), 8, 32}};
}

// Byte counts as integers: gtest prints a failing predicate's arguments, and as doubles two
// different counts both read 1.25829e+07.
bool within(int64_t measured, int64_t predicted, double tol) {
  return std::abs(static_cast<double>(measured - predicted)) <= tol * static_cast<double>(predicted);
}

// Clears the memory limit however the test ends.
struct LimitGuard {
  ~LimitGuard() { dtl::memory::set_limit(0); }
};

// ================================================================ Task 1: the state

TEST(ParameterCount, EqualsTheBuiltModel) {
  std::vector<GPTConfig> cfgs = {GPTConfig::tiny(), config(3, 48, 3, 100, 20)};
  GPTConfig untied = config(2, 32, 4, 64, 16);
  untied.tied_head = false;
  untied.bias = false;
  untied.d_ff = 40;
  cfgs.push_back(untied);
  for (const GPTConfig& c : cfgs) {
    GPT model(c);
    EXPECT_EQ(OBSERVE(dtl::lab06::parameter_count(c)), dtl::model::num_parameters(*model))
        << c.to_string();
  }
}

TEST(Estimate, StateBytesPerParameter) {
  const GPTConfig c = GPTConfig::tiny();
  const int64_t N = OBSERVE(dtl::lab06::parameter_count(c));
  struct Want {
    Precision p;
    OptimizerKind o;
    int64_t params, grads, master, optimizer;
  };
  // ZeRO (Rajbhandari et al. 2020): mixed-precision Adam is 2 + 2 + 12 = 16 bytes per parameter.
  const std::vector<Want> wants = {{Precision::kFP32, OptimizerKind::kSGD, 4, 4, 0, 0},
                                   {Precision::kFP32, OptimizerKind::kAdamW, 4, 4, 0, 8},
                                   {Precision::kMixedBF16, OptimizerKind::kSGD, 2, 2, 4, 0},
                                   {Precision::kMixedBF16, OptimizerKind::kAdamW, 2, 2, 4, 8}};
  for (const Want& w : wants) {
    const Breakdown b = observed(dtl::lab06::estimate(c, 4, 16, w.p, w.o));
    const std::string what = std::string(to_string(w.p)) + " " + to_string(w.o);
    EXPECT_EQ(b.params, w.params * N) << what;
    EXPECT_EQ(b.grads, w.grads * N) << what;
    EXPECT_EQ(b.master, w.master * N) << what;
    EXPECT_EQ(b.optimizer, w.optimizer * N) << what;
  }
  EXPECT_EQ(observed(dtl::lab06::estimate(c, 4, 16, Precision::kMixedBF16, OptimizerKind::kAdamW))
                .state(),
            16 * N);
}

TEST(Estimate, RejectsBadShapes) {
  const GPTConfig c = GPTConfig::tiny();
  const auto P = Precision::kFP32;
  const auto O = OptimizerKind::kAdamW;
  EXPECT_THAT(error_of([&] { dtl::lab06::estimate(c, 0, 8, P, O); }), HasSubstr("batch"));
  EXPECT_THAT(error_of([&] { dtl::lab06::estimate(c, 2, 0, P, O); }), HasSubstr("seq"));
  EXPECT_THAT(error_of([&] { dtl::lab06::estimate(c, 2, c.seq_len + 1, P, O); }), HasSubstr("seq"));
}

TEST(Measure, StateAfterAStepIsExact) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  const GPTConfig c = config(2, 32, 2, 64, 16);
  const int64_t slack = 1024;  // AdamW's per-parameter step counters, if a version keeps tensors
  for (OptimizerKind o : {OptimizerKind::kSGD, OptimizerKind::kAdamW}) {
    const StepRun r = run_step(c, 4, 16, o);
    const Breakdown b = observed(dtl::lab06::estimate(c, 4, 16, Precision::kFP32, o));
    EXPECT_EQ(r.m.before - r.baseline, b.params) << to_string(o);
    const int64_t state = r.m.after - r.baseline;
    EXPECT_GE(state, b.state()) << to_string(o);
    EXPECT_LE(state, b.state() + slack) << to_string(o);
  }
}

// ================================================================ Task 2: activations and peak

TEST(Activations, PerLayerFormula) {
  const GPTConfig c = config(2, 32, 2, 64, 16);
  // e (B T (8d + 2f) + B H T^2): 4 x (4 x 16 x (256 + 256) + 4 x 2 x 256) = 139264
  EXPECT_EQ(OBSERVE(dtl::lab06::activation_bytes_per_layer(c, 4, 16, Precision::kFP32)), 139264);
  EXPECT_EQ(OBSERVE(dtl::lab06::activation_bytes_per_layer(c, 4, 16, Precision::kMixedBF16)),
            69632);
  const Breakdown b =
      observed(dtl::lab06::estimate(c, 4, 16, Precision::kFP32, OptimizerKind::kAdamW));
  EXPECT_EQ(b.activations, 2 * 139264 + 2 * 4 * 4 * 16 * 32);
  EXPECT_EQ(b.logits, 4 * 4 * 16 * 64);
}

TEST(Activations, WithinFifteenPercentOfWhatForwardLeaves) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  for (const Case& k : six_cases()) {
    const Breakdown b =
        observed(dtl::lab06::estimate(k.cfg, k.B, k.T, Precision::kFP32, OptimizerKind::kAdamW));
    const int64_t saved = measured_saved(k.cfg, k.B, k.T);  // the common model's: the oracle
    EXPECT_PRED3(within, saved, b.activations + b.logits, 0.15)
        << name(k.cfg, k.B, k.T) << ": measured " << saved << ", predicted "
        << b.activations + b.logits;
  }
}

TEST(Peak, WithinFifteenPercentOfTheTrackersPeak) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  for (const Case& k : six_cases()) {
    const Breakdown b =
        observed(dtl::lab06::estimate(k.cfg, k.B, k.T, Precision::kFP32, OptimizerKind::kAdamW));
    const StepRun r = run_step(k.cfg, k.B, k.T, OptimizerKind::kAdamW);
    const int64_t peak = r.m.peak - r.baseline;
    EXPECT_PRED3(within, peak, b.peak, 0.15)
        << name(k.cfg, k.B, k.T) << ": measured " << peak << ", predicted " << b.peak;
  }
}

TEST(Peak, ALimitBelowThePredictedPeakThrowsAndOneAboveDoesNot) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  const GPTConfig c = config(2, 32, 2, 256, 32);
  const int64_t B = 8, T = 32;
  // The student's prediction sets the limits: observed, so the driver checks it and uses it too.
  const Breakdown b =
      observed(dtl::lab06::estimate(c, B, T, Precision::kFP32, OptimizerKind::kAdamW));
  LimitGuard guard;
  dtl::memory::install();
  const auto base = static_cast<int64_t>(dtl::memory::current_bytes());
  // Room for the model and the batch, not for the step's peak. Whether the step ran out of
  // memory is the student's process's to say (MEASURED).
  dtl::memory::set_limit(static_cast<size_t>(base + b.peak * 8 / 10));
  bool threw = false;
  std::string what;
  try {
    run_step(c, B, T, OptimizerKind::kAdamW);
  } catch (const dtl::OutOfMemory& e) {
    threw = true;
    what = e.what();
  }
  if (!MEASURED(threw)) {
    ADD_FAILURE() << "a step under a limit of 80% of the predicted peak did not throw";
  } else {
    what = MEASURED(what);
    EXPECT_THAT(what, HasSubstr("limit")) << what;
  }
  dtl::memory::set_limit(static_cast<size_t>(dtl::memory::current_bytes() + b.peak * 12 / 10));
  std::string above = "(no exception)";
  try {
    run_step(c, B, T, OptimizerKind::kAdamW);
  } catch (const dtl::NotImplemented&) {
    throw;
  } catch (const std::exception& e) {
    above = e.what();
  }
  EXPECT_EQ(MEASURED(above), "(no exception)") << "a step under 120% of the predicted peak";
}

TEST(Table, ShowsEveryCategoryPredictedAndMeasured) {
  const GPTConfig c = GPTConfig::tiny();
  const Breakdown b = dtl::lab06::estimate(c, 4, 16, Precision::kFP32, OptimizerKind::kAdamW);
  const std::string predicted_only = OBSERVE(dtl::lab06::breakdown_table(b));
  for (const char* row : {"params", "grads", "optimizer", "activations", "peak"})
    EXPECT_THAT(predicted_only, HasSubstr(row));
  EXPECT_THAT(predicted_only, HasSubstr(dtl::memory::format_bytes(double(observed(b).peak))));
  Measured m;
  m.before = 1000 + b.params;
  m.after = 1000 + b.state();
  m.peak = 1000 + 2 * b.peak;  // twice the prediction: ratio 2.000
  const std::string table = OBSERVE(dtl::lab06::breakdown_table(b, &m, 1000));
  EXPECT_THAT(table, HasSubstr("2.000"));
  EXPECT_THAT(table, HasSubstr("1.000"));
}

}  // namespace
