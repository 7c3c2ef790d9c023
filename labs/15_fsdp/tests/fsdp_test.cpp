// Lab 15 public tests: the formulas, the wrap policies, FlatParameter's layout, every sharding
// strategy following DDP's trajectory with weight decay, the traffic and the parameter memory
// of a step, prefetch, and the state dicts. Run: ./lab test 15.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "fsdp_test_util.hpp"

namespace lab15_test {
namespace {

using dtl::lab15::param_bytes;
using dtl::lab15::size_based_policy;
using dtl::lab15::step_traffic;
using dtl::lab15::transformer_policy;
using dtl::testing::expect_error_mentions;
constexpr auto FULL = ShardingStrategy::FULL_SHARD;
constexpr auto SGO = ShardingStrategy::SHARD_GRAD_OP;
constexpr auto NO = ShardingStrategy::NO_SHARD;
constexpr auto HYBRID = ShardingStrategy::HYBRID_SHARD;

// ---------------------------------------------------------------- Task 1: the formulas

// Units of 10 (root), 7 and 9 elements, 4 bytes each. Over 4 ranks: S = 3, 2, 3 and
// P = 12, 8, 12.
TEST(Formulas, StepTrafficPerStrategy) {
  const std::vector<int64_t> n = {10, 7, 9};
  auto t = observed(step_traffic(n, {FULL, FULL, FULL}, 4, 4));
  EXPECT_EQ(t.all_gather, 4 * (12 + 2 * 8 + 2 * 12));  // the root once, the others twice
  EXPECT_EQ(t.reduce_scatter, 4 * (12 + 8 + 12));
  EXPECT_EQ(t.all_reduce, 0);
  t = observed(step_traffic(n, {SGO, SGO, SGO}, 4, 4));
  EXPECT_EQ(t.all_gather, 4 * (12 + 8 + 12));  // kept from forward to backward: once each
  EXPECT_EQ(t.reduce_scatter, 4 * (12 + 8 + 12));
  t = observed(step_traffic(n, {NO, NO, NO}, 1, 4));
  EXPECT_EQ(t.all_gather + t.reduce_scatter, 0);
  EXPECT_EQ(t.all_reduce, 4 * 26);
  // Hybrid, 2 nodes of 2: shard over 2 (S = 5, 4, 5; P = 10, 8, 10), all-reduce S across.
  t = observed(step_traffic(n, {HYBRID, HYBRID, HYBRID}, 2, 4));
  EXPECT_EQ(t.all_gather, 4 * (10 + 2 * 8 + 2 * 10));
  EXPECT_EQ(t.reduce_scatter, 4 * (10 + 8 + 10));
  EXPECT_EQ(t.all_reduce, 4 * (5 + 4 + 5));
  // A replicated root in a sharded model.
  t = observed(step_traffic(n, {NO, FULL, FULL}, 4, 4));
  EXPECT_EQ(t.all_gather, 4 * (2 * 8 + 2 * 12));
  EXPECT_EQ(t.all_reduce, 4 * 10);
  // One rank: nothing to send.
  EXPECT_EQ(observed(step_traffic(n, {FULL, FULL, FULL}, 1, 1)).total(), 0);
  EXPECT_EQ(observed(step_traffic(n, {NO, NO, NO}, 1, 1)).total(), 0);
}

TEST(Formulas, ParamBytesPerStrategy) {
  const std::vector<int64_t> n = {10, 7, 9, 5};  // over 4 ranks: S = 3, 2, 3, 2; P = 12, 8, 12, 8
  auto b = observed(param_bytes(n, {FULL, FULL, FULL, FULL}, 4, 4, /*prefetch=*/false));
  EXPECT_EQ(b.sharded, 4 * 10);
  EXPECT_EQ(b.unsharded, 4 * (12 + 12));  // the root + the largest unit
  b = observed(param_bytes(n, {FULL, FULL, FULL, FULL}, 4, 4, /*prefetch=*/true));
  EXPECT_EQ(b.unsharded, 4 * (12 + 8 + 12));  // the root + the largest adjacent pair
  b = observed(param_bytes(n, {FULL, FULL, FULL, FULL}, 4, 4, /*prefetch=*/true, /*limit=*/1));
  EXPECT_EQ(b.unsharded, 4 * (12 + 12));  // a limit of one unit: no prefetch can happen
  b = observed(param_bytes(n, {FULL, FULL, FULL, FULL}, 4, 4, /*prefetch=*/true, /*limit=*/0));
  EXPECT_EQ(b.unsharded, 4 * (12 + 8 + 12));
  b = observed(param_bytes(n, {SGO, SGO, SGO, SGO}, 4, 4, true));
  EXPECT_EQ(b.unsharded, 4 * (12 + 8 + 12 + 8));  // everything by the end of forward
  b = observed(param_bytes(n, {NO, NO, NO, NO}, 1, 4, true));
  EXPECT_EQ(b.sharded, 4 * 31);
  EXPECT_EQ(b.unsharded, 0);
  b = observed(param_bytes(n, {NO, FULL, FULL, FULL}, 4, 4, true, 2, /*element_bytes=*/2));
  EXPECT_EQ(b.sharded, 2 * (10 + 7));
  EXPECT_EQ(b.unsharded, 2 * (8 + 12));
}

TEST(Formulas, BadArgumentsAreNamed) {
  expect_error_mentions([] { step_traffic({1, 2}, {FULL}, 2, 2); }, "strategies");
  expect_error_mentions([] { param_bytes({1}, {FULL}, 0, 2, false); }, "shard");
  expect_error_mentions([] { step_traffic({1}, {FULL}, 1, 0); }, "world");
}

// ---------------------------------------------------------------- Task 2: wrap policies

TEST(Policies, TransformerPolicyWrapsEachBlock) {
  GPT model(config(3));
  const auto units = observed(transformer_policy(model));
  ASSERT_EQ(units.size(), 3u);
  auto named = model->named_parameters();
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(units[b].name, "blocks." + std::to_string(b));
    std::set<std::string> want;
    for (const auto& item : named)
      if (item.key().rfind("blocks." + std::to_string(b) + ".", 0) == 0) want.insert(item.key());
    EXPECT_EQ(std::set<std::string>(units[b].params.begin(), units[b].params.end()), want);
  }
}

TEST(Policies, SizeBasedPolicyGroupsConsecutiveBlocks) {
  GPT model(config(5));
  const int64_t block = dtl::unit_numels(model)[1];
  const auto policy = size_based_policy(model, block + 1);  // two blocks reach it, one does not
  const auto units = observed(policy);
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[0].name, "blocks.0-1");
  EXPECT_EQ(units[1].name, "blocks.2-3");
  EXPECT_EQ(units[2].name, "blocks.4");  // what is left
  EXPECT_EQ(OBSERVE(dtl::unit_numels(model, policy)),
            (std::vector<int64_t>{2 * block, 2 * block, block}));
  const auto ones = observed(size_based_policy(model, 1));
  EXPECT_EQ(ones.size(), 5u);
  ASSERT_FALSE(ones.empty());
  EXPECT_EQ(ones[0].name, "blocks.0") << "a unit of one block";
  // "At least": a group that reaches min_numel exactly is complete.
  auto exact = observed(size_based_policy(model, block));
  ASSERT_EQ(exact.size(), 5u) << "one block holds exactly min_numel = " << block << " elements";
  EXPECT_EQ(exact[4].name, "blocks.4");
  exact = observed(size_based_policy(model, 2 * block));
  ASSERT_EQ(exact.size(), 3u);
  EXPECT_EQ(exact[0].name, "blocks.0-1");
  const auto all = observed(size_based_policy(model, 1'000'000'000));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "blocks.0-4");
  expect_error_mentions([&] { size_based_policy(model, 0); }, "min_numel");
}

// ---------------------------------------------------------------- Task 3: FlatParameter

// Three parameters of 12, 5 and 7 elements (24), sharded over the world: every rank checks the
// layout, its own shard and its pieces.
TEST(FlatParam, LayoutShardAndPieces) {
  const int world = dtl::world().size(), rank = dtl::world().rank();
  torch::manual_seed(3);
  std::vector<torch::Tensor> params = {torch::randn({3, 4}).to(device()).requires_grad_(),
                                       torch::randn({5}).to(device()).requires_grad_(),
                                       torch::randn({7}).to(device()).requires_grad_()};
  std::vector<torch::Tensor> values;
  for (auto& p : params) values.push_back(p.detach().clone().reshape({-1}));
  const torch::Tensor concat = torch::cat(values);
  FlatParameter f("unit", {"a", "b", "c"}, params, world, rank);
  const int64_t S = (24 + world - 1) / world;
  EXPECT_EQ(OBSERVE(f.numel()), 24);
  EXPECT_EQ(OBSERVE(f.shard_numel()), S);
  EXPECT_EQ(OBSERVE(f.padded_numel()), world * S);
  ASSERT_TRUE(OBSERVE(f.is_unsharded()));
  DTL_EXPECT_EQUAL(f.full().narrow(0, 0, 24), concat);
  if (world * S > 24) {
    EXPECT_EQ(OBSERVE(f.full().narrow(0, 24, world * S - 24).abs().sum().item<double>()), 0.0)
        << "padding";
  }
  // This rank's shard: its slice of the padded buffer, in memory of its own.
  DTL_EXPECT_EQUAL(f.shard().detach(), f.full().narrow(0, rank * S, S));
  EXPECT_TRUE(OBSERVE(f.shard().is_leaf() && f.shard().requires_grad()));
  EXPECT_TRUE(OBSERVE(f.shard().data_ptr() != f.full().narrow(0, rank * S, S).data_ptr()));
  // The parameters compute with full()'s memory: writing one writes the other.
  {
    torch::NoGradGuard no_grad;
    f.full().narrow(0, 12, 5).fill_(42);
  }
  EXPECT_EQ(OBSERVE(params[1].detach().sum().item<double>()), 42.0 * 5)
      << "parameters must be views of full()";
  EXPECT_EQ(OBSERVE(params[0].sizes().vec()), (std::vector<int64_t>{3, 4}));
  // Pieces: exactly the shard's elements that belong to a parameter, in order, sharing its memory.
  // Observed as one list (tests util: observed_pieces); the shard they must match is this run's.
  const torch::Tensor shard = f.shard().detach();
  int64_t covered = 0;
  for (const auto& piece : observed_pieces(f)) {
    ASSERT_GT(piece.numel, 0);
    ASSERT_TRUE(piece.param >= 0 && piece.param < 3) << "piece of parameter " << piece.param;
    ASSERT_TRUE(piece.shard_offset >= 0 && piece.shard_offset + piece.numel <= shard.numel())
        << "piece [" << piece.shard_offset << ", +" << piece.numel << ") outside the shard";
    const int64_t param_start = std::vector<int64_t>{0, 12, 17}[piece.param];
    EXPECT_EQ(piece.shard_offset, param_start + piece.param_offset - rank * S);
    DTL_EXPECT_EQUAL(piece.view, shard.narrow(0, piece.shard_offset, piece.numel));
    EXPECT_TRUE(piece.leaf_requires_grad);
    EXPECT_TRUE(piece.shares_shard)
        << "a piece must share the shard's memory (AdamW writes the shard through it)";
    covered += piece.numel;
  }
  const int64_t lo = std::min<int64_t>(24, rank * S), hi = std::min<int64_t>(24, (rank + 1) * S);
  EXPECT_EQ(covered, hi - lo) << "the pieces must cover the shard's parameter elements, padding excluded";
}

TEST(FlatParam, ReleaseKeepsShapesAndTheShard) {
  const int world = dtl::world().size(), rank = dtl::world().rank();
  std::vector<torch::Tensor> params = {torch::ones({4, 3}).to(device()).requires_grad_(),
                                       torch::full({5}, 2.0).to(device()).requires_grad_()};
  FlatParameter f("unit", {"w", "b"}, params, world, rank);
  const torch::Tensor shard_before = f.shard().detach().clone();
  f.release();
  EXPECT_FALSE(OBSERVE(f.is_unsharded()));
  EXPECT_FALSE(OBSERVE(dtl::has_storage(params[0])))
      << "release() must free the parameters' memory";
  EXPECT_EQ(OBSERVE(params[0].sizes().vec()), (std::vector<int64_t>{4, 3}));
  DTL_EXPECT_EQUAL(f.shard().detach(), shard_before);
  f.allocate();
  EXPECT_TRUE(OBSERVE(f.is_unsharded()));
  EXPECT_TRUE(OBSERVE(dtl::has_storage(params[1])));
  EXPECT_EQ(OBSERVE(params[1].sizes().vec()), (std::vector<int64_t>{5}));
}

TEST(FlatParam, KeepFullIsTheShard) {
  std::vector<torch::Tensor> params = {torch::ones({2, 2}).to(device()).requires_grad_(),
                                       torch::ones({3}).to(device()).requires_grad_()};
  FlatParameter f("root", {"w", "b"}, params, 1, 0, /*keep_full=*/true);
  EXPECT_EQ(OBSERVE(f.shard_numel()), 7);
  EXPECT_TRUE(OBSERVE(f.shard().data_ptr() == f.full().data_ptr())) << "NO_SHARD: one memory";
  f.release();
  EXPECT_TRUE(OBSERVE(f.is_unsharded())) << "a kept-full unit is never released";
  EXPECT_EQ(OBSERVE(f.pieces().size()), 2u);
}

// ---------------------------------------------------------------- Task 4: FULL_SHARD

TEST(Fsdp, FullShardFollowsDdpWithWeightDecay) {
  expect_fsdp_equals_ddp(config(), {}, 3, adamw(), "FULL_SHARD");
}

// With eps far above sqrt(v) AdamW's step is proportional to the gradient: a gradient summed over
// the ranks instead of averaged, or one rank's alone, moves the parameters differently.
TEST(Fsdp, GradientsAreTheMeanOverRanks) {
  expect_fsdp_equals_ddp(config(), {}, 2, adamw(/*eps=*/1.0, /*weight_decay=*/0.0), "FULL_SHARD, eps 1");
}

// Two backwards before a step add their gradients (the same rows twice: twice the gradient,
// which AdamW with eps 1 turns into a different step than one backward's).
TEST(Fsdp, TwoBackwardsAccumulate) {
  expect_fsdp_equals_ddp(config(), {}, 2, adamw(/*eps=*/1.0, /*weight_decay=*/0.1),
                         "FULL_SHARD, two backwards per step, eps 1", dtl::lab15::transformer_policy,
                         /*backwards=*/2);
}

// Every rank starts from rank 0's parameters, whatever its own model held.
TEST(Fsdp, StartsFromRankZerosParameters) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(2);
  GPT model(cfg);
  model->to(device());
  GPT probe(cfg);  // the same seed: rank 0's values
  probe->to(device());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(0.25 * comm->rank());
  }
  FullyShardedDataParallel fsdp(model, *comm, {}, adamw());
  DTL_EXPECT_EQUAL(fsdp.full_parameters(), dtl::testing::flat_params(*probe))
      << "construction broadcasts every parameter from rank 0";
}

