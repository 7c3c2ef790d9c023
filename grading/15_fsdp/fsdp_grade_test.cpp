// Lab 15 grading tests: more formulas, another policy, accumulation, set_lr, mixed strategies'
// traffic, hybrid sharding with one rank per node, the limit, state dicts of replicated units,
// a no-grad forward, the loss itself. Only what fsdp.hpp promises.
#include <gtest/gtest.h>

#include "tests/fsdp_test_util.hpp"

namespace lab15_test {
namespace {

using dtl::lab15::param_bytes;
using dtl::lab15::size_based_policy;
using dtl::lab15::step_traffic;
using dtl::testing::expect_error_mentions;
constexpr auto FULL = ShardingStrategy::FULL_SHARD;
constexpr auto SGO = ShardingStrategy::SHARD_GRAD_OP;
constexpr auto NO = ShardingStrategy::NO_SHARD;
constexpr auto HYBRID = ShardingStrategy::HYBRID_SHARD;

// Units of 11 (root), 4, 13 and 6 over 3 ranks: S = 4, 2, 5, 2 and P = 12, 6, 15, 6.
TEST(GradeFormulas, PaddingOverThreeRanks) {
  const std::vector<int64_t> n = {11, 4, 13, 6};
  auto t = observed(step_traffic(n, {FULL, FULL, FULL, FULL}, 3, 3));
  EXPECT_EQ(t.all_gather, 4 * (12 + 2 * (6 + 15 + 6)));
  EXPECT_EQ(t.reduce_scatter, 4 * (12 + 6 + 15 + 6));
  EXPECT_EQ(t.all_reduce, 0);
  t = observed(step_traffic(n, {SGO, FULL, SGO, NO}, 3, 3, /*element_bytes=*/2));
  EXPECT_EQ(t.all_gather, 2 * (12 + 2 * 6 + 15));
  EXPECT_EQ(t.reduce_scatter, 2 * (12 + 6 + 15));
  EXPECT_EQ(t.all_reduce, 2 * 6);
  auto b = observed(param_bytes(n, {FULL, FULL, FULL, FULL}, 3, 3, true));
  EXPECT_EQ(b.sharded, 4 * (4 + 2 + 5 + 2));
  EXPECT_EQ(b.unsharded, 4 * (12 + 15 + 6));  // the root + the pair (13, 6) padded
  b = observed(param_bytes(n, {FULL, SGO, FULL, FULL}, 3, 3, false));
  EXPECT_EQ(b.unsharded, 4 * (12 + 6 + 15));  // the SGO unit stays, FULL ones one at a time
}

TEST(GradeFormulas, HybridEdgeCases) {
  const std::vector<int64_t> n = {10, 7};
  // One rank per node: a shard group of one gathers and scatters nothing, replicas all-reduce.
  auto t = observed(step_traffic(n, {HYBRID, HYBRID}, 1, 4));
  EXPECT_EQ(t.all_gather + t.reduce_scatter, 0);
  EXPECT_EQ(t.all_reduce, 4 * 17);
  // One node: no replicas, FULL_SHARD's traffic.
  t = observed(step_traffic(n, {HYBRID, HYBRID}, 4, 4));
  EXPECT_EQ(t.all_reduce, 0);
  EXPECT_EQ(t.all_gather, 4 * (12 + 2 * 8));
  expect_error_mentions([] { param_bytes({1, 2, 3}, {FULL, FULL}, 1, 1, true); }, "strategies");
  expect_error_mentions([] { param_bytes({1}, {FULL}, 1, 0, true); }, "world");
}

TEST(GradeFsdp, SizeBasedPolicyFollowsDdp) {
  GPT probe(config(4));
  const int64_t block = dtl::unit_numels(probe)[1];
  expect_fsdp_equals_ddp(config(4), {}, 2, adamw(), "size-based units of two blocks",
                         [block](GPT& m) { return size_based_policy(m, 2 * block); });
}

TEST(GradeFsdp, TwoBackwardsAccumulate) {
  expect_fsdp_equals_ddp(config(), {}, 2, adamw(), "FULL_SHARD, two backwards per step",
                         dtl::lab15::transformer_policy, /*backwards=*/2);
  expect_fsdp_equals_ddp(config(), with(NO), 2, adamw(), "NO_SHARD, two backwards per step",
                         dtl::lab15::transformer_policy, /*backwards=*/2);
}

TEST(GradeFsdp, HybridWithOneRankPerNodeFollowsDdp) {
  expect_fsdp_equals_ddp(config(2, 24, false, 37), with(HYBRID, 1), 2, adamw(), "HYBRID_SHARD x1");
  expect_fsdp_equals_ddp(config(2, 24, false, 37), with(SGO), 2, adamw(), "SHARD_GRAD_OP, untied");
}

// A step at lr 0 moves nothing but AdamW's moments; then the schedule resumes.
TEST(GradeFsdp, SetLrReachesTheOptimizer) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(2);
  Data data(cfg, comm->size());
  GPT model(cfg);
  model->to(device());
  FullyShardedDataParallel fsdp(model, *comm, {}, adamw(1e-6, 0.0));
  const torch::Tensor before = fsdp.full_parameters();
  fsdp.set_lr(0.0);
  fsdp_step(fsdp, my_rows(data.sampler, 0, *comm));
  DTL_EXPECT_EQUAL(fsdp.full_parameters(), OBSERVE(before));  // both the code's
  fsdp.set_lr(3e-3);
  fsdp_step(fsdp, my_rows(data.sampler, 1, *comm));
  EXPECT_GT(OBSERVE((fsdp.full_parameters() - before).abs().max().item<double>()), 1e-5);
}

TEST(GradeFsdp, MixedStrategiesTrafficMatchesTheFormula) {
  const int world = dtl::world().size();
  FSDPConfig fc;
  fc.unit_strategy = {{"root", NO}, {"blocks.0", SGO}};
  auto comm = fresh_comm();
  const GPTConfig cfg = config(3, 32, false, 50);
  Data data(cfg, world);
  GPT model(cfg);
  model->to(device());
  FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
  const auto strategies = OBSERVE(fsdp.strategies());
  ASSERT_GE(strategies.size(), 3u);
  ASSERT_EQ(strategies[0], NO);
  ASSERT_EQ(strategies[1], SGO);
  ASSERT_EQ(strategies[2], FULL);
  fsdp_step(fsdp, my_rows(data.sampler, 0, *comm));
  const auto want = observed(step_traffic(fsdp.unit_numels(), fsdp.strategies(), world, world));
  const auto got = counted(measured_stats(fsdp));
  EXPECT_EQ(got.all_gather, want.all_gather);
  EXPECT_EQ(got.reduce_scatter, want.reduce_scatter);
  EXPECT_EQ(got.all_reduce, want.all_reduce);
}

TEST(GradeFsdp, LimitZeroStillPrefetches) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(4);
  Data data(cfg, comm->size());
  FSDPConfig fc;
  fc.limit_all_gathers = 0;
  GPT model(cfg);
  model->to(device());
  FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
  GatheredDuringBackward probe(fsdp);
  fsdp.loss(my_rows(data.sampler, 0, *comm)).backward();
  EXPECT_EQ(OBSERVE(probe.most), 2);
}

