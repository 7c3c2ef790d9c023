// Public tests of lab 05. Run: ./lab test 05   (world sizes 1, 2, 3 and 4)
//
// Oracles: closed-form numbers (global batch, scaled and scheduled learning rates, loss
// scales), serial training on the whole global batch (dtl::train_step, same seed, same lr per
// step), agreement across ranks, and the DDP Comm's own counts (Comm::stats()).
#include "grad_accumulation.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "dtl/split.hpp"  // defines: split_range
#include "tests/grad_accumulation_test_util.hpp"

namespace {

using namespace lab05_test;  // NOLINT: helpers shared with the grading tests
using dtl::lab05::global_batch;
using dtl::lab05::linear_scaled_lr;
using dtl::lab05::masked_lm_loss_sum;
using dtl::lab05::micro_batch_loss_scale;
using dtl::lab05::noise_scale_terms;
using dtl::lab05::NoiseScaleEstimator;
using dtl::lab05::NoiseScaleTerms;
using dtl::lab05::scheduled_lr;
using dtl::lab05::sqrt_scaled_lr;
using dtl::testing::expect_error_mentions;

// ---------------------------------------------------------------- Task 1: global_batch

TEST(GlobalBatch, IsWorldTimesMicroTimesAccum) {
  // The three settings of the demo: 16 sequences per optimizer step each.
  EXPECT_EQ(OBSERVE(global_batch(1, 16, 1)), 16);
  EXPECT_EQ(OBSERVE(global_batch(2, 4, 2)), 16);
  EXPECT_EQ(OBSERVE(global_batch(4, 2, 2)), 16);
  // Llama 2's 4M tokens (1024 sequences of 4096) on 1024 GPUs with tensor parallelism 8:
  // 128 data-parallel ranks x micro 1 x accum 8.
  EXPECT_EQ(OBSERVE(global_batch(128, 1, 8)), 1024);
  EXPECT_EQ(OBSERVE(global_batch(3, 5, 7)), 105);
}

TEST(GlobalBatch, RejectsNonPositiveValues) {
  expect_error_mentions([] { global_batch(0, 2, 2); }, "world=0");
  expect_error_mentions([] { global_batch(4, -1, 2); }, "micro=-1");
  expect_error_mentions([] { global_batch(4, 2, 0); }, "accum=0");
}

// ---------------------------------------------------------------- Task 2: scaling rules

TEST(ScaledLr, LinearRuleOfGoyalEtAl) {
  // Goyal et al. 2017: lr 0.1 per 256 images, so 3.2 at 8192.
  EXPECT_NEAR(OBSERVE(linear_scaled_lr(0.1, 256, 8192)), 3.2, 1e-12);
  EXPECT_NEAR(OBSERVE(linear_scaled_lr(3e-4, 16, 1024)), 0.0192, 1e-15);
  EXPECT_NEAR(OBSERVE(linear_scaled_lr(1e-3, 64, 16)), 2.5e-4, 1e-15) << "it scales down too";
  EXPECT_EQ(OBSERVE(linear_scaled_lr(1e-3, 48, 48)), 1e-3);
}

TEST(ScaledLr, SquareRootRule) {
  EXPECT_NEAR(OBSERVE(sqrt_scaled_lr(3e-4, 16, 1024)), 2.4e-3, 1e-15)
      << "64 x the batch: 8 x the lr";
  EXPECT_NEAR(OBSERVE(sqrt_scaled_lr(1e-3, 100, 25)), 5e-4, 1e-15);
  EXPECT_NEAR(OBSERVE(sqrt_scaled_lr(1e-3, 1, 2)), 1e-3 * std::sqrt(2.0), 1e-15);
  EXPECT_EQ(OBSERVE(sqrt_scaled_lr(2e-3, 7, 7)), 2e-3);
}

TEST(ScaledLr, RejectsBadArguments) {
  for (auto fn : {&linear_scaled_lr, &sqrt_scaled_lr}) {
    expect_error_mentions([&] { fn(0.0, 16, 32); }, "base_lr=0");
    expect_error_mentions([&] { fn(1e-3, -4, 32); }, "base_batch=-4");
    expect_error_mentions([&] { fn(1e-3, 16, 0); }, "batch=0");
  }
}

// ---------------------------------------------------------------- Task 3: the schedule

TEST(ScheduledLr, WarmupThenCosineFromTheScaledPeak) {
  LrSchedule s;
  s.base_lr = 1e-3;
  s.base_batch = 16;
  s.scaling = LrScaling::Linear;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.min_lr_ratio = 0.1;
  // Batch 64 = 4 x 16: peak 4e-3. Warm-up: (s + 1) / 4 of it.
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 0)), 1e-3, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 1)), 2e-3, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 3)), 4e-3, 1e-15);
  // Cosine over the 10 steps 4..13: step 4 the peak, step 13 the floor 4e-4; step 7 is
  // progress 3/9 = 1/3 of the way: 4e-4 + 0.5 x 3.6e-3 x (1 + cos(pi/3)) = 4e-4 + 2.7e-3.
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 4)), 4e-3, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 7)), 3.1e-3, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 13)), 4e-4, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 20)), 4e-4, 1e-15)
      << "past the end it stays at the floor";
  // The other rules, same shape.
  s.scaling = LrScaling::Sqrt;
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 3)), 2e-3, 1e-15) << "sqrt(4) x 1e-3";
  s.scaling = LrScaling::None;
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 3)), 1e-3, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 13)), 1e-4, 1e-15);
}