TEST(Fsdp, UntiedHeadAndOddSizesNeedPadding) {
  expect_fsdp_equals_ddp(config(2, 24, /*tied=*/false, /*vocab=*/37), {}, 2, adamw(),
                         "FULL_SHARD, untied head, vocab 37");
}

// Between forward and backward only the root is gathered; after backward nothing is, no
// parameter keeps a .grad() and every shard has its reduced gradient.
TEST(Fsdp, UnitsAreReleasedAndGradientsSharded) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  Data data(cfg, comm->size());
  GPT model(cfg);
  model->to(device());
  FullyShardedDataParallel fsdp(model, *comm, {}, adamw());
  const auto& flats = fsdp.flat_parameters();
  ASSERT_EQ(OBSERVE(fsdp.units().size()), 4u);
  EXPECT_EQ(OBSERVE(fsdp.units()[0].name), "root");
  // Whether each unit is gathered, observed as one list (a bool per FlatParameter, in order).
  auto unsharded = [&] {
    std::vector<bool> out;
    for (const auto& f : flats) out.push_back(f.is_unsharded());
    return out;
  };
  auto name = [&](size_t u) {
    return u < fsdp.units().size() ? fsdp.units()[u].name : "unit " + std::to_string(u);
  };
  const auto constructed = OBSERVE(unsharded());
  for (size_t u = 0; u < constructed.size(); ++u)
    EXPECT_FALSE(constructed[u]) << "after construction";
  torch::Tensor loss = fsdp.loss(my_rows(data.sampler, 0, *comm));
  const auto forward = OBSERVE(unsharded());
  ASSERT_FALSE(forward.empty());
  EXPECT_TRUE(forward[0]) << "the root stays gathered until its backward";
  for (size_t u = 1; u < forward.size(); ++u)
    EXPECT_FALSE(forward[u]) << "FULL_SHARD frees " << name(u) << " after forward";
  loss.backward();
  const auto backward = OBSERVE(unsharded());
  for (size_t u = 0; u < backward.size(); ++u) {
    EXPECT_FALSE(backward[u]) << name(u) << " after backward";
    const FlatParameter& f = flats.at(u);
    ASSERT_TRUE(OBSERVE(f.shard().grad().defined())) << name(u);
    EXPECT_EQ(OBSERVE(f.shard().grad().numel()), OBSERVE(f.shard_numel()));
    bool full_grad = false;
    for (const auto& p : f.params()) full_grad = full_grad || p.grad().defined();
    EXPECT_FALSE(OBSERVE(full_grad)) << "a full gradient survived";
  }
}

