// labs/08_tensor_parallel/tensor_parallel.cpp — your code for lab 08 (see README.md).
//
// Replace every DTL_UNIMPLEMENTED with your implementation. The header (tensor_parallel.hpp) is
// the contract: what each function takes, returns, and which errors it raises.
#include "tensor_parallel.hpp"

#include <fmt/format.h>

#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab08 {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The shape of a custom autograd Function (LibTorch's C++ API; save_comm and saved_comm are in
// the header):
//
//   struct Twice : torch::autograd::Function<Twice> {
//     static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* tp) {
//       save_comm(ctx, *tp);              // anything backward needs
//       return x * 2;                     // a NEW tensor
//     }
//     static variable_list backward(AutogradContext* ctx, variable_list grads) {
//       // one gradient per forward argument after ctx: x's, then an undefined one for tp
//       return {grads[0] * 2, torch::Tensor()};
//     }
//   };
//   torch::Tensor y = Twice::apply(x, &tp);
//
// Define yours here (an anonymous namespace is a good home for them and your helpers).

// ---------------------------------------------------------------- Task 1

torch::Tensor copy_to_tp(const torch::Tensor& x, Comm& tp) {
  // TODO(lab08): identity forward (a new tensor), all-reduce (sum) of the gradient backward.
  (void)x, (void)tp;
  DTL_UNIMPLEMENTED("lab 08: copy_to_tp (Task 1)");
}

torch::Tensor reduce_from_tp(const torch::Tensor& x, Comm& tp) {
  // TODO(lab08): all-reduce (sum) forward into a new tensor, identity backward.
  (void)x, (void)tp;
  DTL_UNIMPLEMENTED("lab 08: reduce_from_tp (Task 1)");
}

torch::Tensor scatter_to_tp(const torch::Tensor& x, Comm& tp) {
  // TODO(lab08): this rank's slice of the last dimension forward (shard_of gives it and checks
  // divisibility); backward, the ranks' gradient slices gathered along the last dimension.
  (void)x, (void)tp;
  DTL_UNIMPLEMENTED("lab 08: scatter_to_tp (Task 1)");
}

torch::Tensor gather_from_tp(const torch::Tensor& x, Comm& tp) {
  // TODO(lab08): all-gather along the last dimension forward (Comm::all_gather concatenates
  // flat buffers in rank order: think about where the slices land); backward, keep this rank's
  // slice of the gradient.
  (void)x, (void)tp;
  DTL_UNIMPLEMENTED("lab 08: gather_from_tp (Task 1)");
}

// ---------------------------------------------------------------- Task 2

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& full_weight,
                                                   const torch::Tensor& full_bias, Comm& tp,
                                                   bool gather_output)
    : gather_output(gather_output), tp_(&tp) {
  // TODO(lab08): set in_features/out_features, keep this rank's rows of the weight and bias as
  // registered parameters ("weight", "bias"): copies that require grad.
  (void)full_weight, (void)full_bias;
  DTL_UNIMPLEMENTED("lab 08: ColumnParallelLinear (Task 2)");
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  // TODO(lab08): check x's last dimension, then copy_to_tp, the local linear, and the gather if
  // gather_output.
  (void)x;
  DTL_UNIMPLEMENTED("lab 08: ColumnParallelLinear::forward (Task 2)");
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::Tensor& full_weight,
                                             const torch::Tensor& full_bias, Comm& tp,
                                             bool input_is_parallel)
    : input_is_parallel(input_is_parallel), tp_(&tp) {
  // TODO(lab08): set in_features/out_features, keep this rank's columns of the weight; the bias
  // whole.
  (void)full_weight, (void)full_bias;
  DTL_UNIMPLEMENTED("lab 08: RowParallelLinear (Task 2)");
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  // TODO(lab08): check x, take this rank's slice unless input_is_parallel (scatter_to_tp), the
  // local linear without bias, reduce_from_tp, then the bias.
  (void)x;
  DTL_UNIMPLEMENTED("lab 08: RowParallelLinear::forward (Task 2)");
}

// ---------------------------------------------------------------- Task 3

TensorParallelMLPImpl::TensorParallelMLPImpl(const torch::Tensor& fc_weight,
                                             const torch::Tensor& fc_bias,
                                             const torch::Tensor& proj_weight,
                                             const torch::Tensor& proj_bias, Comm& tp) {
  // TODO(lab08): register "fc" and "proj" (which flags make the middle communication-free?).
  (void)fc_weight, (void)fc_bias, (void)proj_weight, (void)proj_bias, (void)tp;
  DTL_UNIMPLEMENTED("lab 08: TensorParallelMLP (Task 3)");
}

torch::Tensor TensorParallelMLPImpl::forward(const torch::Tensor& x) {
  // TODO(lab08): fc, GELU (tanh approximation: torch::gelu(t, "tanh")), proj.
  (void)x;
  DTL_UNIMPLEMENTED("lab 08: TensorParallelMLP::forward (Task 3)");
}

}  // namespace dtl::lab08
