// Public tests of lab 02. Run: ./lab test 02   (world sizes 1, 2, 3 and 4)
//
// The oracle is serial training: every rank also trains a private model on the WHOLE global
// batch with lab 01's reference train_step (dtl::testing::serial: same seed, no
// communication), and the data-parallel replicas must match it, and each other, after every
// step. Batches are chosen so that shards are uneven and some ranks get no rows at all,
// because even batches hide the classic bugs (dividing by the world size, dropping the
// remainder).
#include "data_parallel.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/harness/checks.hpp"  // defines: serial, DTL_EXPECT_PARAMS_CLOSE, DTL_EXPECT_SAME_ON_ALL_RANKS
#include "dtl/runtime.hpp"         // defines: world()
#include "dtl/split.hpp"           // defines: split_range (the oracle of shard_range)
#include "dtl/optim.hpp"           // defines: OptimConfig, make_adamw
#include "dtl/train.hpp"           // defines: train_step (the single-process ground truth)

namespace dtl::lab02 {
namespace {

using model::GPTConfig;

Comm& W() { return dtl::world(); }

// The data-parallel side lives on the Runtime's device (--device cuda: NCCL needs CUDA
// tensors); the serial oracles stay on the CPU and the comparisons move both sides there.
using testing::device;

// The sharding rule of the handout is the course's one splitting rule, dtl::split_range: the
// oracle of your shard_range, and what the gradient tests use so they do not depend on yours.
std::pair<int64_t, int64_t> rule(int64_t rows, int r, int n) {
  const dtl::Range range = dtl::split_range(rows, n, r);
  return {range.begin, range.end};
}

std::string where(int64_t rows) {
  return "global batch " + std::to_string(rows) + " on " + std::to_string(W().size()) +
         " ranks (this is rank " + std::to_string(W().rank()) + ")";
}

// Global batch sizes every test sweeps: even for 1, 2 and 4 ranks; uneven for 3 and 4; and
// one with fewer rows than ranks (a rank with nothing to do).
std::vector<int64_t> batch_sizes() { return {8, 5, std::max(1, W().size() - 1)}; }

// A Shard from the code under test, both ends observed (dtl/harness/observe.hpp).
Shard observed(const Shard& s) {
  Shard o;
  o.begin = OBSERVE(s.begin);
  o.end = OBSERVE(s.end);
  return o;
}

TEST(ShardRange, HandoutExamples) {
  auto expect_shard = [](int64_t rows, int rank, int world, int64_t begin, int64_t end) {
    const Shard s = observed(shard_range(rows, rank, world));
    EXPECT_EQ(s.begin, begin) << "shard_range(" << rows << ", " << rank << ", " << world << ")";
    EXPECT_EQ(s.end, end) << "shard_range(" << rows << ", " << rank << ", " << world << ")";
  };
  expect_shard(5, 0, 3, 0, 2);
  expect_shard(5, 1, 3, 2, 4);
  expect_shard(5, 2, 3, 4, 5);
  expect_shard(2, 0, 4, 0, 1);
  expect_shard(2, 1, 4, 1, 2);
  expect_shard(2, 2, 4, 2, 2);
  expect_shard(2, 3, 4, 2, 2);
  expect_shard(12, 3, 4, 9, 12);
  expect_shard(0, 1, 2, 0, 0);
}

TEST(ShardRange, CoversEveryRowExactlyOnceAndBalances) {
  for (int world = 1; world <= 6; ++world)
    for (int64_t rows = 0; rows <= 13; ++rows) {
      int64_t next = 0;
      for (int rank = 0; rank < world; ++rank) {
        const Shard s = observed(shard_range(rows, rank, world));
        const std::string what = "rows " + std::to_string(rows) + ", rank " + std::to_string(rank) +
                                 " of " + std::to_string(world);
        EXPECT_EQ(s.begin, next) << what << ": shards must be contiguous, in rank order";
        EXPECT_EQ(s.size(), rows / world + (rank < rows % world ? 1 : 0))
            << what << ": the first rows % world ranks get one extra row";
        EXPECT_EQ(s.begin, dtl::split_range(rows, world, rank).begin) << what;
        next = s.end;
      }
      EXPECT_EQ(next, rows) << "rows " << rows << " on " << world << ": every row, once";
    }
}

TEST(ShardBatch, ReturnsThisRanksRowsAsAView) {
  const torch::Tensor global = torch::arange(7 * 3, torch::kLong).view({7, 3});
  for (int world = 1; world <= 4; ++world)
    for (int rank = 0; rank < world; ++rank) {
      const auto [begin, end] = rule(7, rank, world);
      const torch::Tensor mine = shard_batch(global, rank, world);
      DTL_EXPECT_EQUAL(mine, global.narrow(0, begin, end - begin))
          << "rank " << rank << " of " << world;
      EXPECT_TRUE(OBSERVE(mine.data_ptr() == global[begin].data_ptr())) << "a view, not a copy";
    }
  // Fewer rows than ranks: the last ranks get [0, 3] tensors, not an error.
  EXPECT_EQ(OBSERVE(shard_batch(global.narrow(0, 0, 2), 3, 4).sizes().vec()),
            (std::vector<int64_t>{0, 3}));
}

// AdamW for the equality tests. eps 1e-6 instead of 1e-8: Adam divides each update by
// sqrt(v) + eps, so for a gradient element near eps the last-bit differences between a serial
// sum and a sum of shards are amplified into visible weight differences. A larger eps keeps
// the comparison about data parallelism, not about Adam's conditioning.
dtl::OptimConfig dp_adamw() {
  dtl::OptimConfig oc;
  oc.eps = 1e-6;
  oc.weight_decay = 0.1;
  return oc;
}

// Gradient of the mean loss over the whole global batch, computed serially.
torch::Tensor serial_gradient(const GPTConfig& cfg, const torch::Tensor& global) {
  return testing::serial(1, [&] {
    GPT m(cfg);
    m->loss(global).backward();
    return testing::flat_grads(*m);
  });
}

TEST(AverageGradients, EqualsTheGlobalBatchGradient) {
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 21);
  for (int64_t rows : batch_sizes()) {
    const torch::Tensor global =
        data::GlobalBatchSampler(corpus, rows, cfg.seq_len).global_batch_at(0);
    const torch::Tensor expected = serial_gradient(cfg, global);

    GPT model(cfg);
    model->to(device());
    const auto [begin, end] = rule(rows, W().rank(), W().size());
    if (end > begin) model->loss(global.narrow(0, begin, end - begin).to(device())).backward();
    // A rank without rows ran no backward: its .grad() tensors are undefined.
    average_gradients(*model, W(), end - begin, rows);
    const torch::Tensor got = testing::flat_grads(*model);
    DTL_EXPECT_GRADS_CLOSE(*model, expected, 1e-4, 1e-7) << where(rows);
    DTL_EXPECT_SAME_ON_ALL_RANKS(got) << where(rows);
  }
}

// K steps of data-parallel training vs K steps of lab 01's reference on the global batch.
template <typename MakeOptimizer>
void expect_dp_equals_serial(const GPTConfig& cfg, int64_t rows, int steps,
                             MakeOptimizer make_optimizer, double rtol, double atol) {
  data::SyntheticCorpus corpus(cfg.vocab_size, 33);
  data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  const torch::Tensor expected = testing::serial(1, [&] {
    GPT m(cfg);
    auto opt = make_optimizer(m);
    for (int s = 0; s < steps; ++s) dtl::train_step(m, *opt, sampler.global_batch_at(s));
    return testing::flat_params(*m);
  });

  GPT model(cfg);
  model->to(device());
  auto opt = make_optimizer(model);
  const auto [begin, end] = rule(rows, W().rank(), W().size());
  for (int s = 0; s < steps; ++s) {
    const StepStats st = dp_train_step(model, *opt, sampler.global_batch_at(s).to(device()), W());
    EXPECT_EQ(OBSERVE(st.local_rows), end - begin) << where(rows) << ", step " << s;
  }
  const torch::Tensor got = testing::flat_params(*model);
  DTL_EXPECT_PARAMS_CLOSE(*model, expected, rtol, atol) << where(rows) << " after " << steps << " steps";
  DTL_EXPECT_SAME_ON_ALL_RANKS(got) << where(rows) << ": the replicas drifted apart";
}

TEST(DataParallel, MatchesSerialTrainingWithAdamW) {
  for (int64_t rows : batch_sizes())
    expect_dp_equals_serial(
        GPTConfig::tiny(), rows, 3, [](GPT& m) { return dtl::make_adamw(*m, dp_adamw()); }, 1e-4,
        2e-5);
}

// SGD is sensitive to the scale of the gradient (Adam mostly is not), so this catches an
// average that is off by a constant factor, e.g. summing without weighting.
TEST(DataParallel, MatchesSerialTrainingWithSgd) {
  for (int64_t rows : batch_sizes())
    expect_dp_equals_serial(
        GPTConfig::tiny(), rows, 2,
        [](GPT& m) {
          return std::make_unique<torch::optim::SGD>(m->parameters(),
                                                     torch::optim::SGDOptions(0.5));
        },
        1e-4, 1e-6);
}

// Bytes on the wire per step: one ring all-reduce of every gradient, 2 (n - 1) / n x grad
// bytes per rank. Counted on a private Comm so no other traffic is included. The counters are
// measured inside the process under test, so the test also checks what the traffic was for:
// the model trained as serial training does.
TEST(DataParallel, CommunicatesOneAllReducePerParameter) {
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 4);
  data::GlobalBatchSampler sampler(corpus, 6, cfg.seq_len);
  const int steps = 2;
  const torch::Tensor expected = testing::serial(1, [&] {
    GPT m(cfg);
    auto o = dtl::make_adamw(*m, dp_adamw());
    for (int s = 0; s < steps; ++s) dtl::train_step(m, *o, sampler.global_batch_at(s));
    return testing::flat_params(*m);
  });
  GPT model(cfg);
  model->to(device());
  auto opt = dtl::make_adamw(*model, dp_adamw());
  std::shared_ptr<Comm> comm = W().dup();

