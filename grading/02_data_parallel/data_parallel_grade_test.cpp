// Grading tests of lab 02 (hidden until after the due date): another model shape, longer runs,
// frozen parameters, sub-communicators, the loss a step reports, and bad input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "data_parallel.hpp"
#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"           // defines: dtl::Error, dtl::NotImplemented
#include "dtl/harness/checks.hpp"  // defines: serial, DTL_EXPECT_PARAMS_CLOSE, DTL_EXPECT_SAME_ON_ALL_RANKS
#include "dtl/runtime.hpp"         // defines: world()
#include "dtl/optim.hpp"           // defines: OptimConfig, make_adamw
#include "dtl/train.hpp"           // defines: train_step (the single-process ground truth)

namespace dtl::lab02 {
namespace {

using model::GPTConfig;

Comm& W() { return dtl::world(); }

using dtl::testing::expect_error_mentions;
// The data-parallel side on the Runtime's device; the serial oracles stay on the CPU.
using dtl::testing::device;


GPTConfig untied_deeper() {
  GPTConfig c;
  c.vocab_size = 96;
  c.seq_len = 24;
  c.n_layer = 3;
  c.n_head = 4;
  c.d_model = 48;
  c.tied_head = false;
  c.bias = false;
  return c;
}

// AdamW with eps 1e-6: see dp_adamw() in the public tests (Adam amplifies last-bit
// differences of gradients near eps; a larger eps keeps the comparison about DP).
dtl::OptimConfig dp_adamw(double weight_decay = 0.1) {
  dtl::OptimConfig oc;
  oc.eps = 1e-6;
  oc.weight_decay = weight_decay;
  return oc;
}

// Serial ground truth: `steps` steps of lab 01's reference on the global batch.
torch::Tensor serial_params(const GPTConfig& cfg, const data::GlobalBatchSampler& sampler,
                            int steps, const dtl::OptimConfig& oc,
                            const std::vector<std::string>& frozen = {}) {
  return testing::serial(1, [&] {
    GPT m(cfg);
    for (const auto& name : frozen) m->named_parameters()[name].set_requires_grad(false);
    auto opt = dtl::make_adamw(*m, oc);
    for (int s = 0; s < steps; ++s) dtl::train_step(m, *opt, sampler.global_batch_at(s));
    return testing::flat_params(*m);
  });
}

TEST(ShardGrading, RejectsBadArguments) {
  expect_error_mentions([] { shard_range(4, 0, 0); }, "world");
  expect_error_mentions([] { shard_range(4, 3, 3); }, "rank");
  expect_error_mentions([] { shard_range(4, -1, 2); }, "rank");
  expect_error_mentions([] { shard_range(-1, 0, 2); }, "rows");
  expect_error_mentions([] { shard_batch(torch::zeros({8, 3}), 2, 2); }, "rank");
}

TEST(ShardGrading, LargeOddSizes) {
  const int64_t rows = 1000003;  // prime
  const int world = 7;           // 1000003 = 7 * 142857 + 4
  EXPECT_EQ(OBSERVE(shard_range(rows, 0, world).size()), 142858);
  EXPECT_EQ(OBSERVE(shard_range(rows, 3, world).end), 4 * 142858);
  EXPECT_EQ(OBSERVE(shard_range(rows, 4, world).size()), 142857);
  EXPECT_EQ(OBSERVE(shard_range(rows, 6, world).end), rows);
}

TEST(AverageGradientsGrading, RejectsBadCounts) {
  GPT model(GPTConfig::tiny());
  model->to(device());
  expect_error_mentions([&] { average_gradients(*model, W(), 0, 0); }, "global_count");
  expect_error_mentions([&] { average_gradients(*model, W(), 5, 4); }, "local_count");
  expect_error_mentions([&] { average_gradients(*model, W(), -1, 4); }, "local_count");
}

// Frozen parameters have no gradient on any rank, and every rank must skip them alike.
// All-reducing one anyway would give it a .grad of zeros, which AdamW treats as a real
// gradient: with weight decay the "frozen" weight would then shrink every step.
TEST(AverageGradientsGrading, FrozenParametersAreSkipped) {
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 13);
  data::GlobalBatchSampler sampler(corpus, 5, cfg.seq_len);
  const std::vector<std::string> frozen = {"wpe.weight", "ln_f.bias"};
  const dtl::OptimConfig oc = dp_adamw();
  const torch::Tensor expected = serial_params(cfg, sampler, 2, oc, frozen);

