// Tests of the shared optimizer pieces (dtl/optim.hpp), the BLAS report and the ground-truth
// train step (dtl/train.hpp).
#include <gtest/gtest.h>

#include <cmath>

#include "dtl/blas.hpp"
#include "dtl/data.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "dtl/train.hpp"

namespace {

TEST(Optim, AdamWDecaysMatricesOnly) {
  torch::nn::Linear lin(4, 3);
  dtl::OptimConfig c;
  c.weight_decay = 0.1;
  auto opt = dtl::make_adamw(*lin, c);
  ASSERT_EQ(opt->param_groups().size(), 2u);
  const auto& decay = static_cast<const torch::optim::AdamWOptions&>(opt->param_groups()[0].options());
  const auto& none = static_cast<const torch::optim::AdamWOptions&>(opt->param_groups()[1].options());
  EXPECT_EQ(opt->param_groups()[0].params().size(), 1u);  // the weight
  EXPECT_EQ(opt->param_groups()[1].params().size(), 1u);  // the bias
  EXPECT_DOUBLE_EQ(decay.weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(none.weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(std::get<1>(decay.betas()), 0.95);
}

TEST(Optim, CosineAndWarmupSchedules) {
  dtl::OptimConfig c;
  c.lr = 1.0;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(dtl::cosine_lr(c, 0, 11), 1.0);
  EXPECT_NEAR(dtl::cosine_lr(c, 5, 11), 0.55, 1e-12);  // halfway: the mean of 1 and 0.1
  EXPECT_NEAR(dtl::cosine_lr(c, 10, 11), 0.1, 1e-12);
  EXPECT_NEAR(dtl::cosine_lr(c, 50, 11), 0.1, 1e-12);  // past the end: stays at the floor
  c.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(dtl::warmup_cosine_lr(c, 0, 14), 0.25);
  EXPECT_DOUBLE_EQ(dtl::warmup_cosine_lr(c, 3, 14), 1.0);
  EXPECT_DOUBLE_EQ(dtl::warmup_cosine_lr(c, 4, 14), 1.0);  // decay starts at the peak
  EXPECT_NEAR(dtl::warmup_cosine_lr(c, 13, 14), 0.1, 1e-12);
}

TEST(Optim, TrainStepLowersTheLoss) {
  auto cfg = dtl::model::GPTConfig::tiny();
  dtl::model::GPT model(cfg);
  auto opt = dtl::make_adamw(*model);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 1);
  dtl::data::GlobalBatchSampler sampler(corpus, 8, cfg.seq_len);
  const float first = dtl::train_step(model, *opt, sampler.global_batch_at(0));
  float last = first;
  for (int s = 1; s < 30; ++s) last = dtl::train_step(model, *opt, sampler.global_batch_at(s));
  EXPECT_LT(last, first - 0.5f) << "30 AdamW steps should cut the loss of a random model";
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
}

// ./lab setup installs OpenBLAS: every matmul in the course depends on it being picked up.
TEST(Blas, TorchUsesAnOptimizedBlas) {
  const dtl::BlasInfo b = dtl::blas_info();
  EXPECT_FALSE(b.library.empty()) << "no library provides sgemm_";
  EXPECT_TRUE(b.optimized) << "CPU matmuls use " << b.name << " (" << b.library
                           << "), 20x slower than OpenBLAS: run ./lab setup";
  EXPECT_LE(b.threads, dtl::Runtime::get().intra_op_threads())
      << "BLAS threads per rank must not exceed the Runtime's share of the cores";
  EXPECT_EQ(dtl::Runtime::get().blas().name, b.name);
}

}  // namespace
