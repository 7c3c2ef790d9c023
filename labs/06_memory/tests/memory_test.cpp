// Public tests of lab 06, run at world sizes 1 and 2 (./lab test 06). Lab 06 is single-process
// in spirit: every rank builds its own model and measures itself with the tracking allocator.
//
// Oracles: model::num_parameters of a built model for the parameter count; bytes per element
// for the state (ZeRO's 16 bytes per parameter for mixed-precision AdamW); the header's closed
// forms for the activations, the logits and both peaks (exact, both precisions, both
// optimizers, at shapes where each high-water mark wins: a term left out fails even when it is
// too small for the tolerance below); the tracker's live bytes after a step for params + grads
// + optimizer state (exact, up to a small fixed slack), and at the start of the second step;
// the tracker's live bytes after forward and its peaks for activations, peak and steady peak
// (within 15%); dtl::OutOfMemory under a memory limit below the predicted peak, and under one
// between the two peaks in the second step only.
#include "memory.hpp"
#include "memory_test_util.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
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
using dtl::lab06::TwoSteps;
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

// A fresh model and optimizer, and a batch. baseline = live bytes before the model was built
// (the batch already exists), so everything above it is the model's. Both are the figures of
// the process the steps run in (MEASURED): only their differences mean anything.
struct Fresh {
  torch::Tensor batch;
  int64_t baseline = 0;
  GPT model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};
Fresh fresh(const GPTConfig& cfg, int64_t B, int64_t T, OptimizerKind opt) {
  dtl::memory::install();
  Fresh f;
  f.batch = torch::randint(cfg.vocab_size, {B, T + 1}, torch::kInt64);
  f.baseline = MEASURED(static_cast<int64_t>(dtl::memory::current_bytes()));
  f.model = GPT(cfg);
  if (opt == OptimizerKind::kAdamW) {
    f.optimizer = dtl::make_adamw(*f.model);
  } else {
    f.optimizer =
        std::make_unique<torch::optim::SGD>(f.model->parameters(), torch::optim::SGDOptions(1e-2));
  }
  return f;
}