// ---------------------------------------------------------------- Task 5: the other strategies

// NO_SHARD and HYBRID_SHARD with eps 1 (the step proportional to the gradient): their
// gradients are the mean over all ranks, not over one group.
TEST(Fsdp, EveryStrategyFollowsDdp) {
  const int world = dtl::world().size();
  expect_fsdp_equals_ddp(config(), with(ShardingStrategy::SHARD_GRAD_OP), 2, adamw(), "SHARD_GRAD_OP");
  expect_fsdp_equals_ddp(config(), with(ShardingStrategy::NO_SHARD), 2, adamw(1.0, 0.1), "NO_SHARD, eps 1");
  expect_fsdp_equals_ddp(config(), with(ShardingStrategy::HYBRID_SHARD, hybrid_ranks_per_node(world)),
                         2, adamw(1.0, 0.1), "HYBRID_SHARD, eps 1");
  FSDPConfig mixed;
  mixed.unit_strategy = {{"root", ShardingStrategy::NO_SHARD}, {"blocks.1", ShardingStrategy::SHARD_GRAD_OP}};
  expect_fsdp_equals_ddp(config(), mixed, 2, adamw(), "root NO_SHARD, blocks.1 SHARD_GRAD_OP");
}

// What one step sends, per strategy, against step_traffic; nothing else goes over the wrapper's
// communicators.
TEST(Fsdp, TrafficMatchesTheFormula) {
  const int world = dtl::world().size();
  const GPTConfig cfg = config(3, 32, true, 61);  // vocab 61: the root's size needs padding
  std::vector<FSDPConfig> configs = {with(ShardingStrategy::FULL_SHARD), with(ShardingStrategy::SHARD_GRAD_OP),
                                     with(ShardingStrategy::NO_SHARD),
                                     with(ShardingStrategy::HYBRID_SHARD, hybrid_ranks_per_node(world))};
  for (const auto& fc : configs) {
    auto comm = fresh_comm();
    Data data(cfg, world);
    GPT model(cfg);
    model->to(device());
    FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
    fsdp_step(fsdp, my_rows(data.sampler, 0, *comm));
    const int shard = fc.strategy == ShardingStrategy::HYBRID_SHARD ? fc.ranks_per_node
                      : fc.strategy == ShardingStrategy::NO_SHARD   ? 1 : world;
    const auto want = observed(step_traffic(fsdp.unit_numels(), fsdp.strategies(), shard, world));
    const WrapperStats stats = measured_stats(fsdp);
    const auto got = counted(stats);
    const std::string what = std::string(dtl::lab15::to_string(fc.strategy)) + " on " + std::to_string(world);
    EXPECT_EQ(got.all_gather, want.all_gather) << what;
    EXPECT_EQ(got.reduce_scatter, want.reduce_scatter) << what;
    EXPECT_EQ(got.all_reduce, want.all_reduce) << what;
    const int64_t ops = stats.total_count();
    int64_t expected_ops = 0;
    for (const dtl::CommStats* st : {&stats.shard, &stats.replicate})
      expected_ops += (*st)[OpType::AllGather].count + (*st)[OpType::ReduceScatter].count +
                      (*st)[OpType::AllReduce].count;
    EXPECT_EQ(ops, expected_ops) << what << ": only all-gathers, reduce-scatters and all-reduces";
  }
}

