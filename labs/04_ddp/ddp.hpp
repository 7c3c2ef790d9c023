// labs/04_ddp/ddp.hpp — the interface of lab 04 (the seam the tests call; do not edit).
//
// defines: DDPOptions, assign_buckets, verify_model_across_ranks, DistributedDataParallel;
// uses three LibTorch helpers from the runtime: GradReadyHook, queue_end_of_backward, bucket_view.
//
// What PyTorch's DistributedDataParallel does inside (torch/nn/parallel/distributed.py and
// torch/csrc/distributed/c10d/reducer.cpp; Li et al., VLDB 2020), rebuilt on dtl::Comm:
//
//   construction   verify that every rank has the same model, broadcast rank 0's parameters
//                  and buffers, group the parameters into buckets, hook every parameter
//   backward       autograd fills param.grad() layer by layer, from the loss backwards; the
//                  hook of each parameter copies its gradient / world into its bucket's flat
//                  buffer; a bucket whose last gradient arrives is all-reduced right away,
//                  asynchronously, while autograd goes on computing earlier layers
//   end of backward  wait for the buckets, write the averaged gradients back into .grad
//
// So the all-reduce of the last layers overlaps with the backward of the first ones, and a
// few large all-reduces replace one per parameter (lab 02), which pays the latency once per
// bucket instead of once per tensor. How much is hidden, you measure in the demo.
//
// Words the tests look for in error messages are listed with each function ("...").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtl/comm.hpp"   // defines: Comm, Work, ReduceOp
#include "dtl/error.hpp"  // defines: DTL_CHECK
#include "dtl/hooks.hpp"  // defines: GradReadyHook, queue_end_of_backward, bucket_view

