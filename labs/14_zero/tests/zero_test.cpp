// Lab 14 public tests: the ZeRO formulas, the data-parallel trajectory at every stage, the
// bytes each rank holds (measured), the bytes each step communicates (counted), and stage 3's
// parameters existing only while their unit runs. Run: ./lab test 14.
#include <gtest/gtest.h>

#include "dtl/memory.hpp"
#include "zero_test_util.hpp"

namespace lab14_test {
namespace {

using dtl::lab14::model_state_bytes;
using dtl::lab14::Precision;
using dtl::lab14::shard_size;
using dtl::testing::expect_error_mentions;

// ---------------------------------------------------------------- Task 1: the formulas

TEST(Formulas, ShardSizeIsTheCeiling) {
  EXPECT_EQ(OBSERVE(shard_size(8, 4)), 2);
  EXPECT_EQ(OBSERVE(shard_size(10, 4)), 3);  // ranks 0-2 own 3, rank 3 owns 1 and 2 of padding
  EXPECT_EQ(OBSERVE(shard_size(0, 3)), 0);
  EXPECT_EQ(OBSERVE(shard_size(5, 1)), 5);
  EXPECT_EQ(OBSERVE(shard_size(1, 7)), 1);
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
    EXPECT_EQ(static_cast<double>(observed(model_state_bytes(stage, psi, 64, mixed)).total()),
              want64[stage])
        << "stage " << stage << ", 64 ranks";
    EXPECT_EQ(static_cast<double>(observed(model_state_bytes(stage, psi, 4, mixed)).total()),
              want4[stage])
        << "stage " << stage << ", 4 ranks";
  }
  const auto s2 = observed(model_state_bytes(2, psi, 64, mixed));
  EXPECT_EQ(s2.params, 2 * psi[0]);
  EXPECT_EQ(s2.grads, 2 * psi[0] / 64);
  EXPECT_EQ(s2.optimizer, 12 * psi[0] / 64);
}

// Two units of 10 and 7 elements on 4 ranks: S = 3 + 2, P = 4 S = 20, psi = 17.
TEST(Formulas, PaddingCountsPerUnitInFp32) {
  const std::vector<int64_t> units = {10, 7};
  const auto s0 = observed(model_state_bytes(0, units, 4));
  const auto s1 = observed(model_state_bytes(1, units, 4));
  const auto s2 = observed(model_state_bytes(2, units, 4));
  const auto s3 = observed(model_state_bytes(3, units, 4));
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

// ---------------------------------------------------------------- Tasks 2-4, one stage each
//
// Every check below runs once per stage, in its own test (ZeroStage1.* is Task 2, ZeroStage2.*
// Task 3, ZeroStage3.* Task 4), so that each task earns its points alone.

#define DTL_ZERO_TEST_PER_STAGE(Name, check) \
  TEST(ZeroStage1, Name) { check(1); }       \
  TEST(ZeroStage2, Name) { check(2); }       \
  TEST(ZeroStage3, Name) { check(3); }

void follows_trajectory(int stage) { expect_zero_equals_serial(config(), stage, 3, adamw()); }
DTL_ZERO_TEST_PER_STAGE(FollowsTheDataParallelTrajectory, follows_trajectory)

// With eps far above sqrt(v) AdamW's step is proportional to the gradient: a gradient summed
// over the ranks instead of averaged, or one rank's alone, moves the parameters differently.
void mean_over_ranks(int stage) { expect_zero_equals_serial(config(), stage, 2, adamw(/*eps=*/1.0)); }
DTL_ZERO_TEST_PER_STAGE(GradientsAreTheMeanOverRanks, mean_over_ranks)

// d 24, vocab 50: no unit's size is a multiple of 4 (or 3).
void odd_sizes(int stage) {
  expect_zero_equals_serial(config(1, 24, /*tied=*/false, 50), stage, 2, adamw());
}
DTL_ZERO_TEST_PER_STAGE(UntiedHeadAndOddSizesNeedPadding, odd_sizes)

// The owned slice of each unit, exactly: rank r holds elements [r S, (r+1) S) of the unit's
// flat parameters, zero past the end.
void owned_slices(int stage) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(1, 24, false, 50);
  const torch::Tensor expected = dtl::testing::serial(1, [&] {
    GPT m(cfg);
    return dtl::testing::flat_params(*m);
  });
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, adamw());
  const std::vector<dtl::Unit> units = observed_units(zero);
  ASSERT_EQ(OBSERVE(zero.shards().size()), units.size());
  int64_t offset = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t numel = 0;
    for (const auto& name : units[u].params) numel += model->named_parameters()[name].numel();
    const int64_t S = shard_size(numel, comm->size());
    torch::Tensor unit = torch::zeros({S * comm->size()});
    unit.narrow(0, 0, numel).copy_(expected.narrow(0, offset, numel));
    offset += numel;
    const torch::Tensor& shard = zero.shards().at(u);
    EXPECT_TRUE(OBSERVE(shard.requires_grad())) << "unit " << u;
    DTL_EXPECT_EQUAL(shard.detach().cpu(), unit.narrow(0, comm->rank() * S, S))
        << "unit " << units[u].name << ", rank " << comm->rank();
  }
}
DTL_ZERO_TEST_PER_STAGE(ShardsAreTheOwnedSlicesOfEachUnit, owned_slices)

