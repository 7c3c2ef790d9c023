// Grading-only tests of lab 11 (hidden until the due date; ./lab grade 11 runs them).
//
// Beyond the public tests: larger random partitions with real-valued and zero costs, non-finite
// costs, a head-heavy model whose balanced cut differs from the even one, micro-batches of one
// row, and backwards in forward order (SGD, sensitive to the 1/m scaling, is a public test). (The given constructor's checks are the course's code, not graded.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"
#include "pipeline.hpp"
#include "tests/pipeline_test_util.hpp"

namespace dtl::lab11 {
namespace {

using namespace lab11_test;  // NOLINT
using ::testing::HasSubstr;

TEST(GradePartition, RealValuedCostsAgainstBruteForce) {
  std::mt19937 rng(2024);
  std::uniform_real_distribution<double> u(0.0, 5.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 10);
    std::vector<double> costs(static_cast<size_t>(n));
    for (auto& c : costs) c = (rng() % 5 == 0) ? 0.0 : u(rng);
    for (int p = 1; p <= n; ++p) {
      const auto parts = observed(partition(costs, p));
      expect_valid_partition(parts, n, p);
      EXPECT_NEAR(max_stage_cost(costs, parts), brute_force_best(costs, p), 1e-9)
          << ::testing::PrintToString(costs) << ", " << p << " stages";
    }
  }
}

TEST(GradePartition, EdgeCases) {
  expect_valid_partition(observed(partition({0, 0, 0}, 3)), 3, 3);  // all free: one unit each
  expect_valid_partition(observed(partition({7}, 1)), 1, 1);
  const auto parts = observed(partition({1, 100, 1, 1, 1, 1}, 2));
  EXPECT_DOUBLE_EQ(max_stage_cost({1, 100, 1, 1, 1, 1}, parts), 101.0);
  EXPECT_THAT(testing::error_of([] { partition({1, std::nan(""), 1}, 2); }), HasSubstr("cost"));
  EXPECT_THAT(testing::error_of([] {
                partition({1, std::numeric_limits<double>::infinity()}, 1);
              }),
              HasSubstr("cost"));
  EXPECT_THAT(testing::error_of([] { partition({}, 1); }), HasSubstr("more stages than units"));
  EXPECT_THAT(testing::error_of([] { partition({1, 2}, -1); }), HasSubstr("stages"));
}

TEST(GradeImbalance, OfTheOptimalCutAndInvalidParts) {
  const std::vector<double> costs = {3, 1, 1, 1, 2, 2};
  const auto parts = partition(costs, 3);
  EXPECT_NEAR(OBSERVE(imbalance(costs, parts)), brute_force_best(costs, 3) / (10.0 / 3.0), 1e-12);
  EXPECT_THAT(testing::error_of([&] {
                imbalance(costs, {{0, 3}, {3, 5}});
              }),
              HasSubstr("partition"));  // misses the last unit
  EXPECT_THAT(testing::error_of([&] {
                imbalance(costs, {{0, 3}, {3, 3}, {3, 6}});
              }),
              HasSubstr("partition"));  // an empty stage
  EXPECT_THAT(testing::error_of([&] { imbalance(costs, {}); }), HasSubstr("partition"));
}

TEST(GradePipelineStage, BackwardsInForwardOrderGiveTheSameGradients) {
  const GPTConfig cfg = tiny4();
  const torch::Tensor global = batch(cfg, 6, 4);
  const auto expected = serial_gradients(cfg, global);
  PipelineStage stage(cfg, dtl::world(), even_parts(cfg, dtl::world().size()));
  for (int64_t k = 0; k < 3; ++k) stage.forward(global.narrow(0, 2 * k, 2));
  for (int64_t k = 0; k < 3; ++k) stage.backward(k, 1.0 / 3);  // oldest first
  if (Comm* group = stage.embedding_group()) sum_embedding_grad(stage, *group);
  expect_named_close(stage, expected, true, 1e-4, 1e-6, "backwards in forward order");
  stage.finish_step();
}

TEST(GradeFillDrain, MicroBatchesOfOneRow) {
  expect_training_matches_serial(tiny4(), 4, 4, 2, even_parts(tiny4(), dtl::world().size()));
}

TEST(GradeFillDrain, HeadHeavyModelWithTheBalancedCut) {
  GPTConfig cfg = tiny4();
  cfg.n_layer = 5;
  cfg.vocab_size = 512;  // the head now costs more than a block
  const auto parts = partition(unit_costs(cfg), dtl::world().size());
  expect_training_matches_serial(cfg, 6, 2, 2, parts);
}

}  // namespace
}  // namespace dtl::lab11
