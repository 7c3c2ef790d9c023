// Grading tests of lab 05 (hidden from students until the due date). Everything checked here
// is promised by grad_accumulation.hpp; the public tests' oracle and helpers are reused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dtl/split.hpp"  // defines: split_range
#include "grad_accumulation.hpp"
#include "tests/grad_accumulation_test_util.hpp"

namespace {

using namespace lab05_test;  // NOLINT
using dtl::lab05::global_batch;
using dtl::lab05::linear_scaled_lr;
using dtl::lab05::micro_batch_loss_scale;
using dtl::lab05::noise_scale_terms;
using dtl::lab05::NoiseScaleEstimator;
using dtl::lab05::scheduled_lr;
using dtl::lab05::sqrt_scaled_lr;
using dtl::testing::expect_error_mentions;

// ---------------------------------------------------------------- closed forms

TEST(GradeClosedForms, GlobalBatchOfRealRuns) {
  // GPT-3 175B: 1536 sequences of 2048 tokens, e.g. 1536 data-parallel ranks x 1 x 1, or with
  // tensor x pipeline parallelism 8 x 8 on 1536 GPUs, 24 data-parallel ranks x 1 x 64.
  EXPECT_EQ(OBSERVE(global_batch(24, 1, 64)), 1536);
  EXPECT_EQ(OBSERVE(global_batch(1, 1, 1)), 1);
  expect_error_mentions([] { global_batch(-3, 1, 1); }, "world=-3");
  expect_error_mentions([] { global_batch(1, 0, 0); }, "micro=0");  // the first broken one
}

TEST(GradeClosedForms, ScalingRulesAtTheirEdges) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expect_error_mentions([&] { linear_scaled_lr(nan, 16, 32); }, "base_lr=");
  expect_error_mentions([&] { sqrt_scaled_lr(inf, 16, 32); }, "base_lr=");
  expect_error_mentions([] { sqrt_scaled_lr(-1e-3, 16, 32); }, "base_lr=-0.001");
  expect_error_mentions([] { linear_scaled_lr(1e-3, 16, -2); }, "batch=-2");
  // Batch 16 -> 1024: linear 64 x, sqrt 8 x.
  EXPECT_NEAR(OBSERVE(linear_scaled_lr(6e-4, 16, 1024)) / 6e-4, 64.0, 1e-12);
  EXPECT_NEAR(OBSERVE(sqrt_scaled_lr(6e-4, 16, 1024)) / 6e-4, 8.0, 1e-12);
  EXPECT_NEAR(OBSERVE(sqrt_scaled_lr(1.0, 3, 1)), 1.0 / std::sqrt(3.0), 1e-15);
}

TEST(GradeClosedForms, ScheduleEdges) {
  LrSchedule s;
  s.base_lr = 2e-3;
  s.base_batch = 32;
  s.scaling = LrScaling::Sqrt;
  s.warmup_steps = 0;
  s.total_steps = 3;
  s.min_lr_ratio = 0.0;
  // Batch 8: peak 1e-3; no warm-up: cosine over 3 steps, 1e-3, 5e-4, 0.
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 8, 0)), 1e-3, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 8, 1)), 5e-4, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 8, 2)), 0.0, 1e-15);
  // Warm-up as long as the run: a ramp that ends at the peak.
  s.warmup_steps = 3;
  s.scaling = LrScaling::Linear;
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 0)), 4e-3 / 3, 1e-15);
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 2)), 4e-3, 1e-15);
  // One step in all.
  s.warmup_steps = 0;
  s.total_steps = 1;
  EXPECT_NEAR(OBSERVE(scheduled_lr(s, 64, 0)), 4e-3, 1e-15);
  s.min_lr_ratio = 1.5;
  expect_error_mentions([&] { scheduled_lr(s, 64, 0); }, "min_lr_ratio=1.5");
  s.min_lr_ratio = 0.1;
  s.base_lr = 0;
  expect_error_mentions([&] { scheduled_lr(s, 64, 0); }, "base_lr=0");
  s.base_lr = 1e-3;
  s.scaling = LrScaling::None;
  s.base_batch = -1;
  expect_error_mentions([&] { scheduled_lr(s, 64, 0); }, "base_batch=-1");
}

