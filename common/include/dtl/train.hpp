// dtl/train.hpp — defines: train_step (the single-process ground truth).
//
// One plain training step of the course GPT on one process. Every parallel technique in the
// course is checked against it: same seed, same global batch, same optimizer -> the same
// parameters, up to float rounding. Lab 01 has students write it; this copy is the oracle.
#pragma once

#include <torch/torch.h>

#include "dtl/model.hpp"  // defines: model::GPT

namespace dtl {

// Clear gradients, forward, mean cross-entropy (model->loss), backward, optimizer step, on
// `batch` ([B, T + 1] int64 tokens). Returns the loss before the update; leaves the gradients
// in the parameters' .grad().
inline float train_step(model::GPT& model, torch::optim::Optimizer& optimizer,
                        const torch::Tensor& batch) {
  optimizer.zero_grad();
  torch::Tensor loss = model->loss(batch);
  loss.backward();
  optimizer.step();
  return loss.item<float>();
}

}  // namespace dtl
