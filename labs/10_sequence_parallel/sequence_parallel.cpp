// labs/10_sequence_parallel/sequence_parallel.cpp — your code for lab 10 (see README.md).
//
// Replace every DTL_UNIMPLEMENTED with your implementation. The header (sequence_parallel.hpp)
// is the contract. Lab 09's reference (dtl::lab09::...) and lab 08's (dtl::lab08::...) are
// yours to use: ParallelBlock slices a block for you, VocabParallelEmbedding::lookup_local is the
// embedding before its all-reduce, attention_of_heads computes heads, save_comm/saved_comm keep
// a Comm in an autograd Function (see lab 08's tensor_parallel.cpp for the Function pattern).
#include "sequence_parallel.hpp"

#include <fmt/format.h>

#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab10 {

// ---------------------------------------------------------------- Task 1

torch::Tensor scatter_to_sp(const torch::Tensor& x, Comm& tp) {
  // TODO(lab10): my chunk of dimension 1 forward; all-gather of the chunks backward.
  (void)x, (void)tp;
  DTL_UNIMPLEMENTED("lab 10: scatter_to_sp (Task 1)");
}

torch::Tensor gather_from_sp(const torch::Tensor& x, Comm& tp) {
  // TODO(lab10): all-gather along dimension 1 forward (Comm::all_gather concatenates along
  // dimension 0: move the sequence there and back); reduce-scatter (sum) backward.
  (void)x, (void)tp;
  DTL_UNIMPLEMENTED("lab 10: gather_from_sp (Task 1)");
}

torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, Comm& tp) {
  // TODO(lab10): reduce-scatter along dimension 1 forward; all-gather backward.
  (void)x, (void)tp;
  DTL_UNIMPLEMENTED("lab 10: reduce_scatter_to_sp (Task 1)");
}

// ---------------------------------------------------------------- Task 2

SequenceParallelBlockImpl::SequenceParallelBlockImpl(const dtl::model::BlockImpl& serial,
                                                     const GPTConfig& cfg, Comm& tp)
    : tp_(&tp) {
  // TODO(lab10): a dtl::lab09::ParallelBlock from (serial, cfg, tp) holds every shard: register
  // its ln1, attn, ln2 and mlp under the same names.
  (void)serial, (void)cfg;
  DTL_UNIMPLEMENTED("lab 10: SequenceParallelBlock (Task 2)");
}

torch::Tensor SequenceParallelBlockImpl::forward(const torch::Tensor& x) {
  // TODO(lab10): the header's two lines: gather before the column matmul (qkv, fc), reduce-scatter
  // after the row matmul (proj, without its bias), the bias once on the chunk.
  (void)x;
  DTL_UNIMPLEMENTED("lab 10: SequenceParallelBlock::forward (Task 2)");
}

// ---------------------------------------------------------------- Task 3

SequenceParallelGPTImpl::SequenceParallelGPTImpl(const dtl::model::GPTImpl& serial, Comm& tp)
    : cfg_(serial.config()), tp_(&tp) {
  // TODO(lab10): as lab 09's TensorParallelGPT, with SequenceParallelBlocks.
  DTL_UNIMPLEMENTED("lab 10: SequenceParallelGPT (Task 3)");
}

torch::Tensor SequenceParallelGPTImpl::forward(const torch::Tensor& idx) {
  // TODO(lab10): reduce-scatter the embedding's partial rows, add my chunk's positions, the
  // blocks, ln_f, one gather, the head.
  (void)idx;
  DTL_UNIMPLEMENTED("lab 10: SequenceParallelGPT::forward (Task 3)");
}

torch::Tensor SequenceParallelGPTImpl::loss(const torch::Tensor& tokens) {
  // TODO(lab10): lab 09's loss.
  (void)tokens;
  DTL_UNIMPLEMENTED("lab 10: SequenceParallelGPT::loss (Task 3)");
}

bool is_sequence_parallel_param(const std::string& name) {
  // TODO(lab10): the header lists them.
  (void)name;
  DTL_UNIMPLEMENTED("lab 10: is_sequence_parallel_param (Task 3)");
}

void sync_sequence_parallel_grads(torch::nn::Module& model, Comm& tp) {
  // TODO(lab10): one all-reduce (sum) of the gradients of the sequence-parallel parameters.
  (void)model, (void)tp;
  DTL_UNIMPLEMENTED("lab 10: sync_sequence_parallel_grads (Task 3)");
}

// ---------------------------------------------------------------- Task 4

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             Comm& cp) {
  // TODO(lab10): an autograd Function. Forward: for step i = 0..cp-1 hold the K/V chunk of rank
  // r - i, merge its scores into running (max, sum, output) statistics (skip chunks from later
  // ranks, mask the diagonal one), and pass it on to r + 1 (sendrecv_async overlaps the transfer
  // with the math). Save the log-sum-exp per query. Backward: the same ring with K, V and their
  // partial dK, dV travelling, then one last hop that brings each chunk's dK, dV home.
  (void)q, (void)k, (void)v, (void)cp;
  DTL_UNIMPLEMENTED("lab 10: ring_attention (Task 4)");
}

}  // namespace dtl::lab10
