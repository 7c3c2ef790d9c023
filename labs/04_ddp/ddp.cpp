// ddp.cpp — lab 04: YOUR code. Replace every TODO(lab04) block, in task order.
//
// Read ddp.hpp first: it is the specification (what the tests check, and the error words).
// Run the public tests with `./lab test 04` (world sizes 1, 2, 3 and 4).
//
// The State below is a suggestion: add, rename or remove members as you like (tests only call
// the functions of ddp.hpp).
#include "ddp.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_set>

namespace dtl::lab04 {

// ---------------------------------------------------------------- Task 1: the bucket rule

std::vector<std::vector<int64_t>> assign_buckets(const std::vector<int64_t>& param_bytes,
                                                 int64_t first_bucket_bytes,
                                                 int64_t bucket_cap_bytes) {
  // TODO(lab04): validate the arguments (DTL_CHECK, naming "first_bucket_bytes",
  // "bucket_cap_bytes", "param_bytes"), then walk the parameters from the last to the first,
  // closing a bucket when it reaches its cap (ddp.hpp has the rule and a worked example).
  DTL_UNIMPLEMENTED("lab 04: assign_buckets");
}

// ---------------------------------------------------------------- Task 2: same model everywhere

void verify_model_across_ranks(torch::nn::Module& module, Comm& comm) {
  // TODO(lab04): describe every parameter and buffer (module.named_parameters(true),
  // module.named_buffers(true): name, dtype, shape, requires_grad) and compare the
  // descriptions across ranks with all_gather, without shipping the weights.
  //   - Ranks may have different NUMBERS of tensors: all_gather needs the same size on every
  //     rank, so agree on the sizes first.
  //   - Every rank must reach the same verdict from the gathered data and raise the same error
  //     naming the first tensor that differs and the ranks that disagree with rank 0 (a rank
  //     that returns while another raises leaves the others waiting in the next collective).
  //   - all_gather wants tensors on comm.device(); strings travel as uint8 tensors.
  DTL_UNIMPLEMENTED("lab 04: verify_model_across_ranks");
}

// ---------------------------------------------------------------- the wrapper's state

struct DistributedDataParallel::State {
  DistributedDataParallel* self = nullptr;  // self->require_sync() tells whether to sync
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<Comm> comm;
  DDPOptions options;

  std::vector<torch::Tensor> params;                // managed parameters, registration order
  std::vector<std::string> names;                   // their (first) names
  std::vector<std::vector<int64_t>> bucket_params;  // what buckets() returns

  struct Bucket {
    torch::Tensor flat;   // the gradients of its parameters, back to back
    int64_t pending = 0;  // how many of its parameters are not ready yet in this backward
    Work work;            // its all-reduce, once issued
  };
  std::vector<Bucket> buckets;
  std::vector<int64_t> bucket_of;   // parameter -> its bucket
  std::vector<torch::Tensor> slot;  // parameter -> its slice of the bucket buffer (bucket_view)
  std::vector<std::unique_ptr<GradReadyHook>> hooks;

  std::mutex mu;             // hooks and the end-of-backward callback: one at a time
  bool in_backward = false;  // the end-of-backward callback of this backward is queued
  size_t next_to_issue = 0;  // buckets [0, next_to_issue) are issued
  std::vector<char> ready;   // got its gradient in this backward
  std::vector<char> used;    // got a gradient since the last synchronisation (no_sync too)

  void on_grad_ready(size_t i);
  void finish_backward();
};

// ---------------------------------------------------------------- Task 4: the gradient hook

void DistributedDataParallel::State::on_grad_ready(size_t i) {
  // TODO(lab04): parameter i's gradient is in params[i].grad(). In order:
  //   - under no_sync (self->require_sync() is false): remember that i was used, and return;
  //   - first hook of this backward: reset the per-backward state and queue finish_backward
  //     with queue_end_of_backward;
  //   - copy grad / world size into slot[i] (with gradient_as_bucket_view the gradient may
  //     already BE the slot: compare data_ptr());
  //   - issue comm->all_reduce_async(flat, ReduceOp::Sum) for every bucket that is complete,
  //     from next_to_issue on, stopping at the first incomplete one.
  DTL_UNIMPLEMENTED("lab 04: the gradient hook (on_grad_ready)");
}

// ---------------------------------------------------------------- Tasks 5-6: end of backward

void DistributedDataParallel::State::finish_backward() {
  // TODO(lab04): runs inside backward(), after its last gradient.
  //   - parameters whose hook did not run: ready now (their accumulated .grad() if they were
  //     used under no_sync since the last synchronisation, zeros otherwise), then issue the
  //     remaining buckets, in order;
  //   - find_unused_parameters: all-reduce an int32 usage map after the last bucket;
  //   - wait for every all-reduce; write the averaged gradients into .grad() (or, with
  //     gradient_as_bucket_view, make sure .grad() is the slot); skip parameters nobody used;
  //   - clear the per-synchronisation state; raise (after all the waiting) if a parameter
  //     was unused and find_unused_parameters is off.
  DTL_UNIMPLEMENTED("lab 04: the end of backward (finish_backward)");
}

// ---------------------------------------------------------------- Task 3: construction

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 Comm& comm, DDPOptions options)
    : state_(std::make_unique<State>()) {
  state_->self = this;
  // TODO(lab04): in this order (ddp.hpp, "Construction"):
  //   1. the managed parameters: module->named_parameters(true), each tensor once
  //      (unsafeGetTensorImpl() identifies a tensor), only those that require grad;
  //   2. verify_model_across_ranks, then the checks of ddp.hpp ("device", "dtype",
  //      "no parameter");
  //   3. broadcast every parameter and buffer from rank 0 (under torch::NoGradGuard);
  //   4. assign_buckets over the gradient bytes; one flat buffer per bucket and one
  //      bucket_view slot per parameter; with gradient_as_bucket_view, move existing grads
  //      into their slots;
  //   5. one GradReadyHook per managed parameter calling on_grad_ready(i).
  // Keep comm alive with comm.shared_from_this().
  DTL_UNIMPLEMENTED("lab 04: DistributedDataParallel constructor");
}

// ---------------------------------------------------------------- given

DistributedDataParallel::~DistributedDataParallel() {
  if (!state_) return;
  state_->hooks.clear();  // first: no hook may run into a dying State
  for (auto& b : state_->buckets) {
    try {
      b.work.wait();  // an all-reduce still in flight (a backward that threw) uses b.flat
    } catch (...) {
    }
  }
}

torch::nn::Module& DistributedDataParallel::module() const { return *state_->module; }
Comm& DistributedDataParallel::comm() const { return *state_->comm; }
const DDPOptions& DistributedDataParallel::options() const { return state_->options; }
const std::vector<torch::Tensor>& DistributedDataParallel::parameters() const {
  return state_->params;
}
const std::vector<std::string>& DistributedDataParallel::parameter_names() const {
  return state_->names;
}
const std::vector<std::vector<int64_t>>& DistributedDataParallel::buckets() const {
  return state_->bucket_params;
}

}  // namespace dtl::lab04
