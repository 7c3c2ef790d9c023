// labs/15_fsdp/fsdp.hpp — the interface of lab 15 (the seam the tests call; do not edit).
//
// defines: ShardingStrategy, BackwardPrefetch, FSDPConfig, ParamBytes, StepTraffic,
// param_bytes, step_traffic, transformer_policy, size_based_policy, FlatParameter, ShardPiece,
// ShardedEntry, FullyShardedDataParallel.
//
// PyTorch's FullyShardedDataParallel (Zhao et al., VLDB 2023; torch/distributed/fsdp) is ZeRO
// stage 3 (lab 14) made into a wrapper you put around a model and forget:
//
//   units      a wrap policy cuts the model into units (one per transformer block; the root
//              unit holds what is left: embeddings, final LayerNorm, head). Each unit's
//              parameters live in one FlatParameter: flattened, padded to a multiple of the
//              shard group's size, and sharded; the original parameters stay addressable as
//              views, so an optimizer still sees per-parameter tensors (weight decay on
//              matrices only, which lab 14's flat shards could not do).
//   forward    all-gather a unit, run it, free it again (reshard_after_forward); the root stays
//              gathered from the start of forward to the end of backward (it is needed first
//              thing in backward anyway).
//   backward   a hook on the unit's output re-gathers it before its backward runs; when the last
//              of its parameters has its gradient, the unit's gradient is reduce-scattered and
//              the full copy freed.
//   strategies FULL_SHARD (the above), SHARD_GRAD_OP (keep a unit gathered from its forward to
//              its backward: one all-gather per step instead of two, more memory), NO_SHARD
//              (all-reduce the gradient: data parallelism), HYBRID_SHARD (FULL_SHARD inside a
//              node, replicas across nodes: reduce-scatter inside, then all-reduce the shard
//              across).
//   prefetch   issue the next unit's all-gather before the current unit computes (forward:
//              forward_prefetch; backward: BACKWARD_PRE), so communication can hide behind
//              compute (lab 16 measures it), bounded by limit_all_gathers.
//
// Words the tests look for in error messages are listed with each function ("...").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtl/comm.hpp"     // defines: Comm, Work, ReduceOp
#include "dtl/error.hpp"    // defines: DTL_CHECK
#include "dtl/hooks.hpp"    // defines: GradReadyHook, queue_end_of_backward, bucket_view
#include "dtl/model.hpp"    // defines: model::GPT, GPTConfig
#include "dtl/optim.hpp"    // defines: OptimConfig, make_adamw_groups
#include "dtl/storage.hpp"  // defines: free_storage, alloc_storage, has_storage
#include "dtl/units.hpp"    // defines: Unit

namespace dtl::lab15 {

using model::GPT;
using model::GPTConfig;

// ---------------------------------------------------------------- configuration

enum class ShardingStrategy { FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD };
enum class BackwardPrefetch { NONE, BACKWARD_PRE };

inline const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD: return "HYBRID_SHARD";
  }
  return "?";
}

struct FSDPConfig {
  ShardingStrategy strategy = ShardingStrategy::FULL_SHARD;
  // Per-unit exceptions by unit name ("root", "blocks.0", ...): e.g. {"root": NO_SHARD} keeps the
  // small root replicated. FULL_SHARD, SHARD_GRAD_OP and NO_SHARD mix freely. This lab does not
  // mix HYBRID_SHARD with the others: a simplification of its own, so that one shard group and
  // one replicate group serve every unit. (PyTorch allows the mix; it requires only that every
  // HYBRID_SHARD unit use the same two process groups: _validate_and_get_hybrid_shard_state.)
  std::map<std::string, ShardingStrategy> unit_strategy;
  // HYBRID_SHARD only: the shard group is each run of ranks_per_node consecutive ranks (a node:
  // the emulator and real launchers put consecutive ranks on one node); the replicate group
  // the ranks with the same position in every node.
  int ranks_per_node = 0;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  bool forward_prefetch = false;
  // At most this many units other than the root are unsharded at once; a prefetch that would
  // exceed it is not issued (the unit is gathered when it is needed). 0: no limit. PyTorch's
  // limit_all_gathers=True allows two.
  int limit_all_gathers = 2;
};

// ---------------------------------------------------------------- Task 1: the formulas

