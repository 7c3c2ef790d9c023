// Grading tests of lab 13 (hidden from students until the due date). They check nothing the
// header does not promise: nested and repeated checkpoints, views as inputs, parameters used
// inside and outside, other model shapes (untied, bias-free, custom d_ff, more heads), SGD,
// eval mode, more measured shapes, closed forms at GPT-3 scale, a one-layer model where full
// checkpointing saves nothing, and a chosen plan that really runs under its budget.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "checkpointing.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/memory.hpp"
#include "tests/checkpointing_test_util.hpp"

namespace dtl::lab13 {
namespace {

using namespace lab13::testing;  // NOLINT
using dtl::testing::error_of;
using ::testing::HasSubstr;

const std::vector<Policy> kPolicies = {Policy::kNone, Policy::kSelective, Policy::kFull};

// ---------------------------------------------------------------- checkpoint

TEST(GradeCheckpoint, NestedCheckpointsAndViewsAsInputs) {
  const torch::Tensor x0 = torch::randn({6, 10}), w0 = torch::randn({10, 10});
  auto run = [&](bool use_checkpoint) {
    torch::Tensor base = x0.clone().requires_grad_(true);
    torch::Tensor w = w0.clone().requires_grad_(true);
    const torch::Tensor view = base.t();  // a non-contiguous view as the input
    const CheckpointFn inner = [w](const std::vector<torch::Tensor>& in) {
      return torch::dropout(torch::matmul(w, in[0]).tanh(), 0.3, true);
    };
    const CheckpointFn outer = [w, inner, use_checkpoint](const std::vector<torch::Tensor>& in) {
      torch::Tensor h = use_checkpoint ? checkpoint(inner, {in[0]}) : inner({in[0]});
      return torch::dropout(h, 0.2, true) * in[0];
    };
    torch::manual_seed(21);
    torch::Tensor out = use_checkpoint ? checkpoint(outer, {view}) : outer({view});
    // The output used twice, and w used outside the checkpoint as well.
    (out.sum() + (out * out).mean() + w.sum()).backward();
    return std::make_pair(base.grad(), w.grad());
  };
  const auto plain = run(false);
  const auto ckpt = run(true);
  ASSERT_TRUE(OBSERVE(ckpt.first.defined() && ckpt.second.defined()));
  EXPECT_TRUE(OBSERVE(torch::equal(ckpt.first, plain.first))) << "input gradient";
  EXPECT_TRUE(OBSERVE(torch::equal(ckpt.second, plain.second))) << "parameter gradient";
}

TEST(GradeCheckpoint, RepeatedCallsEachReplayTheirOwnMasks) {
  const torch::Tensor x0 = torch::randn({64});
  const CheckpointFn fn = [](const std::vector<torch::Tensor>& in) {
    return torch::dropout(in[0], 0.5, true);
  };
  auto run = [&](bool use_checkpoint) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::manual_seed(4);
    torch::Tensor y = x;
    for (int i = 0; i < 3; ++i) y = use_checkpoint ? checkpoint(fn, {y}) : fn({y});
    y.sum().backward();
    return std::make_pair(x.grad(), torch::rand({4}));
  };
  const auto plain = run(false);
  const auto ckpt = run(true);
  EXPECT_TRUE(OBSERVE(torch::equal(ckpt.first, plain.first)));
  EXPECT_TRUE(OBSERVE(torch::equal(ckpt.second, plain.second)));
}

// ---------------------------------------------------------------- policies

TEST(GradePolicies, OtherShapesSgdBitwise) {
  GPTConfig cfg = config(3, 48, 4, 80, 24, 0.2);
  cfg.tied_head = false;
  cfg.bias = false;
  cfg.d_ff = 72;
  const torch::Tensor batch = dtl::testing::serial(8, [&] {
    return torch::randint(cfg.vocab_size, {3, 25}, torch::kInt64);
  });
  auto train = [&](bool plain, Policy policy) {
    return dtl::testing::serial(12, [&] {
      GPT model(cfg);
      model->train();
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.5));
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        torch::Tensor loss = plain ? model->loss(batch) : gpt_loss(model, batch, policy);
        loss.backward();
        opt.step();
      }
      return dtl::testing::flat_params(*model);
    });
  };
  const torch::Tensor want = train(true, Policy::kNone);
  for (Policy p : kPolicies) {
    const torch::Tensor got = train(false, p);
    EXPECT_TRUE(OBSERVE(torch::equal(got, want))) << to_string(p);
    DTL_EXPECT_SAME_ON_ALL_RANKS(got);
  }
}

TEST(GradePolicies, EvalModeAndShortSequences) {
  const GPTConfig cfg = config(2, 32, 2, 64, 32, 0.3);
  GPT model(cfg);
  model->eval();
  const torch::Tensor tokens = torch::randint(cfg.vocab_size, {2, 6}, torch::kInt64);
  const torch::Tensor want = model->loss(tokens);
  for (Policy p : kPolicies) {
    EXPECT_TRUE(OBSERVE(torch::equal(gpt_loss(model, tokens, p), want))) << to_string(p);
  }
}

// ---------------------------------------------------------------- memory and plans

