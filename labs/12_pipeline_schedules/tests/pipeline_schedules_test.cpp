// Public tests of lab 12. Run: ./lab test 12   (world sizes 1-4; the pipeline = the world)
//
// Schedules and the simulator are pure functions (checked on every rank alike): the orders
// Megatron-LM's schedules.py produces, the bubble formula of Narayanan et al. 2021, the
// in-flight counts, deadlocks named. The executor trains the course GPT with real
// communication and must match serial training under every schedule.
#include "pipeline_schedules.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dtl/harness/checks.hpp"  // defines: expect_error_mentions, error_of
#include "tests/schedules_test_util.hpp"

namespace dtl::lab12 {
namespace {

using namespace lab12_test;  // NOLINT
using dtl::testing::expect_error_mentions;

// ---------------------------------------------------------------- Task 1

TEST(Schedules, GPipeRunsAllForwardsThenAllBackwards) {
  const std::vector<std::string> s = observed(gpipe(2, 3), 1);
  ASSERT_EQ(s.size(), 2u);
  for (const auto& actions : s) EXPECT_EQ(actions, "F0 F1 F2 B0 B1 B2");
}

TEST(Schedules, OneFOneBWarmsUpThenAlternates) {
  const std::vector<std::string> s = observed(one_f_one_b(3, 4), 1);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], "F0 F1 F2 B0 F3 B1 B2 B3") << "rank 0: p - 1 = 2 warm-up forwards";
  EXPECT_EQ(s[1], "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(s[2], "F0 B0 F1 B1 F2 B2 F3 B3") << "the last rank: no warm-up";
  EXPECT_EQ(observed(one_f_one_b(4, 2), 1).at(0), "F0 F1 B0 B1") << "warm-up capped at m";
}

TEST(Schedules, InterleavedFollowsMegatronsOrder) {
  const std::vector<std::string> s = observed(interleaved(2, 4, 2), 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0],
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(s[1],
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // v = 1 is 1F1B.
  const std::vector<std::string> a = observed(interleaved(3, 5, 1), 1);
  const std::vector<std::string> b = observed(one_f_one_b(3, 5), 1);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(a.at(r), b.at(r)) << "rank " << r;
}

TEST(Schedules, EveryRankRunsEveryActionOnce) {
  for (int p : {1, 2, 3, 4})
    for (int64_t m : {int64_t{p}, int64_t{2 * p}, int64_t{4 * p}})
      for (int v : {1, 2, 3}) {
        const std::vector<std::string> s =
            observed(v == 1 ? one_f_one_b(p, m) : interleaved(p, m, v), v);
        ASSERT_EQ(static_cast<int>(s.size()), p);
        for (const std::string& actions : s) {
          std::map<std::string, int> count;  // of each action's describe(), the words of the text
          std::istringstream words(actions);
          for (std::string a; words >> a;) ++count[a];
          EXPECT_EQ(static_cast<int64_t>(count.size()), 2 * m * v) << p << " " << m << " " << v;
          for (const auto& [name, n] : count) EXPECT_EQ(n, 1) << name;
        }
      }
}

TEST(Schedules, RejectBadSizes) {
  expect_error_mentions([] { gpipe(0, 4); }, "p=0");
  expect_error_mentions([] { one_f_one_b(2, 0); }, "m=0");
  expect_error_mentions([] { interleaved(2, 4, 0); }, "v=0");
  expect_error_mentions([] { interleaved(3, 4, 2); }, "multiple");
}

// ---------------------------------------------------------------- Task 2

TEST(Simulate, BubbleEqualsTheFormula) {
  const Costs costs{1.0, 2.0, 0.0};
  for (int p : {1, 2, 3, 4, 8})
    for (int64_t m : {int64_t{p}, int64_t{2 * p}, int64_t{3 * p}, int64_t{5}}) {
      EXPECT_NEAR(OBSERVE(simulate(gpipe(p, m), 1, costs).bubble), bubble_formula(p, m, 1), 1e-12)
          << "GPipe p=" << p << " m=" << m;
      EXPECT_NEAR(OBSERVE(simulate(one_f_one_b(p, m), 1, costs).bubble), bubble_formula(p, m, 1),
                  1e-12)
          << "1F1B p=" << p << " m=" << m;
      if (m % p != 0) continue;
      for (int v : {2, 3, 4})
        EXPECT_NEAR(OBSERVE(simulate(interleaved(p, m, v), v, costs).bubble),
                    bubble_formula(p, m, v), 1e-12)
            << "interleaved p=" << p << " m=" << m << " v=" << v;
    }
  // Makespan, in whole-stage units: (m + p - 1)(f + b) for GPipe and 1F1B; (v m + p - 1)(f + b)
  // / v interleaved (a chunk's forward costs f / v: the bubble alone cannot tell, it is the
  // same ratio when every action costs v times too much).
  EXPECT_NEAR(OBSERVE(simulate(gpipe(4, 8), 1, costs).makespan), 11 * 3.0, 1e-12);
  EXPECT_NEAR(OBSERVE(simulate(one_f_one_b(4, 8), 1, costs).makespan), 11 * 3.0, 1e-12);
  EXPECT_NEAR(OBSERVE(simulate(interleaved(4, 8, 2), 2, costs).makespan), 19 * 3.0 / 2, 1e-12);
  EXPECT_NEAR(OBSERVE(simulate(interleaved(2, 4, 4), 4, costs).makespan), 17 * 3.0 / 4, 1e-12);
  EXPECT_NEAR(OBSERVE(simulate(interleaved(4, 8, 2), 2, costs).busy).at(0), 8 * 3.0, 1e-12)
      << "a rank's busy time is m (f + b) whatever v";
}

TEST(Simulate, InFlightActivations) {
  const Costs costs;
  for (int p : {2, 3, 4})
    for (int64_t m : {int64_t{p}, int64_t{3 * p}}) {
      const std::vector<int64_t> g = OBSERVE(simulate(gpipe(p, m), 1, costs).peak_in_flight),
                                 f = OBSERVE(simulate(one_f_one_b(p, m), 1, costs).peak_in_flight);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(g.at(r), m) << "GPipe holds every micro-batch, rank " << r;
        EXPECT_EQ(f.at(r), std::min<int64_t>(p - r, m)) << "1F1B, rank " << r;
      }
      const int v = 2;
      const std::vector<int64_t> i =
          OBSERVE(simulate(interleaved(p, m, v), v, costs).peak_in_flight);
      for (int r = 0; r < p; ++r) {
        const int64_t warmup = m == p ? v * m : (p - r - 1) * 2 + (v - 1) * p;
        EXPECT_EQ(i.at(r), std::min<int64_t>(warmup + 1, v * m)) << "rank " << r;
      }
    }
}

// Latency on each hop: GPipe pays it 2 (p - 1) times (fill and drain); 1F1B, whose steady state
// waits on every message, 16 times at p = 4, m = 8 (the note's table: 33 -> 34.6 at 0.1, 41 at
// 0.5).
TEST(Simulate, PointToPointLatency) {
  const int p = 4;
  const double l = 0.1;
  const double g0 = OBSERVE(simulate(gpipe(p, 8), 1, {1, 2, 0}).makespan);
  EXPECT_NEAR(OBSERVE(simulate(gpipe(p, 8), 1, {1, 2, l}).makespan) - g0, 2 * (p - 1) * l, 1e-9);
  const double f0 = OBSERVE(simulate(one_f_one_b(p, 8), 1, {1, 2, 0}).makespan);
  EXPECT_NEAR(OBSERVE(simulate(one_f_one_b(p, 8), 1, {1, 2, l}).makespan) - f0, 16 * l, 1e-9);
  EXPECT_NEAR(OBSERVE(simulate(one_f_one_b(p, 8), 1, {1, 2, 0.5}).makespan), 41.0, 1e-9);
}

TEST(Simulate, NamesTheDeadlock) {
  // Rank 0 waits for rank 1's backward of micro-batch 0; rank 1 starts with micro-batch 1,
  // whose forward rank 0 has not run yet.
  const Schedule cycle = {parse("F0 B0 F1 B1"), parse("F1 B1 F0 B0")};
  const std::string msg = dtl::testing::error_of([&] { simulate(cycle, 1, Costs{}); });
  for (const char* part : {"deadlock", "rank 0 waits at B0", "rank 1 waits at F1"})
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  // A backward before its own forward.
  expect_error_mentions([] { simulate({parse("B0 F0")}, 1, Costs{}); }, "deadlock");
}

TEST(Simulate, RejectsIncompleteSchedules) {
  Schedule s = one_f_one_b(3, 4);
  s[2].erase(s[2].begin() + 5);  // rank 2: F0 B0 F1 B1 F2 [B2] F3 B3
  const std::string msg = dtl::testing::error_of([&] { simulate(s, 1, Costs{}); });
  EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("B2"), std::string::npos) << msg;
  s = one_f_one_b(2, 2);
  s[0].push_back(s[0][0]);
  expect_error_mentions([&] { simulate(s, 1, Costs{}); }, "F0");
  // m is the largest micro-batch index + 1 (of any rank), not rank 0's count of forwards: a
  // forward missing on rank 0 is named as missing, not as the others being out of range.
  s = one_f_one_b(2, 3);
  s[0].erase(s[0].begin());  // rank 0: [F0] F1 B0 F2 B1 B2
  const std::string missing = dtl::testing::error_of([&] { simulate(s, 1, Costs{}); });
  EXPECT_NE(missing.find("rank 0"), std::string::npos) << missing;
  EXPECT_NE(missing.find("F0"), std::string::npos) << missing;
}

