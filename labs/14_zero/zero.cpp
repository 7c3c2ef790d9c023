// Lab 14: ZeRO stages 1, 2 and 3 around AdamW.
// Your code goes here; the contract is zero.hpp (the given pieces are in dtl/units.hpp and dtl/storage.hpp).
#include "zero.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab14 {

int64_t shard_size(int64_t numel, int world) {
  // TODO(lab14): Task 1.
  (void)numel, (void)world;
  DTL_UNIMPLEMENTED("lab 14: shard_size (Task 1)");
}

ModelStateBytes model_state_bytes(int stage, const std::vector<int64_t>& unit_numels, int world,
                                  const Precision& p) {
  // TODO(lab14): Task 1. The table in zero.hpp, with padding counted per unit.
  (void)stage, (void)unit_numels, (void)world, (void)p;
  DTL_UNIMPLEMENTED("lab 14: model_state_bytes (Task 1)");
}

// TODO(lab14): Tasks 2-4. Your state: what must outlive the constructor? At least the model,
// the Comm, the stage, the units' parameters, one flat buffer and one shard per unit, and the
// AdamW over the shards (make_adamw(shards, config) from dtl/optim.hpp).
struct ZeroOptimizer::State {};

// TODO(lab14): Task 3 (stages 2 and 3). A custom autograd function, one node per call of
// unit_calls(): a struct deriving from torch::autograd::Function<YourStruct> with
//   static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
//                                at::TensorList shards, ...);
//   static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
//                                                  torch::autograd::variable_list grad_outputs);
// applied as YourStruct::apply(x, at::TensorList(shards), ...). backward returns one gradient
// per argument of forward, in order (one per shard, undefined for non-tensor arguments).
//  - Why must the shards be inputs of the node, even for the embedding call whose input x is
//    an integer tensor that needs no gradient?
//  - Grad mode is off inside forward and backward (torch::AutoGradMode turns it on). Run the
//    call on x.detach() (requiring grad when x does) and keep the output: its graph is the one
//    backward differentiates with torch::autograd::grad(outputs, inputs, grad_outputs,
//    retain_graph, create_graph, allow_unused).
//  - ctx->saved_data holds IValues (an int64_t can carry a pointer); what must stay alive
//    until backward has run?
//  - Stage 3: free_storage / alloc_storage (zero.hpp) around each use of a unit's buffer.
//    Why must backward gather again before it differentiates the kept graph?

ZeroOptimizer::ZeroOptimizer(GPT model, Comm& comm, int stage, const OptimConfig& config)
    : s_(std::make_unique<State>()) {
  // TODO(lab14): Task 2. Check the arguments (the header lists the error words), broadcast the
  // parameters from rank 0, build one flat buffer per unit of gpt_units(model) with the
  // parameters re-pointed into it (p.set_data(view)), cut this rank's shard of each, and make
  // the AdamW over the shards. Stage 3 (Task 4): the shards are copies, the buffers freed.
  //  - Under torch::NoGradGuard: copying into parameters is not something to differentiate.
  //  - A shard that is a view of the buffer (detach() keeps the storage) lets AdamW write the
  //    parameters in place; may all_gather's input alias its output?
  (void)model, (void)comm, (void)stage, (void)config;
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer (Task 2)");
}

ZeroOptimizer::~ZeroOptimizer() = default;

torch::Tensor ZeroOptimizer::loss(const torch::Tensor& tokens) {
  // TODO(lab14): Task 2: stage 1 is model->loss. Task 3: stages 2 and 3 run the calls of
  // unit_calls() through your autograd function: embed, each block, head (GPT's embed(),
  // block(i) and head() are public), then model::lm_loss against tokens[:, 1:].
  (void)tokens;
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::loss (Tasks 2-3)");
}

void ZeroOptimizer::step() {
  // TODO(lab14): Task 2. Stage 1: reduce-scatter each unit's flattened, padded .grad into its
  // shard's gradient (mean over ranks). Then AdamW; then all-gather every unit's buffer
  // (stages 1-2). What does stage 3 skip, and why?
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::step (Task 2)");
}

void ZeroOptimizer::zero_grad() {
  // TODO(lab14): Task 2.
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::zero_grad (Task 2)");
}

void ZeroOptimizer::set_lr(double lr) {
  // TODO(lab14): Task 2 (dtl::set_lr on your AdamW).
  (void)lr;
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::set_lr (Task 2)");
}

int ZeroOptimizer::stage() const { DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::stage (Task 2)"); }

const std::vector<Unit>& ZeroOptimizer::units() const {
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::units (Task 2)");
}

const std::vector<torch::Tensor>& ZeroOptimizer::shards() const {
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::shards (Task 2)");
}

torch::Tensor ZeroOptimizer::full_parameters() {
  // TODO(lab14): Task 2 (stage 3: gather, copy out, free again).
  DTL_UNIMPLEMENTED("lab 14: ZeroOptimizer::full_parameters (Task 2)");
}

}  // namespace dtl::lab14
