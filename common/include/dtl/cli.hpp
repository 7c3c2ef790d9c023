// dtl/cli.hpp — defines: add_model_options.
//
// The command-line flags every demo that trains the course GPT offers, in one place, so that
// `./lab run NN -- --layers 8` means the same in every lab.
#pragma once

#include <CLI/CLI.hpp>

#include "dtl/model.hpp"  // defines: model::GPTConfig

namespace dtl {

// --layers, --d-model, --heads, --vocab, --seq, each defaulting to cfg's current value.
inline void add_model_options(CLI::App& app, model::GPTConfig& cfg) {
  app.add_option("--layers", cfg.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "model width")->capture_default_str();
  app.add_option("--heads", cfg.n_head, "attention heads")->capture_default_str();
  app.add_option("--vocab", cfg.vocab_size, "vocabulary")->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "tokens per sequence")->capture_default_str();
}

}  // namespace dtl
