// Lab 06: where the bytes of a training step go, predicted and measured. Your code goes here.
#include "memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "dtl/error.hpp"
#include "dtl/memory.hpp"
#include "dtl/train.hpp"

namespace dtl::lab06 {

int64_t parameter_count(const GPTConfig& cfg) {
  // TODO(lab06): Task 1. Count the parameters of model::GPT(cfg) in closed form.
  //  - Read GPTImpl's constructor, BlockImpl, CausalSelfAttentionImpl and MLPImpl in
  //    common/src/model.cpp: which Linears, which LayerNorms, which embeddings?
  //  - cfg.bias removes the Linears' biases but not the LayerNorms'; cfg.tied_head decides
  //    whether the head is a tensor of its own.
  (void)cfg;
  DTL_UNIMPLEMENTED("lab 06: parameter_count (Task 1)");
}

int64_t activation_bytes_per_layer(const GPTConfig& cfg, int64_t batch, int64_t seq,
                                   Precision precision) {
  // TODO(lab06): Task 2. The formula of the header, after the checks it lists.
  //  - Before you write it, convince yourself of each term: which tensors of BlockImpl::forward
  //    does autograd keep for backward, and which die as soon as the next op has run?
  (void)cfg, (void)batch, (void)seq, (void)precision;
  DTL_UNIMPLEMENTED("lab 06: activation_bytes_per_layer (Task 2)");
}

Breakdown estimate(const GPTConfig& cfg, int64_t batch, int64_t seq, Precision precision,
                   OptimizerKind optimizer) {
  // TODO(lab06): Tasks 1 and 2. Fill every field of Breakdown as the header defines it.
  //  - State (Task 1): bytes per element times N for params, grads, master and optimizer.
  //  - Activations and logits (Task 2), then peak and steady_peak: the same three high-water
  //    marks on top of what is resident when the step starts (the first step: the weights; every
  //    later one: all of the state).
  (void)cfg, (void)batch, (void)seq, (void)precision, (void)optimizer;
  DTL_UNIMPLEMENTED("lab 06: estimate (Tasks 1-2)");
}

Measured measure(GPT& model, torch::optim::Optimizer& optimizer, const torch::Tensor& batch) {
  // TODO(lab06): Task 3. Install the tracker, read the live bytes, reset the peak (the analogue
  // of torch.cuda.reset_peak_memory_stats), run one dtl::train_step, read peak and live bytes.
  (void)model, (void)optimizer, (void)batch;
  DTL_UNIMPLEMENTED("lab 06: measure (Task 3)");
}

TwoSteps measure_two_steps(GPT& model, torch::optim::Optimizer& optimizer,
                           const torch::Tensor& batch) {
  // TODO(lab06): Task 3. The first step is measure's. For the second, read and reset as measure
  // does, but write the step out: zero every existing gradient in place (do not free it), then
  // loss, backward, optimizer step. Let the loss die before you read the live bytes after.
  (void)model, (void)optimizer, (void)batch;
  DTL_UNIMPLEMENTED("lab 06: measure_two_steps (Task 3)");
}

std::string breakdown_table(const Breakdown& predicted, const Measured* measured, int64_t baseline,
                            const Measured* second) {
  // TODO(lab06): Task 3. One row per category with memory::format_bytes of the predicted bytes;
  // with a measurement, the measured bytes and the ratio measured / predicted ("{:.3f}").
  (void)predicted, (void)measured, (void)baseline, (void)second;
  DTL_UNIMPLEMENTED("lab 06: breakdown_table (Task 3)");
}

}  // namespace dtl::lab06
