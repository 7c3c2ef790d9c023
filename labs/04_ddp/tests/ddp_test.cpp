// Public tests of lab 04. Run: ./lab test 04   (world sizes 1, 2, 3 and 4)
//
// Oracles: serial training on the whole global batch (dtl::train_step, same seed), naive
// per-parameter averaging (lab 02's method, written out here), agreement across ranks, the
// bucket rule of ddp.hpp, and the Comm's own records of what was sent and when it was issued
// (Comm::stats(), Comm::recent_ops()) — never wall-clock durations.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "ddp.hpp"
#include "dtl/data.hpp"  // defines: SyntheticCorpus, GlobalBatchSampler
#include "tests/ddp_test_util.hpp"

namespace {

using namespace lab04_test;  // NOLINT: models and helpers shared with the grading tests
using dtl::lab04::assign_buckets;
using dtl::lab04::verify_model_across_ranks;
using dtl::testing::expect_error_mentions;
using dtl::testing::flat_grads;
using dtl::testing::flat_params;
using Buckets = std::vector<std::vector<int64_t>>;

// ---------------------------------------------------------------- Task 1: assign_buckets

TEST(AssignBuckets, HandoutExample) {
  EXPECT_EQ(OBSERVE(assign_buckets({4, 4, 6, 2, 2}, 3, 8)), (Buckets{{4, 3}, {2, 1}, {0}}));
}

TEST(AssignBuckets, SmallCases) {
  EXPECT_EQ(OBSERVE(assign_buckets({}, 1, 1)), Buckets{}) << "no parameters, no buckets";
  EXPECT_EQ(OBSERVE(assign_buckets({5}, 100, 100)), (Buckets{{0}})) << "what is left is a bucket";
  EXPECT_EQ(OBSERVE(assign_buckets({5, 5, 5}, 1, 1)), (Buckets{{2}, {1}, {0}}))
      << "tiny caps: one each";
  EXPECT_EQ(OBSERVE(assign_buckets({8, 8, 8, 8}, 8, 16)), (Buckets{{3}, {2, 1}, {0}}))
      << "a bucket closes when it REACHES its cap (>=)";
  EXPECT_EQ(OBSERVE(assign_buckets({100, 1, 1}, 1000, 1000)), (Buckets{{2, 1, 0}}));
  EXPECT_EQ(OBSERVE(assign_buckets({1, 100, 1, 1}, 2, 50)), (Buckets{{3, 2}, {1}, {0}}))
      << "a parameter over the cap gets a bucket of its own";
  EXPECT_EQ(OBSERVE(assign_buckets({0, 0, 4}, 4, 4)), (Buckets{{2}, {1, 0}}))
      << "zero-byte parameters";
}

// The rule, checked as properties over many random layouts: reverse order, every index once,
// bucket 0 closes at first_bucket_bytes, the others at the cap, only the last may be short.
TEST(AssignBuckets, FollowsTheRuleOnRandomLayouts) {
  torch::manual_seed(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = torch::randint(0, 30, {1}).item<int64_t>();
    std::vector<int64_t> bytes(static_cast<size_t>(n));
    for (auto& b : bytes) b = 4 * torch::randint(0, 300, {1}).item<int64_t>();
    const int64_t first = 4 * torch::randint(1, 200, {1}).item<int64_t>();
    const int64_t cap = 4 * torch::randint(1, 600, {1}).item<int64_t>();
    const Buckets got = OBSERVE(assign_buckets(bytes, first, cap));
    std::vector<int64_t> order;
    for (size_t b = 0; b < got.size(); ++b) {
      ASSERT_FALSE(got[b].empty()) << "bucket " << b << " is empty";
      for (int64_t i : got[b]) ASSERT_TRUE(i >= 0 && i < n) << "bucket " << b << ": index " << i;
      const int64_t limit = b == 0 ? first : cap;
      int64_t total = 0;
      for (size_t k = 0; k < got[b].size(); ++k) {
        if (k + 1 < got[b].size()) {
          total += bytes[static_cast<size_t>(got[b][k])];
          EXPECT_LT(total, limit) << "bucket " << b << " should have closed before its last "
                                  << "parameter (trial " << trial << ")";
        }
        order.push_back(got[b][k]);
      }
      total += bytes[static_cast<size_t>(got[b].back())];
      if (b + 1 < got.size()) {
        EXPECT_GE(total, limit) << "bucket " << b << " closed before reaching its cap";
      }
    }
    std::vector<int64_t> expected(static_cast<size_t>(n));
    std::iota(expected.rbegin(), expected.rend(), 0);  // n-1, n-2, ..., 0
    EXPECT_EQ(order, expected) << "every parameter once, from the last registered to the first";
  }
}

TEST(AssignBuckets, RejectsBadArguments) {
  expect_error_mentions([] { assign_buckets({4}, 0, 8); }, "first_bucket_bytes");
  expect_error_mentions([] { assign_buckets({4}, 8, -1); }, "bucket_cap_bytes");
  expect_error_mentions([] { assign_buckets({4, -4}, 8, 8); }, "param_bytes");
}

// ---------------------------------------------------------------- Task 2: verification

TEST(VerifyModel, AcceptsTheSameModelWithoutAllReduce) {
  auto comm = fresh_comm();
  GPT model(GPTConfig::tiny());
  EXPECT_EQ(dtl::testing::error_of([&] { verify_model_across_ranks(*model, *comm); }),
            "(no dtl::Error)")
      << "the same model on every rank is accepted";
  const dtl::CommStats st = MEASURED(comm->stats());
  EXPECT_EQ(st[OpType::AllReduce].count, 0) << st.to_string();
  EXPECT_EQ(st[OpType::Broadcast].count, 0) << "verify only compares descriptions";
}

TEST(VerifyModel, EveryRankNamesTheParameterThatDiffers) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  GPTConfig cfg = GPTConfig::tiny();
  if (comm->rank() == comm->size() - 1) cfg.d_ff = 3 * cfg.d_model;  // the last rank differs
  GPT model(cfg);
  const std::string msg = dtl::testing::error_of([&] { verify_model_across_ranks(*model, *comm); });
  EXPECT_NE(msg.find("differs across ranks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blocks.0.mlp.fc.weight"), std::string::npos)
      << "the first differing tensor in registration order: " << msg;
  EXPECT_NE(msg.find("ranks [" + std::to_string(comm->size() - 1) + "]"), std::string::npos)
      << "the ranks that disagree with rank 0: " << msg;
}

