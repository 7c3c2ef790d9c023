// why_distributed.hpp — lab 01: the interface the tests call (do not edit).
//
// defines: Precision, OptimizerKind, StateBytes, param_count, flops_per_token,
//          training_state_bytes, mfu, train_step                 <- you implement these
//          OptimConfig, make_adamw, cosine_lr, set_lr, gpt3_175b, llama_7b_like,
//          measure_matmul_flops                                  <- provided
//
// The four counting functions turn a model config into the three numbers that decide whether
// training fits on one machine: how many parameters (N), how many FLOPs each token costs
// (about 6N), and how many bytes the training state needs (about 16 bytes per parameter with
// AdamW). train_step is the single-process step every later lab is measured against: lab 02's
// data-parallel step must reproduce it exactly, on any number of ranks.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "dtl/model.hpp"  // defines: GPTConfig, GPT, num_parameters
#include "dtl/timer.hpp"  // defines: Timer

namespace dtl::lab01 {

using model::GPT;
using model::GPTConfig;

// ------------------------------------------------------------------ you implement these

// Exact number of trainable scalars of model::GPT(cfg), in closed form (no tensors):
//   embeddings   V*d (token) + S*d (position)
//   per block    4 d^2 (qkv + attention proj) + 2 d ff (MLP) + 4 d (two LayerNorms)
//                + (3d + d + ff + d) biases when cfg.bias
//   final        2 d (ln_f) + V*d more when the head is not tied to the token embedding
// where V = vocab_size, S = seq_len, d = d_model, ff = cfg.ff(). Must equal
// model::num_parameters(*GPT(cfg)) for every valid config. Throws dtl::Error (via
// cfg.validate()) for an invalid config.
int64_t param_count(const GPTConfig& cfg);

// Training FLOPs per token (forward + backward), the PaLM / nanoGPT convention:
//   6 N  +  12 L d T
// N = param_count(cfg) (every parameter, tied embedding once), L = n_layer, d = d_model
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
// Throws dtl::Error naming the constraint when tokens_per_s < 0 or peak_flops <= 0 (or either
// is not finite).
double mfu(double tokens_per_s, const GPTConfig& cfg, double peak_flops);

// One single-process training step on `batch` ([B, T + 1] int64 tokens from
// data::GlobalBatchSampler): clear old gradients, forward, mean cross-entropy loss
// (model->loss), backward, optimizer step. Returns the loss BEFORE the update. Gradients are
// left in the parameters' .grad() (tests read them).
float train_step(GPT& model, torch::optim::Optimizer& optimizer, const torch::Tensor& batch);

// ------------------------------------------------------------------ provided (frame code)

// AdamW hyper-parameters the labs share, so every lab optimises the same way.
struct OptimConfig {
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;  // GPT-3 / LLaMA use 0.95: faster to react than the default 0.999
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied to matrices and embeddings only (nanoGPT's rule)
  double min_lr_ratio = 0.1;  // cosine_lr decays lr to lr * min_lr_ratio at the last step
};

// AdamW over model's parameters: decoupled weight decay on >= 2-D tensors (matrices,
// embeddings), none on biases and LayerNorm gains, which decay would only pull toward 0.
inline std::unique_ptr<torch::optim::AdamW> make_adamw(torch::nn::Module& model,
                                                       const OptimConfig& c = {}) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(c.weight_decay));
  groups.emplace_back(no_decay, opts(0.0));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(c.lr));
}

// Learning rate of `step` (0-based) out of `total` under cosine decay from c.lr down to
// c.lr * c.min_lr_ratio: big steps early to leave the random init fast, small steps late so
// the noise of each batch's gradient stops kicking the weights around the optimum.
inline double cosine_lr(const OptimConfig& c, int64_t step, int64_t total) {
  const double progress =
      total > 1 ? static_cast<double>(step) / static_cast<double>(total - 1) : 0;
  const double min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * std::min(progress, 1.0)));
}

// Sets the learning rate of every parameter group of any torch optimizer.
inline void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

// Real models in this GPT family, for the lecture's back-of-the-envelope numbers.
// GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d 12288, 96 heads, context 2048,
// GPT-2 vocabulary 50257, tied embedding.
inline GPTConfig gpt3_175b() {
  GPTConfig c;
  c.vocab_size = 50257;
  c.seq_len = 2048;
  c.n_layer = 96;
  c.n_head = 96;
  c.d_model = 12288;
  return c;
}
// A 7B model with LLaMA-7B's shapes (32 layers, d 4096, 32 heads, vocab 32000, context 4096,
// untied head, no biases). LLaMA's SwiGLU MLP has three [4096 x 11008] matrices; our GELU MLP
// has two, so ff = 1.5 x 11008 = 16512 gives the same MLP parameter count. Learned positions
// (LLaMA uses RoPE) add 16.8M: 6.76B here vs 6.74B for LLaMA-7B.
inline GPTConfig llama_7b_like() {
  GPTConfig c;
  c.vocab_size = 32000;
  c.seq_len = 4096;
  c.n_layer = 32;
  c.n_head = 32;
  c.d_model = 4096;
  c.d_ff = 16512;
  c.tied_head = false;
  c.bias = false;
  return c;
}

// The machine's achievable dense float32 matmul rate in FLOP/s, measured: for each size n,
// the median over `reps` timed n x n x n products (2 n^3 FLOPs each, after one warm-up); the
// result is the best size's median. This is the "peak" MFU is measured against here: the best
// this process does on the operation that dominates training, not a datasheet number (on a
// GPU one uses the datasheet's bf16 tensor-core peak, e.g. 312 TFLOP/s for an A100).
inline double measure_matmul_flops(const std::vector<int64_t>& sizes = {256, 512, 768},
                                   int reps = 5) {
  torch::NoGradGuard no_grad;
  double best = 0;
  for (const int64_t n : sizes) {
    const torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
    torch::Tensor c = torch::mm(a, b);  // warm-up: thread pool start, page faults
    std::vector<double> seconds;
    for (int i = 0; i < reps; ++i) {
      Timer t;
      torch::mm_out(c, a, b);
      seconds.push_back(t.seconds());
    }
    std::nth_element(seconds.begin(), seconds.begin() + reps / 2, seconds.end());
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n / seconds[reps / 2]);
  }
  return best;
}

}  // namespace dtl::lab01
