// Lab 19 grading tests: orders with the pipeline innermost, the expert grid's combined groups,
// context parallelism's groups over real ranks, position embeddings, and more translations.
// Only what parallel_state.hpp promises.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtl/harness/checks.hpp"
#include "parallel_state.hpp"
#include "tests/parallel_state_test_util.hpp"  // defines: observed(ParallelPlan)

namespace lab19_test {
namespace {

using dtl::lab19::from_deepspeed_config;
using dtl::lab19::from_megatron_args;
using dtl::lab19::ParallelConfig;
using dtl::lab19::ParallelState;
using dtl::lab19::RankGenerator;
using dtl::testing::expect_error_mentions;
using Groups = std::vector<std::vector<int>>;

TEST(GradeRankGroups, PipelineInnermostAndAppendedTokens) {
  const RankGenerator g(2, 1, 2, 2, 1, "pp-tp-dp");  // cp and ep appended at the end
  EXPECT_EQ(OBSERVE(g.order()), "pp-tp-dp-ep-cp");
  EXPECT_EQ(OBSERVE(g.get_ranks("pp")), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(OBSERVE(g.get_ranks("tp")), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(OBSERVE(g.get_ranks("dp-tp")), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(OBSERVE(g.size("dp")), 2);
  EXPECT_EQ(OBSERVE(g.size("cp")), 1);
}

// Missing tokens (all of size 1) are appended in Megatron's order: tp, pp, dp, ep, cp.
TEST(GradeRankGroups, AppendedTokensInMegatronsOrder) {
  EXPECT_EQ(OBSERVE(RankGenerator(2, 1, 1, 2, 1, "tp-pp").order()), "tp-pp-dp-ep-cp");
  EXPECT_EQ(OBSERVE(RankGenerator(1, 1, 4, 1, 1, "dp").order()), "dp-tp-pp-ep-cp");
  EXPECT_EQ(OBSERVE(RankGenerator(1, 1, 1, 1, 2, "cp-ep").order()), "cp-ep-tp-pp-dp");
  EXPECT_EQ(OBSERVE(RankGenerator(2, 1, 1, 2, 1, "tp-pp").get_ranks("pp")),
            (Groups{{0, 2}, {1, 3}}));
}

TEST(GradeRankGroups, ExpertGridCombinations) {
  // 16 ranks, tp 2, ep 4, expert dp 2: tp-ep groups of 8 consecutive ranks.
  const RankGenerator e(2, 4, 2, 1, 1);
  EXPECT_EQ(OBSERVE(e.get_ranks("ep").at(0)), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(OBSERVE(e.get_ranks("tp-ep")),
            (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(OBSERVE(e.get_ranks("dp").at(0)), (std::vector<int>{0, 8}));
}

TEST(GradeParallelState, ContextParallelAndPositionEmbedding) {
  auto world = dtl::testing::fresh_comm();
  const int n = world->size();
  ParallelConfig c;
  c.cp = n % 2 == 0 ? 2 : 1;
  c.pp = n % 2 == 0 ? n / 2 : n;
  ParallelState ps(*world, c);
  EXPECT_EQ(OBSERVE(ps.size("cp")), c.cp);
  EXPECT_EQ(OBSERVE(ps.size("dp")), 1);
  for (const auto& g : OBSERVE(ps.groups("position_embedding"))) EXPECT_EQ(g.size(), 1u);
  const auto pos = OBSERVE(ps.group_of("position_embedding"));
  const bool first_stage = OBSERVE(ps.coord("pp")) == 0;
  EXPECT_EQ(OBSERVE(ps.has("position_embedding")), first_stage);
  if (first_stage) {
    EXPECT_EQ(pos, (std::vector<int>{world->rank()}));
    EXPECT_EQ(OBSERVE(ps.comm("position_embedding").size()), 1);
  } else {
    expect_error_mentions([&] { ps.comm("position_embedding"); }, "group");
  }
  EXPECT_EQ(OBSERVE(ps.comm("dp-cp").size()), c.cp);
  EXPECT_EQ(OBSERVE(ps.comm("tp-pp").size()), c.pp);
}

// What Megatron accepts although the order does not end in pp: the experts' data-parallel size
// equals the attention's (ep = cp) and both grids put the stages the same ranks apart.
TEST(GradeParallelState, OrdersMegatronAcceptsWithExperts) {
  auto world = dtl::testing::fresh_comm();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ParallelConfig c;
  c.pp = 2;
  c.cp = 2;
  c.ep = 2;
  c.order = "tp-cp-ep-pp-dp";
  ParallelState ps(*world, c);
  EXPECT_EQ(OBSERVE(ps.groups("pp")), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(OBSERVE(ps.groups("ep")), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(OBSERVE(ps.groups("cp")), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(OBSERVE(ps.size("expert_dp")), 1);
  // pp last: any expert layout.
  ParallelConfig last;
  last.pp = 2;
  last.ep = 2;
  last.order = "tp-ep-dp-pp";
  ParallelState ps2(*world, last);
  EXPECT_EQ(OBSERVE(ps2.groups("pp")), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(OBSERVE(ps2.groups("ep")), (Groups{{0, 1}, {2, 3}}));
}

TEST(GradeTranslation, MoreMegatronAndDeepSpeed) {
  dtl::lab19::GPTConfig m;
  m.n_layer = 12;
  m.n_head = 12;
  m.vocab_size = 96;
  m.seq_len = 48;
  auto p =
      observed(from_megatron_args({"--context-parallel-size=2", "--tensor-model-parallel-size=3",
                                   "--recompute-granularity=full", "--fp16", "--clip-grad", "0"},
                                  12, m));
  EXPECT_EQ(p.cp, 2);
  EXPECT_EQ(p.tp, 3);
  EXPECT_EQ(p.dp, 2);
  EXPECT_EQ(p.recompute, "full");
  EXPECT_EQ(p.precision, "fp16");
  EXPECT_EQ(p.grad_clip, 0.0);
  expect_error_mentions([&] { from_megatron_args({"--recompute-granularity", "some"}, 1, m); },
                        "--recompute-granularity");
  expect_error_mentions([&] { from_megatron_args({"--micro-batch-size", "zero"}, 1, m); }, "--micro-batch-size");
  auto d = observed(from_deepspeed_config(
      R"({"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 3},
                                             "fp16": {"enabled": true}})",
      12, 3, 2, m));
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.global_batch, 6);
  EXPECT_EQ(d.zero_stage, 3);
  EXPECT_EQ(d.precision, "fp16");
  EXPECT_EQ(d.grad_clip, 0.0);
  expect_error_mentions([&] { from_deepspeed_config(R"({"train_batch_size": 7})", 12, 3, 2, m); }, "train_batch_size");
}

}  // namespace
}  // namespace lab19_test