// Two nodes of two ranks: hybrid sharding keeps the gathers and scatters inside a node and sends
// only the shard's all-reduce across; FULL_SHARD's every collective crosses.
TEST(Fsdp, HybridSendsLessAcrossNodes) {
  const int world = dtl::world().size();
  if (world != 4) GTEST_SKIP() << "needs 4 ranks (2 nodes x 2)";
  const GPTConfig cfg = config();
  double across[2];
  int k = 0;
  for (const auto& fc : {with(ShardingStrategy::FULL_SHARD), with(ShardingStrategy::HYBRID_SHARD, 2)}) {
    auto comm = fresh_comm();
    Data data(cfg, world);
    const torch::Tensor expected = ddp_params(cfg, data, 1, adamw(), 1);
    GPT model(cfg);
    model->to(device());
    FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
    fsdp_step(fsdp, my_rows(data.sampler, 0, *comm));
    across[k++] = MEASURED(inter_node_wire_bytes(fsdp, 2));
    // Sending less is easy when the step is wrong: it must still be DDP's step.
    DTL_EXPECT_CLOSE(fsdp.full_parameters(), expected, 1e-4, 2e-5) << (k == 1 ? "full" : "hybrid");
  }
  EXPECT_GT(across[0], 0);
  EXPECT_LT(across[1], 0.5 * across[0]) << "HYBRID_SHARD must send less than half of FULL_SHARD's "
                                           "bytes across nodes";
}