TEST(ScheduledLr, RejectsBadArguments) {
  const LrSchedule ok = short_schedule();
  expect_error_mentions([&] { scheduled_lr(ok, 16, -1); }, "step=-1");
  LrSchedule s = ok;
  s.total_steps = 0;
  expect_error_mentions([&] { scheduled_lr(s, 16, 0); }, "total_steps=0");
  s = ok;
  s.warmup_steps = -2;
  expect_error_mentions([&] { scheduled_lr(s, 16, 0); }, "warmup_steps=-2");
  s = ok;
  s.base_batch = 0;
  expect_error_mentions([&] { scheduled_lr(s, 16, 0); }, "base_batch=0");
  expect_error_mentions([&] { scheduled_lr(ok, 0, 0); }, "batch=0");
}

// ---------------------------------------------------------------- Task 4: the loss scale

TEST(LossScale, EachMicroBatchCountsByItsShareOfTheGlobalBatch) {
  // One rank, 5 rows in micro-batches of 3 and 2: 3/5 and 2/5 (NOT 1/2 and 1/2).
  EXPECT_NEAR(OBSERVE(micro_batch_loss_scale(3, 5, 1)), 0.6, 1e-15);
  EXPECT_NEAR(OBSERVE(micro_batch_loss_scale(2, 5, 1)), 0.4, 1e-15);
  // DDP divides by the world size: the scale has to undo it.
  EXPECT_NEAR(OBSERVE(micro_batch_loss_scale(2, 16, 4)), 0.5, 1e-15);
  EXPECT_NEAR(OBSERVE(micro_batch_loss_scale(3, 16, 3)), 0.5625, 1e-15);
  EXPECT_EQ(OBSERVE(micro_batch_loss_scale(0, 16, 3)), 0.0);
  // Over every micro-batch of every rank the scales add up to the world size (DDP divides the
  // sum by it), for any split: 16 rows on 3 ranks (6, 5, 5) in 4 micro-batches each.
  for (int64_t world : {1, 2, 3, 4}) {
    double total = 0;
    for (int64_t r = 0; r < world; ++r) {
      const int64_t local = dtl::split_range(16, world, r).size();
      for (int64_t k = 0; k < 4; ++k)
        total += OBSERVE(micro_batch_loss_scale(dtl::split_range(local, 4, k).size(), 16, world));
    }
    EXPECT_NEAR(total, static_cast<double>(world), 1e-12) << "world " << world;
  }
}