TEST(VerifyModel, AFrozenParameterOnOneRankIsADifference) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  GPT model(GPTConfig::tiny());
  if (comm->rank() == 1) model->named_parameters()["ln_f.weight"].set_requires_grad(false);
  expect_error_mentions([&] { verify_model_across_ranks(*model, *comm); }, "ln_f.weight");
}

// ---------------------------------------------------------------- Task 3: construction

// Rank 0's whole state wins: parameters and buffers (running statistics, step counters), of
// every dtype. A rank whose buffers kept their own values would train a different model.
TEST(DDPConstruction, BroadcastsRankZerosParametersAndBuffers) {
  auto comm = fresh_comm();
  GPT model(GPTConfig::tiny());
  const torch::Tensor rank0 = flat_params(*model);  // every rank builds the same init...
  torch::Tensor stats = model->register_buffer("stats", torch::arange(3, torch::kFloat32));
  torch::Tensor steps = model->register_buffer("steps", torch::full({2}, int64_t{7}));
  {
    torch::NoGradGuard no_grad;  // ...and then drifts: only rank 0's values must survive
    for (auto& p : model->parameters()) p.add_(0.5 * comm->rank());
    stats.add_(comm->rank());
    steps.add_(comm->rank());
  }
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm);
  DTL_EXPECT_CLOSE(flat_params(*model).cpu(), rank0, 0, 0);
  DTL_EXPECT_SAME_ON_ALL_RANKS(flat_params(*model));
  DTL_EXPECT_EQUAL(model->named_buffers()["stats"].cpu(), torch::arange(3, torch::kFloat32))
      << "a float buffer keeps rank 0's values";
  DTL_EXPECT_EQUAL(model->named_buffers()["steps"].cpu(), torch::full({2}, int64_t{7}))
      << "an int64 buffer too";
  EXPECT_EQ(MEASURED(comm->stats())[OpType::AllReduce].count, 0)
      << "construction issues no all-reduce";
}