// zero_grad() drops gradients, not graphs: called between loss() and backward() (as PyTorch
// allows), the step is the same.
void zero_grad_before_backward(int stage) {
  expect_zero_equals_serial(config(), stage, 2, adamw(/*eps=*/1.0), 2, 1e-4, 2e-5,
                            /*zero_grad_after_loss=*/true);
}
DTL_ZERO_TEST_PER_STAGE(ZeroGradBetweenLossAndBackward, zero_grad_before_backward)

// An evaluation under NoGradGuard gives the training loss and keeps no graph: no tensor that
// needs grad comes out, and (CPU, the tracker) nothing stays allocated once it returns.
void evaluation_keeps_nothing(int stage) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 8);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm->size(), cfg.seq_len);
  const torch::Tensor rows = my_rows(sampler, 0, *comm);
  if (device().is_cpu()) dtl::memory::install();
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, adamw());
  const torch::Tensor trained = zero.loss(rows).detach();
  torch::Tensor evaluated;
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  {
    torch::NoGradGuard no_grad;
    evaluated = zero.loss(rows);
  }
  const auto after = static_cast<int64_t>(dtl::memory::current_bytes());
  const int64_t kept = MEASURED(after - before);
  EXPECT_FALSE(OBSERVE(evaluated.requires_grad())) << "a loss under NoGradGuard needs no gradient";
  DTL_EXPECT_CLOSE(evaluated, trained);
  if (device().is_cpu()) {
    EXPECT_LE(kept, 1024) << "bytes still held after an evaluation under NoGradGuard "
                             "(a graph, or a gathered unit)";
  }
}
DTL_ZERO_TEST_PER_STAGE(EvaluationUnderNoGradKeepsNoGraph, evaluation_keeps_nothing)

// ---------------------------------------------------------------- what each stage removes

// What the tracker sees a rank hold after one step and at the end of the next backward,
// against model_state_bytes (CPU only). Stage 0 (plain data parallelism) checks the oracle.
TEST(ZeroStage1, MeasuredStateMatchesTheFormula) {
  expect_state_matches_formula(config(2, 32, /*tied=*/false), /*stage=*/0);
  expect_state_matches_formula(config(2, 32, /*tied=*/false), /*stage=*/1);
}
TEST(ZeroStage2, MeasuredStateMatchesTheFormula) {
  expect_state_matches_formula(config(2, 32, /*tied=*/false), /*stage=*/2);
}
TEST(ZeroStage3, MeasuredStateMatchesTheFormula) {
  expect_state_matches_formula(config(2, 32, /*tied=*/false), /*stage=*/3);
}