// Every formula takes the units of a wrapped model as FullyShardedDataParallel builds them:
// unit_numels[0] is the root, then the other units in forward order; `strategies` gives each
// unit's strategy (same length); `shard` is the shard group's size for the sharded strategies
// (the world size, or ranks_per_node for HYBRID_SHARD) and `world` the number of ranks. A unit
// of n elements sharded over g ranks keeps S = ceil(n / g) elements per rank and is P = g * S
// elements when gathered (padding included); a NO_SHARD unit keeps all n (S = P = n). Elements
// are `element_bytes` each.

// Parameter bytes one rank holds. `sharded`: the shards (sum of S), always there. `unsharded`:
// the largest amount of gathered (full, P-element) parameters present at once during a
// training step, on top of the shards:
//   - a NO_SHARD unit's shard IS its full parameters: it adds nothing;
//   - the root, when sharded, is gathered for the whole step: P_root;
//   - SHARD_GRAD_OP units are all gathered at the end of forward: their P all count;
//   - FULL_SHARD and HYBRID_SHARD units are gathered one at a time, or two adjacent ones when
//     `prefetch` is on and limit_all_gathers allows two (limit 0 or >= 2): the largest P_i
//     (+ P_{i+1}) over the non-root FULL_SHARD/HYBRID_SHARD units in forward order.
// Raises dtl::Error unless sizes match ("strategies"), shard >= 1 and world >= 1 ("shard",
// "world").
struct ParamBytes {
  int64_t sharded = 0, unsharded = 0;
  int64_t total() const { return sharded + unsharded; }
};
ParamBytes param_bytes(const std::vector<int64_t>& unit_numels,
                       const std::vector<ShardingStrategy>& strategies, int shard, int world,
                       bool prefetch, int limit_all_gathers = 2, int64_t element_bytes = 4);

// What one training step (one forward, one backward) issues, in bytes as dtl::CommStats counts
// them (an all-gather counts its output, a reduce-scatter its input, an all-reduce its tensor),
// summed over the wrapper's communicators:
//   all_gather      P per gather of a sharded unit: the root once, a SHARD_GRAD_OP unit once,
//                   a FULL_SHARD or HYBRID_SHARD unit twice (forward and backward)
//   reduce_scatter  P per sharded unit (its gradient, once per backward)
//   all_reduce      NO_SHARD: n per unit over all ranks; HYBRID_SHARD: S per unit across nodes
// An op over a group of one rank is never issued (it would move nothing): at world 1 all three
// are 0; a shard group of one (HYBRID with ranks_per_node 1) issues no gather or scatter.
struct StepTraffic {
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  int64_t total() const { return all_gather + reduce_scatter + all_reduce; }
};
StepTraffic step_traffic(const std::vector<int64_t>& unit_numels,
                         const std::vector<ShardingStrategy>& strategies, int shard, int world,
                         int64_t element_bytes = 4);

// ---------------------------------------------------------------- Task 2: wrap policies

// A wrap policy names the units other than the root, in forward order; FullyShardedDataParallel
// puts every parameter no unit claims into the root unit ("root"). Units hold whole transformer
// blocks, consecutive ones (the wrapper runs the model block by block).
// transformer_policy: one unit per block, named "blocks.<i>" (PyTorch's
// transformer_auto_wrap_policy with the block class).
std::vector<Unit> transformer_policy(GPT& model);
// size_based_policy: consecutive blocks grouped into one unit until the group holds at least
// min_numel elements, then a new group starts; the last group may hold fewer. A unit of blocks
// a..b is named "blocks.<a>-<b>" ("blocks.<a>" for one block). Raises dtl::Error unless
// min_numel >= 1 ("min_numel").
std::vector<Unit> size_based_policy(GPT& model, int64_t min_numel);

// ---------------------------------------------------------------- Task 3: FlatParameter

// The part of one original parameter that falls into this rank's shard: elements
// [param_offset, param_offset + numel) of the flattened parameter.
struct ShardPiece {
  int param = 0;             // index into the FlatParameter's params
  int64_t param_offset = 0;  // where in the flattened parameter the piece starts
  int64_t shard_offset = 0;  // where in shard() it lies
  int64_t numel = 0;         // > 0
  torch::Tensor view;        // 1-D, numel elements: a leaf requiring grad that shares shard()'s
                             // memory (writing it writes the shard): what AdamW updates
};