// ---------------------------------------------------------------- Task 6: prefetch

// Prefetching changes when gathers happen, never what is computed: bitwise the same parameters.
TEST(Prefetch, ChangesNothingButTiming) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(4);
  Data data(cfg, comm->size());
  std::vector<torch::Tensor> results;
  for (bool on : {false, true}) {
    FSDPConfig fc;
    fc.forward_prefetch = on;
    fc.backward_prefetch = on ? BackwardPrefetch::BACKWARD_PRE : BackwardPrefetch::NONE;
    GPT model(cfg);
    model->to(device());
    FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
    for (int s = 0; s < 2; ++s) fsdp_step(fsdp, my_rows(data.sampler, s, *comm));
    results.push_back(fsdp.full_parameters());
  }
  DTL_EXPECT_EQUAL(results[1], OBSERVE(results[0]));  // both the code's: compared with each other
}

// During backward at most one unit besides the root is gathered without prefetch, two with
// BACKWARD_PRE (and two do occur: the prefetch is real), one again when limit_all_gathers is 1.
TEST(Prefetch, BackwardPrefetchGathersOneUnitAhead) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(4);
  Data data(cfg, comm->size());
  struct Case { BackwardPrefetch prefetch; int limit; int most; };
  for (const Case& c : {Case{BackwardPrefetch::NONE, 2, 1}, Case{BackwardPrefetch::BACKWARD_PRE, 2, 2},
                        Case{BackwardPrefetch::BACKWARD_PRE, 1, 1}}) {
    FSDPConfig fc;
    fc.backward_prefetch = c.prefetch;
    fc.limit_all_gathers = c.limit;
    GPT model(cfg);
    model->to(device());
    FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
    GatheredDuringBackward probe(fsdp);
    fsdp.loss(my_rows(data.sampler, 0, *comm)).backward();
    EXPECT_EQ(OBSERVE(probe.most), c.most)
        << "units gathered at once in backward (root aside), prefetch "
        << (c.prefetch == BackwardPrefetch::NONE ? "off" : "on") << ", limit " << c.limit;
  }
}

