// Lab 14 public tests: the ZeRO formulas, the data-parallel trajectory at every stage, the
// bytes each rank holds (measured), the bytes each step communicates (counted), and stage 3's
// parameters existing only while their unit runs. Run: ./lab test 14.
#include <gtest/gtest.h>

#include "zero_test_util.hpp"

namespace lab14_test {
namespace {

using dtl::lab14::model_state_bytes;
using dtl::lab14::Precision;
using dtl::lab14::shard_size;
using dtl::testing::expect_error_mentions;

// ---------------------------------------------------------------- Task 1: the formulas

TEST(Formulas, ShardSizeIsTheCeiling) {
  EXPECT_EQ(shard_size(8, 4), 2);
  EXPECT_EQ(shard_size(10, 4), 3);  // ranks 0-2 own 3, rank 3 owns 1 and 2 of padding
  EXPECT_EQ(shard_size(0, 3), 0);
  EXPECT_EQ(shard_size(5, 1), 5);
  EXPECT_EQ(shard_size(1, 7), 1);
  expect_error_mentions([] { shard_size(-1, 2); }, "numel");
  expect_error_mentions([] { shard_size(4, 0); }, "world");
}

// Rajbhandari et al., Table 1: psi = 7.5B parameters, mixed-precision Adam (K = 12).
TEST(Formulas, ReproduceTheZeroPapersTable) {
  const std::vector<int64_t> psi = {7'500'000'000};
  const Precision mixed = Precision::mixed_adam();
  const double want64[] = {120e9, 31.40625e9, 16.640625e9, 1.875e9};  // "120, 31.4, 16.6, 1.88 GB"
  const double want4[] = {120e9, 52.5e9, 41.25e9, 30e9};              // "52.5, 41.3, 30 GB"
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_EQ(static_cast<double>(model_state_bytes(stage, psi, 64, mixed).total()), want64[stage])
        << "stage " << stage << ", 64 ranks";
    EXPECT_EQ(static_cast<double>(model_state_bytes(stage, psi, 4, mixed).total()), want4[stage])
        << "stage " << stage << ", 4 ranks";
  }
  const auto s2 = model_state_bytes(2, psi, 64, mixed);
  EXPECT_EQ(s2.params, 2 * psi[0]);
  EXPECT_EQ(s2.grads, 2 * psi[0] / 64);
  EXPECT_EQ(s2.optimizer, 12 * psi[0] / 64);
}

// Two units of 10 and 7 elements on 4 ranks: S = 3 + 2, P = 4 S = 20, psi = 17.
TEST(Formulas, PaddingCountsPerUnitInFp32) {
  const std::vector<int64_t> units = {10, 7};
  const auto s0 = model_state_bytes(0, units, 4);
  const auto s1 = model_state_bytes(1, units, 4);
  const auto s2 = model_state_bytes(2, units, 4);
  const auto s3 = model_state_bytes(3, units, 4);
  EXPECT_EQ(s0.params, 68);
  EXPECT_EQ(s0.grads, 68);
  EXPECT_EQ(s0.optimizer, 136);
  EXPECT_EQ(s1.params, 80);
  EXPECT_EQ(s1.grads, 68);
  EXPECT_EQ(s1.optimizer, 40);
  EXPECT_EQ(s2.params, 80);
  EXPECT_EQ(s2.grads, 20);
  EXPECT_EQ(s2.optimizer, 40);
  EXPECT_EQ(s3.total(), 16 * 5);
  expect_error_mentions([&] { model_state_bytes(4, units, 4); }, "stage");
  expect_error_mentions([&] { model_state_bytes(1, units, 0); }, "world");
}

// ---------------------------------------------------------------- Tasks 2-4: training

TEST(Zero, EveryStageFollowsTheDataParallelTrajectory) {
  for (int stage = 1; stage <= 3; ++stage) expect_zero_equals_serial(config(), stage, 3, adamw());
}

// With eps far above sqrt(v) AdamW's step is proportional to the gradient: a gradient summed
// over the ranks instead of averaged, or one rank's alone, moves the parameters differently.
TEST(Zero, GradientsAreTheMeanOverRanks) {
  for (int stage = 1; stage <= 3; ++stage)
    expect_zero_equals_serial(config(), stage, 2, adamw(/*eps=*/1.0));
}

TEST(Zero, UntiedHeadAndOddSizesNeedPadding) {
  // d 24, vocab 50: no unit's size is a multiple of 4 (or 3).
  for (int stage = 1; stage <= 3; ++stage)
    expect_zero_equals_serial(config(1, 24, /*tied=*/false, 50), stage, 2, adamw());
}

// The owned slice of each unit, exactly: rank r holds elements [r S, (r+1) S) of the unit's
// flat parameters, zero past the end.
TEST(Zero, ShardsAreTheOwnedSlicesOfEachUnit) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(1, 24, false, 50);
  const torch::Tensor expected = dtl::testing::serial(1, [&] {
    GPT m(cfg);
    return dtl::testing::flat_params(*m);
  });
  for (int stage = 1; stage <= 3; ++stage) {
    GPT model(cfg);
    model->to(device());
    ZeroOptimizer zero(model, *comm, stage, adamw());
    ASSERT_EQ(zero.shards().size(), zero.units().size());
    int64_t offset = 0;
    for (size_t u = 0; u < zero.units().size(); ++u) {
      int64_t numel = 0;
      for (const auto& name : zero.units()[u].params) numel += model->named_parameters()[name].numel();
      const int64_t S = shard_size(numel, comm->size());
      torch::Tensor unit = torch::zeros({S * comm->size()});
      unit.narrow(0, 0, numel).copy_(expected.narrow(0, offset, numel));
      offset += numel;
      const torch::Tensor& shard = zero.shards()[u];
      EXPECT_TRUE(shard.requires_grad()) << "stage " << stage << " unit " << u;
      DTL_EXPECT_EQUAL(shard.detach().cpu(), unit.narrow(0, comm->rank() * S, S))
          << "stage " << stage << ", unit " << zero.units()[u].name << ", rank " << comm->rank();
    }
  }
}

// ---------------------------------------------------------------- what each stage removes

// What the tracker sees a rank hold after one step, against model_state_bytes (CPU only).
TEST(Zero, MeasuredStateMatchesTheFormula) {
  expect_state_matches_formula(config(2, 32, /*tied=*/false), /*first_stage=*/0);
}

// Stage 3: between uses a unit's parameters hold no bytes; after forward too (the buffers were
// freed once each call ran), and backward still computes the right gradients (the trajectory
// tests) because it gathers them again.
TEST(Zero, Stage3ParametersExistOnlyWhileTheirUnitRuns) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 3);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm->size(), cfg.seq_len);
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, 3, adamw());
  auto held = [&] {
    int64_t bytes = 0;
    for (const auto& p : model->parameters()) bytes += static_cast<int64_t>(p.storage().nbytes());
    return bytes;
  };
  EXPECT_EQ(held(), 0) << "after construction";
  zero.zero_grad();
  torch::Tensor loss = zero.loss(my_rows(sampler, 0, *comm));
  EXPECT_EQ(held(), 0) << "after forward";
  loss.backward();
  EXPECT_EQ(held(), 0) << "after backward";
  for (const auto& p : model->parameters())
    EXPECT_FALSE(p.grad().defined()) << "stage 3 never sets a parameter's .grad";
  zero.step();
  EXPECT_EQ(held(), 0) << "after step";
}