TEST(GradeClosedForms, LossScales) {
  EXPECT_NEAR(OBSERVE(micro_batch_loss_scale(16, 16, 1)), 1.0, 1e-15)
      << "one micro-batch, one rank";
  EXPECT_NEAR(OBSERVE(micro_batch_loss_scale(1, 3, 2)), 2.0 / 3, 1e-15);
  EXPECT_NEAR(OBSERVE(micro_batch_loss_scale(5, 1000, 8)), 0.04, 1e-15);
  expect_error_mentions([] { micro_batch_loss_scale(1, 4, -1); }, "world=-1");
  expect_error_mentions([] { micro_batch_loss_scale(1, -4, 1); }, "global_rows=-4");
}

TEST(GradeClosedForms, NoiseScaleEdges) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(OBSERVE(noise_scale_terms(0.7, 4.5, 0.7, 4.5).has_value()))
      << "equal batches: no estimate";
  expect_error_mentions([&] { noise_scale_terms(1.0, 4.0, 1.0, inf); }, "big_batch=");
  expect_error_mentions([&] { noise_scale_terms(inf, 4.0, 1.0, 8.0); }, "small_sq_norm=");
  expect_error_mentions([] { noise_scale_terms(1.0, -2.0, 1.0, 8.0); }, "small_batch=-2");
  // No noise at all (the same norm at both batches): |G|^2 is that norm, S is 0, and the
  // estimator gives no B_simple (a zero noise scale is not resolved from these two batches).
  const auto t = noise_scale_terms(2.5, 3.0, 2.5, 12.0);
  ASSERT_TRUE(OBSERVE(t.has_value()));
  EXPECT_NEAR(OBSERVE(t->grad_sq), 2.5, 1e-12);
  EXPECT_NEAR(OBSERVE(t->trace), 0.0, 1e-12);
  NoiseScaleEstimator est(0.9);
  est.add(*t);
  EXPECT_FALSE(OBSERVE(est.b_simple().has_value()));
  EXPECT_NEAR(OBSERVE(est.grad_sq()), 0.25, 1e-12) << "0.9 x 0 + 0.1 x 2.5";
}

TEST(GradeClosedForms, TrainerRejectsANoiseScaleItCannotMeasure) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  auto opt = adamw()(model);
  AccumulationOptions o;
  o.accum_steps = 2;
  o.measure_noise_scale = true;
  o.no_sync = false;
  expect_error_mentions([&] { AccumulationTrainer t(model, ddp, *opt, o); }, "no_sync");
  o.no_sync = true;
  o.noise_scale_decay = 1.5;
  expect_error_mentions([&] { AccumulationTrainer t(model, ddp, *opt, o); }, "decay=1.5");
}

// ---------------------------------------------------------------- the trainer

// 18 rows, accum 3: at world 3 every micro-batch has 2 rows (18 = 3 x 2 x 3); at 2 and 4 the
// shards and micro-batches are uneven. An untied 3-block model, sqrt scaling, AdamW.
TEST(GradeTrainer, UntiedModelAtABatchDivisibleByThree) {
  auto comm = fresh_comm();
  GPTConfig cfg = GPTConfig::tiny();
  cfg.n_layer = 3;
  cfg.tied_head = false;
  const int64_t rows = 18;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 60);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  AccumulationOptions o;
  o.accum_steps = 3;
  o.schedule = short_schedule(1e-3, LrScaling::Sqrt, 4);
  std::vector<double> serial_losses;
  const torch::Tensor expected =
      serial_params(cfg, sampler, 3, o.schedule, adamw(), &serial_losses);
  const TrainedRun run = run_trainer(*comm, cfg, sampler, 3, o, adamw());
  DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 2e-5) << describe(*comm, rows, 3);
  DTL_EXPECT_SAME_ON_ALL_RANKS(run.params);
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(run.global_losses[s], serial_losses[s], 1e-5) << "step " << s;
    EXPECT_NEAR(run.stats[s].lr, expected_lr(o.schedule, rows, s), 1e-15) << "step " << s;
  }
}

// As many micro-batches as rows: one sequence per backward (12 rows; accum 12, 6, 4, 3 at world
// 1, 2, 3, 4). SGD: every weight error shows. Still one all-reduce per bucket per step.
TEST(GradeTrainer, OneRowPerMicroBatch) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 12;
  const int64_t accum = rows / comm->size();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 61);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  AccumulationOptions o;
  o.accum_steps = accum;
  o.schedule = short_schedule(0.3, LrScaling::None);
  const torch::Tensor expected = serial_params(cfg, sampler, 2, o.schedule, sgd());
  const TrainedRun run = run_trainer(*comm, cfg, sampler, 2, o, sgd());
  DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 1e-6) << describe(*comm, rows, accum);
  EXPECT_EQ(run.all_reduces, 2 * run.buckets) << "one all-reduce per bucket per optimizer step";
  for (const StepStats& st : run.stats)
    EXPECT_EQ(st.micro_rows, std::vector<int64_t>(static_cast<size_t>(accum), 1));
}