// One unit's parameters in one flat buffer (PyTorch FSDP's FlatParameter):
//
//   full()    numel() elements, the parameters back to back in the given order, then zeros to
//             padded_numel() = shard_world * shard_numel(); every parameter's data is re-pointed
//             (set_data) at its slice of full(), so the module computes with full()'s memory;
//   shard()   this rank's shard_numel() elements, elements [shard_rank * S, (shard_rank+1) * S)
//             of full(), a leaf requiring grad whose .grad() the wrapper fills with the reduced
//             gradient slice. With keep_full (NO_SHARD; requires shard_world == 1) shard() IS
//             full(): same memory, never freed. Otherwise shard() has storage of its own (a
//             copy), and full() can be released.
//   pieces()  for every parameter that overlaps the shard, in parameter order, the overlap
//             (ShardPiece): the per-parameter tensors an optimizer steps, so per-parameter
//             rules (weight decay on matrices only) still apply to a flat shard.
//
// Construction copies the parameters' current values into full() and cuts the shard, then
// leaves full() allocated (is_unsharded() true). release() frees full()'s memory (free_storage:
// the parameters keep their shapes, no bytes); allocate() gives it memory again, uninitialised
// (then all-gather into it, or copy the shard in at shard_world 1). Raises dtl::Error when
// params is empty ("empty"), when shard_world < 1 or shard_rank is out of [0, shard_world)
// ("shard"), when keep_full with shard_world != 1 ("keep_full"), or when the parameters are not
// all floating point of one dtype on one device ("dtype").
class FlatParameter {
 public:
  FlatParameter(std::string name, std::vector<std::string> param_names,
                std::vector<torch::Tensor> params, int shard_world, int shard_rank,
                bool keep_full = false);
  ~FlatParameter();
  FlatParameter(FlatParameter&&) noexcept;
  FlatParameter& operator=(FlatParameter&&) noexcept;

  const std::string& name() const;
  const std::vector<std::string>& param_names() const;
  const std::vector<torch::Tensor>& params() const;  // the module's parameters (views of full())
  int64_t numel() const;         // sum of the parameters' numels
  int64_t shard_numel() const;   // S = ceil(numel / shard_world)
  int64_t padded_numel() const;  // shard_world * S
  int shard_world() const;
  int shard_rank() const;
  const torch::Tensor& full() const;
  const torch::Tensor& shard() const;
  const std::vector<ShardPiece>& pieces() const;
  bool is_unsharded() const;  // full() has memory
  void release();             // no-op when keep_full or already released
  void allocate();            // no-op when already allocated

  struct State;  // yours: define it in fsdp.cpp

 private:
  std::unique_ptr<State> s_;
};

// ---------------------------------------------------------------- Tasks 4-6: the wrapper

// One entry of a sharded state dict: this rank's piece of one parameter.
struct ShardedEntry {
  std::string name;                   // the parameter's name (as named_parameters())
  std::vector<int64_t> global_shape;  // the parameter's full shape
  int64_t offset = 0;                 // first element of the piece in the flattened parameter
  torch::Tensor values;               // 1-D copy of the piece (numel > 0)
};