TEST(DDPConstruction, ManagesTrainableParametersInRegistrationOrder) {
  auto comm = fresh_comm();
  GPT model(GPTConfig::tiny());
  model->named_parameters()["wpe.weight"].set_requires_grad(false);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm);
  std::vector<std::string> expected;
  for (const auto& p : model->named_parameters())
    if (p.value().requires_grad()) expected.push_back(p.key());
  EXPECT_EQ(OBSERVE(ddp.parameter_names()), expected)
      << "trainable parameters, in registration order";
  ASSERT_EQ(OBSERVE(ddp.parameters().size()), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(OBSERVE(ddp.parameters()[i].is_same(model->named_parameters()[expected[i]])))
        << "parameters()[" << i << "] must be the module's own tensor " << expected[i];
}

// A chain with known sizes: the assignment equals assign_buckets on the managed bytes, which
// here is worked out by hand. Widths 8 -> 16 -> 16 -> 4 (float32):
//   l0.weight 512 B (0), l0.bias 64 B (1), l1.weight 1024 B (2), l1.bias 64 B (3),
//   l2.weight 256 B (4), l2.bias 16 B (5).
// first 200 B, cap 1100 B, walking 5, 4, 3, ...: {5, 4} = 272 B >= 200; {3, 2} = 1088 B < 1100,
// + 1 -> 1152 B >= 1100: {3, 2, 1}; then {0} is what is left.
TEST(DDPConstruction, BucketsFollowTheRule) {
  auto comm = fresh_comm();
  Chain model(std::vector<int64_t>{8, 16, 16, 4});
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, caps(200, 1100));
  EXPECT_EQ(OBSERVE(ddp.buckets()), (Buckets{{5, 4}, {3, 2, 1}, {0}}));
  // The reference's assign_buckets in the autograder's driver: the rule, as an oracle.
  EXPECT_EQ(OBSERVE(ddp.buckets()), assign_buckets(managed_bytes(*model), 200, 1100));

  // PyTorch's defaults put this whole model into one bucket.
  DistributedDataParallel defaults(model.ptr(), *comm);
  EXPECT_EQ(OBSERVE(defaults.buckets()), (Buckets{{5, 4, 3, 2, 1, 0}}));
}

TEST(DDPConstruction, RejectsAModelThatDiffersAcrossRanks) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  GPTConfig cfg = GPTConfig::tiny();
  if (comm->rank() == 1) cfg.tied_head = false;  // rank 1 has an extra lm_head.weight
  GPT model(cfg);
  model->to(device());
  const std::string msg =
      dtl::testing::error_of([&] { DistributedDataParallel ddp(model.ptr(), *comm); });
  EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("differs across ranks"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- Tasks 4-5: training

// K DDP steps on this rank's rows == K serial steps on the whole global batch.
template <typename MakeOpt>
void expect_ddp_equals_serial(int64_t rows, int steps, DDPOptions options, MakeOpt make_opt,
                              double rtol, double atol,
                              const std::vector<std::string>& frozen = {}) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();  // tied head: wte is embedding AND output layer
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 40 + rows);
  dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
  const torch::Tensor expected = serial_params(cfg, sampler, steps, make_opt, frozen);

  GPT model(cfg);
  for (const auto& name : frozen) model->named_parameters()[name].set_requires_grad(false);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, options);
  auto opt = make_opt(model);
  for (int s = 0; s < steps; ++s)
    ddp_step(model, *opt, sampler.global_batch_at(s).to(device()), *comm);
  const torch::Tensor got = flat_params(*model);
  const std::string where = "global batch " + std::to_string(rows) + " on " +
                            std::to_string(comm->size()) + " ranks, " +
                            std::to_string(ddp.buckets().size()) + " buckets";
  DTL_EXPECT_CLOSE(got, expected, rtol, atol) << where;
  DTL_EXPECT_SAME_ON_ALL_RANKS(got) << where << ": the replicas drifted apart";
  for (const auto& name : frozen)
    EXPECT_FALSE(OBSERVE(model->named_parameters()[name].grad().defined())) << name << " is frozen";
}

