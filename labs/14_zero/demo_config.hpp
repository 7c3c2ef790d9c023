// Shared by lab 14's demo and benchmark: the small GPT they train and its AdamW.
#pragma once

#include "dtl/optim.hpp"
#include "zero.hpp"

namespace dtl::lab14::demo {

// 4 blocks, d 128, 4 heads, V 256, T 64, tied head: six units (a block is 0.76 MiB of fp32),
// big enough that the shards are not noise, small enough for four ranks on two cores.
inline GPTConfig demo_config() { return GPTConfig::small(); }

// No weight decay (ZeroOptimizer's flat shards cannot tell matrices from biases); eps 1e-6 so
// that the benchmark's check against single-process AdamW is not at the mercy of eps-sized
// gradients.
inline OptimConfig demo_adamw() {
  OptimConfig oc;
  oc.eps = 1e-6;
  return oc;
}

}  // namespace dtl::lab14::demo
