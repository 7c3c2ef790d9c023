// labs/14_zero/zero.hpp — the interface of lab 14 (the seam the tests call; do not edit).
//
// defines: Precision, ModelStateBytes, shard_size, model_state_bytes, ZeroOptimizer; uses
// Unit, gpt_units, unit_numels, unit_calls, free_storage, alloc_storage from the runtime.
//
// ZeRO (Rajbhandari et al., SC'20) asks what a data-parallel rank really has to hold. Plain DP
// keeps on every rank the full parameters, the full gradients and the full optimizer state:
// n copies of everything. ZeRO partitions ("shards") them over the n ranks, one more kind per
// stage:
//
//   stage 1  optimizer state    each rank runs AdamW on its 1/n slice of the parameters only
//   stage 2  + gradients        a unit's gradients are reduce-scattered into the owners' slices
//                               as soon as backward has made them, then dropped
//   stage 3  + parameters       a unit's parameters exist in full only while the unit runs:
//                               all-gathered before its forward, freed after, all-gathered
//                               again before its backward, freed after
//
// Everything is flattened per UNIT (the embedding, each transformer block, the head): a unit's
// parameters, in registration order, back to back, zero-padded to n * S elements, S =
// shard_size(numel, n); rank r owns elements [r S, (r + 1) S). Collectives move whole units.
//
// Words the tests look for in error messages are listed with each function ("...").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtl/comm.hpp"   // defines: Comm
#include "dtl/error.hpp"  // defines: DTL_CHECK
#include "dtl/model.hpp"  // defines: model::GPT, GPTConfig
#include "dtl/optim.hpp"  // defines: OptimConfig
#include "dtl/storage.hpp"  // defines: free_storage, alloc_storage
#include "dtl/units.hpp"    // defines: Unit, gpt_units, unit_numels, unit_calls