// Several buckets on the tiny GPT (~110 KiB of gradients).
DDPOptions small_buckets() { return caps(8 << 10, 24 << 10); }

TEST(DDPTraining, MatchesSerialTrainingWithAdamW) {
  const int n = dtl::world().size();
  for (int64_t rows : {int64_t{2} * n, int64_t{2} * n + 1})  // even, then uneven shards
    expect_ddp_equals_serial(
        rows, 3, small_buckets(), [](GPT& m) { return dtl::make_adamw(*m, ddp_adamw()); }, 1e-4,
        2e-5, {"wpe.weight"});
}

// SGD is sensitive to the gradient's scale (Adam mostly is not): this catches a missing or
// doubled division by the world size.
TEST(DDPTraining, MatchesSerialTrainingWithSgd) {
  const int n = dtl::world().size();
  expect_ddp_equals_serial(
      3 * n, 2, small_buckets(),
      [](GPT& m) {
        return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.5));
      },
      1e-4, 1e-6);
}

TEST(DDPTraining, PyTorchDefaultCapsAlsoMatch) {
  const int n = dtl::world().size();
  expect_ddp_equals_serial(
      2 * n, 2, DDPOptions{}, [](GPT& m) { return dtl::make_adamw(*m, ddp_adamw()); }, 1e-4,
      2e-5);
}

// One backward: the gradients equal naive averaging (lab 02: one all-reduce per parameter,
// divided by the world size) of the same local gradients.
TEST(DDPTraining, GradientsEqualNaivePerParameterAveraging) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 5);
  const torch::Tensor global =
      dtl::data::GlobalBatchSampler(corpus, 2 * comm->size(), cfg.seq_len).global_batch_at(0).to(device());

  GPT naive = naive_averaged(cfg, my_rows(global, *comm));

  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  model->loss(my_rows(global, *comm)).backward();
  dtl::testing::expect_modules_close(*model, *naive, 1e-5, 1e-7, /*grads=*/true);
  DTL_EXPECT_SAME_ON_ALL_RANKS(flat_grads(*model));
}

// ---------------------------------------------------------------- Tasks 4-5: the traffic