namespace dtl::lab04 {

// ---------------------------------------------------------------- options

struct DDPOptions {
  // Byte cap of every bucket after the first. PyTorch's default: bucket_cap_mb = 25 (MiB).
  int64_t bucket_cap_bytes = int64_t{25} << 20;
  // Byte cap of bucket 0, the first one all-reduced: small, so communication starts early in
  // backward. PyTorch's kDefaultFirstBucketBytes = 1 MiB.
  int64_t first_bucket_bytes = int64_t{1} << 20;
  // Parameters that get no gradient in a backward are marked ready by the wrapper at the end of
  // backward, so their buckets still complete (see "Unused parameters" below).
  bool find_unused_parameters = false;
  // .grad() of every parameter IS its slice of the bucket buffer: no copy back, no second copy
  // of the gradients in memory (see "gradient_as_bucket_view" below).
  bool gradient_as_bucket_view = false;
};

// ---------------------------------------------------------------- Task 1: the bucket rule

// Groups parameters into buckets. param_bytes[i] is the gradient size in bytes of the i-th
// parameter in REGISTRATION order (the order module.parameters() lists them). Autograd
// produces gradients roughly in the reverse of that order (the last layer's first), so:
//   walk the parameters from the LAST to the first, appending each to the open bucket;
//   close the open bucket as soon as its bytes reach its cap (>=): bucket 0's cap is
//   first_bucket_bytes, every later bucket's is bucket_cap_bytes;
//   after the walk, close the open bucket if it holds anything.
// Returns the buckets in that order (bucket 0 first), each listing parameter indices in the
// order they were appended. A bucket may exceed its cap by its last parameter; a parameter
// larger than the cap gets a bucket of its own. Every index appears exactly once; no bucket is
// empty; no parameters -> no buckets. Example: bytes {4, 4, 6, 2, 2} (indices 0..4), first 3,
// cap 8 -> {{4, 3}, {2, 1}, {0}} (bytes 4, 10, 4: bucket 0 closes at 4 >= 3, bucket 1 at
// 10 >= 8, bucket 2 is what is left).
// This is the rule reducer.cpp's compute_bucket_assignment_by_size applies when PyTorch
// rebuilds its buckets in gradient-ready order after the first iteration; here the reversed
// registration order stands in for the ready order from the start.
// Raises dtl::Error unless first_bucket_bytes > 0 ("first_bucket_bytes"), bucket_cap_bytes > 0
// ("bucket_cap_bytes") and every param_bytes[i] >= 0 ("param_bytes").
std::vector<std::vector<int64_t>> assign_buckets(const std::vector<int64_t>& param_bytes,
                                                 int64_t first_bucket_bytes,
                                                 int64_t bucket_cap_bytes);

// ---------------------------------------------------------------- Task 2: same model everywhere

// Checks, with collectives on `comm` (every rank of comm calls it), that every rank holds the
// same model: the same parameters AND buffers, in the same registration order, with the same
// names, shapes, dtypes and requires_grad flags (values may differ: construction broadcasts
// them). Exchange a compact description (e.g. a fingerprint per tensor), never the weights.
// On a mismatch EVERY rank raises the same dtl::Error (no rank may hang or return normally)
// whose message contains "differs across ranks", the name of the first parameter or buffer
// (in registration order) that differs (e.g. "blocks.1.mlp.fc.weight"; when one rank has
// more tensors than another, the name of the first tensor that some rank lacks), and the
// ranks that disagree with rank 0 (e.g. "ranks [2]").
// Communicates only all_gather (no all-reduce), a number of calls the same on every rank.
void verify_model_across_ranks(torch::nn::Module& module, Comm& comm);

// ---------------------------------------------------------------- Tasks 3-6: the wrapper

// Data parallelism the way PyTorch's DDP Reducer does it. Every rank wraps its replica:
//
//   DistributedDataParallel ddp(model.ptr(), comm, options);   // verify + broadcast + hooks
//   for (...) {
//     optimizer.zero_grad();
//     model->loss(my_rows).backward();   // returns with .grad() averaged over the ranks
//     optimizer.step();
//   }
//
// The wrapper does not run forward: call the module as usual; the hooks do the work during
// backward(). All its communication is on `comm`.
//
// Managed parameters: module.parameters(recurse) in registration order, a tensor registered
// under several names listed once (its first name), without the ones that do not require grad
// (frozen ones are never hooked, bucketed or communicated, and their .grad() stays undefined).
// A tied weight used twice in forward (the course GPT's embedding doubles as its output head)
// is one tensor: autograd sums both uses into one gradient before its hook runs.
//
// Construction (collective over comm, every rank calls it with the same options):
//   - verify_model_across_ranks(module, comm) (raises as described there);
//   - broadcast every parameter (frozen ones too) and every buffer from rank 0 of comm, so all
//     replicas start equal (any number of broadcasts, e.g. coalesced per dtype);
//   - buckets = assign_buckets(gradient bytes of the managed parameters, caps of options);
//     bucket b owns one flat buffer (dtype and device of the parameters) holding its
//     parameters' gradients back to back, in the order buckets()[b] lists them;
//   - one GradReadyHook per managed parameter (keep them alive as long as the wrapper).
//   Issues no all-reduce. Raises dtl::Error when a managed parameter is not on comm.device()
//   ("device"), when the managed parameters do not all share one dtype ("dtype"), when there
//   is no managed parameter at all ("no parameter"), or when assign_buckets does.
//
// A synchronised backward (not inside no_sync()):
//   - when parameter i's gradient is ready (its hook), copy grad / world into its slot of the
//     bucket buffer (PyTorch's Reducer divides while copying: one pass, and an fp16 sum of n
//     gradients cannot overflow when each is pre-divided);
//   - as soon as bucket b and every bucket before it are complete, issue
//     comm.all_reduce_async(bucket b's buffer, ReduceOp::Sum) from that hook, during backward.
//     Buckets are issued strictly in bucket order on every rank: a later bucket that fills
//     first waits (unissued) for the earlier ones, or the ranks would pair different buckets;
//   - at the end of backward (a callback queued with queue_end_of_backward by the first hook
//     of the backward: it runs inside backward(), after the last gradient): mark the params
//     that got no gradient (see below), issue the buckets not yet issued in order, wait for
//     all, and write each parameter's averaged gradient into its .grad(). When backward()
//     returns, every rank holds the same .grad(): the mean over ranks of the ranks' .grad().
//   Exactly one all-reduce per bucket per synchronised backward, each of the whole bucket
//   buffer (numel = the sum of its parameters' numels); with find_unused_parameters, plus one
//   all-reduce of an int32 usage map (numel = parameters().size()) issued after the last
//   bucket's. No other op. A backward whose graph reaches no managed parameter does nothing.
//
// Every rank must run the same number of synchronised backwards, each reaching the managed
// parameters (a rank with no rows still runs a backward). The mean over ranks is the gradient
// of the global-batch mean loss only when every rank has the same number of rows; with uneven
// shards, scale each rank's loss by world * local_rows / global_rows before backward().
//
// Unused parameters (a parameter whose hook did not run in a synchronised backward, nor in a
// no_sync backward since the last synchronisation): it contributes zeros to its bucket.
//   - find_unused_parameters = true: afterwards, a parameter that no rank used keeps its
//     .grad() untouched (like serial training, where it gets no gradient: an undefined
//     .grad() is skipped by the optimizer); one used by some ranks gets the mean as usual. The
//     usage map all-reduce tells the ranks which is which.
//   - find_unused_parameters = false: the wrapper still completes every all-reduce (so no rank
//     is left waiting), then backward() raises dtl::Error on the ranks that saw it, naming the
//     first such parameter in registration order and "find_unused_parameters".
//
// gradient_as_bucket_view = true: after a synchronised backward every managed .grad() shares
// memory with its bucket buffer (made with bucket_view(), so optimizer.zero_grad() of
// LibTorch 1.13, which calls detach_(), still works), holding the averaged gradient; nothing is
// copied back. If an optimizer sets grads to undefined (LibTorch 2.x zero_grad), the next hook
// copies the new gradient into the slot and points .grad() at it again (as PyTorch does).
// Parameters of one bucket thus lie back to back in memory, in buckets()[b] order.
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, Comm& comm,
                          DDPOptions options = {});
  ~DistributedDataParallel();  // removes the hooks: the module can be trained without DDP again
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() const;
  Comm& comm() const;
  const DDPOptions& options() const;
  // The managed parameters (see above) in registration order, and their (first) names.
  const std::vector<torch::Tensor>& parameters() const;
  const std::vector<std::string>& parameter_names() const;
  // The bucket assignment: indices into parameters(), bucket 0 first (assign_buckets' result).
  const std::vector<std::vector<int64_t>>& buckets() const;

  // Gradient accumulation without communication (given). While a NoSync is alive, backward()
  // only accumulates into .grad() locally: hooks issue nothing, no end-of-backward callback.
  // The first synchronised backward after it all-reduces the accumulated .grad() (the sum of
  // every local backward since the last synchronisation) like any other gradient:
  //   { auto guard = ddp.no_sync(); model->loss(micro0).backward(); }   // local only
  //   model->loss(micro1).backward();                                   // syncs micro0 + micro1
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(&ddp), saved_(ddp.require_sync_) {
      ddp.require_sync_ = false;
    }
    ~NoSync() {
      if (ddp_) ddp_->require_sync_ = saved_;
    }
    NoSync(NoSync&& o) noexcept : ddp_(o.ddp_), saved_(o.saved_) { o.ddp_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool saved_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  // False while a NoSync is alive (PyTorch: require_backward_grad_sync).
  bool require_sync() const { return require_sync_; }

  // Your implementation's data: define State in ddp.cpp as you like.
  struct State;

 private:
  std::unique_ptr<State> state_;
  bool require_sync_ = true;
};

// ---------------------------------------------------------------- given LibTorch helpers

// From the runtime (dtl/hooks.hpp; lab 15's FSDP uses them too):
//   GradReadyHook(param, on_ready)  runs on_ready each time autograd has accumulated a gradient
//       into param.grad() (a post-hook on the parameter's AccumulateGrad node), as long as the
//       object lives. Keep it alive: a parameter holds its AccumulateGrad node only weakly, so
//       without an owner the node (and its hook) is rebuilt, hook-less, every backward.
//       Runs on autograd's thread inside backward(); an exception from on_ready ends backward().
//   queue_end_of_backward(fn)  runs fn once when the backward() now executing has computed every
//       gradient (still inside backward()). Call it only from code that runs inside a backward.
//   bucket_view(flat, offset, shape)  a tensor over elements [offset, offset + numel) of flat
//       that shares its memory but is not an autograd view (so it can be a .grad(): LibTorch
//       1.13's optimizer.zero_grad() calls detach_(), which autograd forbids on views).
using dtl::bucket_view;
using dtl::GradReadyHook;
using dtl::queue_end_of_backward;

}  // namespace dtl::lab04