TEST(LossScale, RejectsBadArguments) {
  expect_error_mentions([] { micro_batch_loss_scale(2, 16, 0); }, "world=0");
  expect_error_mentions([] { micro_batch_loss_scale(2, 0, 2); }, "global_rows=0");
  expect_error_mentions([] { micro_batch_loss_scale(17, 16, 2); }, "micro_rows=17");
  expect_error_mentions([] { micro_batch_loss_scale(-1, 16, 2); }, "micro_rows=-1");
}

// ---------------------------------------------------------------- Task 5: token-weighted loss

TEST(TokenLoss, SumOverTheCountedTargetsOnly) {
  torch::manual_seed(5);
  const torch::Tensor logits = torch::randn({3, 4, 6}, torch::kFloat64).requires_grad_();
  const torch::Tensor targets = torch::randint(0, 6, {3, 4}, torch::kInt64);
  // Row 0 fully counted, row 1 padded after 2 targets, row 2 all padding.
  torch::Tensor mask = torch::zeros({3, 4}, torch::kBool);
  mask[0].fill_(true);
  mask[1].narrow(0, 0, 2).fill_(true);
  // -log softmax at the target, added up where the mask says so: by hand.
  const torch::Tensor nll =
      -torch::log_softmax(logits, -1).gather(2, targets.unsqueeze(2)).squeeze(2);
  const double expected = (nll * mask.to(torch::kFloat64)).sum().item<double>();
  const torch::Tensor sum = masked_lm_loss_sum(logits, targets, mask);
  EXPECT_EQ(OBSERVE(sum.dim()), 0);
  EXPECT_NEAR(OBSERVE(sum.item<double>()), expected, 1e-12) << "the SUM over 6 counted targets";
  sum.backward();
  EXPECT_EQ(OBSERVE(logits.grad()[2].abs().max().item<double>()), 0.0)
      << "an ignored target gets no gradient";

  // Nothing counted: a zero loss, and a zero gradient, not 0 / 0.
  const torch::Tensor none_logits = logits.detach().clone().requires_grad_();
  const torch::Tensor none =
      masked_lm_loss_sum(none_logits, targets, torch::zeros({3, 4}, torch::kBool));
  EXPECT_EQ(OBSERVE(none.item<double>()), 0.0) << "a micro-batch with no counted target";
  none.backward();
  EXPECT_EQ(OBSERVE(none_logits.grad().abs().max().item<double>()), 0.0) << "and no NaN";
}

TEST(TokenLoss, RejectsBadArguments) {
  const torch::Tensor logits = torch::zeros({2, 3, 5});
  const torch::Tensor targets = torch::zeros({2, 3}, torch::kInt64);
  expect_error_mentions([&] { masked_lm_loss_sum(logits, targets, torch::ones({2, 3})); },
                        "loss_mask");
  expect_error_mentions(
      [&] { masked_lm_loss_sum(logits, targets, torch::ones({2, 4}, torch::kBool)); }, "loss_mask");
  expect_error_mentions(
      [&] { masked_lm_loss_sum(logits.flatten(0, 1), targets, torch::ones({2, 3}, torch::kBool)); },
      "logits");
}

// ---------------------------------------------------------------- Task 6: the noise scale

