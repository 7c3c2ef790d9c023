// Grading tests of lab 04 (hidden until after the due date): other models and caps, weights
// shared between modules, buffers, parameters used on some ranks only, option combinations,
// sub-communicators, a wrapper's lifetime, and bad input. Nothing here goes beyond ddp.hpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ddp.hpp"
#include "dtl/data.hpp"   // defines: SyntheticCorpus, GlobalBatchSampler
#include "tests/ddp_test_util.hpp"

namespace {

using namespace lab04_test;  // NOLINT: models and helpers shared with the public tests
using dtl::lab04::assign_buckets;
using dtl::lab04::verify_model_across_ranks;
using dtl::testing::error_of;
using dtl::testing::expect_error_mentions;
using dtl::testing::flat_grads;
using dtl::testing::flat_params;

// Untied head, no biases, 3 blocks of width 40 with 5 heads: ~0.23 MB of gradients.
GPTConfig untied_deeper() {
  GPTConfig c = GPTConfig::tiny();
  c.vocab_size = 80;
  c.seq_len = 20;
  c.n_layer = 3;
  c.n_head = 5;
  c.d_model = 40;
  c.tied_head = false;
  c.bias = false;
  return c;
}

// Naive averaging of `module`'s gradients (lab 02's method): the oracle for one backward.
// Each tensor once, even when registered under two names.
void naive_average(torch::nn::Module& module, Comm& comm) {
  std::vector<const void*> seen;
  for (auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    if (std::find(seen.begin(), seen.end(), p.unsafeGetTensorImpl()) != seen.end()) continue;
    seen.push_back(p.unsafeGetTensorImpl());
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    comm.all_reduce(p.mutable_grad());
    p.mutable_grad().div_(comm.size());
  }
}

TEST(GradeBuckets, ManyCapsOnAnUntiedModelFollowTheRule) {
  auto comm = fresh_comm();
  GPT model(untied_deeper());
  model->named_parameters()["blocks.1.attn.qkv.weight"].set_requires_grad(false);
  model->to(device());
  for (int64_t first : {int64_t{1}, int64_t{4096}, int64_t{40000}})
    for (int64_t cap : {int64_t{1}, int64_t{30000}, int64_t{100000}, int64_t{25} << 20}) {
      DistributedDataParallel ddp(model.ptr(), *comm, caps(first, cap));
      // The reference's assign_buckets in the autograder's driver: the rule, as an oracle.
      EXPECT_EQ(OBSERVE(ddp.buckets()), assign_buckets(managed_bytes(*model), first, cap))
          << "first " << first << ", cap " << cap;
      for (const auto& name : OBSERVE(ddp.parameter_names()))
        EXPECT_NE(name, "blocks.1.attn.qkv.weight") << "frozen parameters are not managed";
    }
}

TEST(GradeDDP, UntiedDeeperModelManyStepsAdamWAndSgd) {
  const GPTConfig cfg = untied_deeper();
  const int n = dtl::world().size();
  const std::vector<std::string> frozen = {"wpe.weight", "blocks.0.ln1.weight"};
  for (int optimizer = 0; optimizer < 2; ++optimizer) {
    auto make = [&](GPT& m) -> std::unique_ptr<torch::optim::Optimizer> {
      if (optimizer == 0) return dtl::make_adamw(*m, ddp_adamw());
      std::vector<torch::Tensor> trainable;
      for (auto& p : m->parameters())
        if (p.requires_grad()) trainable.push_back(p);
      return std::make_unique<torch::optim::SGD>(trainable, torch::optim::SGDOptions(0.3));
    };
    for (int64_t rows : {int64_t{n}, int64_t{3} * n + 2}) {
      auto comm = fresh_comm();
      dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 50 + rows);
      dtl::data::GlobalBatchSampler sampler(corpus, rows, cfg.seq_len);
      const int steps = 4;
      const torch::Tensor expected = serial_params(cfg, sampler, steps, make, frozen);
      GPT model(cfg);
      for (const auto& name : frozen) model->named_parameters()[name].set_requires_grad(false);
      model->to(device());
      DistributedDataParallel ddp(model.ptr(), *comm, caps(20000, 60000));
      auto opt = make(model);
      for (int s = 0; s < steps; ++s)
        ddp_step(model, *opt, sampler.global_batch_at(s).to(device()), *comm);
      DTL_EXPECT_CLOSE(flat_params(*model), expected, 1e-4, 5e-5)
          << (optimizer == 0 ? "AdamW" : "SGD") << ", global batch " << rows;
      DTL_EXPECT_SAME_ON_ALL_RANKS(flat_params(*model));
      EXPECT_EQ(MEASURED(comm->stats())[OpType::AllReduce].count,
                static_cast<int64_t>(steps * OBSERVE(ddp.buckets().size())));
    }
  }
}