// The tracker's peak during a forward: the gathered units param_bytes() predicts, within 5%.
TEST(Prefetch, ForwardPeakMatchesParamBytes) {
  if (!device().is_cpu()) GTEST_SKIP() << "the tracking allocator counts CPU memory";
  auto comm = fresh_comm();
  const int world = comm->size();
  const GPTConfig cfg = config(4, 64);
  for (bool on : {false, true}) {
    FSDPConfig fc;
    fc.forward_prefetch = on;
    GPT model(cfg);
    FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
    std::vector<ShardingStrategy> all(fsdp.units().size(), ShardingStrategy::FULL_SHARD);
    const int64_t want = OBSERVE(param_bytes(fsdp.unit_numels(), all, world, world, on).unsharded);
    const int64_t got = MEASURED(forward_peak_bytes(fsdp, cfg));
    EXPECT_NEAR(static_cast<double>(got), static_cast<double>(want), 0.05 * want)
        << "forward_prefetch " << on << " on " << world << " ranks: measured " << got
        << " B above the shards, param_bytes says " << want << " B";
  }
}

// ---------------------------------------------------------------- Task 7: state dicts

TEST(StateDict, FullStateDictOnRankZero) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(2, 32, /*tied=*/false);
  Data data(cfg, comm->size());
  GPT model(cfg);
  model->to(device());
  GPT probe(cfg);  // same seed: names and shapes
  FullyShardedDataParallel fsdp(model, *comm, {}, adamw());
  fsdp_step(fsdp, my_rows(data.sampler, 0, *comm));
  const torch::Tensor flat = fsdp.full_parameters();
  // Observed whole (name -> tensor): the checks below read the code's state dict.
  const auto sd = OBSERVE(fsdp.full_state_dict());
  std::vector<std::string> gathered;  // units still gathered afterwards
  for (const auto& f : fsdp.flat_parameters())
    if (f.is_unsharded()) gathered.push_back(f.name());
  if (comm->rank() != 0) {
    EXPECT_TRUE(sd.empty()) << "only rank 0 gets the full state dict";
    return;
  }
  auto named = probe->named_parameters();
  ASSERT_EQ(sd.size(), named.size());
  std::vector<torch::Tensor> values;
  for (const auto& item : named) {
    ASSERT_TRUE(sd.count(item.key())) << item.key();
    EXPECT_EQ(sd.at(item.key()).sizes(), item.value().sizes()) << item.key();
    values.push_back(sd.at(item.key()).reshape({-1}));
  }
  // Both the code's: its state dict against its own full_parameters().
  DTL_EXPECT_EQUAL(torch::cat(values), OBSERVE(flat));
  for (const auto& name : OBSERVE(gathered))
    ADD_FAILURE() << name << " still gathered: released again";
}