// ---------------------------------------------------------------- communication

// One step's traffic (stats after construction): stages 1 and 2 move what data parallelism's
// all-reduce moves (a reduce-scatter and an all-gather per unit), stage 3 half as much again.
TEST(Zero, CommunicationPerStep) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const GPTConfig cfg = config(2, 32, /*tied=*/false);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 5);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * n, cfg.seq_len);
  double stage_wire[4] = {0, 0, 0, 0};
  for (int stage = 1; stage <= 3; ++stage) {
    GPT model(cfg);
    model->to(device());
    ZeroOptimizer zero(model, *comm, stage, adamw());
    const std::vector<int64_t> numels = dtl::lab14::unit_numels(model);
    const auto units = static_cast<int64_t>(numels.size());
    double padded_bytes = 0;  // 4 * n * S over the units
    for (int64_t numel : numels) padded_bytes += 4.0 * n * shard_size(numel, n);
    comm->reset_stats();
    zero_step(zero, my_rows(sampler, 0, *comm));
    const auto st = comm->stats();
    const int64_t gathers = stage == 3 ? 2 * units : units;
    EXPECT_EQ(st[OpType::ReduceScatter].count, units) << "stage " << stage;
    EXPECT_EQ(st[OpType::AllGather].count, gathers) << "stage " << stage;
    EXPECT_EQ(st[OpType::AllReduce].count, 0) << "stage " << stage;
    EXPECT_EQ(st.total_count(), units + gathers) << "stage " << stage << ": nothing else";
    EXPECT_DOUBLE_EQ(st.total_wire_bytes(), wire(OpType::ReduceScatter, padded_bytes, n) +
                                                (stage == 3 ? 2 : 1) *
                                                    wire(OpType::AllGather, padded_bytes, n))
        << "stage " << stage;
    stage_wire[stage] = st.total_wire_bytes();
    if (stage == 1 && n > 1) {  // the same as DP's all-reduce of the padded units
      EXPECT_DOUBLE_EQ(st.total_wire_bytes(), wire(OpType::AllReduce, padded_bytes, n));
    }
  }
  if (n > 1) {
    EXPECT_DOUBLE_EQ(stage_wire[2], stage_wire[1]);
    EXPECT_DOUBLE_EQ(stage_wire[3], 1.5 * stage_wire[1]) << "stage 3 = 1.5 x data parallelism";
  }
}

// ---------------------------------------------------------------- bad input

TEST(BadInput, StageAndWeightDecayAreChecked) {
  auto comm = fresh_comm();
  GPT model(config());
  model->to(device());
  expect_error_mentions([&] { ZeroOptimizer z(model, *comm, 0, adamw()); }, "stage");
  expect_error_mentions([&] { ZeroOptimizer z(model, *comm, 4, adamw()); }, "stage");
  dtl::OptimConfig decayed = adamw();
  decayed.weight_decay = 0.1;
  expect_error_mentions([&] { ZeroOptimizer z(model, *comm, 1, decayed); }, "weight_decay");
}

}  // namespace
}  // namespace lab14_test