// One fresh model measured through one step (measure), or two (measure_two_steps).
struct StepRun {
  int64_t baseline = 0;
  Measured m;
};
StepRun run_step(const GPTConfig& cfg, int64_t B, int64_t T, OptimizerKind opt) {
  Fresh f = fresh(cfg, B, T, opt);
  return {f.baseline, measured(dtl::lab06::measure(f.model, *f.optimizer, f.batch))};
}
struct TwoStepRun {
  int64_t baseline = 0;
  TwoSteps m;
};
TwoStepRun run_two_steps(const GPTConfig& cfg, int64_t B, int64_t T, OptimizerKind opt) {
  Fresh f = fresh(cfg, B, T, opt);
  return {f.baseline, measured(dtl::lab06::measure_two_steps(f.model, *f.optimizer, f.batch))};
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

// The six, and shapes where the attention backward or the optimizer step is the high-water
// mark, an untied head without biases and with a custom d_ff, T below the context: every term
// of the closed forms matters in one of them.
std::vector<Case> closed_form_cases() {
  GPTConfig untied = config(2, 32, 2, 128, 32);
  untied.tied_head = false;
  untied.bias = false;
  untied.d_ff = 72;
  std::vector<Case> cases = six_cases();
  cases.push_back({config(1, 32, 8, 64, 128), 2, 128});  // attention backward
  cases.push_back({config(2, 64, 4, 512, 16), 1, 4});    // the optimizer step, in both peaks
  cases.push_back({untied, 4, 24});
  return cases;
}

// Bytes of one activation element.
int64_t element_bytes(Precision p) { return p == Precision::kFP32 ? 4 : 2; }

// Byte counts as integers: gtest prints a failing predicate's arguments, and as doubles two
// different counts both read 1.25829e+07.
bool within(int64_t measured, int64_t predicted, double tol) {
  return std::abs(static_cast<double>(measured - predicted)) <= tol * static_cast<double>(predicted);
}

// What `run` raised under the memory limit set: its message, or "(no exception)". "Not
// implemented" goes on up, to fail the test as that.
template <typename Run>
std::string error_of_run(Run run) {
  try {
    run();
  } catch (const dtl::NotImplemented&) {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
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

TEST(Activations, EveryTermByClosedFormInBothPrecisions) {
  for (const Case& k : closed_form_cases()) {
    const int64_t B = k.B, T = k.T, d = k.cfg.d_model, f = k.cfg.ff(), H = k.cfg.n_head;
    const int64_t V = k.cfg.vocab_size, L = k.cfg.n_layer;
    for (Precision p : {Precision::kFP32, Precision::kMixedBF16}) {
      const int64_t e = element_bytes(p);
      const std::string what = name(k.cfg, B, T) + " " + to_string(p);
      const int64_t per_layer = e * (B * T * (8 * d + 2 * f) + B * H * T * T);
      EXPECT_EQ(OBSERVE(dtl::lab06::activation_bytes_per_layer(k.cfg, B, T, p)), per_layer) << what;
      const Breakdown b = observed(dtl::lab06::estimate(k.cfg, B, T, p, OptimizerKind::kAdamW));
      // The embedding's output, the blocks, ln_f's output; the loss's log-softmax.
      EXPECT_EQ(b.activations, e * B * T * d + L * per_layer + e * B * T * d) << what;
      EXPECT_EQ(b.logits, e * B * T * V) << what;
    }
  }
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

// The three high-water marks of the header, from the estimate's own fields: what each adds to
// the bytes resident when its step starts.
struct Marks {
  int64_t backward_start, attention_backward, optimizer_step;
};
Marks marks_of(const Breakdown& b, const GPTConfig& c, int64_t B, int64_t T, Precision p,
               OptimizerKind o) {
  const int64_t e = element_bytes(p), d = c.d_model;
  const int64_t largest = std::max({c.vocab_size * d, c.seq_len * d, c.ff() * d, 3 * d * d});
  return {b.activations + b.logits + 2 * e * B * T * c.vocab_size,
          b.activations + 2 * e * B * c.n_head * T * T,
          o == OptimizerKind::kAdamW ? 2 * 4 * largest : 0};
}

TEST(Peak, FirstStepByClosedForm) {
  for (const Case& k : closed_form_cases()) {
    for (Precision p : {Precision::kFP32, Precision::kMixedBF16}) {
      for (OptimizerKind o : {OptimizerKind::kSGD, OptimizerKind::kAdamW}) {
        const Breakdown b = observed(dtl::lab06::estimate(k.cfg, k.B, k.T, p, o));
        const Marks m = marks_of(b, k.cfg, k.B, k.T, p, o);
        // The first step starts with the weights only (master included); all state by its end.
        const int64_t weights = b.params + b.master;
        EXPECT_EQ(b.peak, std::max({weights + m.backward_start, weights + m.attention_backward,
                                    b.state() + m.optimizer_step}))
            << name(k.cfg, k.B, k.T) << " " << to_string(p) << " " << to_string(o);
      }
    }
  }
}

TEST(SteadyPeak, ByClosedFormWithTheWholeStateResident) {
  for (const Case& k : closed_form_cases()) {
    for (Precision p : {Precision::kFP32, Precision::kMixedBF16}) {
      for (OptimizerKind o : {OptimizerKind::kSGD, OptimizerKind::kAdamW}) {
        const Breakdown b = observed(dtl::lab06::estimate(k.cfg, k.B, k.T, p, o));
        const Marks m = marks_of(b, k.cfg, k.B, k.T, p, o);
        // params + grads + master + optimizer under every mark: leaving any out fails here.
        EXPECT_EQ(b.steady_peak,
                  b.state() + std::max({m.backward_start, m.attention_backward, m.optimizer_step}))
            << name(k.cfg, k.B, k.T) << " " << to_string(p) << " " << to_string(o);
      }
    }
  }
}

TEST(SteadyPeak, WithinFifteenPercentOfTheSecondStepsPeak) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  for (const Case& k : six_cases()) {
    const Breakdown b =
        observed(dtl::lab06::estimate(k.cfg, k.B, k.T, Precision::kFP32, OptimizerKind::kAdamW));
    const TwoStepRun r = run_two_steps(k.cfg, k.B, k.T, OptimizerKind::kAdamW);
    const int64_t peak = r.m.second.peak - r.baseline;
    EXPECT_PRED3(within, peak, b.steady_peak, 0.15)
        << name(k.cfg, k.B, k.T) << ": measured " << peak << ", predicted " << b.steady_peak;
  }
}

TEST(Measure, TheSecondStepHoldsTheWholeStateUnderItsMarks) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  const int64_t slack = 1024;  // as in StateAfterAStepIsExact
  // Activations above the state; and a tiny batch under the AdamW update of a [4096, 32] fc,
  // larger than the gradient temporaries of backward (no tied [V, d] gradient in two parts).
  GPTConfig wide = config(1, 32, 2, 64, 16);
  wide.tied_head = false;
  wide.d_ff = 4096;
  for (const Case& k : {Case{config(2, 32, 2, 64, 16), 4, 16}, Case{wide, 1, 4}}) {
    const int64_t saved = measured_saved(k.cfg, k.B, k.T);  // the common model's: the oracle
    const int64_t d = k.cfg.d_model;
    const int64_t largest =
        std::max({k.cfg.vocab_size * d, k.cfg.seq_len * d, k.cfg.ff() * d, 3 * d * d});
    for (OptimizerKind o : {OptimizerKind::kSGD, OptimizerKind::kAdamW}) {
      const std::string what = name(k.cfg, k.B, k.T) + " " + to_string(o);
      const TwoStepRun r = run_two_steps(k.cfg, k.B, k.T, o);
      const Breakdown b = observed(dtl::lab06::estimate(k.cfg, k.B, k.T, Precision::kFP32, o));
      EXPECT_EQ(r.m.first.before - r.baseline, b.params) << what;
      EXPECT_EQ(r.m.second.before, r.m.first.after) << what;
      const int64_t state = r.m.second.after - r.baseline;
      EXPECT_GE(state, b.state()) << what;
      EXPECT_LE(state, b.state() + slack) << what;
      // Lower bounds the tracker must see whatever the estimate says: at the end of the second
      // forward, the resident state and everything forward saved (gradients freed between the
      // steps instead of zeroed stay below it); in its AdamW update, the state and sqrt(v) and
      // sqrt(v) / c of the largest parameter.
      const int64_t above = r.m.second.peak - r.m.second.before;
      EXPECT_GE(above, saved) << what;
      if (o == OptimizerKind::kAdamW) {
        EXPECT_GE(above, 2 * 4 * largest) << what;
      }
    }
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
  const std::string above = error_of_run([&] { run_step(c, B, T, OptimizerKind::kAdamW); });
  EXPECT_EQ(MEASURED(above), "(no exception)") << "a step under 120% of the predicted peak";
}

TEST(SteadyPeak, ALimitBetweenThePeaksPassesTheFirstStepButNotTheSecond) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  // Peaks 1.46 and 2.07 MiB: the state (0.82 MiB) is resident under the second step's
  // activations, so a budget that the first step fits in is not one a run fits in.
  const GPTConfig c = config(4, 32, 2, 64, 32);
  const int64_t B = 4, T = 32;
  const Breakdown b =
      observed(dtl::lab06::estimate(c, B, T, Precision::kFP32, OptimizerKind::kAdamW));
  LimitGuard guard;
  dtl::memory::install();
  const int64_t limit = std::max(b.peak * 12 / 10, b.steady_peak * 8 / 10);
  dtl::memory::set_limit(static_cast<size_t>(dtl::memory::current_bytes() + limit));
  const std::string first = error_of_run([&] { run_step(c, B, T, OptimizerKind::kAdamW); });
  EXPECT_EQ(MEASURED(first), "(no exception)") << "one step under " << limit << " bytes";
  dtl::memory::set_limit(static_cast<size_t>(dtl::memory::current_bytes() + limit));
  bool threw = false;
  try {
    run_two_steps(c, B, T, OptimizerKind::kAdamW);
  } catch (const dtl::OutOfMemory&) {
    threw = true;
  }
  EXPECT_TRUE(MEASURED(threw)) << "two steps under " << limit
                               << " bytes, between the predicted peaks, did not throw";
}

TEST(Table, ShowsEveryCategoryPredictedAndMeasured) {
  const GPTConfig c = GPTConfig::tiny();
  const Breakdown b = dtl::lab06::estimate(c, 4, 16, Precision::kFP32, OptimizerKind::kAdamW);
  const std::string predicted_only = OBSERVE(dtl::lab06::breakdown_table(b));
  for (const char* row : {"params", "grads", "optimizer", "activations", "peak", "steady"})
    EXPECT_THAT(predicted_only, HasSubstr(row));
  const Breakdown o = observed(b);
  EXPECT_THAT(predicted_only, HasSubstr(dtl::memory::format_bytes(double(o.peak))));
  EXPECT_THAT(predicted_only, HasSubstr(dtl::memory::format_bytes(double(o.steady_peak))));
  Measured m;
  m.before = 1000 + b.params;
  m.after = 1000 + b.state();
  m.peak = 1000 + 2 * b.peak;  // twice the prediction: ratio 2.000
  const std::string table = OBSERVE(dtl::lab06::breakdown_table(b, &m, 1000));
  EXPECT_THAT(table, HasSubstr("2.000"));
  EXPECT_THAT(table, HasSubstr("1.000"));
  Measured second = m;
  second.peak = 1000 + 3 * b.steady_peak;  // the steady peak's row: ratio 3.000
  EXPECT_THAT(OBSERVE(dtl::lab06::breakdown_table(b, &m, 1000, &second)), HasSubstr("3.000"));
}

}  // namespace
