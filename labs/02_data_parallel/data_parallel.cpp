// data_parallel.cpp — lab 02: YOUR code. Replace every TODO(lab02) block, in order.
//
// Read data_parallel.hpp first: each function's comment there is its specification.
// Run the public tests with `./lab test 02` (world sizes 1, 2, 3 and 4).
#include "data_parallel.hpp"

#include <fmt/format.h>

#include "dtl/error.hpp"  // defines: DTL_CHECK, DTL_UNIMPLEMENTED
#include "dtl/timer.hpp"  // defines: DeviceTimer

namespace dtl::lab02 {

Shard shard_range(int64_t rows, int rank, int world) {
  // TODO(lab02): contiguous shards in rank order; the first rows % world ranks get one extra
  // row; a rank may own zero rows. Validate world, rank and rows with DTL_CHECK first.
  DTL_UNIMPLEMENTED("lab 02: shard_range");
}

torch::Tensor shard_batch(const torch::Tensor& global, int rank, int world) {
  // TODO(lab02): this rank's rows of `global` as a view (Tensor::narrow), via shard_range.
  DTL_UNIMPLEMENTED("lab 02: shard_batch");
}

void average_gradients(torch::nn::Module& module, Comm& comm, int64_t local_count,
                       int64_t global_count) {
  // TODO(lab02): afterwards every rank must hold the gradient of the mean loss over the WHOLE
  // global batch (global_count rows), while on entry this rank holds the gradient of the mean
  // over its own local_count rows. For each parameter that requires grad, in
  // module.parameters() order:
  //   - scale this rank's gradient by the weight that makes a Sum all-reduce produce that
  //     global mean (work it out for 5 rows on 3 ranks: 2, 2, 1);
  //   - a missing gradient (or local_count == 0) contributes zeros: assign
  //     param.mutable_grad() = torch::zeros_like(param);
  //   - comm.all_reduce(grad, ReduceOp::Sum).
  // Validate global_count > 0 and 0 <= local_count <= global_count first (DTL_CHECK; the
  // message names the argument: "global_count", "local_count").
  DTL_UNIMPLEMENTED("lab 02: average_gradients");
}

StepStats dp_train_step(GPT& model, torch::optim::Optimizer& optimizer,
                        const torch::Tensor& global_batch, Comm& comm) {
  // TODO(lab02): one data-parallel step, timing each phase into StepStats (dtl::DeviceTimer):
  //   compute:   zero_grad; local = shard_batch(...); if it has rows, loss = model->loss(local),
  //              backward, record the loss;
  //   comm:      average_gradients(*model, comm, local rows, global rows);
  //   optimizer: optimizer.step().
  // Validate that global_batch is 2-D with at least one row.
  DTL_UNIMPLEMENTED("lab 02: dp_train_step");
}

}  // namespace dtl::lab02