// One Linear registered under two names (weights shared between modules): one managed
// parameter, hooked once, reduced once.
struct SharedImpl : torch::nn::Module {
  SharedImpl() {
    a = register_module("a", torch::nn::Linear(6, 6));
    b = register_module("b", a);  // the same module again
    out = register_module("out", torch::nn::Linear(6, 2));
    torch::manual_seed(17);
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.copy_(torch::randn_like(p) * 0.3);
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::tanh(b(torch::tanh(a(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, out{nullptr};
};
TORCH_MODULE(Shared);

TEST(GradeDDP, AWeightRegisteredTwiceIsManagedOnce) {
  auto comm = fresh_comm();
  Shared model;
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, caps(4, 64));
  EXPECT_EQ(OBSERVE(ddp.parameter_names()),
            (std::vector<std::string>{"a.weight", "a.bias", "out.weight", "out.bias"}))
      << "each tensor once, under its first name";
  torch::manual_seed(40 + comm->rank());
  const torch::Tensor x = torch::randn({3, 6}, device());
  Shared plain;
  plain->to(device());
  plain->forward(x).pow(2).mean().backward();
  naive_average(*plain, *comm);
  comm->reset_stats();
  model->forward(x).pow(2).mean().backward();
  EXPECT_EQ(MEASURED(comm->stats())[OpType::AllReduce].count,
            static_cast<int64_t>(OBSERVE(ddp.buckets().size())));
  dtl::testing::expect_modules_close(*model, *plain, 1e-5, 1e-7, /*grads=*/true);
}

struct WithBufferImpl : torch::nn::Module {
  explicit WithBufferImpl(bool extra) {
    lin = register_module("lin", torch::nn::Linear(4, 4));
    stats = register_buffer("stats", torch::full({3}, 1.0 + dtl::world().rank()));
    steps = register_buffer("steps", torch::full({1}, int64_t{10} * dtl::world().rank()));
    if (extra) register_buffer("extra", torch::zeros({2}));
  }
  torch::nn::Linear lin{nullptr};
  torch::Tensor stats, steps;
};
TORCH_MODULE(WithBuffer);

TEST(GradeDDP, BuffersComeFromRankZeroToo) {
  auto comm = fresh_comm();
  WithBuffer model(false);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.fill_(comm->rank());
  }
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm);
  DTL_EXPECT_EQUAL(model->stats.cpu(), torch::full({3}, 1.0));
  DTL_EXPECT_EQUAL(model->steps.cpu(), torch::zeros({1}, torch::kLong)) << "int64 buffers too";
  DTL_EXPECT_EQUAL(flat_params(*model).cpu(), torch::zeros({20}));
}

TEST(GradeVerify, AnExtraBufferOnOneRankIsNamed) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  WithBuffer model(comm->rank() == comm->size() - 1);
  const std::string msg = error_of([&] { verify_model_across_ranks(*model, *comm); });
  EXPECT_NE(msg.find("extra"), std::string::npos) << msg;
  EXPECT_NE(msg.find("differs across ranks"), std::string::npos) << msg;
  // Afterwards the ranks are still in lockstep: a collective completes.
  comm->barrier();
}

// `sometimes` is used on even ranks only: the others contribute zeros, everyone ends up with
// the same (mean) gradient; `unused` stays without one everywhere.
TEST(GradeDDP, AParameterUsedOnSomeRanksOnly) {
  auto comm = fresh_comm();
  const bool use = comm->rank() % 2 == 0;
  torch::manual_seed(60 + comm->rank());
  const torch::Tensor x = torch::randn({4, 6}, device());
  Branchy plain;
  plain->to(device());
  plain->forward(x, use).pow(2).mean().backward();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : plain->named_parameters()) {
      if (p.key().rfind("unused.", 0) == 0) continue;
      torch::Tensor& g = p.value().mutable_grad();
      if (!g.defined()) g = torch::zeros_like(p.value());
      comm->all_reduce(g);
      g.div_(comm->size());
    }
  }
  for (bool bucket_view : {false, true}) {
    Branchy model;
    model->to(device());
    DistributedDataParallel ddp(model.ptr(), *comm, caps(4, 100, true, bucket_view));
    for (int step = 0; step < 2; ++step) {  // twice: state is reset between backwards
      for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
      model->forward(x, use).pow(2).mean().backward();
      for (const auto& p : plain->named_parameters()) {
        const torch::Tensor g = model->named_parameters()[p.key()].grad();
        if (p.key().rfind("unused.", 0) == 0) {
          EXPECT_FALSE(OBSERVE(g.defined())) << p.key();
        } else {
          ASSERT_TRUE(OBSERVE(g.defined())) << p.key() << " (bucket view " << bucket_view << ")";
          DTL_EXPECT_CLOSE(g, p.value().grad(), 1e-5, 1e-7)
              << p.key() << ", bucket view " << bucket_view << ", step " << step;
        }
      }
    }
  }
}

