// Shared by lab 15's demo and benchmark: the small GPT they train, its AdamW, and the strategies
// they compare.
#pragma once

#include <string>
#include <vector>

#include "dtl/optim.hpp"
#include "fsdp.hpp"

namespace dtl::lab15::demo {

// 4 blocks, d 128, 4 heads, V 256, T 64, tied head: a block is 0.76 MiB of fp32, the root
// 0.16 MiB; big enough that the shards are not noise, small enough for four ranks on two cores.
inline GPTConfig demo_config() { return GPTConfig::small(); }

// Weight decay on the matrices (what lab 14's flat shards could not do, and FSDP's pieces can);
// eps 1e-6 so that checks against DDP are not at the mercy of eps-sized gradients.
inline OptimConfig demo_adamw() {
  OptimConfig oc;
  oc.eps = 1e-6;
  oc.weight_decay = 0.1;
  return oc;
}

// The four strategies, HYBRID_SHARD with nodes of `ranks_per_node` ranks.
inline std::vector<FSDPConfig> strategies(int ranks_per_node) {
  std::vector<FSDPConfig> out(4);
  out[0].strategy = ShardingStrategy::FULL_SHARD;
  out[1].strategy = ShardingStrategy::SHARD_GRAD_OP;
  out[2].strategy = ShardingStrategy::NO_SHARD;
  out[3].strategy = ShardingStrategy::HYBRID_SHARD;
  out[3].ranks_per_node = ranks_per_node;
  return out;
}

}  // namespace dtl::lab15::demo