TEST(NoiseScale, TermsRecoverTheTrueGradientAndTheNoise) {
  // |G_small|^2 = 3 at batch 4, |G_big|^2 = 1.5 at 16: |G|^2 = (24 - 12) / 12 = 1,
  // S = 1.5 / (1/4 - 1/16) = 8, so B_simple = 8.
  const auto t = noise_scale_terms(3.0, 4.0, 1.5, 16.0);
  ASSERT_TRUE(OBSERVE(t.has_value()));
  EXPECT_NEAR(OBSERVE(t->grad_sq), 1.0, 1e-12);
  EXPECT_NEAR(OBSERVE(t->trace), 8.0, 1e-12);
  // The property: norms that follow E|G_b|^2 = |G|^2 + S / b exactly give |G|^2 and S back,
  // for any two batch sizes (a harmonic mean of rows is not an integer).
  for (const auto& [g2, tr] : {std::pair{1.0, 8.0}, {0.02, 35.0}, {4.5, 0.3}}) {
    for (const auto& [bs, bb] : {std::pair{1.0, 2.0}, {4.8, 17.0}, {8.0, 32.0}, {16.0, 1024.0}}) {
      const auto e = noise_scale_terms(g2 + tr / bs, bs, g2 + tr / bb, bb);
      const std::string where = "B_small " + std::to_string(bs) + ", B_big " + std::to_string(bb);
      ASSERT_TRUE(OBSERVE(e.has_value())) << where;
      EXPECT_NEAR(OBSERVE(e->grad_sq), g2, 1e-9 * (1 + tr)) << where;
      EXPECT_NEAR(OBSERVE(e->trace), tr, 1e-9 * (1 + tr) * bb) << where;
    }
  }
  // A single step's estimate can be negative: it is returned, not clipped.
  EXPECT_LT(OBSERVE(noise_scale_terms(1.0, 2.0, 1.2, 8.0)->trace), 0.0);
  // One rank: the small batch IS the big batch, and there is no estimate.
  EXPECT_FALSE(OBSERVE(noise_scale_terms(2.0, 16.0, 2.0, 16.0).has_value()));
}

TEST(NoiseScale, RejectsBadArguments) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error_mentions([] { noise_scale_terms(-1.0, 4.0, 1.0, 8.0); }, "small_sq_norm=-1");
  expect_error_mentions([&] { noise_scale_terms(1.0, 4.0, nan, 8.0); }, "big_sq_norm=");
  expect_error_mentions([] { noise_scale_terms(1.0, 0.0, 1.0, 8.0); }, "small_batch=0");
  expect_error_mentions([] { noise_scale_terms(1.0, 8.0, 1.0, 4.0); }, "big_batch=4");
  expect_error_mentions([] { NoiseScaleEstimator e(1.0); }, "decay=1");
  expect_error_mentions([] { NoiseScaleEstimator e(-0.5); }, "decay=-0.5");
}

// The paper's advice: average the numerator and the denominator separately, then divide.
TEST(NoiseScale, EstimatorDividesTheAveragesNotTheRatios) {
  NoiseScaleEstimator est(0.5);
  EXPECT_FALSE(OBSERVE(est.b_simple().has_value())) << "no estimate before any step";
  EXPECT_EQ(OBSERVE(est.count()), 0);
  const std::vector<NoiseScaleTerms> steps = {{-0.4, 6.0}, {1.0, 10.0}, {0.2, 30.0}, {2.0, -4.0}};
  double g = 0, tr = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    est.add(steps[i]);
    g = 0.5 * g + 0.5 * steps[i].grad_sq;
    tr = 0.5 * tr + 0.5 * steps[i].trace;
    EXPECT_NEAR(OBSERVE(est.grad_sq()), g, 1e-12) << "after step " << i;
    EXPECT_NEAR(OBSERVE(est.trace()), tr, 1e-12) << "after step " << i;
    EXPECT_EQ(OBSERVE(est.count()), static_cast<int64_t>(i + 1));
    const std::optional<double> b = OBSERVE(est.b_simple());
    if (g > 0 && tr > 0) {
      ASSERT_TRUE(b.has_value()) << "after step " << i;
      EXPECT_NEAR(*b, tr / g, 1e-12) << "after step " << i;
    } else {
      EXPECT_FALSE(b.has_value()) << "after step " << i << ": averages " << g << ", " << tr;
    }
  }
  NoiseScaleEstimator last(0.0);
  last.add({2.0, 10.0});
  last.add({4.0, 10.0});
  EXPECT_NEAR(OBSERVE(*last.b_simple()), 2.5, 1e-12) << "decay 0 keeps the last step only";
}

// ---------------------------------------------------------------- Tasks 7-8: the trainer

