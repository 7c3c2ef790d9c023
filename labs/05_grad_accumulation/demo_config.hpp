// labs/05_grad_accumulation/demo_config.hpp — the workload of the demo (main.cpp) and the
// benchmark (bench.cpp). Not student code.
#pragma once

#include <cstdint>

#include "dtl/model.hpp"  // defines: model::GPTConfig

namespace dtl::lab05 {

// 2 blocks of width 128 on 64-token sequences over a 128-token vocabulary: 0.42M parameters,
// 1.6 MiB of float32 gradients; a global batch of 16-32 sequences runs in tens of ms per rank.
inline model::GPTConfig demo_config() {
  model::GPTConfig c;
  c.vocab_size = 128;
  c.seq_len = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 128;
  return c;
}

// DDP bucket caps (the first bucket too) for that model: 256 KiB cuts its gradients into
// several buckets, as PyTorch's 25 MiB does for a model of a few GB.
constexpr int64_t kDemoBucketBytes = int64_t{256} << 10;

}  // namespace dtl::lab05
