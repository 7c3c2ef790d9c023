// dtl/model.hpp — defines: model::GPTConfig, init_normal, init_parameters, causal_attention,
// lm_loss, CausalSelfAttention, MLP, Block, GPT, num_parameters.
//
// The GPT-2-style decoder every lab trains: token + learned position embeddings, n_layer
// pre-LayerNorm blocks (causal multi-head self-attention, GELU MLP), a final LayerNorm and a
// language-model head that is tied to the token embedding by default.
//
// Initialisation is a pure function of (seed, parameter name): init_normal draws the FULL
// tensor of a parameter from its own generator. A tensor-parallel, pipeline or FSDP version of
// the model builds exactly the same numbers by slicing the full tensor of the same name, in
// any creation order and on any rank, so "equal to serial training" is testable bit for bit.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace dtl {
namespace model {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t seq_len = 64;  // maximum context = number of learned positions
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t d_model = 64;
  int64_t d_ff = 0;       // 0 means 4 * d_model
  double dropout = 0.0;   // on attention probabilities and residual branches (train mode only)
  bool tied_head = true;  // the lm head shares the token-embedding weight
  bool bias = true;       // biases in Linear layers (LayerNorm always has one)
  uint64_t seed = 1234;   // init seed

  int64_t ff() const;        // effective d_ff
  int64_t head_dim() const;  // d_model / n_head
  // Throws dtl::Error naming the broken constraint, e.g.
  // "GPTConfig: n_head=3 does not divide d_model=64".
  void validate() const;
  std::string to_string() const;  // one line, every field
  static GPTConfig tiny();        // vocab 64, seq 16, 2 layers, 2 heads, d_model 32: for tests
  // vocab 256, seq 64, 4 layers, 4 heads, d_model 128 (a block is 0.76 MiB of fp32): the demos of
  // the sharding labs (14, 15), big enough that shards are not noise, small enough for four ranks
  // on two cores.
  static GPTConfig small();

  // Real models in this GPT family, for the lectures' back-of-the-envelope numbers.
  // GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d 12288, 96 heads, context 2048,
  // GPT-2 vocabulary 50257, tied embedding. Trained on 300B tokens.
  static GPTConfig gpt3_175b();
  // A 7B model with Llama 2 7B's shapes (Touvron et al. 2023: 32 layers, d 4096, 32 heads,
  // vocab 32000, context 4096, untied head, no biases; pretrained on 2T tokens). The first
  // LLaMA 7B had the same shapes with context 2048. Llama's SwiGLU MLP has three [4096 x 11008] matrices; our GELU MLP has two, so
  // ff = 1.5 x 11008 = 16512 gives the same MLP parameter count. Learned positions (Llama uses
  // RoPE, no parameters) add 16.8M: 6.76B here vs 6.74B for Llama 2 7B.
  static GPTConfig llama2_7b_like();
};

// Deterministic initial value of the FULL (unsharded) parameter `name`: normal(0, std) float32
// drawn from a CPU generator seeded by mixing `seed` with a stable hash (FNV-1a) of `name`.
// Independent of every other parameter and of creation order; slice it to get a shard.
torch::Tensor init_normal(uint64_t seed, const std::string& name, at::IntArrayRef shape,
                          double std);

// Sets every parameter of `module` to its GPT-2 initial value, naming it prefix + local name
// ("blocks.3." + "attn.qkv.weight"): weights and embeddings init_normal(cfg.seed, name, std
// 0.02), the residual projections (attn.proj, mlp.proj) std 0.02 / sqrt(2 * n_layer), biases
// 0, LayerNorm weights 1. GPT calls it on itself; a pipeline stage that builds only some
// blocks calls it per block with "blocks.<i>." and gets the same numbers as the full model.
void init_parameters(torch::nn::Module& module, const GPTConfig& cfg,
                     const std::string& prefix = "");

// Causal scaled-dot-product attention written out (LibTorch 1.13 has no SDPA):
// q, k, v [B, H, T, Dh] -> [B, H, T, Dh]. Position t attends to positions <= t only.
// dropout_p applies to the attention probabilities when `training`.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training);

// Mean cross-entropy of logits [B, T, V] against next-token targets [B, T] (int64).
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

// Multi-head causal self-attention. One fused `qkv` Linear [3d, d] whose output rows are
// [q; k; v], each section [d, d] with heads contiguous (head h = rows h*Dh .. (h+1)*Dh of each
// section), so a tensor-parallel rank owning heads [a, b) takes the same row range of each of
// the three sections. `proj` Linear [d, d] mixes the heads back.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]

  torch::nn::Linear qkv{nullptr};
  torch::nn::Linear proj{nullptr};
  int64_t n_head;
  int64_t head_dim;
  double dropout;
};
TORCH_MODULE(CausalSelfAttention);

// fc Linear [ff, d] -> GELU (tanh approximation, as GPT-2) -> proj Linear [d, ff].
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]

  torch::nn::Linear fc{nullptr};
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(MLP);

// Pre-LN transformer block: x + drop(attn(ln1(x))), then x + drop(mlp(ln2(x))).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]

  torch::nn::LayerNorm ln1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln2{nullptr};
  MLP mlp{nullptr};
  double dropout;
};
TORCH_MODULE(Block);

// The whole model. Members are public so later labs can run pieces on their own: a pipeline
// stage runs embed() or some blocks or head(); activation checkpointing wraps single blocks.
// Constructing a GPT does not advance torch's global random generator.
class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& cfg);

  // idx [B, T] int64 token ids, T <= seq_len -> logits [B, T, V].
  torch::Tensor forward(const torch::Tensor& idx);
  // tokens [B, T + 1] -> scalar mean cross-entropy of predicting tokens[:, 1:] from
  // tokens[:, :-1] (what SyntheticCorpus batches hold).
  torch::Tensor loss(const torch::Tensor& tokens);

  torch::Tensor embed(const torch::Tensor& idx);  // [B, T] -> wte(idx) + wpe(0..T-1): [B, T, d]
  torch::Tensor head(const torch::Tensor& x);     // [B, T, d] -> ln_f, lm head: [B, T, V]
  Block block(int64_t i) const;                   // blocks[i] as a Block
  const GPTConfig& config() const { return cfg_; }

  torch::nn::Embedding wte{nullptr};      // [V, d]
  torch::nn::Embedding wpe{nullptr};      // [seq_len, d]
  torch::nn::ModuleList blocks{nullptr};  // n_layer Blocks: "blocks.0", "blocks.1", ...
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // [V, d], no bias; only when !tied_head

 private:
  GPTConfig cfg_;
};
TORCH_MODULE(GPT);

// Number of scalar parameters; a tensor registered under several names counts once.
int64_t num_parameters(torch::nn::Module& module);

}  // namespace model
}  // namespace dtl