// Every rank's pieces, gathered: each parameter covered exactly once per replica, with the
// full parameters' values.
TEST(StateDict, ShardedPiecesCoverEveryParameter) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(2);
  Data data(cfg, comm->size());
  GPT model(cfg);
  model->to(device());
  FullyShardedDataParallel fsdp(model, *comm, {}, adamw());
  fsdp_step(fsdp, my_rows(data.sampler, 0, *comm));
  const auto sd = fsdp.sharded_state_dict();
  const auto full = fsdp.full_state_dict();
  // Every rank sends its (offset, numel, values) per parameter to rank 0 in a fixed layout: one
  // flat vector per parameter with this rank's elements written in, zeros elsewhere, and a
  // count of how often each element was written.
  GPT probe(cfg);
  for (const auto& item : probe->named_parameters()) {
    torch::Tensor values = torch::zeros({item.value().numel()}, dtl::testing::device_options());
    torch::Tensor count = torch::zeros({item.value().numel()}, dtl::testing::device_options());
    std::vector<std::vector<int64_t>> shapes;  // the global shape of each of this rank's pieces
    for (const auto& e : sd) {
      if (e.name != item.key()) continue;
      shapes.push_back(e.global_shape);
      values.narrow(0, e.offset, e.values.numel()).copy_(e.values);
      count.narrow(0, e.offset, e.values.numel()).add_(1);
    }
    for (const auto& shape : OBSERVE(shapes)) EXPECT_EQ(shape, item.value().sizes().vec());
    comm->all_reduce(values);
    comm->all_reduce(count);
    EXPECT_EQ(OBSERVE(count.min().item<double>()), 1.0)
        << item.key() << ": an element in no shard or in two";
    EXPECT_EQ(OBSERVE(count.max().item<double>()), 1.0) << item.key();
    if (comm->rank() == 0) {
      // Both the code's: the pieces against its own full state dict.
      DTL_EXPECT_EQUAL(values, OBSERVE(full.at(item.key()).reshape({-1})));
    }
  }
}

