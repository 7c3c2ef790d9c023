// dtl/hooks.hpp — defines: GradReadyHook, queue_end_of_backward, bucket_view.
//
// The LibTorch pieces a wrapper needs to act *during* backward, as PyTorch's DDP Reducer and
// FSDP do: run code when a parameter's gradient is ready, run code once when backward ends, and
// hand a parameter a .grad() that lives inside a larger flat buffer. Lab 04 (DDP) introduced
// them; lab 15 (FSDP) uses them too.
#pragma once

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "dtl/error.hpp"  // defines: DTL_CHECK

namespace dtl {

// Runs `on_ready` each time autograd has finished accumulating a gradient into param.grad()
// (a post-hook on the parameter's AccumulateGrad node: when it runs, param.grad() holds the new
// gradient). As long as this object lives; the destructor removes the hook.
// Why an object: a parameter holds its AccumulateGrad node only weakly. If nobody else keeps a
// shared_ptr to it, the node dies after each backward and the next backward builds a fresh one
// without the hook: the hook silently never runs again. PyTorch's Reducer keeps its
// grad_accumulators_ alive for the same reason.
// Runs on autograd's thread, inside backward(). An exception thrown by on_ready ends that
// backward() with the same exception.
class GradReadyHook {
 public:
  GradReadyHook(const torch::Tensor& param, std::function<void()> on_ready) {
    DTL_CHECK(param.is_leaf() && param.requires_grad(),
              "GradReadyHook: the tensor must be a leaf that requires grad");
    accumulator_ = torch::autograd::impl::grad_accumulator(param);
    DTL_CHECK(accumulator_ != nullptr, "GradReadyHook: the tensor has no gradient accumulator");
    using torch::autograd::variable_list;
    key_ = accumulator_->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [fn = std::move(on_ready)](const variable_list& outputs, const variable_list&) {
          fn();
          return outputs;
        }));
  }
  ~GradReadyHook() { accumulator_->del_post_hook(key_); }
  GradReadyHook(const GradReadyHook&) = delete;
  GradReadyHook& operator=(const GradReadyHook&) = delete;

 private:
  std::shared_ptr<torch::autograd::Node> accumulator_;
  uintptr_t key_ = 0;
};

// Queues `fn` to run once when the backward() currently executing has finished computing every
// gradient (still inside backward(): it returns after fn). Call it only from code that runs
// inside a backward, e.g. a GradReadyHook. An exception thrown by fn comes out of backward().
// PyTorch's Reducer queues its finalize_backward the same way.
inline void queue_end_of_backward(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

// A tensor of shape `shape` over elements [offset, offset + numel) of the contiguous `flat`:
// it shares flat's memory, but is not an autograd view of it (optimizer.zero_grad() calls
// detach_(), which autograd forbids on views), so it can serve as a parameter's .grad().
inline torch::Tensor bucket_view(const torch::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  torch::NoGradGuard no_grad;
  torch::Tensor t = torch::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, shape);
  return t;
}

}  // namespace dtl
