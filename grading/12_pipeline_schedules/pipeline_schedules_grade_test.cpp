// Grading tests of lab 12 (hidden from students until the due date). Same oracles as the public
// tests, where those do not look: larger pipelines and other cost ratios, fewer micro-batches
// than ranks, deadlocks across three ranks, tied and untied heads, three chunks per rank, and
// several training steps.
#include "pipeline_schedules.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "dtl/harness/checks.hpp"
#include "tests/schedules_test_util.hpp"

namespace dtl::lab12 {
namespace {

using namespace lab12_test;  // NOLINT

// The formula holds for any ratio of backward to forward cost, at 8 and 16 ranks.
TEST(GradeSimulate, LargerPipelinesOtherCosts) {
  const Costs costs{1.0, 3.0, 0.0};
  for (int p : {8, 16})
    for (int64_t m : {int64_t{p}, int64_t{4 * p}})
      for (int v : {1, 2, 4}) {
        const Schedule s = v == 1 ? one_f_one_b(p, m) : interleaved(p, m, v);
        EXPECT_NEAR(OBSERVE(simulate(s, v, costs).bubble), bubble_formula(p, m, v), 1e-12)
            << "p=" << p << " m=" << m << " v=" << v;
      }
  EXPECT_NEAR(OBSERVE(simulate(gpipe(16, 64), 1, costs).bubble), bubble_formula(16, 64, 1), 1e-12);
}

// Fewer micro-batches than ranks: the warm-up is capped, the bubble is still the formula.
TEST(GradeSimulate, FewerMicroBatchesThanRanks) {
  for (int64_t m : {1, 2, 3}) {
    const SimResult r = simulate(one_f_one_b(4, m), 1, Costs{});
    EXPECT_NEAR(OBSERVE(r.bubble), bubble_formula(4, m, 1), 1e-12) << "m=" << m;
    EXPECT_EQ(OBSERVE(r.peak_in_flight).at(0), m);
    EXPECT_EQ(observed(one_f_one_b(4, m), 1).at(0), observed(gpipe(4, m), 1).at(0))
        << "with m <= p - 1 rank 0 only warms up and drains";
  }
  EXPECT_EQ(observed(interleaved(2, 2, 2), 2).at(1), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0")
      << "m == p: all warm-up";
}

// A wait cycle through three ranks is reported with each of them; a repeated action by name.
TEST(GradeSimulate, DeadlocksAcrossThreeRanks) {
  Schedule s = one_f_one_b(3, 3);
  s[2] = parse("F1 B1 F0 B0 F2 B2");  // the last rank wants micro-batch 1 first
  s[0] = parse("F0 B0 F1 F2 B1 B2");  // rank 0 waits for B0 before sending F1
  const std::string msg = dtl::testing::error_of([&] { simulate(s, 1, Costs{}); });
  for (const char* part : {"deadlock", "rank 0", "rank 1", "rank 2"})
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  Schedule r = interleaved(2, 2, 2);
  r[1][3] = r[1][2];  // F0.1 twice, F1.1 missing: either may be named
  const std::string again = dtl::testing::error_of([&] { simulate(r, 2, Costs{}); });
  EXPECT_NE(again.find("rank 1"), std::string::npos) << again;
  EXPECT_TRUE(again.find("F0.1") != std::string::npos || again.find("F1.1") != std::string::npos)
      << again;
}

// 1F1B with m = p + 1 (Megatron's order), fixed: the executor is graded apart from Task 1.
Schedule fixed_one_f_one_b_m_p_plus_1(int p) {
    if (p == 1) return {parse("F0 B0 F1 B1")};
    if (p == 2) return {parse("F0 F1 B0 F2 B1 B2"),
                        parse("F0 B0 F1 B1 F2 B2")};
    if (p == 3) return {parse("F0 F1 F2 B0 F3 B1 B2 B3"),
                        parse("F0 F1 B0 F2 B1 F3 B2 B3"),
                        parse("F0 B0 F1 B1 F2 B2 F3 B3")};
    if (p == 4) return {parse("F0 F1 F2 F3 B0 F4 B1 B2 B3 B4"),
                        parse("F0 F1 F2 B0 F3 B1 F4 B2 B3 B4"),
                        parse("F0 F1 B0 F2 B1 F3 B2 F4 B3 B4"),
                        parse("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4")};
  ADD_FAILURE() << "p=" << p;
  return {};
}

// Interleaved with v = 3 and m = p: all warm-up, forwards k = 0..3p-1 are micro-batch k % p of
// chunk k / p, backwards the same micro-batches of chunk 2 - k / p.
Schedule fixed_interleaved_v3_m_p(int p) {
  std::string order;
  for (const char* kind : {"F", "B"})
    for (int k = 0; k < 3 * p; ++k) {
      const int chunk = kind[0] == 'F' ? k / p : 2 - k / p;
      order += (order.empty() ? "" : " ") + (kind + std::to_string(k % p)) + "." + std::to_string(chunk);
    }
  return Schedule(static_cast<size_t>(p), parse(order));
}

// Three steps of 1F1B with a tied and with an untied head.
TEST(GradeExecute, TiedAndUntiedHeadsOverSteps) {
  const int p = dtl::world().size();
  for (bool tied : {true, false})
    expect_execution_trains_like_serial(model6(tied), fixed_one_f_one_b_m_p_plus_1(p), 1, 2 * (p + 1), 3,
                                        tied ? "1F1B, tied" : "1F1B, untied");
}

// Three chunks per rank (a deeper model), and GPipe with m = 1.
TEST(GradeExecute, ThreeChunksAndOneMicroBatch) {
  const int p = dtl::world().size();
  GPTConfig cfg = model6();
  cfg.n_layer = 10;  // 12 units: up to 4 ranks x 3 chunks
  expect_execution_trains_like_serial(cfg, fixed_interleaved_v3_m_p(p), 3, 2 * p, 2, "interleaved v=3");
  expect_execution_trains_like_serial(model6(), Schedule(static_cast<size_t>(p), parse("F0 B0")), 1, 3, 1, "GPipe, m = 1");
}

}  // namespace
}  // namespace dtl::lab12
