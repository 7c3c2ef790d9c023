// why_distributed.cpp — lab 01 reference solution.
//
// Four small formulas and one training step. The formulas are the whole argument of lecture
// 01: plug GPT-3's config into them and the answers (2.8 TB of training state, 3e23 FLOPs)
// say that no single device can hold or train the model in a useful time.
#include "why_distributed.hpp"

#include <fmt/format.h>

#include <cmath>

#include "dtl/error.hpp"  // defines: DTL_CHECK

namespace dtl::lab01 {

int64_t param_count(const GPTConfig& cfg) {
  cfg.validate();  // "n_head=3 does not divide d_model=64" beats a wrong number
  const int64_t V = cfg.vocab_size, S = cfg.seq_len, d = cfg.d_model, ff = cfg.ff();

  // One transformer block. The matrices dominate: 4 d^2 in attention (the fused qkv [3d, d]
  // plus the output projection [d, d]) and 2 d ff in the MLP (fc [ff, d], proj [d, ff]);
  // with ff = 4d that is the famous 12 d^2 per layer.
  int64_t block = 4 * d * d + 2 * d * ff;
  block += 2 * (2 * d);                       // ln1 and ln2: a gain and a bias each
  if (cfg.bias) block += 3 * d + d + ff + d;  // qkv, attn proj, fc, mlp proj biases

  int64_t n = V * d + S * d;  // token and position embeddings
  n += cfg.n_layer * block;
  n += 2 * d;  // final LayerNorm
  // A tied head reuses the token embedding (counted once); an untied one is a second [V, d].
  if (!cfg.tied_head) n += V * d;
  return n;
}

double flops_per_token(const GPTConfig& cfg) {
  const double n = static_cast<double>(param_count(cfg));
  // Forward: 2 FLOPs (multiply + add) per parameter per token; backward: twice the forward
  // (one matmul for the input gradient, one for the weight gradient) -> 6N.
  const double dense = 6.0 * n;
  // Attention scores Q K^T and the weighted sum P V: per token and layer, 2 d T FLOPs each
  // forward (T keys of d = heads x head_dim), x3 for forward + backward -> 12 L d T.
  const double attention = 12.0 * static_cast<double>(cfg.n_layer) *
                           static_cast<double>(cfg.d_model) * static_cast<double>(cfg.seq_len);
  return dense + attention;
}

namespace {
// Bytes of one element of the working weights and of the gradients.
int64_t weight_bytes(Precision p) { return p == Precision::kFP32 ? 4 : 2; }
int64_t grad_bytes(Precision p) { return p == Precision::kMixedBF16 ? 2 : 4; }
// Float32 buffers the optimizer keeps per parameter.
int64_t optimizer_buffers(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kSGD:
      return 0;
    case OptimizerKind::kSGDMomentum:
      return 1;
    case OptimizerKind::kAdamW:
      return 2;
  }
  throw Error("training_state_bytes: unknown OptimizerKind");
}
}  // namespace

StateBytes training_state_bytes(const GPTConfig& cfg, Precision precision,
                                OptimizerKind optimizer) {
  const int64_t n = param_count(cfg);
  StateBytes s;
  s.params = n * weight_bytes(precision);
  s.grads = n * grad_bytes(precision);
  // Mixed precision updates a float32 copy of the weights: bf16 has 8 mantissa bits, so
  // w + lr * update would round the small update away. The bf16 weights are re-cast from it.
  s.master = precision == Precision::kFP32 ? 0 : n * 4;
  s.optimizer = n * 4 * optimizer_buffers(optimizer);
  return s;
}

double mfu(double tokens_per_s, const GPTConfig& cfg, double peak_flops) {
  DTL_CHECK(std::isfinite(tokens_per_s) && tokens_per_s >= 0,
            fmt::format("mfu: tokens_per_s={} must be finite and >= 0", tokens_per_s));
  DTL_CHECK(std::isfinite(peak_flops) && peak_flops > 0,
            fmt::format("mfu: peak_flops={} must be finite and > 0", peak_flops));
  // Model FLOPs, not hardware FLOPs: recomputation (lab 13) would not count.
  return tokens_per_s * flops_per_token(cfg) / peak_flops;
}

float train_step(GPT& model, torch::optim::Optimizer& optimizer, const torch::Tensor& batch) {
  // Gradients accumulate in .grad() across backward calls (that is how gradient accumulation
  // works, lab 05), so the previous step's gradients must be cleared first.
  optimizer.zero_grad();
  torch::Tensor loss = model->loss(batch);  // mean cross-entropy over B x T predictions
  loss.backward();                          // fills p.grad() for every parameter
  optimizer.step();                         // AdamW: update moments, then the weights
  return loss.item<float>();                // the loss of the weights before the update
}

}  // namespace dtl::lab01