// DDP on a sub-communicator: ranks split by parity into two independent data-parallel groups,
// each training on its own global batch. The world and rank of the split are ddp.comm()'s.
TEST(GradeTrainer, DataParallelGroupOfASubCommunicator) {
  auto world = fresh_comm();
  const int color = world->rank() % 2;
  std::shared_ptr<dtl::Comm> group = world->split(color, world->rank());
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 7;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 62 + color);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  AccumulationOptions o;
  o.accum_steps = 2;
  o.schedule = short_schedule(0.3, LrScaling::None);
  const torch::Tensor expected = serial_params(cfg, sampler, 2, o.schedule, sgd());
  const TrainedRun run = run_trainer(*group, cfg, sampler, 2, o, sgd());
  DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 1e-6)
      << "group " << color << " of " << group->size() << " ranks, global batch 7, accum 2";
  EXPECT_EQ(MEASURED(world->stats())[OpType::AllReduce].count, 0)
      << "all traffic on the group's Comm";
}

// A rejected step leaves the trainer usable: the next valid step is step 0 with step 0's lr,
// and the guard of no_sync never outlives a step.
TEST(GradeTrainer, ARejectedStepChangesNothingAndTrainingGoesOn) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 3 * comm->size();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 63);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  AccumulationOptions o;
  o.accum_steps = 3;
  o.schedule = short_schedule();
  const torch::Tensor expected = serial_params(cfg, sampler, 2, o.schedule, adamw());

  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  auto opt = adamw()(model);
  AccumulationTrainer trainer(model, ddp, *opt, o);
  comm->reset_stats();
  const torch::Tensor short_batch = sampler.global_batch_at(0).narrow(0, 0, rows - 1).to(device());
  expect_error_mentions([&] { trainer.step(short_batch); }, "empty micro-batch");
  expect_error_mentions([&] { trainer.step(short_batch.to(torch::kFloat32)); }, "global_batch");
  expect_error_mentions([&] { trainer.step(torch::Tensor()); }, "global_batch");
  EXPECT_EQ(MEASURED(comm->stats()).total_count(), 0);
  EXPECT_TRUE(OBSERVE(ddp.require_sync()));
  for (int s = 0; s < 2; ++s) {
    const StepStats st = observed(trainer.step(sampler.global_batch_at(s).to(device())));
    EXPECT_EQ(st.step, s);
    EXPECT_TRUE(OBSERVE(ddp.require_sync())) << "no NoSync guard may outlive a step";
  }
  DTL_EXPECT_CLOSE(dtl::testing::flat_params(*model).cpu(), expected.cpu(), 1e-4, 2e-5);
}

