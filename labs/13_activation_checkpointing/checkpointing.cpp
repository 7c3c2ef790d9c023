// Lab 13: activation checkpointing, selective and full, and the plan that fits a memory budget.
// Your code goes here; the contract is checkpointing.hpp.
#include "checkpointing.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab13 {
namespace {

// TODO(lab13): Task 1. A custom autograd function: a struct deriving from
// torch::autograd::Function<YourStruct> with two static members,
//   static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const CheckpointFn& fn,
//                                at::TensorList inputs);
//   static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
//                                                  torch::autograd::variable_list grad_outputs);
// called as YourStruct::apply(fn, at::TensorList(inputs)). backward returns one gradient per
// argument of forward, in order: an undefined tensor for fn, then one per input.
//  - What must forward keep, and where (ctx->save_for_backward, ctx->saved_data: wrap_fn)?
//  - Random generators: at::detail::getDefaultCPUGenerator() and, for a CUDA device dev,
//    at::globalContext().defaultGenerator(dev); get_state() / set_state() under the
//    generator's mutex(). Which state must backward replay, and which must it leave behind?
//  - Grad mode is off inside backward (torch::AutoGradMode turns it on). Which tensors should
//    the recomputed graph end at, so that its backward stops there and tells you the inputs'
//    gradients? torch::autograd::backward({out}, {grad}) runs it.

}  // namespace

torch::Tensor checkpoint(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs) {
  // TODO(lab13): Task 1. Check the arguments (the header lists the error words), then apply
  // your autograd function.
  (void)fn, (void)inputs;
  DTL_UNIMPLEMENTED("lab 13: checkpoint (Task 1)");
}

torch::Tensor block_forward(Block block, const torch::Tensor& x, Policy policy) {
  // TODO(lab13): Task 2. BlockImpl::forward, CausalSelfAttentionImpl::forward and MLPImpl
  // (common/src/model.cpp) written out here, so that kSelective can wrap the attention core in
  // a checkpoint and kFull the whole block.
  //  - Same ops, same order, same arguments: one extra or reordered random draw and the bits
  //    differ (the tests compare with torch::equal).
  //  - The fn you checkpoint runs again in backward, after this function returned: what may it
  //    capture by reference? (block.ptr() is a shared_ptr to the BlockImpl.)
  (void)block, (void)x, (void)policy;
  DTL_UNIMPLEMENTED("lab 13: block_forward (Task 2)");
}

torch::Tensor gpt_loss(GPT& model, const torch::Tensor& tokens, Policy policy) {
  // TODO(lab13): Task 2. GPTImpl::loss with every block run by block_forward under `policy`
  // (GPT's embed(), block(i), head() and model::lm_loss are public).
  (void)model, (void)tokens, (void)policy;
  DTL_UNIMPLEMENTED("lab 13: gpt_loss (Task 2)");
}

ActivationMemory activation_memory(const GPTConfig& cfg, int64_t batch, int64_t seq,
                                   Policy policy) {
  // TODO(lab13): Task 3. After the header's checks, the closed forms you derive from its list:
  // find each listed tensor in the forward code (its shape), and ask which tensors the last
  // block holds at each of the three moments. ActivationMemory.ClosedForm's comments give
  // worked values to check your terms against.
  (void)cfg, (void)batch, (void)seq, (void)policy;
  DTL_UNIMPLEMENTED("lab 13: activation_memory (Task 3)");
}

double recompute_flops(const GPTConfig& cfg, int64_t batch, int64_t seq, Policy policy) {
  // TODO(lab13): Task 3. Count the matmul FLOPs that the policy's backward runs a second time.
  (void)cfg, (void)batch, (void)seq, (void)policy;
  DTL_UNIMPLEMENTED("lab 13: recompute_flops (Task 3)");
}

Plan choose_checkpointing(const GPTConfig& cfg, int64_t batch, int64_t seq, int64_t memory_budget) {
  // TODO(lab13): Task 3. Of the plans that fit the budget, the one that recomputes least; when
  // none fits, an error that lets the user act (what would they need to know?).
  (void)cfg, (void)batch, (void)seq, (void)memory_budget;
  DTL_UNIMPLEMENTED("lab 13: choose_checkpointing (Task 3)");
}

}  // namespace dtl::lab13