// The lecture's claim: the same global batch gives the same training whatever world x micro
// x accum produce it. Global batch 16 at this world size with accum 1, 2 and 4 (at world 3 the
// 16 rows split 6, 5, 5 and the micro-batches are uneven), AdamW with weight decay, a linearly
// scaled lr with warm-up and decay: 3 steps equal 3 serial steps, and so does every loss.
TEST(Trainer, MatchesSerialTrainingForAnyMicroAndAccum) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 16;
  const int steps = 3;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 50);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  const LrSchedule schedule = short_schedule();
  std::vector<double> serial_losses;
  const torch::Tensor expected =
      serial_params(cfg, sampler, steps, schedule, adamw(), &serial_losses);

  for (int64_t accum : {1, 2, 4}) {
    AccumulationOptions o;
    o.accum_steps = accum;
    o.schedule = schedule;
    const TrainedRun run = run_trainer(*comm, cfg, sampler, steps, o, adamw());
    const std::string where = describe(*comm, rows, accum);
    DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 2e-5) << where;
    DTL_EXPECT_SAME_ON_ALL_RANKS(run.params) << where << ": the replicas drifted apart";
    EXPECT_EQ(run.optimizer_steps, steps) << where;
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(run.global_losses[s], serial_losses[s], 1e-5)
          << where << ", step " << s << ": the row-weighted mean loss over the global batch";
      const StepStats& st = run.stats[s];
      EXPECT_EQ(st.local_rows, dtl::split_range(rows, comm->size(), comm->rank()).size()) << where;
      ASSERT_EQ(st.micro_rows.size(), static_cast<size_t>(accum)) << where;
      for (int64_t k = 0; k < accum; ++k)
        EXPECT_EQ(st.micro_rows[k], dtl::split_range(st.local_rows, accum, k).size())
            << where << ": micro-batch " << k;
    }
  }
}

// Micro-batches of different sizes, within a rank and across ranks: 4n + 1 rows in 3
// micro-batches per rank (1 rank: 2, 2, 1; 2 ranks: 5 rows = 2, 2, 1 and 4 rows = 2, 1, 1; ...).
// Plain SGD, so the update is the gradient itself: weighting each micro-batch by 1/accum, or
// each rank's rows by 1/world, moves the parameters elsewhere.
TEST(Trainer, UnevenMicroBatchesAreWeightedByTheirRows) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 4 * comm->size() + 1;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 51);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  LrSchedule constant;
  constant.base_lr = 0.5;
  constant.base_batch = rows;
  constant.scaling = LrScaling::None;
  constant.total_steps = 2;
  constant.min_lr_ratio = 1.0;
  const torch::Tensor expected = serial_params(cfg, sampler, 2, constant, sgd());
  AccumulationOptions o;
  o.accum_steps = 3;
  o.schedule = constant;
  const TrainedRun run = run_trainer(*comm, cfg, sampler, 2, o, sgd());
  DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 1e-6)
      << describe(*comm, rows, 3) << " (micro-batches of 2 and 1 rows)";
  DTL_EXPECT_SAME_ON_ALL_RANKS(run.params);
}

// The schedule moves once per optimizer step: with 4 micro-batches per step, step s still
// trains with the lr of step s.
TEST(Trainer, LrAdvancesOncePerOptimizerStep) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 16;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 52);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  AccumulationOptions o;
  o.accum_steps = 4;
  o.schedule = short_schedule();

  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  auto opt = adamw()(model);
  AccumulationTrainer trainer(model, ddp, *opt, o);
  EXPECT_EQ(OBSERVE(trainer.optimizer_steps()), 0);
  for (int s = 0; s < 4; ++s) {
    const StepStats st = observed(trainer.step(sampler.global_batch_at(s).to(device())));
    const double lr = expected_lr(o.schedule, rows, s);
    EXPECT_EQ(st.step, s);
    EXPECT_NEAR(st.lr, lr, 1e-15) << "step " << s << " (the global batch is " << rows
                                  << ", base_batch " << o.schedule.base_batch << ")";
    EXPECT_EQ(OBSERVE(trainer.optimizer_steps()), s + 1) << "one optimizer step, whatever accum is";
    for (const auto& group : opt->param_groups())
      EXPECT_NEAR(OBSERVE(group.options().get_lr()), lr, 1e-15) << "the optimizer stepped with it";
  }
}