  int64_t n_params = 0, grad_bytes = 0;
  for (const auto& p : model->parameters()) {
    ++n_params;
    grad_bytes += p.numel() * static_cast<int64_t>(sizeof(float));
  }
  const int n = comm->size();
  for (int s = 0; s < steps; ++s)
    dp_train_step(model, *opt, sampler.global_batch_at(s).to(device()), *comm);
  DTL_EXPECT_PARAMS_CLOSE(*model, expected, 1e-4, 2e-5);

  const CommStats st = MEASURED(comm->stats());
  EXPECT_EQ(st[OpType::AllReduce].count, steps * n_params) << "one all-reduce per parameter";
  EXPECT_EQ(st.total_count(), st[OpType::AllReduce].count) << "and no other op: " << st.to_string();
  EXPECT_EQ(st[OpType::AllReduce].bytes, steps * grad_bytes) << "every gradient, float32";
  const double ring = 2.0 * (n - 1) / n * static_cast<double>(grad_bytes);
  EXPECT_NEAR(st[OpType::AllReduce].wire_bytes, steps * ring, 1e-6 * grad_bytes)
      << "2 (n - 1) / n x gradient bytes per rank per step";
}

TEST(DataParallel, RanksWithoutRowsStillTrainInLockstep) {
  // One row, every rank but rank 0 idle: they must still join every all-reduce and step.
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 8);
  data::GlobalBatchSampler sampler(corpus, 1, cfg.seq_len);
  const torch::Tensor expected = testing::serial(1, [&] {
    GPT m(cfg);
    auto opt = dtl::make_adamw(*m, dp_adamw());
    dtl::train_step(m, *opt, sampler.global_batch_at(0));
    return testing::flat_params(*m);
  });
  GPT model(cfg);
  model->to(device());
  auto opt = dtl::make_adamw(*model, dp_adamw());
  const StepStats st = dp_train_step(model, *opt, sampler.global_batch_at(0).to(device()), W());
  EXPECT_EQ(OBSERVE(st.local_rows), W().rank() == 0 ? 1 : 0);
  if (W().rank() != 0) {
    EXPECT_EQ(OBSERVE(st.loss), 0.0) << "no rows, no loss";
  }
  DTL_EXPECT_PARAMS_CLOSE(*model, expected, 1e-4, 2e-5);
  DTL_EXPECT_SAME_ON_ALL_RANKS(testing::flat_params(*model));
}

}  // namespace
}  // namespace dtl::lab02
