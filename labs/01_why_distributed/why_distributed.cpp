// why_distributed.cpp — lab 01: YOUR code. Replace every TODO(lab01) block.
//
// Read why_distributed.hpp first: each function's comment there is its specification
// (formulas, conventions, errors). Run the public tests with `./lab test 01`.
#include "why_distributed.hpp"

#include <fmt/format.h>

#include <cmath>

#include "dtl/error.hpp"  // defines: DTL_CHECK, DTL_UNIMPLEMENTED

namespace dtl::lab01 {

int64_t param_count(const GPTConfig& cfg) {
  // TODO(lab01): count the parameters of model::GPT(cfg) in closed form.
  //   - call cfg.validate() first, so a broken config raises dtl::Error;
  //   - embeddings, n_layer blocks (attention, MLP, two LayerNorms, optional biases), ln_f,
  //     and the lm head only when it is not tied (see the header for the layout);
  //   - model::num_parameters(*GPT(cfg)) is what the tests compare against: build a small
  //     model and print both while you work.
  DTL_UNIMPLEMENTED("lab 01: param_count");
}

double flops_per_token(const GPTConfig& cfg) {
  // TODO(lab01): 6 N + 12 L d T (see the header for why each term is there).
  DTL_UNIMPLEMENTED("lab 01: flops_per_token");
}

StateBytes training_state_bytes(const GPTConfig& cfg, Precision precision,
                                OptimizerKind optimizer) {
  // TODO(lab01): fill the four fields of StateBytes from param_count(cfg) and the bytes per
  // element of each piece: weights (fp32 4, bf16 2), grads (depends on the precision mode),
  // float32 master weights (mixed precision only) and float32 optimizer buffers (SGD 0,
  // momentum 1, AdamW 2).
  DTL_UNIMPLEMENTED("lab 01: training_state_bytes");
}

double mfu(double tokens_per_s, const GPTConfig& cfg, double peak_flops) {
  // TODO(lab01): achieved model FLOP/s divided by peak_flops. Reject bad input with DTL_CHECK:
  // tokens_per_s must be finite and >= 0, peak_flops finite and > 0 (name the argument in the
  // message, e.g. "mfu: peak_flops=0 must be finite and > 0").
  DTL_UNIMPLEMENTED("lab 01: mfu");
}

float train_step(GPT& model, torch::optim::Optimizer& optimizer, const torch::Tensor& batch) {
  // TODO(lab01): one training step: clear the old gradients, loss = model->loss(batch),
  // backward, optimizer step; return the loss value (before the update) as a float.
  DTL_UNIMPLEMENTED("lab 01: train_step");
}

}  // namespace dtl::lab01