// Stages 2 and 3 never set a parameter's .grad: right after backward, only the shards have
// gradients (this rank's reduced slices, S_u elements each).
void no_parameter_grad(int stage) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 3);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm->size(), cfg.seq_len);
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, adamw());
  zero.zero_grad();
  zero.loss(my_rows(sampler, 0, *comm)).backward();
  for (const auto& item : model->named_parameters())
    EXPECT_FALSE(OBSERVE(item.value().grad().defined()))
        << item.key() << ": stage " << stage << " never sets a parameter's .grad";
  const size_t shards = OBSERVE(zero.shards().size());
  for (size_t u = 0; u < shards; ++u) {
    const torch::Tensor& g = zero.shards().at(u).grad();
    ASSERT_TRUE(OBSERVE(g.defined()))
        << "unit " << u << ": the shard's gradient, right after backward";
    EXPECT_EQ(OBSERVE(g.numel()), OBSERVE(zero.shards().at(u).numel())) << "unit " << u;
  }
}
TEST(ZeroStage2, NoParameterGradAfterBackward) { no_parameter_grad(2); }
TEST(ZeroStage3, NoParameterGradAfterBackward) { no_parameter_grad(3); }

// Stage 3: between uses a unit's parameters hold no bytes; after forward too (the buffers were
// freed once each call ran), and backward still computes the right gradients (the trajectory
// tests) because it gathers them again.
TEST(ZeroStage3, ParametersExistOnlyWhileTheirUnitRuns) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 3);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm->size(), cfg.seq_len);
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, 3, adamw());
  auto held = [&] {  // observed: the storage the student's code left the parameters
    int64_t bytes = 0;
    for (const auto& p : model->parameters()) bytes += static_cast<int64_t>(p.storage().nbytes());
    return OBSERVE(bytes);
  };
  EXPECT_EQ(held(), 0) << "after construction";
  zero.zero_grad();
  torch::Tensor loss = zero.loss(my_rows(sampler, 0, *comm));
  EXPECT_EQ(held(), 0) << "after forward";
  loss.backward();
  EXPECT_EQ(held(), 0) << "after backward";
  zero.step();
  EXPECT_EQ(held(), 0) << "after step";
}

// ---------------------------------------------------------------- communication

// One step's traffic (stats after construction): stages 1 and 2 move what data parallelism's
// all-reduce moves (a reduce-scatter and an all-gather per unit), stage 3 half as much again.
void communication_per_step(int stage) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const GPTConfig cfg = config(2, 32, /*tied=*/false);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 5);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * n, cfg.seq_len);
  const torch::Tensor expected = serial_params(cfg, sampler, 1, adamw());
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, adamw());
  const std::vector<int64_t> numels = dtl::lab14::unit_numels(model);
  const auto units = static_cast<int64_t>(numels.size());
  double padded_bytes = 0;  // 4 * n * S over the units
  for (int64_t numel : numels) padded_bytes += 4.0 * n * shard_size(numel, n);
  comm->reset_stats();
  zero_step(zero, my_rows(sampler, 0, *comm));
  const auto st = MEASURED(comm->stats());
  const int64_t gathers = stage == 3 ? 2 * units : units;
  EXPECT_EQ(st[OpType::ReduceScatter].count, units);
  EXPECT_EQ(st[OpType::AllGather].count, gathers);
  EXPECT_EQ(st[OpType::AllReduce].count, 0);
  EXPECT_EQ(st.total_count(), units + gathers) << "nothing else";
  // Stages 1 and 2: the same as DP's all-reduce of the padded units; stage 3: 1.5 x that.
  EXPECT_DOUBLE_EQ(st.total_wire_bytes(), wire(OpType::ReduceScatter, padded_bytes, n) +
                                              (stage == 3 ? 2 : 1) *
                                                  wire(OpType::AllGather, padded_bytes, n));
  if (n > 1) {
    EXPECT_DOUBLE_EQ(st.total_wire_bytes(), (stage == 3 ? 1.5 : 1.0) *
                                                wire(OpType::AllReduce, padded_bytes, n));
  }
  // The counters are measured in the process under test: the step they counted must also be
  // the serial step (full_parameters() gathers after the counting above).
  DTL_EXPECT_CLOSE(zero.full_parameters(), expected, 1e-4, 2e-5) << "stage " << stage;
}
DTL_ZERO_TEST_PER_STAGE(CommunicationPerStep, communication_per_step)

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
