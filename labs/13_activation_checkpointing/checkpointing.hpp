// checkpointing.hpp — lab 13: the interface the tests call (do not edit).
//
// defines: CheckpointFn, checkpoint, wrap_fn / unwrap_fn (given), Policy, to_string (given),
//          block_forward, gpt_loss, ActivationMemory, activation_memory, recompute_flops, Plan,
//          choose_checkpointing
//
// Activation checkpointing trades compute for memory: a checkpointed piece of the forward pass
// keeps only its inputs, and backward runs it again (with autograd on) to get the tensors its
// gradient needs. Which pieces to checkpoint is the whole art: the attention core alone
// ("selective", Korthikanti et al. 2022) drops the activations that grow with the square of the
// sequence for a few percent more FLOPs; whole blocks ("full") keep one tensor per block for
// one more forward pass. Done right, checkpointing changes no number: the gradients are the
// same bits as without it, dropout included, which is what the tests check first.
//
// Errors: every function below raises dtl::Error (never a crash or a hang) whose message
// contains the word given in its comment.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "dtl/model.hpp"  // defines: model::GPTConfig, GPT, Block, causal_attention, lm_loss

namespace dtl::lab13 {

using model::Block;
using model::GPT;
using model::GPTConfig;

// ---------------------------------------------------------------- Task 1: checkpoint

// The piece of forward to checkpoint: tensors in, one tensor out. It is called once in forward
// and once more in backward, possibly long after the caller returned: capture by value.
using CheckpointFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// out = fn(inputs), as a custom autograd function (torch::autograd::Function):
//  - forward runs fn with autograd off, so none of fn's intermediate tensors is kept; it saves
//    the inputs (save_for_backward) and the state of the random generators fn may draw from:
//    the CPU generator always, and the default CUDA generator of each CUDA device the inputs
//    live on. The output requires grad when an input does.
//  - backward recomputes fn with autograd on, from fresh leaves that share the saved inputs'
//    storage (detach, requires_grad as the input's), with the generators set to the states saved
//    in forward (the same dropout masks) and put back afterwards to what they held before
//    backward (the rest of training sees the same random stream as without checkpointing);
//    then backpropagates the incoming gradient through the recomputed output. Parameters fn
//    uses receive their gradients there, exactly as without checkpointing; the gradients of the
//    leaves are returned as the inputs' gradients (none for inputs that do not require grad).
// fn runs exactly twice when backward runs once: once in forward, once in backward.
// Errors: "fn" when fn is empty, "inputs" when inputs is empty, "input" when one is undefined.
torch::Tensor checkpoint(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs);

// Given: AutogradContext::saved_data holds c10::IValues; these carry a CheckpointFn through it.
//   ctx->saved_data["fn"] = wrap_fn(fn);
//   const CheckpointFn& fn = unwrap_fn(ctx->saved_data["fn"]);  // valid while ctx lives
namespace detail {
struct FnHolder : torch::CustomClassHolder {
  explicit FnHolder(CheckpointFn f) : fn(std::move(f)) {}
  CheckpointFn fn;
};
}  // namespace detail
inline c10::IValue wrap_fn(const CheckpointFn& fn) {
  return c10::IValue::make_capsule(c10::make_intrusive<detail::FnHolder>(fn));
}
inline const CheckpointFn& unwrap_fn(const c10::IValue& v) {
  return static_cast<const detail::FnHolder*>(v.toCapsule().get())->fn;
}

// ---------------------------------------------------------------- Task 2: the policies

enum class Policy {
  kNone,       // autograd keeps everything (lab 06)
  kSelective,  // checkpoint the attention core of every block: causal_attention(q, k, v), i.e.
               // softmax(q k^T / sqrt(Dh)) with dropout, times v
  kFull        // checkpoint every block: one checkpoint whose only input is the block's input
};
inline const char* to_string(Policy p) {
  return p == Policy::kNone ? "none" : p == Policy::kSelective ? "selective" : "full";
}

// block->forward(x) (BlockImpl::forward in common/src/model.cpp) under `policy`: the same ops in
// the same order, so the output, the random draws and the gradients are bitwise those of
// block->forward(x), in train and in eval mode. kSelective checkpoints
// model::causal_attention on the three head views q, k, v [B, H, T, Dh] of the block's qkv
// output (what CausalSelfAttentionImpl::forward passes it); kFull checkpoints the whole block
// with x as the only input (and nothing checkpointed inside).
torch::Tensor block_forward(Block block, const torch::Tensor& x, Policy policy);

// model->loss(tokens) (GPTImpl::loss: embed, the blocks, head, lm_loss) with every block run by
// block_forward under `policy`: the same loss and, after backward, the same gradients, bit for
// bit. Error: "tokens" unless tokens is [B, T + 1] with T >= 1.
torch::Tensor gpt_loss(GPT& model, const torch::Tensor& tokens, Policy policy);

// ---------------------------------------------------------------- Task 3: memory and plans

// Bytes of activations of one training step (loss, backward) of model::GPT(cfg) on
// [batch, seq] tokens in float32 under `policy`: what the tracking allocator (dtl/memory.hpp)
// sees above the live bytes before forward, with the parameters' gradients already allocated.
//
// Symbols: B batch, T seq, d = cfg.d_model, f = cfg.ff(), H = cfg.n_head, V = cfg.vocab_size,
// L = cfg.n_layer, e = 4 (float32), D = 1 when cfg.dropout > 0 else 0 (LibTorch's CPU dropout
// multiplies by a float mask the size of its input and keeps that mask for backward).
//
// The contract is what a step holds; the closed forms are yours to derive (lab 06 counted the
// same tensors without dropout; the public tests' comments give worked values to check them).
// Exactly these tensors are counted, each e x its number of elements:
//   one block, attention side: ln1's output, the contiguous copies of q, k and v, the attention
//       output before proj, proj's dropout mask; the core: the softmax output per head and,
//       with dropout, its mask and the dropped probabilities;
//   one block, MLP side: h (the residual after attention), ln2's output, fc's output, GELU's
//       output, the MLP's dropout mask, and the block's output (the next block's input);
//   kSelective drops the core (the checkpoint keeps q, k and v instead: views of the qkv output,
//       as many bytes as the copies); kFull keeps only each block's input, counted as the
//       previous block's output.
struct ActivationMemory {
  // Live at the end of forward: the embedding's output, every block's share under the policy,
  // ln_f's output and the loss's log-softmax [B T, V].
  int64_t saved = 0;
  // The high-water mark of forward + backward: the largest of three moments,
  //   backward starts: saved plus the gradients of the log-softmax and of the logits;
  //   the last block's MLP backward: what the loss, ln_f and the last block no longer hold is
  //       gone; the last block holds everything it keeps without checkpointing when it was just
  //       recomputed (kFull), else what it keeps under the policy; plus one [B, T, f] gradient
  //       (GELU's) and two [B, T, d] ones;
  //   the last block's attention backward: its MLP side is freed, its attention side is live
  //       (recomputed under kSelective and kFull), plus the gradients of the probabilities and
  //       of the scores.
  int64_t peak = 0;
};
// Errors: "batch" when batch < 1, "seq" unless 1 <= seq <= cfg.seq_len, cfg.validate()'s
// message for an invalid cfg. Estimates: the tests allow 15% against the tracker.
ActivationMemory activation_memory(const GPTConfig& cfg, int64_t batch, int64_t seq, Policy policy);

// FLOPs the recomputation adds to one training step (2 per multiply-add, matmuls only, every
// head together): kNone 0; kSelective runs q k^T and P v of every block again; kFull every
// block's forward matmuls again (qkv, q k^T, P v, proj, fc, the MLP's proj). Derive them.
// A training step without recomputation is about 3 forwards (backward ~ 2 forwards), so kFull
// adds about a third. Errors as activation_memory.
double recompute_flops(const GPTConfig& cfg, int64_t batch, int64_t seq, Policy policy);

struct Plan {
  Policy policy = Policy::kNone;
  int64_t peak_bytes = 0;        // activation_memory(...).peak under policy
  double recompute_flops = 0.0;  // recompute_flops(...) under policy
};

// The plan with the least recomputation whose predicted peak fits: peak <= memory_budget
// (bytes of activations, as activation_memory counts them). Errors: "budget" when memory_budget
// < 1; when no policy fits, a message containing "budget", memory_budget and the smallest peak
// of the three (decimal integers, bytes); otherwise as activation_memory.
Plan choose_checkpointing(const GPTConfig& cfg, int64_t batch, int64_t seq, int64_t memory_budget);

}  // namespace dtl::lab13
