// Public tests of lab 13. Run: ./lab test 13   (world sizes 1 and 2: every rank trains its own
// replica from the same seed, and the ranks must agree).
//
// Oracles: the plain computation, bit for bit (torch::equal), with dropout on: checkpointing
// must change no number, only what is kept and when it is computed; the tracking allocator for
// what forward keeps and for the peak (within 15% of the closed forms); exact worked values for
// the closed forms the student derives from the header's list; those forms for the chooser.
#include "checkpointing.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"  // defines: serial, error_of, DTL_EXPECT_EQUAL, same_on_all_ranks
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"  // defines: make_adamw
#include "dtl/train.hpp"  // defines: train_step
#include "tests/checkpointing_test_util.hpp"

namespace dtl::lab13 {
namespace {

using namespace lab13::testing;  // NOLINT: config, name, on_cpu, dev, measure_step
using dtl::testing::error_of;
using ::testing::HasSubstr;

const std::vector<Policy> kPolicies = {Policy::kNone, Policy::kSelective, Policy::kFull};

// ---------------------------------------------------------------- Task 1: checkpoint

// A small piece of network with a parameter, a nonlinearity and dropout: what a checkpoint
// wraps in practice. Captures w by value (a tensor handle).
CheckpointFn mlp_piece(const torch::Tensor& w, double p) {
  return [w, p](const std::vector<torch::Tensor>& in) {
    torch::Tensor h = torch::tanh(torch::matmul(in[0], w));
    return torch::dropout(torch::matmul(h, w.t()), p, /*train=*/true) * in[1];
  };
}

TEST(Checkpoint, OutputAndGradientsAreBitwiseThoseWithoutIt) {
  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({16, 24}, dev()), s0 = torch::randn({16, 24}, dev());
  const torch::Tensor w0 = torch::randn({24, 40}, dev());
  auto run = [&](bool use_checkpoint) {
    torch::Tensor x = x0.clone().requires_grad_(true), s = s0.clone().requires_grad_(true);
    torch::Tensor w = w0.clone().requires_grad_(true);
    const CheckpointFn fn = mlp_piece(w, 0.3);
    torch::manual_seed(42);
    torch::Tensor out = use_checkpoint ? checkpoint(fn, {x, s}) : fn({x, s});
    (out * out).sum().backward();
    return std::vector<torch::Tensor>{out.detach(), x.grad(), s.grad(), w.grad()};
  };
  const auto plain = run(false);
  const auto ckpt = run(true);
  const char* what[] = {"output", "grad of input 0", "grad of input 1", "grad of the parameter"};
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(OBSERVE(ckpt[i].defined())) << what[i] << " is undefined";
    EXPECT_TRUE(OBSERVE(torch::equal(ckpt[i], plain[i]))) << what[i] << " differs";
  }
}

TEST(Checkpoint, RunsFnOnceInForwardAndOnceInBackward) {
  int calls = 0;
  const CheckpointFn fn = [&calls](const std::vector<torch::Tensor>& in) {
    ++calls;
    return (in[0] * in[0]).sin();
  };
  torch::Tensor x = torch::randn({8}, dev()).requires_grad_(true);
  torch::Tensor out = checkpoint(fn, {x});
  EXPECT_EQ(OBSERVE(calls), 1) << "forward must run fn once";
  EXPECT_TRUE(OBSERVE(out.requires_grad())) << "the output must require grad when an input does";
  out.sum().backward();
  EXPECT_EQ(OBSERVE(calls), 2) << "backward must run fn once more";
}

TEST(Checkpoint, KeepsOnlyItsInputs) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  dtl::memory::install();
  const torch::Tensor x0 = torch::randn({64, 1024});
  const torch::Tensor w = torch::randn({1024}).requires_grad_(true);
  // Five elementwise ops on [64, 1024]: autograd keeps several tensors of 256 KiB each.
  const CheckpointFn fn = [w](const std::vector<torch::Tensor>& in) {
    return ((in[0] * w).tanh() * w).sigmoid().exp();
  };
  torch::Tensor outs[2];
  auto kept = [&](bool use_checkpoint) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
    torch::Tensor out = use_checkpoint ? checkpoint(fn, {x}) : fn({x});
    const auto bytes = static_cast<int64_t>(dtl::memory::current_bytes()) - before;
    outs[use_checkpoint] = out.detach();
    return bytes;
  };
  const int64_t out_bytes = x0.numel() * 4;
  // The plain function's figure is the oracle (this process's own); the checkpoint's is the
  // student's process's (MEASURED).
  const int64_t plain = kept(false), ckpt = MEASURED(kept(true));
  // Keeping nothing is easy when nothing is computed: the output is the function's.
  DTL_EXPECT_EQUAL(outs[1], outs[0]);
  EXPECT_GE(plain, 3 * out_bytes) << "the plain function should keep intermediates";
  // The output itself, and the generator state (a few KiB) if you keep it as a tensor.
  EXPECT_LE(ckpt, out_bytes + 16 * 1024)
      << "checkpoint kept " << ckpt << " bytes beyond its inputs; the output alone is " << out_bytes
      << " (without checkpointing: " << plain << ")";
}

