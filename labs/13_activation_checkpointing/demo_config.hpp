// Shared by lab 13's demo and benchmark: the small GPT they run, and its gradients in one tensor.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "checkpointing.hpp"

namespace dtl::lab13::demo {

// 4 blocks, d 128, 4 heads, T 128, dropout on: big enough that matmuls, not op dispatch,
// dominate the step, small enough for a 2-core machine.
inline GPTConfig demo_config() {
  GPTConfig cfg;
  cfg.n_layer = 4;
  cfg.d_model = 128;
  cfg.n_head = 4;
  cfg.vocab_size = 256;
  cfg.seq_len = 128;
  cfg.dropout = 0.1;
  return cfg;
}

// Every parameter's gradient, flattened in registration order (all must exist).
inline torch::Tensor flat_grads(GPT& model) {
  std::vector<torch::Tensor> g;
  for (const auto& p : model->parameters()) g.push_back(p.grad().flatten());
  return torch::cat(g);
}

}  // namespace dtl::lab13::demo
