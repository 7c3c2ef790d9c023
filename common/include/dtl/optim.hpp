// dtl/optim.hpp — defines: OptimConfig, make_adamw, make_adamw_groups, cosine_lr, warmup_cosine_lr,
// set_lr.
//
// The optimizer every lab trains with, in one place: AdamW with GPT-style hyper-parameters and
// a cosine learning-rate schedule. A parallel lab must step exactly like the single-process
// run it is compared with, so both sides build their optimizer here.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace dtl {

// AdamW hyper-parameters the labs share.
struct OptimConfig {
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;  // GPT-3 and LLaMA use 0.95: reacts faster than the default 0.999
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied to matrices and embeddings only (nanoGPT's rule)
  double min_lr_ratio = 0.1;  // the schedules decay lr to lr * min_lr_ratio at the last step
  int64_t warmup_steps = 0;   // warmup_cosine_lr: linear ramp from 0 over this many steps
};

// AdamW with the groups given: `decay` gets c.weight_decay, `no_decay` none. For tensors whose
// own shape does not tell (FSDP's 1-D pieces of a flat shard, lab 15: a piece of a matrix
// decays, a piece of a bias does not).
inline std::unique_ptr<torch::optim::AdamW> make_adamw_groups(const std::vector<torch::Tensor>& decay,
                                                              const std::vector<torch::Tensor>& no_decay,
                                                              const OptimConfig& c = {}) {
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(c.weight_decay));
  groups.emplace_back(no_decay, opts(0.0));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(c.lr));
}
// AdamW over `params`: decoupled weight decay on >= 2-D tensors (matrices, embeddings), none on
// biases and LayerNorm gains, which decay would only pull toward 0. Parameter order (and so
// the optimizer's state order) is the order given.
inline std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& params,
                                                       const OptimConfig& c = {}) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  return make_adamw_groups(decay, no_decay, c);
}
// The same over every parameter of `model` (model.parameters() order).
inline std::unique_ptr<torch::optim::AdamW> make_adamw(torch::nn::Module& model,
                                                       const OptimConfig& c = {}) {
  return make_adamw(model.parameters(), c);
}

// Learning rate of `step` (0-based) out of `total` under cosine decay from c.lr down to
// c.lr * c.min_lr_ratio: big steps early to leave the random init fast, small steps late so
// the noise of each batch's gradient stops kicking the weights around the optimum.
inline double cosine_lr(const OptimConfig& c, int64_t step, int64_t total) {
  const double progress =
      total > 1 ? static_cast<double>(step) / static_cast<double>(total - 1) : 0;
  const double min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * std::min(progress, 1.0)));
}

// Linear warm-up from 0 to c.lr over c.warmup_steps steps (step s gets lr (s+1)/warmup), then
// cosine decay over the remaining steps down to c.lr * c.min_lr_ratio at step total - 1.
// Warm-up keeps Adam's first updates small while its second-moment estimate is still noisy.
inline double warmup_cosine_lr(const OptimConfig& c, int64_t step, int64_t total) {
  if (step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  return cosine_lr(c, step - c.warmup_steps, std::max<int64_t>(total - c.warmup_steps, 1));
}

// Sets the learning rate of every parameter group of any torch optimizer.
inline void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace dtl