// ---------------------------------------------------------------- Task 3

TEST(Execute, EveryScheduleTrainsLikeSerial) {
  const int p = dtl::world().size();
  const GPTConfig cfg = model6();
  const int64_t m = 2 * p, rows = 2 * m;
  // Fixed orders (fixed_schedule), not your generators: Task 3 is graded on its own.
  expect_execution_trains_like_serial(cfg, fixed_schedule("GPipe", p), 1, rows, 2, "GPipe");
  expect_execution_trains_like_serial(cfg, fixed_schedule("1F1B", p), 1, rows, 2, "1F1B");
  expect_execution_trains_like_serial(cfg, fixed_schedule("interleaved", p), 2, rows, 2,
                                      "interleaved v=2");
}

// SGD's step is the gradient itself: each micro-batch's loss must be scaled by 1/m (AdamW with
// a small eps divides a constant factor out and would not notice).
TEST(Execute, GradientsAreTheMeanOverMicroBatchesWithSgd) {
  const int p = dtl::world().size();
  const int64_t m = 2 * p;
  expect_execution_trains_like_serial(model6(), fixed_schedule("1F1B", p), 1, 2 * m, 2,
                                      "1F1B with SGD", sgd);
  expect_execution_trains_like_serial(model6(false), fixed_schedule("interleaved", p), 2, 2 * m,
                                      1, "interleaved v=2 with SGD", sgd);
}

