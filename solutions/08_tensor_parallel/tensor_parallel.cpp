// solutions/08_tensor_parallel/tensor_parallel.cpp — reference solution of lab 08.
//
// Read it in this order: the four conjugate operators (each an autograd Function whose forward
// and backward are one collective or none), then the two layers (slice the full weight, then
// forward = local matmul + the right operator), then the MLP that puts them together so that
// only the row layer's all-reduce and the column layer's backward all-reduce remain.
#include "tensor_parallel.hpp"

#include <fmt/format.h>

#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab08 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Sum over the tp ranks into a fresh tensor. The clone matters twice: the input may be a view
// or shared with autograd (all_reduce writes in place), and the result must be a new tensor.
torch::Tensor all_reduce_sum(const torch::Tensor& t, Comm& tp) {
  torch::Tensor out = t.contiguous().clone();
  if (tp.size() > 1) tp.all_reduce(out);
  return out;
}

// This rank's slice of the last dimension, as its own contiguous tensor.
torch::Tensor my_slice(const torch::Tensor& t, Comm& tp) {
  const Range r = shard_of(t.size(-1), tp.size(), tp.rank(), "last dimension");
  return t.narrow(-1, r.begin, r.size()).contiguous();
}

// Every rank's [..., k] side by side: [..., tp*k]. Comm::all_gather concatenates flat buffers
// in rank order, i.e. along a new FIRST dimension [tp, ..., k]; the slices belong on the LAST
// one, so they are moved there (one copy, as Megatron's _gather_along_last_dim does).
torch::Tensor gather_last_dim(const torch::Tensor& t, Comm& tp) {
  if (tp.size() == 1) return t.clone();
  torch::Tensor local = t.contiguous();
  std::vector<int64_t> stacked = {tp.size()};
  for (int64_t s : local.sizes()) stacked.push_back(s);
  torch::Tensor all = torch::empty(stacked, local.options());
  tp.all_gather(all, local);
  return torch::cat(all.unbind(0), /*dim=*/-1);
}

// f: identity forward; the gradient of an input every rank used whole is the sum of the ranks'
// partial gradients.
struct CopyToTP : torch::autograd::Function<CopyToTP> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* tp) {
    save_comm(ctx, *tp);
    return x.clone();  // a new tensor: returning the input itself would alias it in the graph
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce_sum(grads[0], saved_comm(ctx)), torch::Tensor()};
  }
};

// g: the sum of partial results forward; each rank's partial result influenced the sum with
// weight one, so its gradient is the output gradient as is.
struct ReduceFromTP : torch::autograd::Function<ReduceFromTP> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, Comm* tp) {
    return all_reduce_sum(x, *tp);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

// Keep my slice forward; the input's gradient is every rank's slice gradient put back together.
struct ScatterToTP : torch::autograd::Function<ScatterToTP> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* tp) {
    save_comm(ctx, *tp);
    return my_slice(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather_last_dim(grads[0], saved_comm(ctx)), torch::Tensor()};
  }
};

// Gather forward; each rank's slice only influenced its own columns of the output.
struct GatherFromTP : torch::autograd::Function<GatherFromTP> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* tp) {
    save_comm(ctx, *tp);
    return gather_last_dim(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {my_slice(grads[0], saved_comm(ctx)), torch::Tensor()};
  }
};

// A parameter made from a slice of a full tensor: its own storage, a leaf that requires grad.
torch::Tensor shard_parameter(const torch::Tensor& full, int64_t dim, const Range& r) {
  return full.detach().narrow(dim, r.begin, r.size()).clone().set_requires_grad(true);
}

void check_full(const torch::Tensor& weight, const torch::Tensor& bias, const char* layer) {
  DTL_CHECK(weight.defined() && weight.dim() == 2,
            fmt::format("{}: the full weight must be [out_features, in_features]", layer));
  DTL_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
            fmt::format("{}: the full bias must be [out_features={}]", layer, weight.size(0)));
}

void check_input(const torch::Tensor& x, int64_t expected, const char* layer) {
  DTL_CHECK(x.dim() >= 1 && x.size(-1) == expected,
            fmt::format("{}: the input's last dimension is {}, expected in_features (this "
                        "rank's part) = {}",
                        layer, x.dim() >= 1 ? x.size(-1) : 0, expected));
}

}  // namespace

// ---------------------------------------------------------------- Task 1

// The checks run before apply(): an error thrown inside a Function's forward would leave a
// half-built graph node behind, and every rank must fail alike, before any collective starts.
static void check_operand(const torch::Tensor& x, const char* op) {
  DTL_CHECK(x.defined() && x.dim() >= 1,
            fmt::format("{}: the input needs at least one dimension", op));
}