// Communication: with no_sync, one all-reduce per bucket per optimizer step, the same bytes
// as accum 1; without no_sync, accum x as many, and the same parameters.
TEST(Trainer, AllReducesOncePerOptimizerStep) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 16;
  const int steps = 2;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 53);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  AccumulationOptions o;
  o.schedule = short_schedule();

  o.accum_steps = 1;
  const TrainedRun one = run_trainer(*comm, cfg, sampler, steps, o, adamw());
  o.accum_steps = 4;
  const TrainedRun four = run_trainer(*comm, cfg, sampler, steps, o, adamw());
  o.no_sync = false;
  const TrainedRun chatty = run_trainer(*comm, cfg, sampler, steps, o, adamw());

  ASSERT_GE(one.buckets, 3) << "the test wants several buckets";
  EXPECT_EQ(one.all_reduces, steps * one.buckets) << "accum 1: one all-reduce per bucket";
  EXPECT_EQ(four.all_reduces, one.all_reduces)
      << "accum 4 with no_sync: the micro-batches before the last must not communicate";
  EXPECT_EQ(four.all_reduce_bytes, one.all_reduce_bytes);
  EXPECT_EQ(chatty.all_reduces, 4 * one.all_reduces)
      << "no_sync = false: every backward all-reduces";
  DTL_EXPECT_CLOSE(chatty.params.cpu(), four.params.cpu(), 1e-4, 2e-5)
      << "no_sync saves traffic, it does not change the math";
}

TEST(Trainer, RejectsBadInputOnEveryRankBeforeCommunicating) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  GPT model(cfg), other(cfg);
  model->to(device());
  other->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  auto opt = adamw()(model);
  AccumulationOptions o;
  o.schedule = short_schedule();

  o.accum_steps = 0;
  expect_error_mentions([&] { AccumulationTrainer t(model, ddp, *opt, o); }, "accum_steps=0");
  o.accum_steps = 2;
  expect_error_mentions([&] { AccumulationTrainer t(other, ddp, *opt, o); }, "ddp");

  AccumulationTrainer trainer(model, ddp, *opt, o);
  const torch::Tensor before = dtl::testing::flat_params(*model);
  comm->reset_stats();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 54);
  // 2 x world - 1 rows cannot fill 2 micro-batches on every rank.
  const torch::Tensor too_small =
      dtl::data::GlobalBatchSampler(corpus, 2 * comm->size() - 1, cfg.seq_len)
          .global_batch_at(0)
          .to(device());
  expect_error_mentions([&] { trainer.step(too_small); }, "empty micro-batch");
  expect_error_mentions([&] { trainer.step(too_small.flatten()); }, "global_batch");
  EXPECT_EQ(MEASURED(comm->stats()).total_count(), 0) << "a rejected step sends nothing";
  EXPECT_EQ(OBSERVE(trainer.optimizer_steps()), 0) << "and is not counted";
  DTL_EXPECT_EQUAL(dtl::testing::flat_params(*model), before);
}

// Padded sequences: each row counts its first 1..T targets, a whole micro-batch of rank 0
// counts none, and the padding changes every step. The loss is the mean over the counted
// targets of the global batch (serial oracle: cross_entropy with ignored targets). A mean per
// micro-batch (NaN for the empty one), weights by rows, or `loss / accum` train another model.
TEST(Trainer, TokenWeightedLossMatchesTheSerialMaskedMean) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t world = comm->size();
  const int64_t rows = 4 * world + 1;
  const int64_t accum = 2;
  const int64_t T = cfg.seq_len;
  const int steps = 3;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 55);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  // Rank 0's last micro-batch: rows [begin, end) of the global batch.
  const dtl::Range rank0 = dtl::split_range(rows, world, 0);
  const dtl::Range last = dtl::split_range(rank0.size(), accum, accum - 1);
  const MaskAt mask_at = [&](int s) { return padded_mask(rows, T, s, last); };
  LrSchedule constant;
  constant.base_lr = 0.5;
  constant.base_batch = rows;
  constant.scaling = LrScaling::None;
  constant.total_steps = steps;
  constant.min_lr_ratio = 1.0;
  std::vector<double> serial_losses;
  const torch::Tensor expected =
      serial_params(cfg, sampler, steps, constant, sgd(), &serial_losses, mask_at);
  AccumulationOptions o;
  o.accum_steps = accum;
  o.schedule = constant;
  const TrainedRun run =
      run_trainer(*comm, cfg, sampler, steps, o, sgd(), small_buckets(), mask_at);
  const std::string where = describe(*comm, rows, accum) + ", padded rows";
  DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 1e-6) << where;
  DTL_EXPECT_SAME_ON_ALL_RANKS(run.params) << where;
  const dtl::Range mine = dtl::split_range(rows, world, comm->rank());
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(run.global_losses[s], serial_losses[s], 1e-5)
        << where << ", step " << s << ": the mean over the counted targets";
    EXPECT_EQ(run.stats[s].local_tokens,
              mask_at(s).narrow(0, mine.begin, mine.size()).sum().item<int64_t>())
        << where << ", step " << s << ": this rank's counted targets";
  }
}