TEST(GradeMeasured, MoreShapesWithinFifteenPercent) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  struct Case {
    GPTConfig cfg;
    int64_t B, T;
  };
  GPTConfig custom_ff = config(2, 48, 3, 96, 48);
  custom_ff.d_ff = 96;
  const std::vector<Case> cases = {
      {config(3, 64, 2, 64, 32), 8, 32}, {config(3, 32, 4, 128, 64), 4, 64}, {custom_ff, 4, 48}};
  for (const Case& c : cases) {
    for (Policy p : kPolicies) {
      const MeasuredStep m = measure_step(c.cfg, c.B, c.T, p);
      const ActivationMemory want = observed(activation_memory(c.cfg, c.B, c.T, p));
      const std::string what = name(c.cfg, c.B, c.T) + " " + to_string(p);
      EXPECT_NEAR(double(m.saved), double(want.saved), 0.15 * double(want.saved)) << what;
      EXPECT_NEAR(double(m.peak), double(want.peak), 0.15 * double(want.peak)) << what;
    }
  }
}

TEST(GradeActivationMemory, Gpt3ScaleClosedForms) {
  // GPT-3 175B shapes, one sequence of 2048, dropout on: e B T d = 4 x 2048 x 12288 =
  // 100663296; e B H T^2 = 4 x 96 x 2048^2 = 1610612736; e B T V = 411705344.
  GPTConfig cfg = GPTConfig::gpt3_175b();
  cfg.dropout = 0.1;
  const int64_t eBTd = 100663296, eBHTT = 1610612736, eBTV = 411705344;
  const int64_t A = 6 * eBTd + 3 * eBHTT, M = 12 * eBTd;
  const ActivationMemory none = observed(activation_memory(cfg, 1, 2048, Policy::kNone));
  const ActivationMemory sel = observed(activation_memory(cfg, 1, 2048, Policy::kSelective));
  const ActivationMemory full = observed(activation_memory(cfg, 1, 2048, Policy::kFull));
  EXPECT_EQ(none.saved, 2 * eBTd + 96 * (A + M) + eBTV);
  EXPECT_EQ(sel.saved, 2 * eBTd + 96 * (A + M - 3 * eBHTT) + eBTV);
  EXPECT_EQ(full.saved, 2 * eBTd + 96 * eBTd + eBTV);
  // Attention dominates at T = 2048: the peak is the last block's attention backward.
  EXPECT_EQ(none.peak, none.saved - eBTV - eBTd - (A + M) + A + 2 * eBHTT);
  EXPECT_EQ(full.peak, full.saved - eBTV - 2 * eBTd + A + 2 * eBHTT);
  EXPECT_DOUBLE_EQ(OBSERVE(recompute_flops(cfg, 1, 2048, Policy::kSelective)),
                   96.0 * 4.0 * 2048.0 * 2048.0 * 12288.0);
}

TEST(GradeChoose, OneLayerFullSavesNothingAndIsNeverChosen) {
  // One block, long sequence: full checkpointing rebuilds the only block in backward, so its
  // peak is above selective's, and a budget that fits full fits selective, which recomputes less.
  const GPTConfig cfg = config(1, 32, 4, 64, 64);
  const int64_t sel = activation_memory(cfg, 8, 64, Policy::kSelective).peak;
  const int64_t full = activation_memory(cfg, 8, 64, Policy::kFull).peak;
  // The budgets below are the code's own numbers; the assertions are on the observed ones.
  ASSERT_GT(OBSERVE(full), OBSERVE(sel));
  EXPECT_EQ(OBSERVE(choose_checkpointing(cfg, 8, 64, full).policy), Policy::kSelective);
  const std::string msg = error_of([&] { choose_checkpointing(cfg, 8, 64, sel - 1); });
  EXPECT_THAT(msg, HasSubstr("budget"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(OBSERVE(sel)))) << "the smallest peak is selective's";
  EXPECT_THAT(error_of([&] { choose_checkpointing(cfg, 8, 65, 1 << 30); }), HasSubstr("seq"));
}

struct LimitGuard {
  ~LimitGuard() { dtl::memory::set_limit(0); }
};

TEST(GradeChoose, TheChosenPlanRunsUnderItsBudgetAndNoCheckpointingDoesNot) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  const GPTConfig cfg = config(2, 32, 4, 64, 64);
  const int64_t B = 8, T = 64;
  const int64_t budget = activation_memory(cfg, B, T, Policy::kSelective).peak;
  const Plan plan = choose_checkpointing(cfg, B, T, budget);
  ASSERT_EQ(OBSERVE(plan.policy), Policy::kSelective);
  LimitGuard guard;
  dtl::memory::install();
  // measure_step allocates the model (~0.1 MiB), its gradients and the batch before forward.
  const auto room = static_cast<size_t>(dtl::memory::current_bytes()) + (512u << 10);
  dtl::memory::set_limit(room + static_cast<size_t>(budget * 115 / 100));
  // Whether a step ran out of memory is the student's process's to say (MEASURED).
  std::string under_budget = "(no exception)";
  try {
    measure_step(cfg, B, T, plan.policy);
  } catch (const dtl::NotImplemented&) {
    throw;
  } catch (const std::exception& e) {
    under_budget = e.what();
  }
  EXPECT_EQ(MEASURED(under_budget), "(no exception)") << "the chosen plan under its budget";
  bool threw = false;
  try {
    measure_step(cfg, B, T, Policy::kNone);
  } catch (const dtl::OutOfMemory&) {
    threw = true;
  }
  EXPECT_TRUE(MEASURED(threw)) << "without checkpointing the step should not fit the budget";
}

}  // namespace
}  // namespace dtl::lab13