// Activations and gradients of 2 x 64 x 128 float32 = 64 KiB, above MPI's eager limit: a send
// completes only once its receiver has posted the receive. An executor that waits for each send
// before going on deadlocks 1F1B here (the last rank sends B0's gradient while its neighbour
// sends F1's activation); small messages would hide it.
TEST(Execute, LargeMessagesDoNotWaitForTheReceiver) {
  const int p = dtl::world().size();
  const int64_t m = 2 * p;
  GPTConfig cfg = GPTConfig::tiny();
  cfg.n_layer = 2;
  cfg.d_model = 128;
  cfg.seq_len = 64;
  expect_execution_trains_like_serial(cfg, fixed_schedule("1F1B", p), 1, 2 * m, 1,
                                      "1F1B, 64 KiB messages");
  expect_execution_trains_like_serial(cfg, fixed_schedule("GPipe", p), 1, 2 * m, 1,
                                      "GPipe, 64 KiB messages");
}

TEST(Execute, InFlightAndTrafficMatchTheSchedule) {
  dtl::Comm& world = dtl::world();
  const int p = world.size(), v = 2;
  const GPTConfig cfg = model6();
  const int64_t m = 2 * p;
  const Schedule s = fixed_schedule("interleaved", p);
  ModelChunks chunks(cfg, world, v, even_parts(cfg, p * v));
  PipelineLinks links(world);
  auto opt = dtl::make_adamw(chunks.module(), adamw());
  const StepResult res =
      execute(s, chunks, links, *opt, batch(cfg, 2 * m, 0).to(dtl::Runtime::get().device()));
  EXPECT_EQ(OBSERVE(res.peak_in_flight), peak_in_flight(s[world.rank()]));
  std::vector<std::string> ran;  // the actions of the timeline, in the order run
  for (const ActionTiming& t : res.timeline) ran.push_back(describe(t.action, v));
  ran = OBSERVE(ran);
  ASSERT_EQ(ran.size(), s[world.rank()].size());
  for (size_t i = 0; i < ran.size(); ++i)
    EXPECT_EQ(ran[i], describe(s[world.rank()][i], v)) << "in order";
  // Each (micro, chunk) crosses every rank boundary once each way: an activation to the next
  // rank unless this is the last virtual stage, a gradient back unless it is the first.
  int64_t sends = 0, recvs = 0;
  for (int c = 0; c < v; ++c) {
    if (!chunks.is_last(c)) sends += m;
    if (!chunks.is_first(c)) recvs += m;
  }
  if (p == 1) return;  // chunks hand over in memory: no links
  // Each link carries one kind of op, one way (p = 2: the two ranks' links are distinct Comms).
  auto expect_only = [](dtl::Comm& link, OpType op, int64_t count) {
    const dtl::CommStats st = MEASURED(link.stats());
    EXPECT_EQ(st[op].count, count) << link.name();
    EXPECT_EQ(st.total_count(), count) << link.name() << ": only " << dtl::to_string(op);
  };
  expect_only(links.activations_to_next(), OpType::Send, sends);
  expect_only(links.activations_from_prev(), OpType::Recv, recvs);
  expect_only(links.grads_to_prev(), OpType::Send, recvs);
  expect_only(links.grads_from_next(), OpType::Recv, sends);
}