TEST(DDPTraffic, OneAllReducePerBucketInBucketOrder) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 6);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm->size(), cfg.seq_len);
  const int steps = 2;
  const auto make_opt = [](GPT& m) { return dtl::make_adamw(*m, ddp_adamw()); };
  const torch::Tensor expected = serial_params(cfg, sampler, steps, make_opt, {});
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  auto opt = make_opt(model);
  const std::vector<int64_t> numels = observed_bucket_numels(ddp);
  const size_t n_buckets = numels.size();
  ASSERT_GE(n_buckets, 3u) << "the test wants several buckets";
  ASSERT_LE(n_buckets, 15u) << "recent_ops() keeps the last 16 ops";
  int64_t grad_bytes = 0;
  for (const auto& p : ddp.parameters()) grad_bytes += p.numel() * 4;

  comm->reset_stats();
  for (int s = 0; s < steps; ++s) {
    ddp_step(model, *opt, sampler.global_batch_at(s).to(device()), *comm);
    const std::vector<OpRecord> ops = measured_all_reduces(*comm);
    ASSERT_GE(ops.size(), n_buckets);
    // The last n_buckets all-reduces are this step's, and they came in bucket order.
    for (size_t b = 0; b < n_buckets; ++b) {
      const OpRecord& r = ops[ops.size() - n_buckets + b];
      EXPECT_EQ(numel_of(r), numels[b])
          << "step " << s << ": all-reduce #" << b << " should be bucket " << b << "'s buffer";
      EXPECT_EQ(r.bytes, numels[b] * 4) << "float32, like the parameters";
    }
  }
  const dtl::CommStats st = MEASURED(comm->stats());
  EXPECT_EQ(st[OpType::AllReduce].count, static_cast<int64_t>(steps * n_buckets))
      << "exactly one all-reduce per bucket per step: " << st.to_string();
  EXPECT_EQ(st.total_count(), st[OpType::AllReduce].count) << "and nothing else: " << st.to_string();
  EXPECT_EQ(st[OpType::AllReduce].bytes, steps * grad_bytes) << "every gradient once per step";
  // The counters are measured in the process under test: the traffic must also have trained
  // the model as serial training does.
  DTL_EXPECT_CLOSE(flat_params(*model), expected, 1e-4, 2e-5);
}

// The point of DDP: bucket 0's all-reduce is issued while backward is still computing. The
// marker is a hook on the embedding output's gradient, which autograd computes after every
// block and the head, just before the embedding's own backward (the last op of backward).
// Bucket 0 holds ln_f and the last block: it must have been issued before that moment.
TEST(DDPTraffic, FirstBucketIsIssuedBeforeBackwardEnds) {
  auto comm = fresh_comm();
  GPTConfig cfg = GPTConfig::tiny();
  cfg.n_layer = 3;
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 7);
  const torch::Tensor tokens =
      dtl::data::GlobalBatchSampler(corpus, 2 * comm->size(), cfg.seq_len).global_batch_at(0).to(device());
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  const std::vector<std::vector<std::string>> names = observed_bucket_names(ddp);
  ASSERT_GE(names.size(), 3u);
  for (const std::string& name : names[0])
    ASSERT_EQ(name.rfind("w", 0), std::string::npos)
        << "bucket 0 must not hold an embedding for this test";

  // Moments on the student's process's clock: measured there, compared with its op records.
  const double embedding_grad_at =
      MEASURED(backward_marking_the_embedding(model, my_rows(tokens, *comm)));
  const double backward_returned_at = MEASURED(dtl::now_seconds());

  const std::vector<OpRecord> ops = measured_all_reduces(*comm);
  ASSERT_EQ(ops.size(), names.size()) << "one all-reduce per bucket";
  ASSERT_GT(embedding_grad_at, 0.0);
  EXPECT_LT(ops[0].issued, embedding_grad_at)
      << "bucket 0's all-reduce was issued " << (ops[0].issued - embedding_grad_at) * 1e3
      << " ms AFTER autograd reached the embedding: it must be issued by the hook that "
         "completes the bucket, during backward, not at the end";
  if (device().is_cpu()) {
    EXPECT_LE(ops.back().finished, backward_returned_at)
        << "backward() must return only after every bucket's all-reduce completed";
  } else {
    // On CUDA, wait() makes the caller's stream wait for the op; it does not block the host, so
    // the host can only check that every bucket's all-reduce was issued (and waited on) before
    // backward() returned.
    EXPECT_LE(ops.back().issued, backward_returned_at)
        << "backward() must return only after every bucket's all-reduce was issued and waited on";
  }
  // And what was issued early was the averaged gradient.
  GPT naive = naive_averaged(cfg, my_rows(tokens, *comm));
  dtl::testing::expect_modules_close(*model, *naive, 1e-5, 1e-7, /*grads=*/true);
}