// no_sync + gradient_as_bucket_view + find_unused_parameters: three micro-batches, and the
// middle one skips `sometimes`; the first synchronised backward carries all of them.
TEST(GradeDDP, NoSyncWithBucketViewAndFindUnused) {
  auto comm = fresh_comm();
  torch::manual_seed(70 + comm->rank());
  std::vector<torch::Tensor> xs;
  for (int k = 0; k < 3; ++k) xs.push_back(torch::randn({3, 6}, device()));
  const std::vector<bool> use = {true, false, false};
  Branchy plain;
  plain->to(device());
  for (int k = 0; k < 3; ++k) plain->forward(xs[k], use[k]).pow(2).mean().backward();
  naive_average(*plain, *comm);

  Branchy model;
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, caps(4, 100, true, true));
  comm->reset_stats();
  {
    auto guard = ddp.no_sync();
    for (int k = 0; k < 2; ++k) model->forward(xs[k], use[k]).pow(2).mean().backward();
  }
  EXPECT_EQ(MEASURED(comm->stats()).total_count(), 0);
  model->forward(xs[2], use[2]).pow(2).mean().backward();  // `sometimes` unused HERE only
  EXPECT_EQ(MEASURED(comm->stats())[OpType::AllReduce].count,
            static_cast<int64_t>(OBSERVE(ddp.buckets().size())) + 1);
  for (const auto& p : plain->named_parameters()) {
    if (p.key().rfind("unused.", 0) == 0) continue;
    const torch::Tensor g = model->named_parameters()[p.key()].grad();
    ASSERT_TRUE(OBSERVE(g.defined())) << p.key();
    DTL_EXPECT_CLOSE(g, p.value().grad(), 1e-5, 1e-7)
        << p.key() << ": used in a no_sync backward counts as used";
  }
}

// After the wrapper is gone, backward is plain local autograd again: no hook, no traffic.
TEST(GradeDDP, ADestroyedWrapperLeavesNoHooks) {
  auto comm = fresh_comm();
  Chain model(std::vector<int64_t>{5, 7, 3});
  model->to(device());
  torch::manual_seed(80 + comm->rank());
  const torch::Tensor x = torch::randn({4, 5}, device());
  {
    DistributedDataParallel ddp(model.ptr(), *comm);
    model->forward(x).sum().backward();
  }
  const int64_t before = MEASURED(comm->stats()).total_count();
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  model->forward(x).sum().backward();
  EXPECT_EQ(MEASURED(comm->stats()).total_count(), before)
      << "a destroyed wrapper still communicates";
  Chain plain(std::vector<int64_t>{5, 7, 3});
  plain->to(device());
  plain->forward(x).sum().backward();
  dtl::testing::expect_modules_close(*model, *plain, 1e-6, 1e-7, /*grads=*/true);
  // And a new wrapper on the same module works.
  DistributedDataParallel again(model.ptr(), *comm);
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  model->forward(x).sum().backward();
  DTL_EXPECT_SAME_ON_ALL_RANKS(flat_grads(*model));
}

// Each wrapper uses the Comm it is given: even and odd ranks train two independent groups.
TEST(GradeDDP, TrainsOnASubCommunicator) {
  std::shared_ptr<Comm> group = dtl::world().split(dtl::world().rank() % 2, dtl::world().rank());
  const GPTConfig cfg = GPTConfig::tiny();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 90 + dtl::world().rank() % 2);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * group->size() + 1, cfg.seq_len);
  auto make = [](GPT& m) { return dtl::make_adamw(*m, ddp_adamw(0.0)); };
  const torch::Tensor expected = serial_params(cfg, sampler, 2, make);
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *group, caps(10000, 30000));
  auto opt = make(model);
  for (int s = 0; s < 2; ++s) ddp_step(model, *opt, sampler.global_batch_at(s).to(device()), *group);
  DTL_EXPECT_CLOSE(flat_params(*model), expected, 1e-4, 2e-5)
      << "group " << dtl::world().rank() % 2 << " of size " << group->size();
  EXPECT_EQ(MEASURED(group->stats())[OpType::AllReduce].count,
            static_cast<int64_t>(2 * OBSERVE(ddp.buckets().size())));
}

