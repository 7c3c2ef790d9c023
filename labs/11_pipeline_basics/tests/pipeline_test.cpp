// Public tests of lab 11. Run: ./lab test 11   (world sizes 1, 2, 3 and 4: one stage per rank)
//
// The oracles: brute force for the partition (every contiguous cut of a few units), and serial
// single-process training for the pipeline: the stages' parameters, named as in the serial GPT,
// must match the serial model's after the same steps on the same global batch.
#include "pipeline.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/harness/checks.hpp"  // defines: serial, tensors_close, error_of, DTL_EXPECT_CLOSE
#include "dtl/optim.hpp"           // defines: OptimConfig, make_adamw
#include "dtl/runtime.hpp"         // defines: world()
#include "dtl/split.hpp"           // defines: split_range
#include "dtl/train.hpp"           // defines: train_step
#include "tests/pipeline_test_util.hpp"

namespace dtl::lab11 {
namespace {

using namespace lab11_test;  // NOLINT: even_parts, brute_force_best, serial_params, ...

// ---------------------------------------------------------------- Task 1

TEST(Partition, HandoutExample) {
  // Two cheap units, one heavy, two cheap: the heavy one alone bounds any 3-way cut from below.
  const std::vector<double> costs = {1, 1, 6, 1, 1};
  const auto parts = observed(partition(costs, 3));
  expect_valid_partition(parts, 5, 3);
  EXPECT_DOUBLE_EQ(max_stage_cost(costs, parts), 6.0);
}

TEST(Partition, OptimalAgainstBruteForce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8);
    std::vector<double> costs(static_cast<size_t>(n));
    for (auto& c : costs) c = static_cast<double>(rng() % 10);  // zeros included
    for (int p = 1; p <= n; ++p) {
      const auto parts = observed(partition(costs, p));
      expect_valid_partition(parts, n, p);
      EXPECT_DOUBLE_EQ(max_stage_cost(costs, parts), brute_force_best(costs, p))
          << "costs " << ::testing::PrintToString(costs) << ", " << p << " stages";
    }
  }
}

TEST(Partition, RejectsBadInput) {
  using ::testing::HasSubstr;
  EXPECT_THAT(testing::error_of([] { partition({1, 2, 3}, 0); }), HasSubstr("stages"));
  EXPECT_THAT(testing::error_of([] {
                partition({1, 2, 3}, 4);
              }),
              HasSubstr("more stages than units"));
  EXPECT_THAT(testing::error_of([] { partition({1, -2, 3}, 2); }), HasSubstr("cost"));
}

TEST(Imbalance, MaxOverMean) {
  EXPECT_DOUBLE_EQ(OBSERVE(imbalance({1, 1, 1, 1}, {{0, 2}, {2, 4}})), 1.0);
  EXPECT_DOUBLE_EQ(OBSERVE(imbalance({4, 1, 1}, {{0, 1}, {1, 3}})), 4.0 / 3.0);
  EXPECT_DOUBLE_EQ(OBSERVE(imbalance({1, 2, 3, 4}, {{0, 4}})), 1.0);
  EXPECT_THAT(testing::error_of([] {
                imbalance({1, 1, 1}, {{0, 1}, {2, 3}});
              }),
              ::testing::HasSubstr("partition"));
}

// ---------------------------------------------------------------- Task 2

// Forward and backward of m micro-batches by hand; the gradients must be those of the serial
// model's mean loss over the global batch.
void expect_stage_gradients(const GPTConfig& cfg, int64_t rows, int64_t m) {
  Comm& comm = dtl::world();
  const torch::Tensor global = batch(cfg, rows, 0);
  const auto expected = serial_gradients(cfg, global);
  PipelineStage stage(cfg, comm, even_parts(cfg, comm.size()));
  const int64_t mb = rows / m;
  const bool last = OBSERVE(stage.is_last());
  std::vector<double> losses;
  for (int64_t k = 0; k < m; ++k) {
    torch::Tensor loss = stage.forward(global.narrow(0, k * mb, mb));
    EXPECT_EQ(OBSERVE(loss.defined()), last) << "forward returns the loss on the last stage only";
    if (last) losses.push_back(loss.item<double>());
  }
  losses = OBSERVE(losses);
  EXPECT_EQ(OBSERVE(stage.in_flight()), m);
  for (int64_t k = m - 1; k >= 0; --k) stage.backward(k, 1.0 / static_cast<double>(m));
  EXPECT_EQ(OBSERVE(stage.in_flight()), 0);
  EXPECT_EQ(OBSERVE(stage.peak_in_flight()), m);
  if (Comm* group = stage.embedding_group()) sum_embedding_grad(stage, *group);
  expect_named_close(stage, expected, /*grads=*/true, 1e-4, 1e-6, where(cfg, m));
  if (last) {
    for (int64_t k = 0; k < m; ++k) {
      const double serial_loss = testing::serial(1, [&] {
        model::GPT full(cfg);
        return full->loss(global.narrow(0, k * mb, mb)).item<double>();
      });
      EXPECT_NEAR(losses.at(static_cast<size_t>(k)), serial_loss, 1e-5) << "micro-batch " << k;
    }
  }
  stage.finish_step();
}

TEST(PipelineStage, GradientsEqualSerialTiedHead) {
  for (int64_t m : {1, 2, 4}) expect_stage_gradients(tiny4(), 8, m);
}

TEST(PipelineStage, GradientsEqualSerialUntiedHead) {
  GPTConfig cfg = tiny4();
  cfg.tied_head = false;
  expect_stage_gradients(cfg, 6, 3);
}

