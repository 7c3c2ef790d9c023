// Lab 19 public tests: Megatron's rank groups (its docstring examples exactly; every order and
// size up to 64 against the runtime's MeshLayout), the ParallelState's groups and sub-Comms, a
// tp x dp training built from them, and the translation of Megatron flags and DeepSpeed configs.
// Run: ./lab test 19.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "dtl/harness/checks.hpp"  // defines: expect_error_mentions, DTL_EXPECT_CLOSE
#include "dtl/mesh.hpp"            // defines: MeshLayout (the oracle)
#include "parallel_state.hpp"
#include "tests/parallel_state_test_util.hpp"  // defines: observed(ParallelPlan)
#include "tests/tpt_test_util.hpp"  // lab 09's: the TP GPT's serial-training oracle

namespace lab19_test {
namespace {

using dtl::lab19::from_deepspeed_config;
using dtl::lab19::from_megatron_args;
using dtl::lab19::ParallelConfig;
using dtl::lab19::ParallelPlan;
using dtl::lab19::ParallelState;
using dtl::lab19::rank_groups;
using dtl::lab19::RankGenerator;
using dtl::testing::expect_error_mentions;
using Groups = std::vector<std::vector<int>>;

// ---------------------------------------------------------------- Task 1: the rank generator

TEST(RankGroups, GenerateMaskedOrthogonalDocstring) {
  // sizes (tp, dp, pp) = (2, 3, 4), the dp groups.
  const Groups dp = OBSERVE(rank_groups({2, 3, 4}, {false, true, false}));
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[2], (std::vector<int>{6, 8, 10}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
}

// initialize_model_parallel's docstring: 16 GPUs, tp 2, pp 4, so dp 2.
TEST(RankGroups, MegatronSixteenGpuExample) {
  const RankGenerator g(/*tp=*/2, /*ep=*/1, /*dp=*/2, /*pp=*/4, /*cp=*/1);
  EXPECT_EQ(OBSERVE(g.world_size()), 16);
  EXPECT_EQ(OBSERVE(g.get_ranks("tp")),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(OBSERVE(g.get_ranks("pp")),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(OBSERVE(g.get_ranks("dp")),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(OBSERVE(g.get_ranks("tp-pp")),
            (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(OBSERVE(g.order()), "tp-cp-ep-dp-pp");
}

// Context parallelism (Megatron's docs): 8 GPUs at tp 4, cp 2; and tp 2, cp 2, dp 2, pp 2.
TEST(RankGroups, ContextParallelExamples) {
  const RankGenerator a(4, 1, 1, 1, 2);
  EXPECT_EQ(OBSERVE(a.get_ranks("cp")), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const RankGenerator b(2, 1, 2, 2, 2);
  EXPECT_EQ(OBSERVE(b.get_ranks("cp").at(0)), (std::vector<int>{0, 2}));
  EXPECT_EQ(OBSERVE(b.get_ranks("dp").at(0)), (std::vector<int>{0, 4}));
  EXPECT_EQ(OBSERVE(b.get_ranks("dp-cp").at(0)), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(OBSERVE(b.get_ranks("pp").at(0)), (std::vector<int>{0, 8}));
}

// A digest of lists of groups (their sizes and members, in order).
uint64_t digest_of(const std::vector<Groups>& all) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i)
      h = (h ^ ((static_cast<uint64_t>(v) >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  for (const Groups& groups : all) {
    mix(static_cast<int64_t>(groups.size()));
    for (const auto& g : groups) {
      mix(static_cast<int64_t>(g.size()));
      for (int r : g) mix(r);
    }
  }
  return h;
}

// Every order of the four dense dimensions, every split of every world up to 64, every group
// token of one or two dimensions: exactly the runtime MeshLayout's groups (disjoint, covering,
// increasing, ordered by first rank). The code's groups of one world (every split and token) are
// observed by their digest, and whole only where it differs from the mesh's: the split run does
// not ship twelve million ranks to say that they match.
TEST(RankGroups, EveryOrderAndSizeMatchesTheMesh) {
  std::vector<std::string> dims = {"tp", "cp", "dp", "pp"};
  std::sort(dims.begin(), dims.end());
  int checked = 0;
  do {
    const std::string order = dims[0] + "-" + dims[1] + "-" + dims[2] + "-" + dims[3];
    for (int world = 1; world <= 64; ++world) {
      std::vector<Groups> got, want;
      std::vector<std::string> what;
      for (int tp = 1; tp <= world; ++tp)
        for (int cp = 1; tp * cp <= world; ++cp)
          for (int pp = 1; tp * cp * pp <= world; ++pp) {
            if (world % (tp * cp * pp) != 0) continue;
            const int dp = world / (tp * cp * pp);
            const RankGenerator g(tp, 1, dp, pp, cp, order);
            std::vector<dtl::MeshDim> mesh_dims;
            for (const auto& d : dims)
              mesh_dims.push_back({d, d == "tp" ? tp : d == "cp" ? cp : d == "dp" ? dp : pp});
            const dtl::MeshLayout mesh(mesh_dims);
            for (const auto& token : {std::vector<std::string>{"tp"}, {"dp"}, {"pp"}, {"cp"},
                                      {"dp", "cp"}, {"tp", "pp"}, {"tp", "dp"}}) {
              std::string name = token[0];
              for (size_t k = 1; k < token.size(); ++k) name += "-" + token[k];
              got.push_back(g.get_ranks(name));
              want.push_back(mesh.groups(token));
              what.push_back("order " + order + ", tp " + std::to_string(tp) + " cp " +
                             std::to_string(cp) + " dp " + std::to_string(dp) + " pp " +
                             std::to_string(pp) + ", token " + name);
              ++checked;
            }
          }
      if (OBSERVE(digest_of(got)) == digest_of(want)) continue;
      const std::vector<Groups> theirs = OBSERVE(got);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(i < theirs.size() ? theirs[i] : Groups{}, want[i]) << what[i];
      FAIL() << "order " << order << ", world " << world << ": " << theirs.size()
             << " lists of groups for " << want.size();
    }
  } while (std::next_permutation(dims.begin(), dims.end()));
  EXPECT_GT(checked, 10000);
}

TEST(RankGroups, BadGeneratorsAreNamed) {
  expect_error_mentions([] { RankGenerator(0, 1, 1, 1, 1); }, "size");
  expect_error_mentions([] { RankGenerator(2, 2, 1, 1, 2); }, "ep");
  expect_error_mentions([] { RankGenerator(2, 1, 2, 1, 1, "tp-xx-dp"); }, "order");
  expect_error_mentions([] { RankGenerator(2, 1, 2, 1, 1, "tp-dp-tp"); }, "order");
  expect_error_mentions([] { RankGenerator(2, 1, 2, 2, 1, "tp-dp"); }, "order");
  expect_error_mentions([] { RankGenerator(2, 1, 2, 1, 1).get_ranks("tp-zz"); }, "token");
  expect_error_mentions([] { rank_groups({2, 2}, {true}); }, "mask");
}

// ---------------------------------------------------------------- Task 2: ParallelState

// Every split of this world into tp x pp (cp 1; and cp 2 where it divides): every group name
// listed as the generators do, and each of this rank's sub-Comms really connecting its group (an
// all-reduce of the members' world ranks adds up to the group's sum).
TEST(ParallelStateGroups, SubCommsConnectTheirGroups) {
  auto world = dtl::testing::fresh_comm();
  const int n = world->size(), me = world->rank();
  for (int tp = 1; tp <= n; ++tp)
    for (int pp = 1; tp * pp <= n; ++pp)
      for (int cp : {1, 2}) {
        if (n % (tp * pp * cp) != 0) continue;
        ParallelConfig c;
        c.tp = tp;
        c.pp = pp;
        c.cp = cp;
        ParallelState ps(*world, c);
        const std::string what = "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " cp " +
                                 std::to_string(cp) + " on " + std::to_string(n);
        const RankGenerator dense(tp, 1, n / (tp * pp * cp), pp, cp);
        EXPECT_EQ(OBSERVE(ps.groups("tp-dp-cp")), OBSERVE(dense.get_ranks("tp-dp-cp"))) << what;
        EXPECT_EQ(OBSERVE(ps.groups("pp")), OBSERVE(dense.get_ranks("pp"))) << what;
        EXPECT_EQ(OBSERVE(ps.size("dp")), n / (tp * pp * cp)) << what;
        // Each sub-Comm first (its collectives follow this run's own groups), then what it
        // showed, observed: per name whether the rank is in a group, the group, the sub-Comm's
        // size and rank, and the all-reduce of the members' world ranks.
        std::vector<std::pair<std::vector<int>, std::pair<std::vector<int>, double>>> seen;
        for (const auto& name : ParallelState::group_names()) {
          const std::vector<int> mine = ps.group_of(name);
          int size = 0, rank = -1;
          double sum = 0;
          if (!mine.empty()) {
            dtl::Comm& sub = ps.comm(name);
            size = sub.size();
            rank = sub.rank();
            torch::Tensor t = torch::full({1}, static_cast<double>(me),
                                          dtl::testing::device_options(torch::kFloat64));
            sub.all_reduce(t);
            sum = t.item<double>();
          }
          seen.push_back({{ps.has(name) ? 1 : 0, size, rank}, {mine, sum}});
        }
        seen = OBSERVE(seen);
        ASSERT_EQ(seen.size(), ParallelState::group_names().size());
        for (size_t k = 0; k < seen.size(); ++k) {
          const std::string& name = ParallelState::group_names()[k];
          const auto& flags = seen[k].first;  // has, size, rank
          const std::vector<int>& mine = seen[k].second.first;
          ASSERT_EQ(flags.size(), 3u);
          ASSERT_EQ(flags[0] != 0, !mine.empty()) << what << ", " << name;
          if (mine.empty()) continue;
          ASSERT_EQ(flags[1], static_cast<int>(mine.size())) << what << ", " << name;
          EXPECT_EQ(mine.at(static_cast<size_t>(flags[2])), me)
              << what << ", " << name << ": the sub-Comm's order is the group's";
          EXPECT_EQ(seen[k].second.second, std::accumulate(mine.begin(), mine.end(), 0.0))
              << what << ", " << name;
        }
        // Embedding groups: the first and last stage of each pipeline.
        const Groups pipelines = OBSERVE(ps.groups("pp"));
        const Groups emb = OBSERVE(ps.groups("embedding"));
        for (const auto& pipeline : pipelines) {
          ASSERT_FALSE(pipeline.empty()) << what;
          const std::vector<int> want = pp == 1 ? std::vector<int>{pipeline.front()}
                                                : std::vector<int>{pipeline.front(), pipeline.back()};
          EXPECT_NE(std::find(emb.begin(), emb.end(), want), emb.end()) << what;
        }
        EXPECT_EQ(OBSERVE(ps.coord("tp")), me % tp) << what;
        EXPECT_EQ(OBSERVE(ps.coord("pp")), me / (tp * cp * (n / (tp * pp * cp)))) << what;
        // Every coordinate is this rank's position in its group of that dimension.
        for (const char* dim : {"tp", "cp", "dp", "pp", "ep", "expert_dp"}) {
          const std::vector<int> mine = OBSERVE(ps.group_of(dim));
          const auto at = std::find(mine.begin(), mine.end(), me);
          ASSERT_NE(at, mine.end()) << what << ", " << dim;
          EXPECT_EQ(OBSERVE(ps.coord(dim)), static_cast<int>(at - mine.begin()))
              << what << ", " << dim;
        }
      }
}

TEST(ParallelStateGroups, ExpertGridComesOutOfDataParallelRanks) {
  auto world = dtl::testing::fresh_comm();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ParallelConfig c;
  c.ep = 2;  // tp 1, dp 4: experts over pairs of data-parallel ranks
  ParallelState ps(*world, c);
  EXPECT_EQ(OBSERVE(ps.groups("ep")), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(OBSERVE(ps.groups("expert_dp")), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(OBSERVE(ps.size("expert_dp")), 2);
  EXPECT_EQ(OBSERVE(ps.coord("ep")), world->rank() % 2);
  // With context parallelism the experts come out of dp x cp: cp 2, dp 2, ep 2 gives an
  // expert data-parallel size of 2 (dp x cp / ep), not dp / ep.
  ParallelConfig c2;
  c2.cp = 2;
  c2.ep = 2;
  ParallelState ps2(*world, c2);
  EXPECT_EQ(OBSERVE(ps2.groups("cp")), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(OBSERVE(ps2.groups("dp")), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(OBSERVE(ps2.groups("ep")), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(OBSERVE(ps2.groups("expert_dp")), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(OBSERVE(ps2.size("expert_dp")), 2);
}

// tp x dp training (tp 2 where the world is even) with the model on the ParallelState's tp
// Comm and gradients averaged over its dp Comm follows serial training on the global batch.
TEST(ParallelStateGroups, TrainsLikeSerialOnItsComms) {
  auto world = dtl::testing::fresh_comm();
  ParallelConfig c;
  c.tp = world->size() % 2 == 0 ? 2 : 1;
  ParallelState ps(*world, c);
  lab09_test::expect_training_follows_serial<dtl::lab09::TensorParallelGPT>(
      lab09_test::config(2), 2, ps.comm("tp"), ps.comm("dp"));
}

TEST(ParallelStateGroups, BadConfigsAreNamed) {
  auto world = dtl::testing::fresh_comm();
  const int n = world->size();
  auto make = [&](ParallelConfig c) { ParallelState ps(*world, c); };
  ParallelConfig c;
  c.tp = n + 1;
  expect_error_mentions([&] { make(c); }, "world");
  c = {};
  c.dp = n + 1;
  expect_error_mentions([&] { make(c); }, "dp");
  c = {};
  c.ep = n + 1;
  expect_error_mentions([&] { make(c); }, "ep");
  c = {};
  c.order = "tp-dp";
  c.pp = n;  // a pipeline the order does not place
  if (n > 1) expect_error_mentions([&] { make(c); }, "order");
  if (n == 4) {
    // Megatron's refusals: pp 2 not last in the order, and experts taking a data-parallel size
    // (dp x cp / ep = 1) other than the attention's (dp = 2).
    c = {};
    c.pp = 2;
    c.ep = 2;
    c.order = "tp-pp-ep-dp";
    expect_error_mentions([&] { make(c); }, "pp-last");
    // The same data-parallel size (cp 2 = ep 2), but cp before pp and ep after it: the dense
    // grid's pipelines are [0, 2] [1, 3], the expert grid's [0, 1] [2, 3].
    c = {};
    c.pp = 2;
    c.cp = 2;
    c.ep = 2;
    c.order = "tp-cp-pp-ep-dp";
    expect_error_mentions([&] { make(c); }, "pipeline");
  }
}

// ---------------------------------------------------------------- Task 3: config translation

dtl::lab19::GPTConfig model(int64_t layers = 8, int64_t heads = 8, int64_t vocab = 256, int64_t seq = 64) {
  dtl::lab19::GPTConfig m;
  m.n_layer = layers;
  m.n_head = heads;
  m.d_model = 64;
  m.vocab_size = vocab;
  m.seq_len = seq;
  return m;
}

TEST(Megatron, TranslatesEveryFlag) {
  const ParallelPlan p = observed(from_megatron_args(
      {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size=2",
       "--sequence-parallel", "--micro-batch-size", "2", "--global-batch-size", "64",
       "--num-layers-per-virtual-pipeline-stage", "2", "--use-distributed-optimizer",
       "--recompute-granularity", "selective", "--clip-grad", "0.5", "--bf16"},
      16, model()));
  EXPECT_EQ(p.world, 16);
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.pp, 2);
  EXPECT_EQ(p.cp, 1);
  EXPECT_EQ(p.dp, 4);
  EXPECT_EQ(p.virtual_stages, 2);  // 8 layers / 2 stages = 4 per stage = 2 chunks of 2
  EXPECT_TRUE(p.sequence_parallel);
  EXPECT_EQ(p.micro_batch, 2);
  EXPECT_EQ(p.global_batch, 64);
  EXPECT_EQ(p.grad_accum, 8);  // 64 / (2 x 4)
  EXPECT_EQ(p.zero_stage, 1);
  EXPECT_EQ(p.recompute, "selective");
  EXPECT_EQ(p.grad_clip, 0.5);
  EXPECT_EQ(p.precision, "bf16");
  // 12 layers over 2 stages: 6 per stage, chunks of 2 layers: 3 chunks per pipeline rank.
  const ParallelPlan v = observed(from_megatron_args(
      {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"}, 2,
      model(12)));
  EXPECT_EQ(v.virtual_stages, 3);
}

TEST(Megatron, DefaultsAreMegatrons) {
  const ParallelPlan p =
      observed(from_megatron_args({"--micro-batch-size", "4", "--sequence-parallel"}, 8, model()));
  EXPECT_EQ(p.dp, 8);
  EXPECT_EQ(p.global_batch, 32) << "global batch defaults to micro x dp";
  EXPECT_EQ(p.grad_accum, 1);
  EXPECT_FALSE(p.sequence_parallel) << "Megatron switches sequence parallelism off at tp 1";
  EXPECT_EQ(p.grad_clip, 1.0);
  EXPECT_EQ(p.precision, "fp32");
  EXPECT_EQ(p.recompute, "none");
  EXPECT_EQ(p.zero_stage, 0);
  EXPECT_EQ(p.virtual_stages, 1);
  // Without context parallelism the sequence may have any length (Megatron checks 2 x cp only
  // for cp > 1).
  EXPECT_EQ(OBSERVE(from_megatron_args({}, 2, model(8, 8, 256, 63)).dp), 2);
}

TEST(Megatron, BadFlagsAreNamed) {
  const auto m = model();
  expect_error_mentions([&] { from_megatron_args({"--tensor-model-parallel-size", "3"}, 12, m); },
                        "--tensor-model-parallel-size");  // 8 heads
  expect_error_mentions([&] { from_megatron_args({"--tensor-model-parallel-size", "4"}, 6, m); },
                        "--tensor-model-parallel-size");  // world 6
  expect_error_mentions([&] { from_megatron_args({"--pipeline-model-parallel-size", "3"}, 3, m); },
                        "--pipeline-model-parallel-size");
  expect_error_mentions([&] {
    from_megatron_args({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"}, 2, m);
  }, "--num-layers-per-virtual-pipeline-stage");
  expect_error_mentions([&] { from_megatron_args({"--context-parallel-size", "3"}, 3, m); },
                        "--context-parallel-size");
  // 24 tokens over cp 8: divisible by 8, not by the 2 x 8 chunks of load-balanced attention.
  expect_error_mentions([&] { from_megatron_args({"--context-parallel-size", "8"}, 8, model(8, 8, 256, 24)); },
                        "--context-parallel-size");
  expect_error_mentions([&] { from_megatron_args({"--micro-batch-size", "3", "--global-batch-size", "10"}, 2, m); },
                        "--global-batch-size");
  expect_error_mentions([&] { from_megatron_args({"--bf16", "--fp16"}, 1, m); }, "--bf16");
  expect_error_mentions([&] { from_megatron_args({"--tensor-parallel-size", "2"}, 2, m); },
                        "--tensor-parallel-size");
  expect_error_mentions([&] { from_megatron_args({"--micro-batch-size"}, 2, m); }, "--micro-batch-size");
}

TEST(DeepSpeed, BatchArithmetic) {
  const auto m = model();
  // world 8, tp 2, pp 1: dp 4.
  auto p = observed(from_deepspeed_config(
      R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2})", 8, 2, 1, m));
  EXPECT_EQ(p.grad_accum, 8);
  p = observed(from_deepspeed_config(
      R"({"train_batch_size": 64, "gradient_accumulation_steps": 4})", 8, 2, 1, m));
  EXPECT_EQ(p.micro_batch, 4);
  p = observed(from_deepspeed_config(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 8, 2, 1, m));
  EXPECT_EQ(p.global_batch, 24);
  p = observed(from_deepspeed_config(R"({"train_batch_size": 32})", 8, 2, 1, m));
  EXPECT_EQ(p.micro_batch, 8);
  EXPECT_EQ(p.grad_accum, 1);
  expect_error_mentions([&] {
    from_deepspeed_config(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 8, 2, 1, m);
  }, "train_batch_size");
}

// The same run written for both frameworks: one plan.
TEST(DeepSpeed, SamePlanAsMegatron) {
  const auto m = model();
  const ParallelPlan megatron = observed(
      from_megatron_args({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                          "2", "--micro-batch-size", "2", "--global-batch-size", "32",
                          "--use-distributed-optimizer", "--bf16"},
                         8, m));
  const ParallelPlan deepspeed = observed(from_deepspeed_config(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
          "zero_optimization": {"stage": 1}, "bf16": {"enabled": true}})",
      8, 2, 2, m));
  EXPECT_EQ(megatron, deepspeed) << megatron.to_string() << "\n" << deepspeed.to_string();
}

TEST(DeepSpeed, BadConfigsAreNamed) {
  const auto m = model();
  expect_error_mentions([&] { from_deepspeed_config("{oops", 8, 2, 1, m); }, "json");
  expect_error_mentions([&] { from_deepspeed_config(R"({"train_batch_size": 8})", 8, 3, 1, m); }, "tp");
  expect_error_mentions([&] { from_deepspeed_config(R"({"train_batch_size": 8})", 6, 1, 3, m); }, "pp");
  expect_error_mentions([&] {
    from_deepspeed_config(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})", 8, 1, 1, m);
  }, "zero_optimization.stage");
  expect_error_mentions([&] {
    from_deepspeed_config(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "fp16": {"enabled": true}})", 8, 1, 1, m);
  }, "bf16");
}

}  // namespace
}  // namespace lab19_test