// Every bucket that holds no embedding is issued before autograd reaches the embedding output
// (not only bucket 0): each is issued by the hook that completes it.
TEST(GradeDDP, EveryBucketBeforeTheEmbeddingIsIssuedDuringBackward) {
  auto comm = fresh_comm();
  const GPTConfig cfg = untied_deeper();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 11);
  const torch::Tensor tokens =
      dtl::data::GlobalBatchSampler(corpus, comm->size(), cfg.seq_len).global_batch_at(0).to(device());
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm, caps(30000, 50000));
  const std::vector<std::vector<std::string>> names = observed_bucket_names(ddp);
  const std::vector<int64_t> numels = observed_bucket_numels(ddp);
  ASSERT_LE(names.size(), 15u);
  ASSERT_EQ(numels.size(), names.size());
  size_t last_without_embedding = 0;  // buckets [0, this) hold no wte / wpe
  while (last_without_embedding < names.size()) {
    bool has = false;
    for (const std::string& name : names[last_without_embedding])
      has |= name.rfind("wpe", 0) == 0 || name.rfind("wte", 0) == 0;
    if (has) break;
    ++last_without_embedding;
  }
  ASSERT_GE(last_without_embedding, 3u);

  // A moment on the student's process's clock: measured there, compared with its op records.
  const double marker = MEASURED(backward_marking_the_embedding(model, my_rows(tokens, *comm)));
  const std::vector<OpRecord> ops = measured_all_reduces(*comm);
  ASSERT_EQ(ops.size(), names.size());
  for (size_t b = 0; b < last_without_embedding; ++b) {
    EXPECT_EQ(numel_of(ops[b]), numels[b]) << "bucket order";
    EXPECT_LT(ops[b].issued, marker) << "bucket " << b << " was issued after backward reached "
                                     << "the embedding: issue each bucket as it completes";
  }
  // What was issued is the averaged gradient.
  GPT naive = naive_averaged(cfg, my_rows(tokens, *comm));
  dtl::testing::expect_modules_close(*model, *naive, 1e-5, 1e-7, /*grads=*/true);
}

// The next synchronised backward after a failed one works (the wrapper's state is reset).
TEST(GradeDDP, AfterAnUnusedParameterErrorTheNextBackwardWorks) {
  auto comm = fresh_comm();
  Branchy model;
  model->named_parameters()["unused.weight"].set_requires_grad(false);
  model->named_parameters()["unused.bias"].set_requires_grad(false);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), *comm);
  torch::manual_seed(100 + comm->rank());
  const torch::Tensor x = torch::randn({4, 6}, device());
  expect_error_mentions([&] { model->forward(x, false).pow(2).mean().backward(); },
                        "sometimes.weight");
  // On CUDA, wait() does not block the host: the ops end on the GPU a little later.
  if (!device().is_cpu()) comm->barrier();
  EXPECT_EQ(MEASURED(comm->pending_ops().size()), 0u)
      << "every all-reduce completed before the error";
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  model->forward(x, true).pow(2).mean().backward();
  Branchy plain;
  plain->named_parameters()["unused.weight"].set_requires_grad(false);
  plain->named_parameters()["unused.bias"].set_requires_grad(false);
  plain->to(device());
  plain->forward(x, true).pow(2).mean().backward();
  naive_average(*plain, *comm);
  dtl::testing::expect_modules_close(*model, *plain, 1e-5, 1e-7, /*grads=*/true);
}

struct MixedImpl : torch::nn::Module {
  MixedImpl() {
    a = register_parameter("a", torch::ones({3}));
    b = register_parameter("b", torch::ones({3}, torch::kFloat64));
  }
  torch::Tensor a, b;
};
TORCH_MODULE(Mixed);

TEST(GradeDDP, RejectsBadInputOnEveryRank) {
  auto comm = fresh_comm();
  Mixed mixed;
  mixed->to(device());
  expect_error_mentions([&] { DistributedDataParallel ddp(mixed.ptr(), *comm); }, "dtype");
  Chain frozen(std::vector<int64_t>{3, 3});
  for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  frozen->to(device());
  expect_error_mentions([&] { DistributedDataParallel ddp(frozen.ptr(), *comm); },
                        "no parameter");
  Chain chain(std::vector<int64_t>{3, 3});
  chain->to(device());
  DDPOptions o;
  o.bucket_cap_bytes = 0;
  expect_error_mentions([&] { DistributedDataParallel ddp(chain.ptr(), *comm, o); },
                        "bucket_cap_bytes");
  comm->barrier();  // still in lockstep
}

}  // namespace
