// Shared by lab 06's public and grading tests: the model shapes they sweep.
#pragma once

#include <cstdint>

#include "memory.hpp"

namespace dtl::lab06::testing {

// A course GPT with the given layers, width, heads, vocabulary and context.
inline GPTConfig config(int64_t layers, int64_t d, int64_t heads, int64_t vocab, int64_t seq_len) {
  GPTConfig c;
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = heads;
  c.vocab_size = vocab;
  c.seq_len = seq_len;
  return c;
}

}  // namespace dtl::lab06::testing