// FSDP around the course GPT, over the ranks of `comm`:
//
//   FullyShardedDataParallel fsdp(model, comm, config, optim_config);   // collective
//   for (...) {
//     fsdp.zero_grad();
//     fsdp.loss(my_rows).backward();   // gathers, frees, reduce-scatters unit by unit
//     fsdp.step();                     // AdamW on this rank's pieces
//   }
//
// Every rank trains on its own rows; the result is the data-parallel trajectory of AdamW with
// the same OptimConfig, weight decay included (on >= 2-D parameters only, as make_adamw does):
// the parameters after each step equal those of DDP (lab 04), up to float rounding.
//
// Construction (collective; every rank passes the same model configuration, config and policy):
//   - broadcast every parameter from rank 0 of comm;
//   - units: policy(model) in forward order, then "root" with every unclaimed parameter, stored
//     as units()[0] = root, units()[1..] the policy's; raises dtl::Error when a unit names a
//     parameter the model does not have ("names"), when a parameter is in two units ("twice"),
//     when a unit holds no parameter ("empty"), and when a unit is not a run of whole
//     consecutive blocks ("whole blocks");
//   - strategies: config.strategy, overridden per unit by config.unit_strategy; raises
//     dtl::Error for an override of a unit that does not exist ("unit"), for HYBRID_SHARD
//     mixed with any other strategy ("HYBRID_SHARD"), for HYBRID_SHARD when ranks_per_node < 1
//     or does not divide comm.size() ("ranks_per_node"), and for ranks_per_node set (!= 0)
//     without HYBRID_SHARD ("ranks_per_node");
//   - communicators (new ones, so their stats hold this wrapper's traffic only): shard_comm()
//     (all ranks of comm, or a node's ranks for HYBRID_SHARD) and replicate_comm() (all ranks
//     for NO_SHARD units, the ranks of the same position across nodes for HYBRID_SHARD; null
//     when no unit needs one);
//   - one FlatParameter per unit: sharded over shard_comm() (FULL_SHARD, SHARD_GRAD_OP,
//     HYBRID_SHARD) or kept whole (NO_SHARD: shard_world 1, keep_full), then every sharded
//     unit released;
//   - AdamW over every unit's pieces (make_adamw_groups: weight decay for the pieces of >= 2-D
//     parameters, none for the others).
//
// loss(tokens): tokens [B, T + 1] -> the mean cross-entropy of the model on them, unit by unit:
//   the root is gathered first and stays gathered until its gradient is reduced (or, without
//   autograd recording (NoGradGuard), until loss() returns); before a unit's forward it is
//   gathered (waiting for its prefetch if one was issued); with forward_prefetch, the next
//   unit's gather is then issued asynchronously; after the unit's forward a FULL_SHARD or
//   HYBRID_SHARD unit is released; when autograd records, a hook on the unit's output is
//   registered that, in backward, gathers the unit again before its backward runs and, with
//   BACKWARD_PRE, issues the gather of the unit before it (not the root) asynchronously.
//   Prefetches respect limit_all_gathers. Every rank issues the same collectives in the same
//   order. Without autograd recording no backward will come, so every sharded unit (the root
//   and SHARD_GRAD_OP units included) is released before loss() returns.
// backward (of that loss): when every parameter of a unit has its gradient (GradReadyHook), the
//   unit's gradients are flattened and padded (zeros for a parameter without one) and reduced
//   to the mean over all ranks: sharded units reduce-scatter over shard_comm() (then, for
//   HYBRID_SHARD, all-reduce the slice over replicate_comm()); NO_SHARD units all-reduce over
//   replicate_comm(). The result is ADDED to the unit's shard().grad() (two backwards before a
//   step accumulate, as in serial training), the parameters' .grad() are dropped, and every
//   sharded unit (the root included) is released. A unit some of whose parameters got no
//   gradient is reduced at the end of backward all the same. After backward() returns, every
//   sharded unit is released and no parameter has a .grad().
// step(): AdamW on the pieces (their .grad(): views of shard().grad()); the full parameters are
//   not touched (they are gathered from the new shards at the next forward).
// zero_grad(): drops every shard's gradient.
//
// Communication per step is exactly step_traffic(unit_numels(), strategies(), shard group size,
// world) over shard_comm() and replicate_comm(); parameter memory follows param_bytes().
class FullyShardedDataParallel {
 public:
  using Policy = std::function<std::vector<Unit>(GPT&)>;
  FullyShardedDataParallel(GPT model, Comm& comm, const FSDPConfig& config = {},
                           const OptimConfig& optim = {}, Policy policy = transformer_policy);
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  torch::Tensor loss(const torch::Tensor& tokens);
  void step();
  void zero_grad();
  void set_lr(double lr);

  const FSDPConfig& config() const;
  const std::vector<Unit>& units() const;               // units()[0] is the root
  const std::vector<ShardingStrategy>& strategies() const;  // one per unit
  std::vector<int64_t> unit_numels() const;             // one per unit
  const std::vector<FlatParameter>& flat_parameters() const;  // one per unit
  Comm& shard_comm() const;
  Comm* replicate_comm() const;  // null when no unit needs one

  // Collective: every parameter's current value, flattened in model->parameters() order (units
  // gathered for the occasion and released again). For checks.
  torch::Tensor full_parameters();
  // Collective: on rank 0 of comm every parameter by name with its full shape (copies); on the
  // other ranks an empty map (PyTorch's FULL_STATE_DICT with rank0_only).
  std::map<std::string, torch::Tensor> full_state_dict();
  // This rank's pieces of every parameter (no communication), for every unit in units() order
  // and each unit's pieces in order. A replicated unit (NO_SHARD, or the replicas of
  // HYBRID_SHARD) is listed on every rank that holds it. (Not lab 17's ShardedTensor contract,
  // which wants every name on every rank and the ranks' ranges disjoint: a checkpoint of these
  // pieces would list empty ranges and keep one replica of each.)
  std::vector<ShardedEntry> sharded_state_dict() const;

  struct State;  // yours: define it in fsdp.cpp

 private:
  std::unique_ptr<State> s_;
};

}  // namespace dtl::lab15
