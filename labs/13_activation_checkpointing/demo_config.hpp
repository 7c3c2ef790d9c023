// Shared by lab 13's demo and benchmark: the small GPT they run, and its gradients in one tensor.
#pragma once

#include <torch/torch.h>

#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>  // mallopt
#endif

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

// Keeps freed memory in the process for the next step, as PyTorch's CUDA caching allocator does.
// glibc hands large blocks (above its mmap threshold) back to the OS when they are freed, and
// the next step page-faults them in again, zero-filled. Measured here, that costs a step without
// checkpointing (64 MiB of activations) more than full recomputation costs: less memory would
// look *faster*, which is true of this allocator, not of recomputation. With the threshold at
// its maximum (32 MiB, above any tensor of the demo) and no trimming, time measures compute.
inline void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace dtl::lab13::demo