// ---------------------------------------------------------------- bad input

TEST(BadInput, WrapPoliciesAreChecked) {
  auto comm = fresh_comm();
  auto make = [&](std::vector<dtl::Unit> units) {
    GPT model(config(3));
    FullyShardedDataParallel fsdp(model, *comm, {}, adamw(), [units](GPT&) { return units; });
  };
  GPT probe(config(3));
  auto blocks = transformer_policy(probe);
  expect_error_mentions([&] { make({{"ghost", {"blocks.9.ln_1.weight"}}}); }, "names");
  expect_error_mentions([&] { make({blocks[0], blocks[0]}); }, "twice");
  expect_error_mentions([&] { make({{"nothing", {}}}); }, "empty");
  dtl::Unit half = blocks[1];
  half.params.pop_back();
  expect_error_mentions([&] { make({half}); }, "whole blocks");
  expect_error_mentions([&] { make({{"embedding", {"wte.weight"}}}); }, "whole blocks");
}

TEST(BadInput, StrategiesAndMeshAreChecked) {
  auto comm = fresh_comm();
  const int world = comm->size();
  auto make = [&](const FSDPConfig& fc) {
    GPT model(config(2));
    FullyShardedDataParallel fsdp(model, *comm, fc, adamw());
  };
  expect_error_mentions([&] { make(with(ShardingStrategy::HYBRID_SHARD, world + 1)); }, "ranks_per_node");
  expect_error_mentions([&] { make(with(ShardingStrategy::HYBRID_SHARD, 0)); }, "ranks_per_node");
  expect_error_mentions([&] { make(with(ShardingStrategy::FULL_SHARD, 1)); }, "ranks_per_node");
  FSDPConfig mixed = with(ShardingStrategy::HYBRID_SHARD, 1);
  mixed.unit_strategy = {{"root", ShardingStrategy::NO_SHARD}};
  expect_error_mentions([&] { make(mixed); }, "HYBRID_SHARD");
  FSDPConfig ghost;
  ghost.unit_strategy = {{"blocks.7", ShardingStrategy::NO_SHARD}};
  expect_error_mentions([&] { make(ghost); }, "unit");
}

TEST(BadInput, FlatParameterArgumentsAreChecked) {
  auto p = [] { return torch::ones({3}).to(device()).requires_grad_(); };
  expect_error_mentions([] { FlatParameter("u", {}, {}, 1, 0); }, "empty");
  expect_error_mentions([&] { FlatParameter("u", {"a"}, {p()}, 2, 2); }, "shard");
  expect_error_mentions([&] { FlatParameter("u", {"a"}, {p()}, 0, 0); }, "shard");
  expect_error_mentions([&] { FlatParameter("u", {"a"}, {p()}, 2, 0, /*keep_full=*/true); }, "keep_full");
  expect_error_mentions([&] {
    FlatParameter("u", {"a", "b"}, {p(), torch::ones({2}, torch::kFloat64).to(device()).requires_grad_()}, 1, 0);
  }, "dtype");
}

}  // namespace
}  // namespace lab15_test
