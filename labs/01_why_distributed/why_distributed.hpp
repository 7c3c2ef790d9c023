// why_distributed.hpp — lab 01: the interface the tests call (do not edit).
//
// defines: Precision, OptimizerKind, StateBytes, param_count, flops_per_token,
//          training_state_bytes, mfu, train_step                 <- you implement these
//          to_string(Precision), to_string(OptimizerKind)        <- given
// Provided by the runtime (common/): the optimizer (dtl/optim.hpp: OptimConfig, make_adamw,
// cosine_lr), real model shapes (GPTConfig::gpt3_175b, GPTConfig::llama2_7b_like) and the
// matmul peak (dtl/perf.hpp: measure_matmul_flops).
//
// The four counting functions turn a model config into the three numbers that decide whether
// training fits on one machine: how many parameters (N), how many FLOPs each token costs
// (about 6N), and how many bytes the training state needs (about 16 bytes per parameter with
// AdamW). train_step is the single-process step every later lab is measured against: lab 02's
// data-parallel step must reproduce it exactly, on any number of ranks.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "dtl/model.hpp"  // defines: GPTConfig, GPT, num_parameters
#include "dtl/optim.hpp"  // defines: OptimConfig, make_adamw, cosine_lr, set_lr

namespace dtl::lab01 {

using model::GPT;
using model::GPTConfig;

// ------------------------------------------------------------------ you implement these

// Exact number of trainable scalars of model::GPT(cfg), in closed form (no tensors). Derive
// it from the model's layout (dtl/model.hpp; model->named_parameters() of a small model lists
// every tensor): the token and the position embedding; in each of the n_layer blocks the fused
// qkv and output projections of attention, the MLP's two matrices (width cfg.ff()), two
// LayerNorms (a gain and a bias each) and, when cfg.bias, the bias of each of the four linear
// layers; the final LayerNorm; an lm head only when the head is not tied (a tied head IS the
// token embedding). Must equal model::num_parameters(*GPT(cfg)) for every valid config.
// Throws dtl::Error for an invalid config by calling cfg.validate(), whose messages the tests
// look for ("does not divide", "n_layer", "vocab_size"): let them through unchanged.
int64_t param_count(const GPTConfig& cfg);

// Training FLOPs per token (forward + backward), PaLM's formula (Chowdhery et al. 2022,
// appendix B) with this course's convention for N:
//   6 N  +  12 L d T
// N = param_count(cfg): every trainable parameter, the tied embedding once, the position
// embedding included (nanoGPT's estimate_mfu leaves it out; the difference, 6 S d, is 0.2%
// for llama2_7b_like). Throws like param_count for an invalid config. L = n_layer, d = d_model
// (= heads x head_dim, "H Q" in PaLM), T = seq_len (the context each token attends over).
// 6N: every parameter takes part in one multiply-add (2 FLOPs) per token in the forward pass,
// and twice that in the backward pass (gradient w.r.t. input and w.r.t. weight).
// 12 L d T: the two attention matmuls (Q K^T and P V) have no parameters, so 6N misses them:
// 2 x 2 d T FLOPs per token per layer forward, times 3 for forward + backward.
// Not counted: embedding lookups, LayerNorm, softmax, GELU (a few % for tiny models, <1% for
// large ones); no recomputation (that would be hardware FLOPs, not model FLOPs).
double flops_per_token(const GPTConfig& cfg);

// Number formats of the training state.
enum class Precision {
  kFP32,               // weights, grads and optimizer state all float32
  kMixedBF16,          // bf16 weights + bf16 grads; float32 master weights and optimizer state
  kMixedBF16FP32Grads  // bf16 weights, float32 grads (accumulated in fp32, as Megatron's
                       // distributed optimizer does); float32 master weights + optimizer state
};
// Optimizers by the state they keep per parameter (always float32).
enum class OptimizerKind {
  kSGD,          // none
  kSGDMomentum,  // one buffer (momentum)
  kAdamW         // two buffers (first and second moment, m and v)
};

// Names for messages ("kMixedBF16", "kAdamW"), so a failing test says which case failed.
inline const char* to_string(Precision p) {
  switch (p) {
    case Precision::kFP32: return "kFP32";
    case Precision::kMixedBF16: return "kMixedBF16";
    case Precision::kMixedBF16FP32Grads: return "kMixedBF16FP32Grads";
  }
  return "?";
}
inline const char* to_string(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kSGD: return "kSGD";
    case OptimizerKind::kSGDMomentum: return "kSGDMomentum";
    case OptimizerKind::kAdamW: return "kAdamW";
  }
  return "?";
}

// Bytes of the training state of one full replica of the model (no activations: lab 06).
struct StateBytes {
  int64_t params = 0;     // the weights forward and backward read (fp32 or bf16)
  int64_t grads = 0;      // one gradient per parameter
  int64_t master = 0;     // float32 master copy of the weights (mixed precision only, else 0)
  int64_t optimizer = 0;  // optimizer state (momentum / Adam moments), float32
  int64_t total() const { return params + grads + master + optimizer; }
};

// The training state of model::GPT(cfg) under the given precision and optimizer, by parameter
// count (param_count(cfg)) and bytes per element. Example: AdamW in kMixedBF16 is
// 2 + 2 + 4 + 8 = 16 bytes per parameter (the ZeRO paper's "16 psi").
StateBytes training_state_bytes(const GPTConfig& cfg, Precision precision, OptimizerKind optimizer);

// Model FLOPs utilisation: achieved model FLOP/s over the hardware's peak,
//   tokens_per_s x flops_per_token(cfg) / peak_flops.
// Throws dtl::Error when tokens_per_s < 0 or is not finite (the message contains
// "tokens_per_s"), or when peak_flops <= 0 or is not finite (it contains "peak_flops").
double mfu(double tokens_per_s, const GPTConfig& cfg, double peak_flops);

// One single-process training step on `batch` ([B, T + 1] int64 tokens from
// data::GlobalBatchSampler): clear old gradients, forward, mean cross-entropy loss
// (model->loss), backward, optimizer step. Returns the loss BEFORE the update. Gradients are
// left in the parameters' .grad() (tests read them). A malformed batch raises the model's own
// dtl::Error, whose message names the expected shape ("[B, T + 1]"): let it through unchanged
// (the grading tests look for it).
float train_step(GPT& model, torch::optim::Optimizer& optimizer, const torch::Tensor& batch);

}  // namespace dtl::lab01
