// Shared by lab 06's public and grading tests: the model shapes they sweep.
#pragma once

#include <cstdint>

#include "dtl/harness/checks.hpp"  // defines: gpt_config
#include "memory.hpp"

namespace dtl::lab06::testing {

// A course GPT with the given layers, width, heads, vocabulary and context.
inline GPTConfig config(int64_t layers, int64_t d, int64_t heads, int64_t vocab, int64_t seq_len) {
  return dtl::testing::gpt_config(layers, d, heads, vocab, seq_len);
}

}  // namespace dtl::lab06::testing