namespace dtl::lab14 {

using model::GPT;
using model::GPTConfig;

// ---------------------------------------------------------------- Task 1: the formulas

// Bytes per parameter of each kind of model state. This lab trains in fp32 with AdamW:
// 4-byte parameters, 4-byte gradients, two 4-byte moments. The ZeRO paper's mixed precision:
// fp16 parameters and gradients (2 + 2) and K = 12 bytes of fp32 optimizer state (a master
// copy of the parameters and the two moments).
struct Precision {
  int64_t param_bytes = 4;
  int64_t grad_bytes = 4;
  int64_t optimizer_bytes = 8;
  static Precision fp32_adamw() { return {4, 4, 8}; }
  static Precision mixed_adam() { return {2, 2, 12}; }
};

struct ModelStateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

// ceil(numel / world): the elements each rank owns of a unit of `numel` elements (the last
// ranks' slices end in padding). Raises dtl::Error unless numel >= 0 ("numel") and world >= 1
// ("world").
int64_t shard_size(int64_t numel, int world);

// Bytes of model state ONE rank holds between steps (after step(), before zero_grad()) when
// the model's units have `unit_numels` elements and `world` ranks train it at `stage` 0-3
// (stage 0: plain data parallelism). With psi = sum of unit_numels, S = sum over units of
// shard_size(numel, world) and P = world * S (the padded full units):
//   stage 0  params psi, grads psi, optimizer psi                 (every kind in full)
//   stage 1  params P,   grads psi, optimizer S                   (autograd's full .grad)
//   stage 2  params P,   grads S,   optimizer S                   (the owned gradient slices)
//   stage 3  params S,   grads S,   optimizer S
// each times the bytes per element of its kind in `p`. With one unit whose numel divides by
// world these are the paper's Table 1 (e.g. stage 2 = 2 psi + 14 psi / n in mixed precision).
// Raises dtl::Error unless 0 <= stage <= 3 ("stage"), or as shard_size does.
ModelStateBytes model_state_bytes(int stage, const std::vector<int64_t>& unit_numels, int world,
                                  const Precision& p = Precision::fp32_adamw());

// ---------------------------------------------------------------- given: units and calls

// From the runtime (dtl/units.hpp, dtl/storage.hpp), shared with lab 15 (FSDP):
//   Unit                   a unit: its name and its parameters' names (as named_parameters())
//   gpt_units(model)       the GPT's units in the order forward first uses them: "embed" (wte,
//                          wpe), one per block ("blocks.0", ...), "head" (ln_f, and lm_head when
//                          the head is not tied)
//   unit_numels(model)     the elements of each unit: what model_state_bytes takes
//   unit_calls(model)      the forward as a sequence of calls, each with the units it reads:
//                          embed -> {embed}, block i -> {block i}, head -> {head}, plus {embed}
//                          when the head is tied (it reads wte: a tied weight is gathered, and
//                          reduce-scattered, once per use)
//   free_storage(t)        release the memory of t's storage; every view of it keeps its shape
//                          but no bytes (FSDP's storage resize to 0)
//   alloc_storage(t)       give that storage t.numel() elements again (uninitialised: all-gather
//                          into it); views stay views, so what autograd saved in forward reads
//                          the re-gathered values in backward
using dtl::alloc_storage;
using dtl::free_storage;
using dtl::gpt_units;
using dtl::Unit;
using dtl::unit_calls;
using dtl::unit_numels;

// ---------------------------------------------------------------- Tasks 2-4: the optimizer

// ZeRO stages 1-3 around AdamW for the course GPT, over the ranks of `comm`:
//
//   ZeroOptimizer zero(model, comm, stage, optim_config);   // collective
//   for (...) {
//     zero.zero_grad();
//     torch::Tensor loss = zero.loss(my_rows);   // forward (stage 3 gathers unit by unit)
//     loss.backward();                           // stages 2-3 reduce-scatter unit by unit
//     zero.step();                               // AdamW on the owned slices, then all-gather
//   }
//
// Every rank trains on its own rows; the result is the data-parallel trajectory: the
// parameters after each step equal (up to float rounding) those of plain data parallelism
// (gradients averaged over the ranks, AdamW on the full model with the same OptimConfig).
//
// Construction (collective; every rank passes the same configuration):
//   - broadcast every parameter from rank 0 of comm, so all ranks start equal;
//   - for each unit of gpt_units(model): one flat buffer of world * S elements (the unit's
//     parameters in order, then zeros), and the parameters re-pointed into it (set_data to a
//     view), so writing the buffer writes the parameters; rank r's slice [r S, (r+1) S) is its
//     shard: a leaf tensor requiring grad, the only thing AdamW (make_adamw(shards, config))
//     updates; stage 3 keeps the shards as separate tensors and frees the full buffers;
//   - raises dtl::Error unless 1 <= stage <= 3 ("stage"), when config.weight_decay != 0
//     ("weight_decay": a flat shard mixes matrices, where AdamW decays, with biases and
//     LayerNorm gains, where it does not), or when a parameter is in no unit ("unit").
//
// loss(tokens): tokens [B, T + 1] -> the mean cross-entropy, as model->loss(tokens).
//   stage 1   model->loss(tokens): autograd fills every parameter's .grad in full.
//   stages 2, 3  the calls of unit_calls(model), each through one custom autograd function:
//       forward   (stage 3: all-gather the call's units into their buffers) run the call on a
//                 detached input, keep its graph, (stage 3: free the buffers), return the
//                 output;
//       backward  (stage 3: all-gather again) take the gradients of the call's input and
//                 parameters from the kept graph, for each unit: flatten its gradients (zeros
//                 for parameters the call did not use), pad, reduce-scatter (mean over ranks)
//                 and return the owned slice as the gradient of that unit's shard, (stage 3:
//                 free the buffers). Autograd sums a unit's slices over calls into shard.grad.
//       No parameter's .grad is ever set in stages 2 and 3: right after backward only the
//       shards have gradients, and no full gradient is held anywhere once backward returns.
//   Under torch::NoGradGuard (an evaluation), loss() returns the same value and keeps no graph
//   and nothing gathered: once it returns, the rank holds what it held before.
//   zero_grad() may run between loss() and backward() (it drops gradients, not graphs); the
//   backward that follows is unchanged.
//
// step(): stage 1: per unit, reduce-scatter the flattened .grad (mean over ranks) into the
//   shard's gradient; then (every stage) AdamW steps the shards; stages 1 and 2 all-gather
//   every unit's buffer from the shards (stage 3 leaves them sharded until the next use).
//   Leaves the gradients where the stage keeps them: stage 1 the full .grad, stages 2 and 3
//   the shards' .grad (model_state_bytes counts exactly these).
// zero_grad(): drops the gradients (stage 1: every parameter's .grad; stages 2-3: the shards').
//
// Communication per step (per unit u, bytes b_u = 4 world S_u): stage 1 one reduce-scatter and
// one all-gather of b_u; stage 2 one reduce-scatter per call using u and one all-gather; stage
// 3 per call using u two all-gathers and one reduce-scatter. Nothing else is communicated
// after construction.
class ZeroOptimizer {
 public:
  ZeroOptimizer(GPT model, Comm& comm, int stage, const OptimConfig& config = {});
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  torch::Tensor loss(const torch::Tensor& tokens);
  void step();
  void zero_grad();
  void set_lr(double lr);

  int stage() const;
  const std::vector<Unit>& units() const;
  // The owned slices, one per unit (S_u elements each, padding included), the tensors AdamW
  // updates; their .grad() is the reduced gradient slice after backward (stages 2-3) or step.
  const std::vector<torch::Tensor>& shards() const;
  // Collective: every parameter's current value, flattened in model->parameters() order
  // (stage 3 gathers them for the occasion and frees them again). For checks and checkpoints.
  torch::Tensor full_parameters();

 private:
  struct State;  // yours: define it in zero.cpp
  std::unique_ptr<State> s_;
};

}  // namespace dtl::lab14
