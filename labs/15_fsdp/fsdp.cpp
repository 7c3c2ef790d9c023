// Lab 15: FSDP (FlatParameters, wrap policies, sharding strategies, prefetch, state dicts).
// Your code goes here; the contract is fsdp.hpp (the given pieces come from dtl/hooks.hpp,
// dtl/storage.hpp and dtl/units.hpp). Tasks in order: README.md.
#include "fsdp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/trace.hpp"

namespace dtl::lab15 {

// ---------------------------------------------------------------- Task 1: the formulas

ParamBytes param_bytes(const std::vector<int64_t>& unit_numels,
                       const std::vector<ShardingStrategy>& strategies, int shard, int world,
                       bool prefetch, int limit_all_gathers, int64_t element_bytes) {
  // TODO(lab15): the shards (sum of S; a NO_SHARD unit's n) and the most gathered at once: the
  // root's P, every SHARD_GRAD_OP unit's P, and the largest P_i (+ P_{i+1} with prefetch and a
  // limit that allows two) over the FULL_SHARD / HYBRID_SHARD units. Check the arguments first.
  DTL_UNIMPLEMENTED("lab 15: param_bytes (Task 1)");
}

StepTraffic step_traffic(const std::vector<int64_t>& unit_numels,
                         const std::vector<ShardingStrategy>& strategies, int shard, int world,
                         int64_t element_bytes) {
  // TODO(lab15): per unit, the gathers (root and SHARD_GRAD_OP once, the others twice), the
  // reduce-scatter, the all-reduces (NO_SHARD: n over all ranks; HYBRID_SHARD: S across
  // nodes). Nothing over a group of one rank.
  DTL_UNIMPLEMENTED("lab 15: step_traffic (Task 1)");
}

// ---------------------------------------------------------------- Task 2: wrap policies

std::vector<Unit> transformer_policy(GPT& model) {
  // TODO(lab15): one unit per block, "blocks.<i>", with every parameter whose name starts with
  // "blocks.<i>." in named_parameters() order.
  DTL_UNIMPLEMENTED("lab 15: transformer_policy (Task 2)");
}

std::vector<Unit> size_based_policy(GPT& model, int64_t min_numel) {
  // TODO(lab15): walk the blocks, growing a group until it holds min_numel elements.
  DTL_UNIMPLEMENTED("lab 15: size_based_policy (Task 2)");
}

// ---------------------------------------------------------------- Task 3: FlatParameter

// Yours to shape. A start: the constructor's arguments, S, the buffers, the pieces.
struct FlatParameter::State {
  std::string name;
  std::vector<std::string> param_names;
  std::vector<torch::Tensor> params;
  int world = 1, rank = 0;
  bool keep_full = false;
  int64_t numel = 0, S = 0;
  torch::Tensor full, shard;
  std::vector<ShardPiece> pieces;
};

FlatParameter::FlatParameter(std::string name, std::vector<std::string> param_names,
                             std::vector<torch::Tensor> params, int shard_world, int shard_rank,
                             bool keep_full)
    : s_(std::make_unique<State>()) {
  // TODO(lab15): check the arguments; full = zeros(shard_world * S); copy each parameter in and
  // re-point it (p.set_data(a view of its slice)), under NoGradGuard; the shard (keep_full: the
  // same memory, bucket_view; else a clone of this rank's slice), requiring grad; the pieces
  // (bucket_view of the shard: leaves that share its memory), requiring grad.
  DTL_UNIMPLEMENTED("lab 15: FlatParameter (Task 3)");
}

FlatParameter::~FlatParameter() = default;
FlatParameter::FlatParameter(FlatParameter&&) noexcept = default;
FlatParameter& FlatParameter::operator=(FlatParameter&&) noexcept = default;

const std::string& FlatParameter::name() const { return s_->name; }
const std::vector<std::string>& FlatParameter::param_names() const { return s_->param_names; }
const std::vector<torch::Tensor>& FlatParameter::params() const { return s_->params; }
int64_t FlatParameter::numel() const { return s_->numel; }
int64_t FlatParameter::shard_numel() const { return s_->S; }
int64_t FlatParameter::padded_numel() const { return s_->world * s_->S; }
int FlatParameter::shard_world() const { return s_->world; }
int FlatParameter::shard_rank() const { return s_->rank; }
const torch::Tensor& FlatParameter::full() const { return s_->full; }
const torch::Tensor& FlatParameter::shard() const { return s_->shard; }
const std::vector<ShardPiece>& FlatParameter::pieces() const { return s_->pieces; }

bool FlatParameter::is_unsharded() const {
  // TODO(lab15): does full() hold memory? (has_storage)
  DTL_UNIMPLEMENTED("lab 15: FlatParameter::is_unsharded (Task 3)");
}
void FlatParameter::release() {
  // TODO(lab15): free_storage(full()) unless keep_full or already released.
  DTL_UNIMPLEMENTED("lab 15: FlatParameter::release (Task 3)");
}
void FlatParameter::allocate() {
  // TODO(lab15): alloc_storage(full()) unless it has memory already.
  DTL_UNIMPLEMENTED("lab 15: FlatParameter::allocate (Task 3)");
}

// ---------------------------------------------------------------- Tasks 4-7: the wrapper

// Yours to shape: what the wrapper, its hooks and its backward bookkeeping share. Hooks run on
// autograd's thread inside backward(); keep every GradReadyHook alive as long as the wrapper.
struct FullyShardedDataParallel::State {
  GPT model{nullptr};
  FSDPConfig config;
  std::vector<Unit> units;
  std::vector<ShardingStrategy> strategies;
  std::vector<FlatParameter> flats;
  std::shared_ptr<Comm> shard_comm, replicate_comm;
  std::unique_ptr<torch::optim::AdamW> adam;
  std::vector<std::unique_ptr<GradReadyHook>> hooks;
};

FullyShardedDataParallel::FullyShardedDataParallel(GPT model, Comm& comm, const FSDPConfig& config,
                                                   const OptimConfig& optim, Policy policy)
    : s_(std::make_unique<State>()) {
  // TODO(lab15) Task 4: units (policy + root, validated), strategies (Task 5: overrides and the
  // mixing rules), communicators (comm.split), broadcast, one FlatParameter per unit (released),
  // AdamW over the pieces (make_adamw_groups), one GradReadyHook per parameter.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel (Task 4)");
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

torch::Tensor FullyShardedDataParallel::loss(const torch::Tensor& tokens) {
  // TODO(lab15) Task 4: gather the root; embed; per unit: gather (Task 6: wait for its
  // prefetch; forward_prefetch the next), run its blocks, register the pre-backward hook on its
  // output (x.register_hook), release (FULL_SHARD / HYBRID_SHARD); head and lm_loss. Backward
  // (in your hooks): gather again before the unit's backward (Task 6: BACKWARD_PRE prefetch),
  // reduce the unit's gradient when its last parameter's arrives, release.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel::loss (Task 4)");
}

void FullyShardedDataParallel::step() {
  // TODO(lab15) Task 4: point every piece's .grad() at its slice of shard().grad()
  // (bucket_view), then AdamW.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel::step (Task 4)");
}

void FullyShardedDataParallel::zero_grad() {
  // TODO(lab15) Task 4: drop the shards' (and the pieces') gradients.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel::zero_grad (Task 4)");
}

void FullyShardedDataParallel::set_lr(double lr) {
  // TODO(lab15) Task 4: dtl::set_lr on your optimizer.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel::set_lr (Task 4)");
}

const FSDPConfig& FullyShardedDataParallel::config() const { return s_->config; }
const std::vector<Unit>& FullyShardedDataParallel::units() const { return s_->units; }
const std::vector<ShardingStrategy>& FullyShardedDataParallel::strategies() const {
  return s_->strategies;
}
std::vector<int64_t> FullyShardedDataParallel::unit_numels() const {
  std::vector<int64_t> n;
  for (const auto& f : s_->flats) n.push_back(f.numel());
  return n;
}
const std::vector<FlatParameter>& FullyShardedDataParallel::flat_parameters() const {
  return s_->flats;
}
Comm& FullyShardedDataParallel::shard_comm() const {
  DTL_CHECK(s_->shard_comm != nullptr, "FSDP: no shard communicator yet");
  return *s_->shard_comm;
}
Comm* FullyShardedDataParallel::replicate_comm() const { return s_->replicate_comm.get(); }

torch::Tensor FullyShardedDataParallel::full_parameters() {
  // TODO(lab15) Task 4: gather every unit, read model->parameters() in order, release again.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel::full_parameters (Task 4)");
}

std::map<std::string, torch::Tensor> FullyShardedDataParallel::full_state_dict() {
  // TODO(lab15) Task 7: one unit at a time: gather, copy on rank 0, release.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel::full_state_dict (Task 7)");
}

std::vector<ShardedEntry> FullyShardedDataParallel::sharded_state_dict() const {
  // TODO(lab15) Task 7: one entry per piece of every unit.
  DTL_UNIMPLEMENTED("lab 15: FullyShardedDataParallel::sharded_state_dict (Task 7)");
}

}  // namespace dtl::lab15