// Padding that empties the last rank's whole shard: that rank still runs every backward (of
// a zero loss, or DDP would wait for it), counts no target, and reports a loss of 0; the step
// still equals the serial mean over the counted targets. Then the masks no step accepts.
TEST(GradeTrainer, TokenWeightedWithARankThatCountsNothing) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t world = comm->size();
  const int64_t rows = 3 * world + 1;
  const int64_t T = cfg.seq_len;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 64);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  // (At one rank, whose rows cannot all be padding, only its last row is.)
  const dtl::Range last_rank =
      world > 1 ? dtl::split_range(rows, world, world - 1) : dtl::Range{rows - 1, rows};
  const MaskAt mask_at = [&](int s) { return padded_mask(rows, T, s + 1, last_rank); };
  AccumulationOptions o;
  o.accum_steps = 3;
  o.schedule = short_schedule(0.3, LrScaling::None);
  o.measure_noise_scale = true;  // a masked step measures nothing
  std::vector<double> serial_losses;
  const torch::Tensor expected =
      serial_params(cfg, sampler, 2, o.schedule, sgd(), &serial_losses, mask_at);
  const TrainedRun run = run_trainer(*comm, cfg, sampler, 2, o, sgd(), small_buckets(), mask_at);
  DTL_EXPECT_CLOSE(run.params.cpu(), expected.cpu(), 1e-4, 1e-6)
      << describe(*comm, rows, 3) << ", the last rank's rows all padding";
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(run.global_losses[s], serial_losses[s], 1e-5) << "step " << s;
    if (world > 1 && comm->rank() == world - 1) {
      EXPECT_EQ(run.stats[s].local_tokens, 0);
      EXPECT_EQ(run.stats[s].loss, 0.0) << "no counted target: loss 0, not NaN";
    }
    EXPECT_FALSE(run.stats[s].b_simple.has_value()) << "a masked step measures nothing";
  }
  EXPECT_EQ(run.all_reduces, 2 * run.buckets) << "no scalar all-reduce without a measurement";

  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  auto opt = sgd()(model);
  AccumulationTrainer trainer(model, ddp, *opt, o);
  comm->reset_stats();
  const torch::Tensor batch = sampler.global_batch_at(0).to(device());
  expect_error_mentions(
      [&] { trainer.step(batch, torch::zeros({rows, T}, torch::kBool).to(device())); },
      "no counted target");
  expect_error_mentions(
      [&] { trainer.step(batch, torch::ones({rows, T}, torch::kFloat32).to(device())); },
      "loss_mask");
  expect_error_mentions(
      [&] { trainer.step(batch, torch::ones({rows, T + 1}, torch::kBool).to(device())); },
      "loss_mask");
  expect_error_mentions([&] { trainer.step(batch, torch::Tensor()); }, "loss_mask");
  EXPECT_EQ(MEASURED(comm->stats()).total_count(), 0) << "a rejected step sends nothing";
  EXPECT_EQ(OBSERVE(trainer.optimizer_steps()), 0);
}

// The noise scale of a data-parallel group: world and rank are the sub-communicator's (groups
// of 2 measure, a group of 1 has no small batch), and a rejected step leaves the estimate alone.
TEST(GradeTrainer, NoiseScaleOfASubCommunicatorGroup) {
  auto world = fresh_comm();
  const int color = world->rank() % 2;
  std::shared_ptr<dtl::Comm> group = world->split(color, world->rank());
  const GPTConfig cfg = GPTConfig::tiny();
  const int64_t rows = 7;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 66 + color);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  AccumulationOptions o;
  o.accum_steps = 3;
  o.schedule = short_schedule(0.3, LrScaling::None);
  o.measure_noise_scale = true;
  o.noise_scale_decay = 0.8;
  const std::vector<NoiseNorms> norms =
      serial_noise_norms(cfg, sampler, 2, o.schedule, sgd(), group->size());
  const auto b_simple = expected_b_simple(norms, static_cast<double>(rows), 0.8);

  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *group, small_buckets());
  auto opt = sgd()(model);
  AccumulationTrainer trainer(model, ddp, *opt, o);
  expect_error_mentions(
      [&] { trainer.step(sampler.global_batch_at(0).narrow(0, 0, 2).to(device())); },
      "empty micro-batch");
  EXPECT_EQ(OBSERVE(trainer.noise_scale().count()), 0) << "a rejected step measures nothing";
  for (int s = 0; s < 2; ++s) {
    const StepStats st = observed(trainer.step(sampler.global_batch_at(s).to(device())));
    const std::string where = "group " + std::to_string(color) + " of " +
                              std::to_string(group->size()) + " ranks, step " + std::to_string(s);
    if (group->size() == 1) {
      EXPECT_FALSE(st.b_simple.has_value()) << where;
      continue;
    }
    EXPECT_NEAR(st.small_sq_norm, norms[s].small_sq_norm, 1e-4 * norms[s].small_sq_norm) << where;
    EXPECT_NEAR(st.big_sq_norm, norms[s].big_sq_norm, 1e-4 * norms[s].big_sq_norm) << where;
    ASSERT_EQ(st.b_simple.has_value(), b_simple[s].has_value()) << where;
    if (b_simple[s]) {
      EXPECT_NEAR(*st.b_simple, *b_simple[s], 1e-3 * *b_simple[s]) << where;
    }
  }
  EXPECT_EQ(OBSERVE(trainer.noise_scale().count()), group->size() > 1 ? 2 : 0);
  EXPECT_EQ(MEASURED(world->stats())[OpType::AllReduce].count, 0)
      << "all traffic on the group's Comm";
}

}  // namespace
