// Public tests of lab 01. Run: ./lab test 01
//
// Oracles: the model's real parameter count (model::num_parameters), numbers computed by hand
// (the arithmetic is in the comments: redo it on paper), one SGD step computed independently
// with autograd, and the entropy floor of the synthetic corpus.
// Lab 01 is single-process: every rank runs the same tests on its own.
#include "why_distributed.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"           // defines: dtl::Error, dtl::NotImplemented
#include "dtl/harness/checks.hpp"  // defines: DTL_EXPECT_PARAMS_CLOSE, flat_params, flat_grads
#include "dtl/memory.hpp"          // defines: current_bytes, format_bytes
#include "dtl/runtime.hpp"         // defines: world()
#include "dtl/train.hpp"           // defines: dtl::train_step (the oracle)
#include "tests/why_distributed_test_util.hpp"  // defines: observed(StateBytes)

namespace dtl::lab01 {
namespace {

// Hand-checked configs. tiny(): V 64, S 16, L 2, H 2, d 32, ff 128, biases, tied head.
GPTConfig untied_no_bias() {  // V 100, S 24, L 3, H 4, d 48, ff 96, no biases, untied head
  GPTConfig c;
  c.vocab_size = 100;
  c.seq_len = 24;
  c.n_layer = 3;
  c.n_head = 4;
  c.d_model = 48;
  c.d_ff = 96;
  c.bias = false;
  c.tied_head = false;
  return c;
}

TEST(ParamCount, EqualsTheModelsRealParameterCount) {
  std::vector<GPTConfig> configs = {GPTConfig::tiny(), untied_no_bias()};
  GPTConfig deeper = GPTConfig::tiny();
  deeper.n_layer = 4;
  deeper.d_model = 64;
  deeper.n_head = 4;
  configs.push_back(deeper);
  GPTConfig odd_ff = GPTConfig::tiny();
  odd_ff.d_ff = 40;
  odd_ff.tied_head = false;
  configs.push_back(odd_ff);
  for (const GPTConfig& c : configs) {
    GPT model(c);
    EXPECT_EQ(OBSERVE(param_count(c)), model::num_parameters(*model)) << c.to_string();
  }
}

TEST(ParamCount, HandComputed) {
  // tiny: block = 4*32^2 + 2*32*128 + 4*32 (LNs) + (3*32 + 32 + 128 + 32) (biases) = 12704
  //       N = 64*32 + 16*32 + 2*12704 + 2*32 = 28032
  EXPECT_EQ(OBSERVE(param_count(GPTConfig::tiny())), 28032);
  // untied_no_bias: block = 4*48^2 + 2*48*96 + 4*48 = 18624
  //       N = 100*48 + 24*48 + 3*18624 + 2*48 + 100*48 (untied head) = 66720
  EXPECT_EQ(OBSERVE(param_count(untied_no_bias())), 66720);
  // GPT-3: 96 x (12 * 12288^2 + 13 * 12288 + 4 * 12288) + 50257*12288 + 2048*12288 + 2*12288
  EXPECT_EQ(OBSERVE(param_count(GPTConfig::gpt3_175b())), 174604259328LL);
  EXPECT_EQ(OBSERVE(param_count(GPTConfig::llama2_7b_like())), 6755459072LL);
}

TEST(FlopsPerToken, SixNPlusAttention) {
  // tiny: 6 * 28032 + 12 * 2 * 32 * 16 = 168192 + 12288
  EXPECT_DOUBLE_EQ(OBSERVE(flops_per_token(GPTConfig::tiny())), 180480.0);
  // untied_no_bias: 6 * 66720 + 12 * 3 * 48 * 24 = 400320 + 41472
  EXPECT_DOUBLE_EQ(OBSERVE(flops_per_token(untied_no_bias())), 441792.0);
  // GPT-3: 6 * 174604259328 + 12 * 96 * 12288 * 2048 = 1.0476e12 + 2.90e10
  EXPECT_DOUBLE_EQ(OBSERVE(flops_per_token(GPTConfig::gpt3_175b())), 1076616585216.0);
}

// The prediction against reality: the tracking allocator sees every byte torch allocates. After
// one fp32 AdamW step the live state is exactly weights + grads + Adam's two moments (the
// activations of the step are freed by then); only AdamW's per-tensor step counters and
// allocator rounding come on top.
TEST(TrainingStateBytes, MatchesWhatTheMemoryTrackerMeasures) {
  GPTConfig cfg = GPTConfig::tiny();
  cfg.d_model = 64;
  cfg.n_head = 4;
  const StateBytes predicted =
      observed(training_state_bytes(cfg, Precision::kFP32, OptimizerKind::kAdamW));
  data::SyntheticCorpus corpus(cfg.vocab_size, 5);
  data::GlobalBatchSampler sampler(corpus, 4, cfg.seq_len);
  const torch::Tensor batch = sampler.global_batch_at(0);
  const size_t before = memory::current_bytes();
  {
    GPT model(cfg);
    auto optimizer = make_adamw(*model);
    dtl::train_step(model, *optimizer, batch);  // the common oracle, not your train_step
    const double measured = static_cast<double>(memory::current_bytes() - before);
    EXPECT_NEAR(measured, static_cast<double>(predicted.total()), 0.02 * predicted.total() + 16384)
        << "measured " << memory::format_bytes(measured) << " of live training state; predicted "
        << memory::format_bytes(static_cast<double>(predicted.total()));
  }
}

TEST(TrainingStateBytes, EveryPrecisionAndOptimizer) {
  const GPTConfig c = GPTConfig::tiny();
  const int64_t n = 28032;
  struct Case {
    Precision p;
    OptimizerKind o;
    int64_t params, grads, master, optimizer;  // bytes per parameter
  };
  const std::vector<Case> cases = {
      {Precision::kFP32, OptimizerKind::kSGD, 4, 4, 0, 0},
      {Precision::kFP32, OptimizerKind::kSGDMomentum, 4, 4, 0, 4},
      {Precision::kFP32, OptimizerKind::kAdamW, 4, 4, 0, 8},
      {Precision::kMixedBF16, OptimizerKind::kSGD, 2, 2, 4, 0},
      {Precision::kMixedBF16, OptimizerKind::kAdamW, 2, 2, 4, 8},
      {Precision::kMixedBF16FP32Grads, OptimizerKind::kAdamW, 2, 4, 4, 8},
      {Precision::kMixedBF16FP32Grads, OptimizerKind::kSGDMomentum, 2, 4, 4, 4},
  };
  for (const Case& k : cases) {
    const StateBytes s = observed(training_state_bytes(c, k.p, k.o));
    const std::string what = std::string("precision ") + to_string(k.p) + ", optimizer " +
                             to_string(k.o);
    EXPECT_EQ(s.params, k.params * n) << what;
    EXPECT_EQ(s.grads, k.grads * n) << what;
    EXPECT_EQ(s.master, k.master * n) << what;
    EXPECT_EQ(s.optimizer, k.optimizer * n) << what;
  }
  // The lecture's headline: GPT-3 with mixed-precision AdamW needs 16 B/param = 2.79 TB.
  const StateBytes g = observed(
      training_state_bytes(GPTConfig::gpt3_175b(), Precision::kMixedBF16, OptimizerKind::kAdamW));
  EXPECT_EQ(g.total(), 16 * 174604259328LL);
}

TEST(Mfu, HandComputed) {
  // 1000 tokens/s x 180480 FLOPs/token on a 1 GFLOP/s machine = 18.048% of peak.
  EXPECT_DOUBLE_EQ(OBSERVE(mfu(1000.0, GPTConfig::tiny(), 1e9)), 0.18048);
  EXPECT_DOUBLE_EQ(OBSERVE(mfu(0.0, GPTConfig::tiny(), 1e9)), 0.0);
  // GPT-3 at 140k tokens/s on 1024 A100s (312 TFLOP/s each): 47%.
  EXPECT_NEAR(OBSERVE(mfu(140e3, GPTConfig::gpt3_175b(), 1024 * 312e12)), 0.4717, 1e-4);
}

using dtl::testing::expect_error_mentions;


TEST(Mfu, RejectsImpossibleInput) {
  expect_error_mentions([] { mfu(100.0, GPTConfig::tiny(), 0.0); }, "peak_flops");
  expect_error_mentions([] { mfu(-1.0, GPTConfig::tiny(), 1e9); }, "tokens_per_s");
  GPTConfig bad = GPTConfig::tiny();
  bad.n_head = 3;  // does not divide d_model 32
  expect_error_mentions([&] { param_count(bad); }, "does not divide");
}

// One step of train_step with plain SGD must equal w - lr * dL/dw, computed here with autograd
// on an identical model; a second step checks that old gradients were cleared first.
TEST(TrainStep, IsExactlyForwardBackwardStep) {
  const GPTConfig cfg = GPTConfig::tiny();
  data::SyntheticCorpus corpus(cfg.vocab_size, 3);
  data::GlobalBatchSampler sampler(corpus, 4, cfg.seq_len);
  const double lr = 0.5;
  GPT model(cfg), expected(cfg);
  model->to(testing::device());  // --device cuda: both on the GPU
  expected->to(testing::device());
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr));
  for (int64_t step = 0; step < 2; ++step) {
    const torch::Tensor batch = sampler.global_batch_at(step).to(testing::device());
    const float loss = OBSERVE(train_step(model, sgd, batch));

    for (auto& p : expected->parameters()) p.mutable_grad() = torch::Tensor();
    torch::Tensor ref_loss = expected->loss(batch);
    ref_loss.backward();
    EXPECT_NEAR(loss, ref_loss.item<float>(), 1e-6) << "train_step must return the loss of the "
                                                       "weights before the update, step "
                                                    << step;
    DTL_EXPECT_GRADS_CLOSE(*model, testing::flat_grads(*expected), 1e-5, 1e-7)
        << "gradients after train_step (step " << step << "): stale gradients not cleared?";
    {
      torch::NoGradGuard no_grad;
      for (auto& p : expected->parameters()) p.sub_(lr * p.grad());
    }
    DTL_EXPECT_PARAMS_CLOSE(*model, testing::flat_params(*expected), 1e-5, 1e-6)
        << "weights after step " << step;
  }
}