TEST(Checkpoint, ReplaysTwoDropoutsAndLeavesTheRandomStreamAsWithoutIt) {
  const torch::Tensor x0 = torch::randn({32, 32}, dev());
  // Two dropout calls in one fn: both masks must be replayed in backward.
  const CheckpointFn fn = [](const std::vector<torch::Tensor>& in) {
    return torch::dropout(in[0], 0.5, true) * torch::dropout(in[0].cos(), 0.25, true);
  };
  auto run = [&](bool use_checkpoint) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::manual_seed(7);
    torch::Tensor out = use_checkpoint ? checkpoint(fn, {x}) : fn({x});
    torch::Tensor between =
        torch::rand({16}, dev());  // training draws between forward and backward
    (out.sum() + between.sum()).backward();
    // What the rest of training draws next: backward must not have moved the stream.
    const torch::Tensor next = torch::rand({16}, dev());
    return std::make_pair(x.grad(), next);
  };
  const auto plain = run(false);
  const auto ckpt = run(true);
  EXPECT_TRUE(OBSERVE(torch::equal(ckpt.first, plain.first)))
      << "the gradient differs: backward's recomputation drew other dropout masks";
  EXPECT_TRUE(OBSERVE(torch::equal(ckpt.second, plain.second)))
      << "after backward the random stream is not where it is without checkpointing";
}

TEST(Checkpoint, InputsThatNeedNoGradientGetNone) {
  torch::Tensor x = torch::randn({4, 6}, dev());  // data: no grad
  torch::Tensor w = torch::randn({6, 3}, dev()).requires_grad_(true);
  torch::Tensor w_plain = w.detach().clone().requires_grad_(true);
  // What the recomputation sees (the second call): leaves requiring grad as the inputs do, so
  // no gradient is computed for x. (x.grad() alone could not tell: autograd drops a gradient
  // returned for an input that does not require grad.)
  auto calls = std::make_shared<int>(0);
  auto recomputed_needs_grad = std::make_shared<std::vector<bool>>();
  const CheckpointFn fn = [calls, recomputed_needs_grad](const std::vector<torch::Tensor>& in) {
    if (++*calls == 2)
      for (const auto& t : in) recomputed_needs_grad->push_back(t.requires_grad());
    return torch::matmul(in[0], in[1]).relu();
  };
  checkpoint(fn, {x, w}).sum().backward();
  ASSERT_EQ(OBSERVE(*calls), 2);
  EXPECT_EQ(OBSERVE(*recomputed_needs_grad), (std::vector<bool>{false, true}))
      << "the recomputation's leaves: x needs no gradient, w does";
  *calls = 0;
  fn({x, w_plain}).sum().backward();
  EXPECT_FALSE(OBSERVE(x.grad().defined()));
  ASSERT_TRUE(OBSERVE(w.grad().defined()));
  EXPECT_TRUE(OBSERVE(torch::equal(w.grad(), w_plain.grad())));
}

TEST(Checkpoint, RejectsBadInput) {
  const CheckpointFn fn = [](const std::vector<torch::Tensor>& in) { return in[0] * 2; };
  EXPECT_THAT(error_of([&] { checkpoint(CheckpointFn(), {torch::ones({2})}); }), HasSubstr("fn"));
  EXPECT_THAT(error_of([&] { checkpoint(fn, {}); }), HasSubstr("inputs"));
  EXPECT_THAT(error_of([&] { checkpoint(fn, {torch::Tensor()}); }), HasSubstr("input"));
}