TEST(PipelineStage, SendsOneActivationAndOneGradientPerBoundaryAndMicroBatch) {
  const GPTConfig cfg = tiny4();
  auto comm = dtl::world().dup();
  PipelineStage stage(cfg, *comm, even_parts(cfg, comm->size()));
  const int64_t m = 4, mb = 2;
  const torch::Tensor global = batch(cfg, m * mb, 1);
  const auto before = MEASURED(comm->stats());
  for (int64_t k = 0; k < m; ++k) stage.forward(global.narrow(0, k * mb, mb));
  for (int64_t k = m - 1; k >= 0; --k) stage.backward(k, 1.0 / m);
  const auto after = MEASURED(comm->stats());
  const int64_t boundaries =
      (OBSERVE(stage.is_first()) ? 0 : 1) + (OBSERVE(stage.is_last()) ? 0 : 1);
  const int64_t sends = after[OpType::Send].count - before[OpType::Send].count;
  const int64_t recvs = after[OpType::Recv].count - before[OpType::Recv].count;
  EXPECT_EQ(sends, m * boundaries)
      << "one activation forward and one gradient back per micro-batch";
  EXPECT_EQ(recvs, m * boundaries);
  const int64_t activation_bytes = mb * cfg.seq_len * cfg.d_model * 4;
  EXPECT_EQ(after[OpType::Send].bytes - before[OpType::Send].bytes, sends * activation_bytes)
      << "every message is one [mb, T, d] float32 activation or its gradient";
  stage.finish_step();
}

TEST(PipelineStage, TracksMicroBatchesInFlight) {
  const GPTConfig cfg = tiny4();
  PipelineStage stage(cfg, dtl::world(), even_parts(cfg, dtl::world().size()));
  const torch::Tensor global = batch(cfg, 4, 2);
  stage.forward(global.narrow(0, 0, 2));
  stage.forward(global.narrow(0, 2, 2));
  EXPECT_EQ(OBSERVE(stage.in_flight()), 2);
  EXPECT_THAT(testing::error_of([&] { stage.backward(5, 1.0); }), ::testing::HasSubstr("micro"));
  EXPECT_THAT(testing::error_of([&] { stage.finish_step(); }), ::testing::HasSubstr("in flight"));
  stage.backward(1, 0.5);
  stage.backward(0, 0.5);
  EXPECT_EQ(OBSERVE(stage.in_flight()), 0);
  stage.finish_step();
  EXPECT_EQ(OBSERVE(stage.peak_in_flight()), 0);
}

// ---------------------------------------------------------------- Task 3

TEST(FillDrain, MatchesSerialTrainingWithAdamW) {
  for (bool tied : {true, false})
    for (int64_t m : {1, 2, 4}) {
      GPTConfig cfg = tiny4();
      cfg.tied_head = tied;
      expect_training_matches_serial(cfg, 8, m, 2, even_parts(cfg, dtl::world().size()));
    }
}

// SGD's step is the gradient itself: a loss not scaled by 1/m (or scaled twice) moves the
// parameters m times too far. AdamW with a small eps divides such a factor out.
TEST(FillDrain, MatchesSerialTrainingWithSgd) {
  GPTConfig cfg = tiny4();
  cfg.tied_head = false;
  auto sgd = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.5));
  };
  expect_training_matches_serial(cfg, 8, 4, 2, even_parts(cfg, dtl::world().size()), sgd, 1e-4,
                                 1e-6);
  cfg.tied_head = true;  // the tied embedding's two halves, summed
  expect_training_matches_serial(cfg, 8, 2, 2, even_parts(cfg, dtl::world().size()), sgd, 1e-4,
                                 1e-6);
}

TEST(FillDrain, MatchesSerialWithTheCostBalancedPartition) {
  const GPTConfig cfg = tiny4();
  const auto parts = partition(unit_costs(cfg), dtl::world().size());
  expect_training_matches_serial(cfg, 6, 3, 2, parts);
}

TEST(FillDrain, ReportsTheLossAndPeakInFlight) {
  const GPTConfig cfg = tiny4();
  PipelineStage stage(cfg, dtl::world(), even_parts(cfg, dtl::world().size()));
  auto opt = make_adamw(stage.module(), adamw());
  const torch::Tensor global = batch(cfg, 8, 3);
  const StepStats st = fill_drain_step(stage, *opt, global, 4);
  const double serial_loss = testing::serial(1, [&] {
    model::GPT full(cfg);
    return full->loss(global).item<double>();
  });
  EXPECT_NEAR(OBSERVE(st.loss), serial_loss, 1e-5)
      << "the global batch's mean loss, on every stage";
  EXPECT_EQ(OBSERVE(st.micro_batches), 4);
  EXPECT_EQ(OBSERVE(st.peak_in_flight), 4) << "fill-drain keeps every micro-batch's activations";
  EXPECT_EQ(OBSERVE(stage.in_flight()), 0);
}

TEST(FillDrain, RejectsMicroBatchesThatDoNotDivideTheBatch) {
  const GPTConfig cfg = tiny4();
  PipelineStage stage(cfg, dtl::world(), even_parts(cfg, dtl::world().size()));
  auto opt = make_adamw(stage.module(), adamw());
  EXPECT_THAT(testing::error_of([&] { fill_drain_step(stage, *opt, batch(cfg, 8, 0), 3); }),
              ::testing::HasSubstr("micro_batches"));
  EXPECT_THAT(testing::error_of([&] { fill_drain_step(stage, *opt, batch(cfg, 8, 0), 0); }),
              ::testing::HasSubstr("micro_batches"));
}

}  // namespace
}  // namespace dtl::lab11