TEST(Execute, RejectsABadScheduleOrBatch) {
  dtl::Comm& world = dtl::world();
  const int p = world.size();
  const GPTConfig cfg = model6();
  ModelChunks chunks(cfg, world, 1, even_parts(cfg, p));
  PipelineLinks links(world);
  auto opt = dtl::make_adamw(chunks.module(), adamw());
  const torch::Tensor global = batch(cfg, 6, 0).to(dtl::Runtime::get().device());
  expect_error_mentions([&] { execute(fixed_schedule("GPipe", p + 1), chunks, links, *opt, global); },
                        "ranks");
  const Schedule gpipe4(static_cast<size_t>(p), parse("F0 F1 F2 F3 B0 B1 B2 B3"));
  expect_error_mentions([&] { execute(gpipe4, chunks, links, *opt, global); },
                        "micro");  // 6 rows, m = 4
  if (p > 1) {
    // The simulator accepts this one (no dependency cycle), but rank 1 receives micro-batch 1
    // before micro-batch 0 while rank 0 sends 0 first: the link would pair the wrong tensors.
    Schedule swapped(static_cast<size_t>(p), parse("F0 F1 B0 B1"));
    std::swap(swapped[1][0], swapped[1][1]);
    expect_error_mentions([&] { execute(swapped, chunks, links, *opt, global); }, "order");
  }
}

}  // namespace
}  // namespace dtl::lab12