// ---------------------------------------------------------------- Task 2: the policies

TEST(Policies, BlockForwardIsBitwiseTheBlock) {
  const GPTConfig cfg = config(1, 32, 4, 64, 16);
  GPT model(cfg);
  const torch::Tensor x0 = torch::randn({3, 16, 32});
  for (bool training : {true, false}) {
    model->train(training);
    auto run = [&](bool plain, Policy policy) {
      model->zero_grad();
      torch::Tensor x = x0.clone().requires_grad_(true);
      torch::manual_seed(3);
      torch::Tensor y =
          plain ? model->block(0)->forward(x) : block_forward(model->block(0), x, policy);
      (y * y).sum().backward();
      return std::make_tuple(y.detach(), x.grad(), dtl::testing::flat_grads(*model));
    };
    const auto want = run(true, Policy::kNone);
    for (Policy p : kPolicies) {
      const auto got = run(false, p);
      const std::string what = std::string(to_string(p)) + (training ? " train" : " eval");
      EXPECT_TRUE(OBSERVE(torch::equal(std::get<0>(got), std::get<0>(want)))) << what << ": output";
      EXPECT_TRUE(OBSERVE(torch::equal(std::get<1>(got), std::get<1>(want))))
          << what << ": input grad";
      EXPECT_TRUE(OBSERVE(torch::equal(std::get<2>(got), std::get<2>(want))))
          << what << ": param grads";
    }
  }
}

// Three AdamW steps with dropout, for every policy: each step's loss and the final parameters
// bitwise those of plain training; and the ranks (each a replica from the same seed) agree.
TEST(Policies, TrainingIsBitwisePlainTraining) {
  const GPTConfig cfg = config(2, 32, 2, 64, 32);
  const torch::Tensor batch = dtl::testing::serial(5, [&] {
    return torch::randint(cfg.vocab_size, {4, 33}, torch::kInt64);
  });
  auto train = [&](bool plain, Policy policy) {
    return dtl::testing::serial(11, [&] {
      GPT model(cfg);
      model->train();
      auto opt = dtl::make_adamw(*model);
      std::vector<float> losses;
      for (int step = 0; step < 3; ++step) {
        if (plain) {
          losses.push_back(dtl::train_step(model, *opt, batch));
        } else {
          opt->zero_grad();
          torch::Tensor loss = gpt_loss(model, batch, policy);
          loss.backward();
          opt->step();
          losses.push_back(loss.item<float>());
        }
      }
      return std::make_pair(losses, dtl::testing::flat_params(*model));
    });
  };
  const auto want = train(true, Policy::kNone);
  for (Policy p : kPolicies) {
    const auto got = train(false, p);
    EXPECT_EQ(OBSERVE(got.first), want.first) << to_string(p) << ": losses differ";
    EXPECT_TRUE(OBSERVE(torch::equal(got.second, want.second)))
        << to_string(p) << ": parameters differ";
    DTL_EXPECT_SAME_ON_ALL_RANKS(got.second);
  }
}

TEST(Policies, GptLossRejectsBadTokens) {
  GPT model(GPTConfig::tiny());
  EXPECT_THAT(error_of([&] { gpt_loss(model, torch::zeros({4}, torch::kInt64), Policy::kNone); }),
              HasSubstr("tokens"));
  EXPECT_THAT(error_of([&] {
                gpt_loss(model, torch::zeros({2, 1}, torch::kInt64), Policy::kFull);
              }),
              HasSubstr("tokens"));
}

