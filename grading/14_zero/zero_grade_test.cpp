// Grading tests of lab 14 (hidden from students until the due date). They check nothing the
// header does not promise: a tied head's extra traffic, more shapes (3 layers, no biases, a
// wide MLP), a learning-rate schedule through set_lr, two micro-batches accumulated before
// one step, stage 3's full_parameters leaving nothing gathered, the formulas at more points,
// and the measured state of a tied model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "tests/zero_test_util.hpp"
#include "zero.hpp"

namespace lab14_test {
namespace {

using dtl::lab14::model_state_bytes;
using dtl::lab14::Precision;
using dtl::lab14::shard_size;

TEST(GradeFormulas, MorePoints) {
  for (int64_t numel : {0, 1, 7, 64, 1000003})
    for (int world : {1, 2, 3, 5, 8})
      EXPECT_EQ(OBSERVE(shard_size(numel, world)), (numel + world - 1) / world);
  // The Megatron distributed optimizer's fp32 case: 16 bytes per parameter vs 8 + 8 / d.
  const std::vector<int64_t> psi = {1'000'000'000};
  EXPECT_EQ(observed(model_state_bytes(0, psi, 8)).total(), 16'000'000'000);
  EXPECT_EQ(observed(model_state_bytes(1, psi, 8)).total(), 8'000'000'000 + 1'000'000'000);
  // N_d = 1024 (the paper's last column, mixed precision): 30.1 / 15.1 / 0.12 GB for 7.5B.
  const std::vector<int64_t> big = {7'500'000'000};
  EXPECT_NEAR(observed(model_state_bytes(1, big, 1024, Precision::mixed_adam())).total() / 1e9,
              30.1, 0.05);
  EXPECT_NEAR(observed(model_state_bytes(2, big, 1024, Precision::mixed_adam())).total() / 1e9,
              15.1, 0.05);
  EXPECT_NEAR(observed(model_state_bytes(3, big, 1024, Precision::mixed_adam())).total() / 1e9,
              0.117, 0.001);
  // Many units: padding is per unit.
  const std::vector<int64_t> units = {1, 1, 1, 1, 1};
  EXPECT_EQ(observed(model_state_bytes(3, units, 4)).total(), 16 * 5);
  EXPECT_EQ(observed(model_state_bytes(1, units, 4)).params, 4 * 20);
}

// One test per stage (GradeZeroStage1.* ... GradeZeroStage3.*): each task earns its points alone.
#define DTL_GRADE_PER_STAGE(Name, check) \
  TEST(GradeZeroStage1, Name) { check(1); } \
  TEST(GradeZeroStage2, Name) { check(2); } \
  TEST(GradeZeroStage3, Name) { check(3); }

void more_shapes(int stage) {
  GPTConfig no_bias = config(3, 32, true);
  no_bias.bias = false;
  GPTConfig wide = config(1, 24, false, 50);
  wide.d_ff = 40;
  wide.n_head = 3;
  for (const GPTConfig& cfg : {no_bias, wide}) expect_zero_equals_serial(cfg, stage, 2, adamw());
}
DTL_GRADE_PER_STAGE(MoreShapesFollowTheTrajectory, more_shapes)

void schedule_through_set_lr(int stage) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  dtl::OptimConfig oc = adamw();
  oc.warmup_steps = 1;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 21);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm->size(), cfg.seq_len);
  const int steps = 3;
  const torch::Tensor expected = dtl::testing::serial(1, [&] {
    GPT model(cfg);
    model->to(device());
    auto opt = dtl::make_adamw(*model, oc);
    for (int s = 0; s < steps; ++s) {
      dtl::set_lr(*opt, dtl::warmup_cosine_lr(oc, s, steps));
      dtl::train_step(model, *opt, sampler.global_batch_at(s).to(device()));
    }
    return dtl::testing::flat_params(*model);
  });
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, oc);
  for (int s = 0; s < steps; ++s) {
    zero.set_lr(dtl::warmup_cosine_lr(oc, s, steps));
    zero_step(zero, my_rows(sampler, s, *comm));
  }
  DTL_EXPECT_CLOSE(zero.full_parameters(), expected, 1e-4, 2e-5) << "stage " << stage;
}
DTL_GRADE_PER_STAGE(LearningRateScheduleThroughSetLr, schedule_through_set_lr)

// Two backwards before one step: gradients add up (autograd's accumulation into .grad, or
// into the shards' .grad), each micro-batch's loss halved, as gradient accumulation does.
void two_micro_batches(int stage) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 22);
  dtl::data::GlobalBatchSampler sampler(corpus, 4 * comm->size(), cfg.seq_len);
  const torch::Tensor expected = serial_params(cfg, sampler, 1, adamw(1.0));
  const int64_t per = 4;
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, adamw(1.0));
  zero.zero_grad();
  const int64_t begin = comm->rank() * per;
  for (int64_t half : {0, 1}) {
    torch::Tensor rows = sampler.rows(0, begin + 2 * half, begin + 2 * half + 2).to(device());
    (zero.loss(rows) * 0.5).backward();
  }
  zero.step();
  DTL_EXPECT_CLOSE(zero.full_parameters(), expected, 1e-4, 2e-5) << "stage " << stage;
}
DTL_GRADE_PER_STAGE(TwoMicroBatchesAccumulateBeforeOneStep, two_micro_batches)

// A tied head reads wte in the head's call: stage 2 reduce-scatters the embedding unit twice,
// stage 3 gathers it twice more and reduce-scatters it twice.
void tied_head_traffic(int stage) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(2, 32, /*tied=*/true);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 5);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm->size(), cfg.seq_len);
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, adamw());
  const int64_t units = static_cast<int64_t>(OBSERVE(zero.units().size()));
  const int64_t uses = units + 1;  // the embedding twice
  comm->reset_stats();
  zero_step(zero, my_rows(sampler, 0, *comm));
  const auto st = MEASURED(comm->stats());
  EXPECT_EQ(st[OpType::ReduceScatter].count, stage == 1 ? units : uses) << "stage " << stage;
  EXPECT_EQ(st[OpType::AllGather].count, stage == 3 ? 2 * uses : units) << "stage " << stage;
  EXPECT_EQ(st.total_count(), st[OpType::ReduceScatter].count + st[OpType::AllGather].count);
}
DTL_GRADE_PER_STAGE(TiedHeadCommunicatesTheEmbeddingPerUse, tied_head_traffic)

TEST(GradeZeroStage3, FullParametersGathersAndFreesAgain) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(1, 24, false, 50);
  const torch::Tensor expected = dtl::testing::serial(1, [&] {
    GPT m(cfg);
    return dtl::testing::flat_params(*m);
  });
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, 3, adamw());
  DTL_EXPECT_EQUAL(zero.full_parameters().cpu(), expected);
  for (const auto& p : model->parameters()) EXPECT_EQ(OBSERVE(p.storage().nbytes()), 0u);
  EXPECT_EQ(OBSERVE(zero.stage()), 3);
}

void measured_tied(int stage) { expect_state_matches_formula(config(3, 32, /*tied=*/true), stage); }
DTL_GRADE_PER_STAGE(MeasuredStateOfATiedModel, measured_tied)

}  // namespace
}  // namespace lab14_test