  GPT model(cfg);
  model->to(device());
  for (const auto& name : frozen) model->named_parameters()[name].set_requires_grad(false);
  auto opt = dtl::make_adamw(*model, oc);
  std::shared_ptr<Comm> comm = W().dup();
  for (int s = 0; s < 2; ++s)
    dp_train_step(model, *opt, sampler.global_batch_at(s).to(device()), *comm);
  int64_t trainable = 0;
  for (const auto& p : model->parameters()) trainable += p.requires_grad() ? 1 : 0;
  EXPECT_EQ(MEASURED(comm->stats())[OpType::AllReduce].count, 2 * trainable)
      << "one all-reduce per parameter that requires grad";
  for (const auto& name : frozen)
    EXPECT_FALSE(OBSERVE(model->named_parameters()[name].grad().defined()))
        << name << " is frozen: it must not get a gradient";
  DTL_EXPECT_PARAMS_CLOSE(*model, expected, 1e-4, 2e-5);
}

TEST(DataParallelGrading, UntiedDeeperModelManySteps) {
  const GPTConfig cfg = untied_deeper();
  const dtl::OptimConfig oc = dp_adamw();
  const int n = W().size();
  for (int64_t rows : {int64_t{7}, int64_t{2 * n + 1}, int64_t{n + 1}}) {
    data::SyntheticCorpus corpus(cfg.vocab_size, 40 + rows);
    data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
    const int steps = 5;
    const torch::Tensor expected = serial_params(cfg, sampler, steps, oc);
    GPT model(cfg);
    model->to(device());
    auto opt = dtl::make_adamw(*model, oc);
    for (int s = 0; s < steps; ++s)
      dp_train_step(model, *opt, sampler.global_batch_at(s).to(device()), W());
    const torch::Tensor got = testing::flat_params(*model);
    DTL_EXPECT_PARAMS_CLOSE(*model, expected, 1e-4, 5e-5) << "global batch " << rows;
    DTL_EXPECT_SAME_ON_ALL_RANKS(got) << "global batch " << rows;
  }
}

// dp_train_step must use the Comm it is given: here two independent data-parallel groups
// (even and odd world ranks) train side by side, each equal to serial training.
TEST(DataParallelGrading, TrainsOnASubCommunicator) {
  std::shared_ptr<Comm> group = W().split(W().rank() % 2, W().rank());
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 70 + W().rank() % 2);  // each group its own data
  data::GlobalBatchSampler sampler(corpus, 5, cfg.seq_len);
  const torch::Tensor expected = serial_params(cfg, sampler, 2, dp_adamw(0.0));
  GPT model(cfg);
  model->to(device());
  auto opt = dtl::make_adamw(*model, dp_adamw(0.0));
  for (int s = 0; s < 2; ++s)
    dp_train_step(model, *opt, sampler.global_batch_at(s).to(device()), *group);
  DTL_EXPECT_PARAMS_CLOSE(*model, expected, 1e-4, 2e-5)
      << "group " << W().rank() % 2 << " of size " << group->size();
  const double ring = 2.0 * (group->size() - 1) / group->size();
  int64_t grad_bytes = 0;
  for (const auto& p : model->parameters()) grad_bytes += 4 * p.numel();
  EXPECT_NEAR(MEASURED(group->stats())[OpType::AllReduce].wire_bytes, 2 * ring * grad_bytes,
              1e-6 * grad_bytes);
}

TEST(DataParallelGrading, ReportsTheLocalLossBeforeTheUpdate) {
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 17);
  data::GlobalBatchSampler sampler(corpus, 7, cfg.seq_len);
  GPT model(cfg), probe(cfg);
  model->to(device());
  probe->to(device());
  auto opt = dtl::make_adamw(*model);
  const int n = W().size(), r = W().rank();
  const int64_t base = 7 / n, extra = 7 % n;
  const int64_t begin = r * base + std::min<int64_t>(r, extra);
  const int64_t rows = base + (r < extra ? 1 : 0);
  for (int s = 0; s < 2; ++s) {
    const torch::Tensor global = sampler.global_batch_at(s).to(device());
    double expected = 0;
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < probe->parameters().size(); ++i)
        probe->parameters()[i].copy_(model->parameters()[i]);
      if (rows > 0) expected = probe->loss(global.narrow(0, begin, rows)).item<double>();
    }
    const StepStats st = dp_train_step(model, *opt, global, W());
    EXPECT_EQ(OBSERVE(st.local_rows), rows);
    EXPECT_NEAR(OBSERVE(st.loss), expected, 1e-5)
        << "mean loss of this rank's rows, before the step";
    EXPECT_GE(MEASURED(st.compute_seconds), 0.0);
    EXPECT_GE(MEASURED(st.comm_seconds), 0.0);
    EXPECT_GE(MEASURED(st.optimizer_seconds), 0.0);
  }
}

// StepStats promises three phase times of one call: compute, communication (waiting for peers
// included), optimizer. They are disjoint parts of the call, so they add up to no more than the
// call's own duration, whatever the machine's speed. A late rank makes the others wait inside
// the all-reduces: a compute timer still running there would count that wait twice.
TEST(DataParallelGrading, PhaseTimesAreDisjointPartsOfTheStep) {
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 23);
  data::GlobalBatchSampler sampler(corpus, 8, cfg.seq_len);
  GPT model(cfg);
  model->to(device());
  auto opt = dtl::make_adamw(*model);
  const int n = W().size(), r = W().rank();
  for (int s = 0; s < 2; ++s) {
    const torch::Tensor global = sampler.global_batch_at(s).to(device());
    W().barrier();
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto start = std::chrono::steady_clock::now();
    const StepStats st = dp_train_step(model, *opt, global, W());
    const double call =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(OBSERVE(st.local_rows), global.size(0) / n + (r < global.size(0) % n ? 1 : 0));
    // One observation of all four, so that the grader's check compares times of one run.
    const std::vector<double> times{st.compute_seconds, st.comm_seconds, st.optimizer_seconds,
                                    call};
    const std::vector<double> t = MEASURED(times);
    EXPECT_LE(t[0] + t[1] + t[2], t[3] + 1e-3)
        << "compute " << t[0] << " s + comm " << t[1] << " s + optimizer " << t[2]
        << " s exceed the call's " << t[3]
        << " s: the phases must not overlap (is a timer still running in the next phase?)";
  }
}

TEST(DataParallelGrading, RejectsMalformedGlobalBatch) {
  GPT model(GPTConfig::tiny());
  model->to(device());
  auto opt = dtl::make_adamw(*model);
  expect_error_mentions([&] { dp_train_step(model, *opt, torch::zeros({17}, torch::kLong), W()); },
                        "global_batch");
  expect_error_mentions(
      [&] {
        dp_train_step(model, *opt, torch::zeros({0, 17}, torch::kLong), W());
      },
      "global_batch");
}

}  // namespace
}  // namespace dtl::lab02
