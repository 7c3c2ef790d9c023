// grad_accumulation.cpp — lab 05: the reference solution.
//
// Global batch, learning-rate scaling and gradient accumulation over lab 04's DDP. The whole
// lab is bookkeeping; each piece is a line or two, and each is a classic source of silent
// bugs in real training code (a run that trains, just not the run you think it is).
#include "grad_accumulation.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <utility>

#include "dtl/error.hpp"  // defines: DTL_CHECK
#include "dtl/split.hpp"  // defines: split_range

namespace dtl::lab05 {

int64_t global_batch(int64_t world, int64_t micro, int64_t accum) {
  DTL_CHECK(world >= 1, fmt::format("global_batch: world={} must be >= 1", world));
  DTL_CHECK(micro >= 1, fmt::format("global_batch: micro={} must be >= 1", micro));
  DTL_CHECK(accum >= 1, fmt::format("global_batch: accum={} must be >= 1", accum));
  // What the optimizer sees is the product: the same 16 sequences whether they come from
  // 4 ranks x 2 rows x 2 passes or 1 rank x 16 rows x 1 pass.
  return world * micro * accum;
}

namespace {

void check_scaling_args(const char* fn, double base_lr, int64_t base_batch, int64_t batch) {
  DTL_CHECK(std::isfinite(base_lr) && base_lr > 0,
            fmt::format("{}: base_lr={} must be a finite number > 0", fn, base_lr));
  DTL_CHECK(base_batch >= 1, fmt::format("{}: base_batch={} must be >= 1", fn, base_batch));
  DTL_CHECK(batch >= 1, fmt::format("{}: batch={} must be >= 1", fn, batch));
}

}  // namespace

double linear_scaled_lr(double base_lr, int64_t base_batch, int64_t batch) {
  check_scaling_args("linear_scaled_lr", base_lr, base_batch, batch);
  // k times the batch averages k times as many gradients: each step's noise shrinks, and one
  // step with k x lr approximates k small steps (Goyal et al. 2017, section 2.1), as long as
  // the gradient barely changes over those k steps. Early in training it changes fast: warm-up.
  return base_lr * static_cast<double>(batch) / static_cast<double>(base_batch);
}

double sqrt_scaled_lr(double base_lr, int64_t base_batch, int64_t batch) {
  check_scaling_args("sqrt_scaled_lr", base_lr, base_batch, batch);
  // The standard deviation of a mean of k x more samples shrinks by sqrt(k): scaling lr by
  // sqrt(k) keeps the update's noise the same. Adam normalises the gradient by its own running
  // magnitude, so its update does not grow linearly with the batch to begin with.
  return base_lr * std::sqrt(static_cast<double>(batch) / static_cast<double>(base_batch));
}

double scheduled_lr(const LrSchedule& schedule, int64_t batch, int64_t step) {
  DTL_CHECK(step >= 0, fmt::format("scheduled_lr: step={} must be >= 0", step));
  DTL_CHECK(schedule.total_steps >= 1,
            fmt::format("scheduled_lr: total_steps={} must be >= 1", schedule.total_steps));
  DTL_CHECK(schedule.warmup_steps >= 0,
            fmt::format("scheduled_lr: warmup_steps={} must be >= 0", schedule.warmup_steps));
  DTL_CHECK(schedule.min_lr_ratio >= 0 && schedule.min_lr_ratio <= 1,
            fmt::format("scheduled_lr: min_lr_ratio={} must be in [0, 1]", schedule.min_lr_ratio));
  double peak = schedule.base_lr;
  switch (schedule.scaling) {
    case LrScaling::None:
      // Still validate, so a bad schedule fails the same way whatever its rule.
      check_scaling_args("scheduled_lr", schedule.base_lr, schedule.base_batch, batch);
      break;
    case LrScaling::Linear:
      peak = linear_scaled_lr(schedule.base_lr, schedule.base_batch, batch);
      break;
    case LrScaling::Sqrt:
      peak = sqrt_scaled_lr(schedule.base_lr, schedule.base_batch, batch);
      break;
  }
  // The shape is common's; what matters is what goes in: the GLOBAL batch for the peak, and
  // the OPTIMIZER step for the position (a schedule stepped per micro-batch would finish its
  // warm-up accum x too early and reach its minimum long before the run ends).
  OptimConfig c;
  c.lr = peak;
  c.warmup_steps = schedule.warmup_steps;
  c.min_lr_ratio = schedule.min_lr_ratio;
  return warmup_cosine_lr(c, step, schedule.total_steps);
}

double micro_batch_loss_scale(int64_t micro_rows, int64_t global_rows, int64_t world) {
  DTL_CHECK(world >= 1, fmt::format("micro_batch_loss_scale: world={} must be >= 1", world));
  DTL_CHECK(global_rows >= 1,
            fmt::format("micro_batch_loss_scale: global_rows={} must be >= 1", global_rows));
  DTL_CHECK(micro_rows >= 0 && micro_rows <= global_rows,
            fmt::format("micro_batch_loss_scale: micro_rows={} must be in [0, global_rows={}]",
                        micro_rows, global_rows));
  // The global mean is sum over all rows / B = sum over micro-batches of (rows_k / B) x mean_k:
  // each micro-batch counts by its share of the global batch, not 1/accum (that is only right
  // when every micro-batch on every rank has the same size). DDP then divides the sum over
  // ranks by world, so multiply by world to cancel it.
  return static_cast<double>(world) * static_cast<double>(micro_rows) /
         static_cast<double>(global_rows);
}

AccumulationTrainer::AccumulationTrainer(GPT model, DistributedDataParallel& ddp,
                                         torch::optim::Optimizer& optimizer,
                                         AccumulationOptions options)
    : model_(std::move(model)), ddp_(&ddp), optimizer_(&optimizer), options_(options) {
  DTL_CHECK(options_.accum_steps >= 1,
            fmt::format("AccumulationTrainer: accum_steps={} must be >= 1", options_.accum_steps));
  DTL_CHECK(&ddp.module() == model_.ptr().get(),
            "AccumulationTrainer: the ddp wrapper given does not wrap this model");
}

StepStats AccumulationTrainer::step(const torch::Tensor& global_batch) {
  // Validate first, on every rank alike (every rank holds the same global batch), so a bad
  // call raises everywhere before any collective: no rank is left waiting in an all-reduce.
  DTL_CHECK(global_batch.defined() && global_batch.dim() == 2 &&
                global_batch.scalar_type() == torch::kInt64,
            "AccumulationTrainer::step: global_batch must be a 2-D int64 tensor [B, T + 1]");
  const Comm& comm = ddp_->comm();
  const int64_t world = comm.size();
  const int64_t accum = options_.accum_steps;
  const int64_t rows = global_batch.size(0);
  DTL_CHECK(rows >= world * accum,
            fmt::format("AccumulationTrainer::step: global_batch has {} rows, fewer than world={} "
                        "x accum_steps={}: some rank would get an empty micro-batch",
                        rows, world, accum));

  StepStats stats;
  stats.step = optimizer_steps_;
  // 1. The schedule moves once per OPTIMIZER step, and the scaling rule sees the global batch:
  // the same lr whether the 16 rows came as 1 x 16 x 1 or 4 x 2 x 2.
  stats.lr = scheduled_lr(options_.schedule, rows, optimizer_steps_);
  set_lr(*optimizer_, stats.lr);

  // 2. This rank's rows, then its micro-batches: the course's one splitting rule, twice.
  optimizer_->zero_grad();
  const Range mine = split_range(rows, world, comm.rank());
  const torch::Tensor local = global_batch.narrow(0, mine.begin, mine.size());
  stats.local_rows = mine.size();
  double loss_sum = 0;  // sum over this rank's rows of the per-row mean loss
  for (int64_t k = 0; k < accum; ++k) {
    const Range micro = split_range(mine.size(), accum, k);
    const torch::Tensor tokens = local.narrow(0, micro.begin, micro.size());
    const bool last = k + 1 == accum;
    // Every backward but the last only accumulates into .grad(): DDP's hooks stay silent
    // inside no_sync, and the last, synchronised backward all-reduces the accumulated sum.
    // (Without no_sync every backward would all-reduce the partial sum: the same result,
    // accum x the traffic.) The guard must be alive during backward(), where the hooks run.
    std::optional<DistributedDataParallel::NoSync> guard;
    if (options_.no_sync && !last) guard.emplace(ddp_->no_sync());
    const torch::Tensor loss = model_->loss(tokens);
    (loss * micro_batch_loss_scale(micro.size(), rows, world)).backward();
    loss_sum += loss.item<double>() * static_cast<double>(micro.size());
    stats.micro_rows.push_back(micro.size());
  }
  stats.loss = loss_sum / static_cast<double>(mine.size());

  // 3. One optimizer step for the whole global batch, and the schedule's position with it.
  optimizer_->step();
  ++optimizer_steps_;
  return stats;
}

}  // namespace dtl::lab05