// The gradient noise scale, measured by the trainer: at every step its two squared norms equal
// the serial ones (each rank's local mean gradient before the all-reduce, averaged over the
// ranks; the global batch's after it), B_simple follows from them, the accumulation does not
// change any of it, and the training is the same as without the measurement. One scalar
// all-reduce per step on top of the buckets'. At one rank there is no small batch: no estimate,
// no extra communication.
TEST(Trainer, MeasuresTheGradientNoiseScale) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t world = comm->size();
  const int64_t rows = 4 * world + 2;  // uneven shards at world 3 and 4
  const int steps = 3;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 56);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  const LrSchedule schedule = short_schedule();
  const torch::Tensor expected = serial_params(cfg, sampler, steps, schedule, adamw());
  const std::vector<NoiseNorms> norms =
      serial_noise_norms(cfg, sampler, steps, schedule, adamw(), world);
  const double decay = 0.5;
  const std::vector<std::optional<double>> b_simple =
      expected_b_simple(norms, static_cast<double>(rows), decay);

  for (int64_t accum : {1, 2}) {
    AccumulationOptions o;
    o.accum_steps = accum;
    o.schedule = schedule;
    o.measure_noise_scale = true;
    o.noise_scale_decay = decay;
    const TrainedRun run = run_trainer(*comm, cfg, sampler, steps, o, adamw());
    const std::string where = describe(*comm, rows, accum) + ", measuring the noise scale";
    DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 2e-5)
        << where << ": the measurement must not change the training";
    if (world == 1) {
      EXPECT_EQ(run.all_reduces, steps * run.buckets) << where << ": nothing to measure";
      for (const StepStats& st : run.stats) {
        EXPECT_FALSE(st.b_simple.has_value()) << where << ": one rank has no small batch";
        EXPECT_EQ(st.small_sq_norm, 0.0) << where;
        EXPECT_EQ(st.big_sq_norm, 0.0) << where;
      }
      continue;
    }
    EXPECT_EQ(run.all_reduces, steps * (run.buckets + 1))
        << where << ": the buckets' all-reduces and one scalar per step";
    for (int s = 0; s < steps; ++s) {
      const StepStats& st = run.stats[s];
      const NoiseNorms& n = norms[s];
      EXPECT_NEAR(st.small_sq_norm, n.small_sq_norm, 1e-4 * n.small_sq_norm)
          << where << ", step " << s
          << ": the mean over ranks of |local mean gradient|^2, before the all-reduce";
      EXPECT_NEAR(st.small_batch, n.small_batch, 1e-12) << where << ", step " << s;
      EXPECT_NEAR(st.big_sq_norm, n.big_sq_norm, 1e-4 * n.big_sq_norm)
          << where << ", step " << s << ": |all-reduced gradient|^2";
      ASSERT_EQ(st.b_simple.has_value(), b_simple[s].has_value()) << where << ", step " << s;
      if (b_simple[s]) {
        EXPECT_NEAR(*st.b_simple, *b_simple[s], 1e-3 * *b_simple[s]) << where << ", step " << s;
      }
    }
  }
}

}  // namespace
