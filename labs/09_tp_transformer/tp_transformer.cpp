// labs/09_tp_transformer/tp_transformer.cpp — your code for lab 09 (see README.md).
//
// Replace every DTL_UNIMPLEMENTED with your implementation. The header (tp_transformer.hpp) is
// the contract: what each class and function takes, returns, and which errors it raises. Lab
// 08's reference layers and operators (dtl::lab08::...) are yours to use.
#include "tp_transformer.hpp"

#include <fmt/format.h>

#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab09 {

// ---------------------------------------------------------------- Task 1

ParallelAttentionImpl::ParallelAttentionImpl(const torch::Tensor& qkv_weight,
                                             const torch::Tensor& qkv_bias,
                                             const torch::Tensor& proj_weight,
                                             const torch::Tensor& proj_bias, int64_t n_head_,
                                             Comm& tp)
    : n_head(n_head_) {
  // TODO(lab09): set local_heads and head_dim (shard_of checks that tp divides n_head); register
  // "qkv", a ColumnParallelLinear that keeps rows qkv_rows(...) of the full qkv weight and bias
  // (lab 08's layer keeps a CONTIGUOUS block of rows of whatever full weight you give it: which
  // full weight makes that block equal to this rank's rows?), and "proj", a RowParallelLinear
  // of the full proj weight with input_is_parallel.
  (void)qkv_weight, (void)qkv_bias, (void)proj_weight, (void)proj_bias, (void)tp;
  DTL_UNIMPLEMENTED("lab 09: ParallelAttention (Task 1)");
}

torch::Tensor ParallelAttentionImpl::forward(const torch::Tensor& x) {
  // TODO(lab09): qkv(x) holds this rank's q, k, v; attention_of_heads (given) computes its
  // heads; proj merges them.
  (void)x;
  DTL_UNIMPLEMENTED("lab 09: ParallelAttention::forward (Task 1)");
}

// ---------------------------------------------------------------- Task 2

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::Tensor& full_weight, Comm& tp)
    : tp_(&tp) {
  // TODO(lab09): this rank's vocabulary range (shard_of, "vocab_size") and its rows of the full
  // table, registered as "weight" (a copy that requires grad).
  (void)full_weight;
  DTL_UNIMPLEMENTED("lab 09: VocabParallelEmbedding (Task 2)");
}

torch::Tensor VocabParallelEmbeddingImpl::lookup_local(const torch::Tensor& idx) {
  // TODO(lab09): check the ids; look up the ids in my range (others: any valid row, then zero
  // those rows). No communication here.
  (void)idx;
  DTL_UNIMPLEMENTED("lab 09: VocabParallelEmbedding::lookup_local (Task 2)");
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& idx) {
  // TODO(lab09): one all-reduce over tp puts the rows of lookup_local together.
  (void)idx;
  DTL_UNIMPLEMENTED("lab 09: VocabParallelEmbedding::forward (Task 2)");
}

// ---------------------------------------------------------------- Task 3

// An autograd Function is the natural shape for the loss (see lab 08's tensor_parallel.cpp for
// the pattern): forward communicates per-token numbers, backward is local.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits,
                                           const torch::Tensor& targets, Comm& tp) {
  // TODO(lab09): check shapes and targets; then the max over the full vocabulary (all-reduce
  // MAX), the target's logit (on one rank, 0 elsewhere) and the sum of exponentials (all-reduce
  // SUM); loss = mean(log(sum_exp) - target_logit). Backward: (softmax - one_hot) / N, locally.
  (void)local_logits, (void)targets, (void)tp;
  DTL_UNIMPLEMENTED("lab 09: vocab_parallel_cross_entropy (Task 3)");
}

// ---------------------------------------------------------------- Task 4

ParallelBlockImpl::ParallelBlockImpl(const dtl::model::BlockImpl& serial, const GPTConfig& cfg,
                                     Comm& tp) {
  // TODO(lab09): check_tp_config; ln1/ln2 copies (copy_of); attn from serial.attn's weights;
  // mlp, lab 08's TensorParallelMLP, from serial.mlp's.
  (void)serial, (void)cfg, (void)tp;
  DTL_UNIMPLEMENTED("lab 09: ParallelBlock (Task 4)");
}

torch::Tensor ParallelBlockImpl::forward(const torch::Tensor& x) {
  // TODO(lab09): the serial block's residual arithmetic.
  (void)x;
  DTL_UNIMPLEMENTED("lab 09: ParallelBlock::forward (Task 4)");
}

TensorParallelGPTImpl::TensorParallelGPTImpl(const dtl::model::GPTImpl& serial, Comm& tp)
    : cfg_(serial.config()), tp_(&tp) {
  // TODO(lab09): check_tp_config; wte, wpe (a copy: EmbeddingOptions(...)._weight(...)),
  // blocks, ln_f, and lm_head when the head is not tied, registered under the serial names.
  DTL_UNIMPLEMENTED("lab 09: TensorParallelGPT (Task 4)");
}

torch::Tensor TensorParallelGPTImpl::forward(const torch::Tensor& idx) {
  // TODO(lab09): embeddings, blocks, ln_f, then this rank's logits: the tied head multiplies by
  // my wte rows (after copy_to_tp), the untied one is lm_head.
  (void)idx;
  DTL_UNIMPLEMENTED("lab 09: TensorParallelGPT::forward (Task 4)");
}

torch::Tensor TensorParallelGPTImpl::loss(const torch::Tensor& tokens) {
  // TODO(lab09): the serial GPT::loss, with vocab_parallel_cross_entropy.
  (void)tokens;
  DTL_UNIMPLEMENTED("lab 09: TensorParallelGPT::loss (Task 4)");
}

}  // namespace dtl::lab09