// Registered late, used early: the second bucket fills first, and must wait for the first.
TEST(DDPTraffic, ABucketThatFillsEarlyWaitsForTheOnesBeforeIt) {
  auto comm = fresh_comm();
  Swapped model;
  model->to(device());
  DDPOptions opt;
  opt.first_bucket_bytes = (16 * 8 + 8) * 4;  // bucket 0 = early.bias + early.weight
  DistributedDataParallel ddp(model.ptr(), *comm, opt);
  ASSERT_EQ(OBSERVE(ddp.buckets()), (Buckets{{3, 2}, {1, 0}}));
  torch::manual_seed(21 + comm->rank());
  model->forward(torch::randn({5, 16}, device())).pow(2).mean().backward();
  const std::vector<OpRecord> ops = measured_all_reduces(*comm);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(numel_of(ops[0]), 16 * 8 + 8)
      << "bucket 0 (early's parameters) first, although bucket 1 (late's) was complete first";
  EXPECT_EQ(numel_of(ops[1]), 8 * 4 + 4);
}

// ---------------------------------------------------------------- Task 6: unused and no_sync

TEST(DDPUnused, FindUnusedParametersCompletesTheBuckets) {
  auto comm = fresh_comm();
  torch::manual_seed(31 + comm->rank());
  const torch::Tensor x = torch::randn({4, 6}, device());
  Branchy model;
  model->to(device());
  // Several buckets, one of them holding only unused parameters.
  DistributedDataParallel ddp(model.ptr(), *comm, caps(4, 100, /*find_unused_parameters=*/true));
  comm->reset_stats();
  model->forward(x, /*use_sometimes=*/true).pow(2).mean().backward();

  // Oracle: naive averaging of a plain copy's gradients.
  Branchy plain;
  plain->to(device());
  plain->forward(x, true).pow(2).mean().backward();
  average_defined_grads(*plain, *comm);
  for (const auto& p : plain->named_parameters()) {
    const torch::Tensor mine = model->named_parameters()[p.key()].grad();
    if (p.key().rfind("unused.", 0) == 0) {
      EXPECT_FALSE(OBSERVE(mine.defined()))
          << p.key() << " took no part: like serial training, no grad";
    } else {
      ASSERT_TRUE(OBSERVE(mine.defined())) << p.key();
      DTL_EXPECT_CLOSE(mine, p.value().grad(), 1e-5, 1e-7) << p.key();
    }
  }
  const dtl::CommStats st = MEASURED(comm->stats());
  EXPECT_EQ(st[OpType::AllReduce].count,
            static_cast<int64_t>(OBSERVE(ddp.buckets().size())) + 1 + 6)
      << "one per bucket + the usage map (+ the oracle's 6): " << st.to_string();
}

// Which parameters took part is a fact of one backward: the next backward starts from none. A
// parameter used by the first backward and not by the second is unused in the second, and, as
// in serial training, gets no gradient there (the gradients are cleared to undefined between
// the two, as LibTorch 2's zero_grad does).
TEST(DDPUnused, EachBackwardRecordsItsOwnUsedParameters) {
  auto comm = fresh_comm();
  torch::manual_seed(41 + comm->rank());
  const torch::Tensor x = torch::randn({4, 6}, device());
  Branchy model, plain;
  model->to(device());
  plain->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, caps(4, 100, /*find_unused_parameters=*/true));
  for (bool use_sometimes : {true, false}) {
    for (auto* m : {&model, &plain})
      for (auto& p : (*m)->parameters()) p.mutable_grad() = torch::Tensor();
    model->forward(x, use_sometimes).pow(2).mean().backward();
    plain->forward(x, use_sometimes).pow(2).mean().backward();
    average_defined_grads(*plain, *comm);
    for (const auto& p : plain->named_parameters()) {
      const torch::Tensor mine = model->named_parameters()[p.key()].grad();
      EXPECT_EQ(OBSERVE(mine.defined()), p.value().grad().defined())
          << p.key() << (use_sometimes ? " (first backward)" : " (second backward, where it "
                                                               "took no part: no gradient)");
      if (mine.defined() && p.value().grad().defined()) {
        DTL_EXPECT_CLOSE(mine, p.value().grad(), 1e-5, 1e-7) << p.key();
      }
    }
  }
}