// The point of the synthetic corpus: its entropy rate is the best loss any model can reach,
// so "is training working" has a numeric answer.
TEST(TrainStep, ReachesTheEntropyFloor) {
  // 200 training steps are the slowest test of the lab and every rank would only repeat the
  // same single-process run: it runs once, at world size 1.
  if (dtl::world().size() > 1) GTEST_SKIP() << "single-process test: runs at world size 1";
  GPTConfig cfg = GPTConfig::tiny();  // vocab 64, seq 16, 2 layers, d 32
  data::SyntheticCorpus corpus(cfg.vocab_size, 11, /*branching=*/4);
  data::GlobalBatchSampler sampler(corpus, 32, cfg.seq_len);
  GPT model(cfg);
  model->to(testing::device());
  OptimConfig oc;
  oc.lr = 2e-2;
  auto optimizer = make_adamw(*model, oc);
  const int64_t steps = 200;
  std::vector<float> losses;
  for (int64_t step = 0; step < steps; ++step) {
    set_lr(*optimizer, cosine_lr(oc, step, steps));
    losses.push_back(
        train_step(model, *optimizer, sampler.global_batch_at(step).to(testing::device())));
  }
  losses = OBSERVE(losses);

  const double floor = corpus.entropy_rate();
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.3) << "an untrained model is ~uniform";
  const double last10 = std::accumulate(losses.end() - 10, losses.end(), 0.0) / 10;
  EXPECT_LT(last10, 1.10 * floor) << "mean loss of the last 10 of 200 steps vs entropy floor "
                                  << floor;
  EXPECT_GT(last10, 0.95 * floor) << "below the floor on fresh data: not a real training loss";
}

}  // namespace
}  // namespace dtl::lab01