// What forward keeps, measured, against the closed forms of the header computed here: selective
// drops exactly the core's L (1 + 2D) B H T^2 floats, full keeps one [B, T, d] per block.
TEST(Policies, WhatForwardKeepsDropsAsTheFormulasSay) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  const GPTConfig cfg = config(2, 32, 4, 64, 64);
  const int64_t B = 8, T = 64, e = 4, d = 32, f = 128, L = 2, H = 4, V = 64;
  const MeasuredStep steps[] = {measure_step(cfg, B, T, Policy::kNone),
                                measure_step(cfg, B, T, Policy::kSelective),
                                measure_step(cfg, B, T, Policy::kFull)};
  const double plain = plain_step_loss(cfg, B, T);
  for (const MeasuredStep& st : steps)
    EXPECT_NEAR(st.loss, plain, 1e-6 * std::abs(plain)) << "dropping activations keeps the loss";
  const int64_t none = steps[0].saved, selective = steps[1].saved, full = steps[2].saved;
  const double core = double(L * e * 3 * B * H * T * T);
  const double layer_none = double(e * (B * T * (10 * d + 2 * f)) + e * 3 * B * H * T * T);
  EXPECT_NEAR(double(none - selective), core, 0.15 * core) << "selective should drop the core";
  const double want_full = double(e * B * T * (2 * d + V) + L * e * B * T * d);
  EXPECT_NEAR(double(full), want_full, 0.15 * want_full)
      << "full should keep one [B,T,d] per block";
  EXPECT_NEAR(double(none - full), double(L) * layer_none - double(L * e * B * T * d),
              0.15 * double(L) * layer_none);
}

// ---------------------------------------------------------------- Task 3: memory and plans

TEST(ActivationMemory, ClosedForm) {
  // L 2, d 32, H 2, V 64, T 32, B 4, dropout on: B T = 128, e B T d = 16384, e B T V = 32768,
  // e B H T^2 = 32768. A = 4 (128 x 6 x 32) + 3 x 32768 = 196608, M = 4 x 128 x (4 x 32 + 256)
  // = 196608, core = 98304.
  const GPTConfig cfg = config(2, 32, 2, 64, 32);
  const ActivationMemory none = observed(activation_memory(cfg, 4, 32, Policy::kNone));
  const ActivationMemory sel = observed(activation_memory(cfg, 4, 32, Policy::kSelective));
  const ActivationMemory full = observed(activation_memory(cfg, 4, 32, Policy::kFull));
  EXPECT_EQ(none.saved, 16384 + 2 * 393216 + 16384 + 32768);
  EXPECT_EQ(sel.saved, 16384 + 2 * 294912 + 16384 + 32768);
  EXPECT_EQ(full.saved, 16384 + 2 * 16384 + 16384 + 32768);
  EXPECT_EQ(none.peak, 851968 + 2 * 32768);  // backward's start is the high-water mark
  // full: rest = 98304 - 32768 - 16384 - 16384 = 32768; the last block's MLP backward:
  // 32768 + 393216 + 4 x 128 x (128 + 64) = 524288.
  EXPECT_EQ(full.peak, 524288);
}

TEST(ActivationMemory, WithoutDropoutTheCoreIsOneTensor) {
  const GPTConfig cfg = config(2, 32, 2, 64, 32, /*dropout=*/0.0);
  // A = 4 x 128 x 5 x 32 + 32768 = 114688, M = 4 x 128 x (3 x 32 + 256) = 180224.
  EXPECT_EQ(OBSERVE(activation_memory(cfg, 4, 32, Policy::kNone).saved),
            16384 + 2 * (114688 + 180224) + 16384 + 32768);
  EXPECT_EQ(OBSERVE(activation_memory(cfg, 4, 32, Policy::kSelective).saved),
            16384 + 2 * (114688 + 180224 - 32768) + 16384 + 32768);
}

TEST(ActivationMemory, RejectsBadShapes) {
  const GPTConfig cfg = GPTConfig::tiny();
  EXPECT_THAT(error_of([&] { activation_memory(cfg, 0, 8, Policy::kNone); }), HasSubstr("batch"));
  EXPECT_THAT(error_of([&] { activation_memory(cfg, 2, 0, Policy::kNone); }), HasSubstr("seq"));
  EXPECT_THAT(error_of([&] { activation_memory(cfg, 2, cfg.seq_len + 1, Policy::kFull); }),
              HasSubstr("seq"));
  GPTConfig bad = cfg;
  bad.n_head = 3;
  EXPECT_THAT(error_of([&] { activation_memory(bad, 2, 8, Policy::kNone); }), HasSubstr("n_head"));
}