// Without gradient_as_bucket_view the averaged gradients are copies the user owns: a .grad() of
// one backward, set aside when the gradients are cleared to undefined (LibTorch 2's zero_grad),
// still holds that backward's values after the next one, as in serial training. That includes
// the gradient a rank receives for a parameter only another rank used: a .grad() that is the
// bucket's own memory would be rewritten by the next backward's averaging.
TEST(DDPUnused, GradientsSetAsideSurviveTheNextBackward) {
  auto comm = fresh_comm();
  Branchy model;
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, caps(4, 100, /*find_unused_parameters=*/true));
  std::vector<torch::Tensor> kept, values;
  for (int64_t k = 0; k < 2; ++k) {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    torch::manual_seed(43 + 7 * k + comm->rank());
    const torch::Tensor x = torch::randn({4, 6}, device());
    model->forward(x, /*use_sometimes=*/comm->rank() == 0).pow(2).mean().backward();
    if (k > 0) break;
    for (const auto& p : ddp.parameters()) {
      kept.push_back(p.grad());
      values.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    }
  }
  for (size_t i = 0; i < kept.size(); ++i) {
    if (!values[i].defined()) continue;
    EXPECT_TRUE(OBSERVE(torch::equal(kept[i], values[i])))
        << ddp.parameter_names()[i] << ": the first backward's gradient changed in the second";
  }
}

// The end-to-end property: AdamW training in which a branch is taken on some steps only equals
// serial training on the whole batch. On a step where nobody used `sometimes`, serial training
// leaves it without a gradient and AdamW skips it (no decay, no momentum); a zero gradient
// instead would move it. Every rank replays the serial run on all ranks' inputs.
TEST(DDPUnused, TrainingWithABranchTakenOnSomeStepsMatchesSerial) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const std::vector<bool> takes_branch = {true, false, true, true, false, false};
  auto input = [&](size_t step, int rank) {
    torch::manual_seed(static_cast<uint64_t>(500 + 10 * step + rank));
    return torch::randn({4, 6}, device());
  };
  Branchy model, serial;
  model->to(device());
  serial->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, caps(4, 100, /*find_unused_parameters=*/true));
  auto opt = dtl::make_adamw(ddp.parameters(), ddp_adamw());
  auto serial_opt = dtl::make_adamw(*serial, ddp_adamw());
  for (size_t step = 0; step < takes_branch.size(); ++step) {
    for (auto* m : {&model, &serial})
      for (auto& p : (*m)->parameters()) p.mutable_grad() = torch::Tensor();
    model->forward(input(step, comm->rank()), takes_branch[step]).pow(2).mean().backward();
    opt->step();
    torch::Tensor total = torch::zeros({}, device());
    for (int r = 0; r < n; ++r)
      total = total + serial->forward(input(step, r), takes_branch[step]).pow(2).mean();
    (total / n).backward();
    serial_opt->step();
    for (const auto& p : serial->named_parameters()) {
      DTL_EXPECT_CLOSE(model->named_parameters()[p.key()], p.value(), 1e-5, 1e-6)
          << p.key() << " after step " << step
          << (takes_branch[step] ? "" : " (a step that did not take the branch)");
    }
  }
}

TEST(DDPUnused, WithoutTheFlagBackwardRaisesInsteadOfHanging) {
  auto comm = fresh_comm();
  Branchy model;
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm);
  torch::manual_seed(32 + comm->rank());
  const torch::Tensor loss = model->forward(torch::randn({4, 6}, device()), true).pow(2).mean();
  const std::string msg = dtl::testing::error_of([&] { loss.backward(); });
  EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unused.weight"), std::string::npos)
      << "the message names the first parameter without a gradient: " << msg;
}

