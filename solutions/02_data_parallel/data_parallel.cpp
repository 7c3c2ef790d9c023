// data_parallel.cpp — lab 02 reference solution.
//
// Synchronous data parallelism, naive version: shard, local forward/backward, one all-reduce
// per parameter, identical optimizer step everywhere.
//
//   global batch (B rows) ──shard──> rank 0: rows [0, b0)   rank 1: [b0, b1)  ...
//            each rank:  forward + backward on its rows  ->  grad_r (of its mean loss)
//            all ranks:  grad = sum_r (n_r / B) grad_r     <- one all-reduce per parameter
//            each rank:  optimizer.step()  (same grads, same weights -> same result)
#include "data_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "dtl/error.hpp"  // defines: DTL_CHECK
#include "dtl/timer.hpp"  // defines: DeviceTimer
#include "dtl/trace.hpp"  // defines: DTL_SCOPE

namespace dtl::lab02 {

Shard shard_range(int64_t rows, int rank, int world) {
  DTL_CHECK(world >= 1, fmt::format("shard_range: world={} must be >= 1", world));
  DTL_CHECK(rank >= 0 && rank < world,
            fmt::format("shard_range: rank={} must be in [0, world={})", rank, world));
  DTL_CHECK(rows >= 0, fmt::format("shard_range: rows={} must be >= 0", rows));
  // Every rank gets `base` rows; the first `extra` ranks one more. Rank r starts after the r
  // shards before it: r * base rows plus one extra row for each earlier rank that had one.
  const int64_t base = rows / world, extra = rows % world;
  Shard s;
  s.begin = rank * base + std::min<int64_t>(rank, extra);
  s.end = s.begin + base + (rank < extra ? 1 : 0);
  return s;
}

torch::Tensor shard_batch(const torch::Tensor& global, int rank, int world) {
  DTL_CHECK(global.defined() && global.dim() >= 1,
            "shard_batch: the global batch must be a tensor with at least one dimension");
  const Shard s = shard_range(global.size(0), rank, world);
  return global.narrow(0, s.begin, s.size());  // a view: no rows are copied
}

void average_gradients(torch::nn::Module& module, Comm& comm, int64_t local_count,
                       int64_t global_count) {
  DTL_CHECK(global_count > 0,
            fmt::format("average_gradients: global_count={} must be > 0", global_count));
  DTL_CHECK(local_count >= 0 && local_count <= global_count,
            fmt::format("average_gradients: local_count={} must be in [0, global_count={}]",
                        local_count, global_count));
  // Weight by rows, not by ranks: with 5 rows on 3 ranks (2, 2, 1) the rank with one row
  // must count half as much as the others. Dividing by comm.size() would silently train on
  // a different loss whenever the batch does not divide evenly.
  const double weight = static_cast<double>(local_count) / static_cast<double>(global_count);
  for (const torch::Tensor& param : module.parameters()) {
    // requires_grad is the same on every rank (same model), so all ranks skip the same ones
    // and the i-th all-reduce means the same parameter everywhere.
    if (!param.requires_grad()) continue;
    torch::Tensor& grad = param.mutable_grad();
    if (!grad.defined() || local_count == 0) {
      // No rows, no backward: contribute zeros, but DO join the collective.
      grad = torch::zeros_like(param);
    } else {
      grad.mul_(weight);
    }
    comm.all_reduce(grad, ReduceOp::Sum);  // in place: every rank now holds the same sum
  }
}

StepStats dp_train_step(GPT& model, torch::optim::Optimizer& optimizer,
                        const torch::Tensor& global_batch, Comm& comm) {
  DTL_CHECK(global_batch.defined() && global_batch.dim() == 2 && global_batch.size(0) >= 1,
            "dp_train_step: global_batch must be [B, T + 1] with B >= 1");
  StepStats stats;
  const int64_t global_rows = global_batch.size(0);

  // DeviceTimer: on a GPU the phases end when their kernels did, not when they were queued.
  DeviceTimer compute;
  optimizer.zero_grad();
  const torch::Tensor local = shard_batch(global_batch, comm.rank(), comm.size());
  stats.local_rows = local.size(0);
  if (stats.local_rows > 0) {  // the mean over zero rows would be NaN: skip, contribute zeros
    DTL_SCOPE("forward+backward");  // a compute bar in --trace / --gantt timelines
    torch::Tensor loss = model->loss(local);
    loss.backward();
    stats.loss = loss.item<double>();
  }
  stats.compute_seconds = compute.seconds();

  // Synchronous: no rank can step before every rank's gradients are in, so this time includes
  // waiting for the slowest rank's backward, not only moving bytes.
  DeviceTimer comm_timer;
  average_gradients(*model, comm, stats.local_rows, global_rows);
  stats.comm_seconds = comm_timer.seconds();

  DeviceTimer step;
  DTL_SCOPE("optimizer");
  optimizer.step();  // identical grads + identical weights -> identical new weights
  stats.optimizer_seconds = step.seconds();
  return stats;
}

}  // namespace dtl::lab02