TEST(RecomputeFlops, ClosedForm) {
  const GPTConfig cfg = config(2, 32, 2, 64, 32);
  // core 4 B T^2 d = 4 x 4 x 1024 x 32 = 524288; projections 2 B T (4 d^2 + 2 d f)
  // = 2 x 128 x (4096 + 8192) = 3145728.
  EXPECT_EQ(OBSERVE(recompute_flops(cfg, 4, 32, Policy::kNone)), 0.0);
  EXPECT_EQ(OBSERVE(recompute_flops(cfg, 4, 32, Policy::kSelective)), 2 * 524288.0);
  EXPECT_EQ(OBSERVE(recompute_flops(cfg, 4, 32, Policy::kFull)), 2 * (524288.0 + 3145728.0));
}

// The tracker against the formulas: what forward keeps and the peak, three policies, four
// shapes (attention-heavy, wide, deep with a large vocabulary, no dropout).
TEST(Measured, WithinFifteenPercentOfTheFormulas) {
  if (!on_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  struct Case {
    GPTConfig cfg;
    int64_t B, T;
  };
  const std::vector<Case> cases = {{config(2, 32, 4, 64, 64), 8, 64},
                                   {config(2, 64, 4, 128, 64), 8, 64},
                                   {config(4, 32, 2, 256, 64), 4, 64},
                                   {config(2, 64, 2, 64, 64, 0.0), 2, 64}};
  for (const Case& c : cases) {
    for (Policy p : kPolicies) {
      const MeasuredStep m = measure_step(c.cfg, c.B, c.T, p);
      const ActivationMemory want = observed(activation_memory(c.cfg, c.B, c.T, p));
      const std::string what = name(c.cfg, c.B, c.T) + " " + to_string(p);
      EXPECT_NEAR(double(m.saved), double(want.saved), 0.15 * double(want.saved))
          << what << ": end of forward";
      EXPECT_NEAR(double(m.peak), double(want.peak), 0.15 * double(want.peak)) << what << ": peak";
    }
  }
}

TEST(Choose, TheCheapestPlanThatFits) {
  const GPTConfig cfg = config(2, 32, 4, 64, 64);
  const int64_t B = 8, T = 64;
  const int64_t none = activation_memory(cfg, B, T, Policy::kNone).peak;
  const int64_t sel = activation_memory(cfg, B, T, Policy::kSelective).peak;
  const int64_t full = activation_memory(cfg, B, T, Policy::kFull).peak;
  // The budgets below are the code's own numbers; the assertions are on the observed ones.
  ASSERT_GT(OBSERVE(none), OBSERVE(sel));
  ASSERT_GT(OBSERVE(sel), OBSERVE(full));
  struct Want {
    int64_t budget;
    Policy policy;
  };
  for (const Want& w : std::vector<Want>{{none * 2, Policy::kNone},
                                         {none, Policy::kNone},
                                         {none - 1, Policy::kSelective},
                                         {sel, Policy::kSelective},
                                         {sel - 1, Policy::kFull},
                                         {full, Policy::kFull}}) {
    const Plan plan = choose_checkpointing(cfg, B, T, w.budget);
    EXPECT_EQ(OBSERVE(plan.policy), w.policy) << "budget " << w.budget;
    EXPECT_EQ(OBSERVE(plan.peak_bytes), OBSERVE(activation_memory(cfg, B, T, w.policy).peak));
    EXPECT_EQ(OBSERVE(plan.recompute_flops), OBSERVE(recompute_flops(cfg, B, T, w.policy)));
  }
}

TEST(Choose, SaysWhyNothingFits) {
  const GPTConfig cfg = config(2, 32, 4, 64, 64);
  const int64_t full = activation_memory(cfg, 8, 64, Policy::kFull).peak;
  const std::string msg = error_of([&] { choose_checkpointing(cfg, 8, 64, full - 1); });
  const int64_t observed_full = OBSERVE(full);  // the budget the student's code was given - 1
  EXPECT_THAT(msg, HasSubstr("budget"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(observed_full - 1)));
  EXPECT_THAT(msg, HasSubstr(std::to_string(observed_full)));
  EXPECT_THAT(error_of([&] { choose_checkpointing(cfg, 8, 64, 0); }), HasSubstr("budget"));
  EXPECT_THAT(error_of([&] { choose_checkpointing(cfg, 0, 64, 1 << 30); }), HasSubstr("batch"));
}

}  // namespace
}  // namespace dtl::lab13