torch::Tensor copy_to_tp(const torch::Tensor& x, Comm& tp) {
  check_operand(x, "copy_to_tp");
  return CopyToTP::apply(x, &tp);
}
torch::Tensor reduce_from_tp(const torch::Tensor& x, Comm& tp) {
  check_operand(x, "reduce_from_tp");
  return ReduceFromTP::apply(x, &tp);
}
torch::Tensor scatter_to_tp(const torch::Tensor& x, Comm& tp) {
  check_operand(x, "scatter_to_tp");
  shard_of(x.size(-1), tp.size(), tp.rank(), "last dimension");  // divisible, or say so now
  return ScatterToTP::apply(x, &tp);
}
torch::Tensor gather_from_tp(const torch::Tensor& x, Comm& tp) {
  check_operand(x, "gather_from_tp");
  return GatherFromTP::apply(x, &tp);
}

// ---------------------------------------------------------------- Task 2

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& full_weight,
                                                   const torch::Tensor& full_bias, Comm& tp,
                                                   bool gather_output)
    : gather_output(gather_output), tp_(&tp) {
  check_full(full_weight, full_bias, "ColumnParallelLinear");
  out_features = full_weight.size(0);
  in_features = full_weight.size(1);
  // Output features are rows of W: this rank's rows and the matching entries of the bias.
  const Range rows = shard_of(out_features, tp.size(), tp.rank(), "out_features");
  weight = register_parameter("weight", shard_parameter(full_weight, 0, rows));
  if (full_bias.defined()) bias = register_parameter("bias", shard_parameter(full_bias, 0, rows));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  check_input(x, in_features, "ColumnParallelLinear");
  // f before the matmul: forward nothing, backward the all-reduce that sums the ranks'
  // contributions to dL/dx (each rank's W_r only saw its own output features).
  const torch::Tensor y = torch::nn::functional::linear(copy_to_tp(x, *tp_), weight, bias);
  return gather_output ? gather_from_tp(y, *tp_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::Tensor& full_weight,
                                             const torch::Tensor& full_bias, Comm& tp,
                                             bool input_is_parallel)
    : input_is_parallel(input_is_parallel), tp_(&tp) {
  check_full(full_weight, full_bias, "RowParallelLinear");
  out_features = full_weight.size(0);
  in_features = full_weight.size(1);
  // Input features are columns of W. The bias is not split: it is added once, after the sum.
  const Range cols = shard_of(in_features, tp.size(), tp.rank(), "in_features");
  weight = register_parameter("weight", shard_parameter(full_weight, 1, cols));
  if (full_bias.defined())
    bias = register_parameter("bias", full_bias.detach().clone().set_requires_grad(true));
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor local = x;
  if (input_is_parallel) {
    check_input(x, weight.size(1), "RowParallelLinear");
  } else {
    check_input(x, in_features, "RowParallelLinear");
    local = scatter_to_tp(x, *tp_);
  }
  // g after the matmul: each rank holds a partial sum over its input features.
  torch::Tensor y = reduce_from_tp(torch::nn::functional::linear(local, weight), *tp_);
  // Adding the bias before the all-reduce would add it tp times.
  return bias.defined() ? y + bias : y;
}

// ---------------------------------------------------------------- Task 3

TensorParallelMLPImpl::TensorParallelMLPImpl(const torch::Tensor& fc_weight,
                                             const torch::Tensor& fc_bias,
                                             const torch::Tensor& proj_weight,
                                             const torch::Tensor& proj_bias, Comm& tp) {
  DTL_CHECK(fc_weight.defined() && proj_weight.defined() && fc_weight.dim() == 2 &&
                proj_weight.dim() == 2 && proj_weight.size(1) == fc_weight.size(0) &&
                proj_weight.size(0) == fc_weight.size(1),
            "TensorParallelMLP: fc weight must be [ff, d] and proj weight [d, ff]");
  // fc's output stays split (no gather), GELU is elementwise so it works on the split features,
  // and proj consumes exactly that split: the one all-reduce is proj's.
  fc = register_module("fc", ColumnParallelLinear(fc_weight, fc_bias, tp, /*gather_output=*/false));
  proj = register_module("proj",
                         RowParallelLinear(proj_weight, proj_bias, tp, /*input_is_parallel=*/true));
}

torch::Tensor TensorParallelMLPImpl::forward(const torch::Tensor& x) {
  return proj(torch::gelu(fc(x), "tanh"));
}

}  // namespace dtl::lab08