TEST(GradeFsdp, NoGradForwardReleasesEverythingAndMatchesTheModel) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  Data data(cfg, comm->size());
  const torch::Tensor rows = my_rows(data.sampler, 0, *comm);
  GPT reference(cfg);
  reference->to(device());
  const double want = reference->loss(rows).item<double>();
  for (const auto& fc : {with(FULL), with(SGO)}) {
    GPT model(cfg);
    model->to(device());
    FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
    {
      torch::NoGradGuard no_grad;
      EXPECT_NEAR(OBSERVE(fsdp.loss(rows).item<double>()), want, 1e-5);
    }
    std::vector<std::string> gathered;
    for (const auto& f : fsdp.flat_parameters())
      if (f.is_unsharded()) gathered.push_back(f.name());
    for (const auto& name : OBSERVE(gathered))
      ADD_FAILURE() << name << " still gathered after a no-grad forward";
    EXPECT_NEAR(OBSERVE(fsdp.loss(rows).item<double>()), want, 1e-5) << "with autograd recording";
  }
}

TEST(GradeStateDict, ReplicatedUnitsAreListedWhole) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(2);
  GPT model(cfg);
  model->to(device());
  FSDPConfig fc;
  fc.unit_strategy = {{"root", NO}};
  FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
  GPT probe(cfg);
  auto named = probe->named_parameters();
  // The root's entries (name, offset, values), observed as one list.
  std::vector<std::pair<std::string, std::pair<int64_t, torch::Tensor>>> root;
  for (const auto& e : fsdp.sharded_state_dict())
    if (e.name.rfind("blocks.", 0) != 0) root.push_back({e.name, {e.offset, e.values}});
  int64_t root_elements = 0;
  for (const auto& [name, entry] : OBSERVE(root)) {
    const auto& [offset, values] = entry;
    const torch::Tensor* p = named.find(name);
    ASSERT_NE(p, nullptr) << name << " is not a parameter of the model";
    EXPECT_EQ(offset, 0) << name;
    EXPECT_EQ(values.numel(), p->numel()) << name << ": a NO_SHARD unit is whole on every rank";
    DTL_EXPECT_EQUAL(values.reshape(p->sizes()), p->to(device()));
    root_elements += values.numel();
  }
  EXPECT_EQ(root_elements, OBSERVE(fsdp.unit_numels().at(0)));
}

}  // namespace
}  // namespace lab15_test