// Two local backwards under no_sync, then one synchronised one == one step on all three
// micro-batches' gradients summed (serial: one backward of the sum of the three losses).
TEST(DDPNoSync, AccumulatesLocallyThenSyncsOnce) {
  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  const int n = comm->size();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 9);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * n, cfg.seq_len);
  const torch::Tensor expected = dtl::testing::serial(1, [&] {
    GPT m(cfg);
    m->to(device());
    torch::Tensor total = torch::zeros({}, device());
    for (int k = 0; k < 3; ++k) total = total + m->loss(sampler.global_batch_at(k).to(device()));
    total.backward();
    return flat_grads(*m);
  });

  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, small_buckets());
  comm->reset_stats();
  {
    auto guard = ddp.no_sync();
    EXPECT_FALSE(OBSERVE(ddp.require_sync()));
    for (int k = 0; k < 2; ++k) model->loss(my_rows(sampler.global_batch_at(k).to(device()), *comm)).backward();
  }
  EXPECT_TRUE(OBSERVE(ddp.require_sync()));
  EXPECT_EQ(MEASURED(comm->stats()).total_count(), 0) << "nothing may be sent inside no_sync";
  model->loss(my_rows(sampler.global_batch_at(2).to(device()), *comm)).backward();
  EXPECT_EQ(MEASURED(comm->stats())[OpType::AllReduce].count,
            static_cast<int64_t>(OBSERVE(ddp.buckets().size())))
      << "the first backward after no_sync syncs once";
  DTL_EXPECT_CLOSE(flat_grads(*model), expected, 1e-4, 1e-6);
  DTL_EXPECT_SAME_ON_ALL_RANKS(flat_grads(*model));
}

// ---------------------------------------------------------------- gradient_as_bucket_view

TEST(DDPBucketView, GradsAreTheBucketsAndTrainingStillMatches) {
  DDPOptions opt = small_buckets();
  opt.gradient_as_bucket_view = true;
  const int n = dtl::world().size();
  expect_ddp_equals_serial(
      2 * n, 3, opt, [](GPT& m) { return dtl::make_adamw(*m, ddp_adamw()); }, 1e-4, 2e-5);

  auto comm = fresh_comm();
  const GPTConfig cfg = GPTConfig::tiny();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 10);
  const torch::Tensor global =
      dtl::data::GlobalBatchSampler(corpus, 2 * n, cfg.seq_len).global_batch_at(0).to(device());
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, opt);
  model->loss(my_rows(global, *comm)).backward();
  // Whether each pair of neighbours in a bucket has its grads back to back, computed in one
  // pass and observed as one list (the driver's own buckets need not match the student's).
  std::vector<std::vector<int>>
      adjacent;  // per bucket, per neighbour pair: 1 yes, 0 no, -1 no grad
  for (const auto& bucket : ddp.buckets()) {
    adjacent.emplace_back();
    for (size_t k = 0; k + 1 < bucket.size(); ++k) {
      const torch::Tensor& g = ddp.parameters()[static_cast<size_t>(bucket[k])].grad();
      const torch::Tensor& next = ddp.parameters()[static_cast<size_t>(bucket[k + 1])].grad();
      adjacent.back().push_back(!g.defined() || !next.defined()
                                    ? -1
                                    : static_cast<const char*>(g.data_ptr()) + g.numel() * 4 ==
                                          static_cast<const char*>(next.data_ptr()));
    }
  }
  adjacent = OBSERVE(adjacent);
  for (size_t b = 0; b < adjacent.size(); ++b)
    for (size_t k = 0; k < adjacent[b].size(); ++k) {
      ASSERT_NE(adjacent[b][k], -1) << "bucket " << b << ": a parameter without a grad";
      EXPECT_EQ(adjacent[b][k], 1)
          << "bucket " << b << ": the grads must lie back to back in the bucket buffer";
    }
}

}  // namespace
