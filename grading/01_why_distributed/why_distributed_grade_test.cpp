// Grading tests of lab 01 (hidden until after the due date): more configs, edge cases and bad
// input. Same oracles as the public tests: the model's real numel, hand-computed numbers, an
// independently driven optimizer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"           // defines: dtl::Error, dtl::NotImplemented
#include "dtl/harness/checks.hpp"  // defines: DTL_EXPECT_PARAMS_CLOSE, flat_params, flat_grads
#include "tests/why_distributed_test_util.hpp"  // defines: observed(StateBytes)
#include "why_distributed.hpp"

namespace dtl::lab01 {
namespace {

using dtl::testing::expect_error_mentions;

TEST(ParamCountGrading, EveryCombinationOfOptions) {
  int checked = 0;
  for (int64_t vocab : {50, 97})
    for (int64_t seq : {8, 33})
      for (int64_t layers : {1, 3})
        for (int64_t d_ff : {0, 24})
          for (bool bias : {true, false})
            for (bool tied : {true, false}) {
              GPTConfig c;
              c.vocab_size = vocab;
              c.seq_len = seq;
              c.n_layer = layers;
              c.n_head = 3;
              c.d_model = 24;
              c.d_ff = d_ff;
              c.bias = bias;
              c.tied_head = tied;
              GPT model(c);
              EXPECT_EQ(OBSERVE(param_count(c)), model::num_parameters(*model)) << c.to_string();
              ++checked;
            }
  EXPECT_EQ(checked, 64);
}

TEST(ParamCountGrading, InvalidConfigsRaise) {
  GPTConfig c = GPTConfig::tiny();
  c.n_head = 5;
  expect_error_mentions([&] { param_count(c); }, "does not divide");
  c = GPTConfig::tiny();
  c.n_layer = 0;
  expect_error_mentions([&] { param_count(c); }, "n_layer");
  c = GPTConfig::tiny();
  c.vocab_size = 0;
  expect_error_mentions([&] { flops_per_token(c); }, "vocab_size");
}

TEST(FlopsGrading, MoreHandComputedConfigs) {
  // V 50, S 8, L 1, H 1, d 8, ff 32 (default 4d), biases, tied:
  // block = 4*64 + 2*8*32 + 4*8 + (24 + 8 + 32 + 8) = 872; N = 400 + 64 + 872 + 16 = 1352
  GPTConfig c;
  c.vocab_size = 50;
  c.seq_len = 8;
  c.n_layer = 1;
  c.n_head = 1;
  c.d_model = 8;
  EXPECT_EQ(OBSERVE(param_count(c)), 1352);
  EXPECT_DOUBLE_EQ(OBSERVE(flops_per_token(c)), 6.0 * 1352 + 12.0 * 1 * 8 * 8);  // 8880
  // The 7B model: attention is 12*32*4096*4096 = 6.4 GFLOP of 47 GFLOP per token at 4k context.
  EXPECT_DOUBLE_EQ(OBSERVE(flops_per_token(GPTConfig::llama2_7b_like())), 46975205376.0);
  // Doubling the context adds 12 L d T more attention FLOPs and 6 * S * d for the positions.
  GPTConfig longer = c;
  longer.seq_len = 16;
  const double f_longer = OBSERVE(flops_per_token(longer)), f = OBSERVE(flops_per_token(c));
  EXPECT_DOUBLE_EQ(f_longer - f, 6.0 * 8 * 8 + 12.0 * 8 * 8);
}

TEST(StateBytesGrading, RealModels) {
  const int64_t n175 = 174604259328LL, n7 = 6755459072LL;
  const StateBytes g = observed(
      training_state_bytes(GPTConfig::gpt3_175b(), Precision::kFP32, OptimizerKind::kAdamW));
  EXPECT_EQ(g.params, 4 * n175);
  EXPECT_EQ(g.grads, 4 * n175);
  EXPECT_EQ(g.master, 0);
  EXPECT_EQ(g.optimizer, 8 * n175);
  EXPECT_EQ(g.total(), 16 * n175);
  // Megatron's distributed-optimizer table: bf16 params + fp32 grads, Adam: 18 bytes/param.
  EXPECT_EQ(observed(training_state_bytes(GPTConfig::llama2_7b_like(),
                                          Precision::kMixedBF16FP32Grads, OptimizerKind::kAdamW))
                .total(),
            18 * n7);
  EXPECT_EQ(observed(training_state_bytes(GPTConfig::llama2_7b_like(), Precision::kMixedBF16,
                                          OptimizerKind::kSGD))
                .total(),
            8 * n7);
  EXPECT_EQ(observed(training_state_bytes(GPTConfig::llama2_7b_like(), Precision::kFP32,
                                          OptimizerKind::kSGDMomentum))
                .total(),
            12 * n7);
}

TEST(MfuGrading, LinearAndRejectsNonFinite) {
  const GPTConfig c = GPTConfig::tiny();
  const double m3000 = OBSERVE(mfu(3000.0, c, 2e9)), m1000 = OBSERVE(mfu(1000.0, c, 2e9));
  const double m1000_1e9 = OBSERVE(mfu(1000.0, c, 1e9));
  EXPECT_DOUBLE_EQ(m3000, 3 * m1000);
  EXPECT_DOUBLE_EQ(m1000, 0.5 * m1000_1e9);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error_mentions([&] { mfu(1.0, c, -5.0); }, "peak_flops");
  expect_error_mentions([&] { mfu(1.0, c, inf); }, "peak_flops");
  expect_error_mentions([&] { mfu(nan, c, 1e9); }, "tokens_per_s");
  expect_error_mentions([&] { mfu(inf, c, 1e9); }, "tokens_per_s");
}

// train_step with AdamW equals driving an identical AdamW by hand, step for step.
TEST(TrainStepGrading, MatchesAHandDrivenAdamW) {
  GPTConfig cfg = GPTConfig::tiny();
  cfg.tied_head = false;
  cfg.bias = false;
  data::SyntheticCorpus corpus(cfg.vocab_size, 5);
  data::GlobalBatchSampler sampler(corpus, 3, cfg.seq_len);
  GPT model(cfg), expected(cfg);
  model->to(testing::device());  // --device cuda: both on the GPU
  expected->to(testing::device());
  OptimConfig oc;
  oc.weight_decay = 0.1;
  auto opt = make_adamw(*model, oc), expected_opt = make_adamw(*expected, oc);
  for (int64_t step = 0; step < 4; ++step) {
    const torch::Tensor batch = sampler.global_batch_at(step).to(testing::device());
    const float loss = OBSERVE(train_step(model, *opt, batch));
    expected_opt->zero_grad();
    torch::Tensor ref = expected->loss(batch);
    ref.backward();
    expected_opt->step();
    EXPECT_NEAR(loss, ref.item<float>(), 1e-6) << "step " << step;
    DTL_EXPECT_GRADS_CLOSE(*model, testing::flat_grads(*expected), 1e-5, 1e-7)
        << "gradients must stay in .grad() after the step, step " << step;
    DTL_EXPECT_PARAMS_CLOSE(*model, testing::flat_params(*expected), 1e-5, 1e-6)
        << "step " << step;
  }
}

TEST(TrainStepGrading, ShortSequencesAndSingleRow) {
  const GPTConfig cfg = GPTConfig::tiny();  // context 16
  GPT model(cfg), expected(cfg);
  model->to(testing::device());
  expected->to(testing::device());
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  // One row of 5 tokens (T = 4 < seq_len): legal, the model uses the first 4 positions.
  const torch::Tensor batch =
      data::SyntheticCorpus(cfg.vocab_size, 9).sequence(0, 5).unsqueeze(0).to(testing::device());
  const float loss = OBSERVE(train_step(model, sgd, batch));
  torch::Tensor ref = expected->loss(batch);
  ref.backward();
  EXPECT_NEAR(loss, ref.item<float>(), 1e-6);
  DTL_EXPECT_GRADS_CLOSE(*model, testing::flat_grads(*expected), 1e-5, 1e-7);
}

TEST(TrainStepGrading, RejectsMalformedBatch) {
  const GPTConfig cfg = GPTConfig::tiny();
  GPT model(cfg);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor flat = torch::zeros({17}, torch::kLong);  // 1-D: not [B, T + 1]
  // The model's own check names the expected shape; train_step must not swallow it.
  expect_error_mentions([&] { train_step(model, sgd, flat); }, "[B, T + 1]");
}

}  // namespace
}  // namespace dtl::lab01
