// labs/05_grad_accumulation/grad_accumulation.hpp — the interface of lab 05 (the seam the tests
// call; do not edit).
//
// defines: global_batch, linear_scaled_lr, sqrt_scaled_lr, LrScaling, LrSchedule, scheduled_lr,
// micro_batch_loss_scale, AccumulationOptions, StepStats, AccumulationTrainer.
//
// The batch an optimizer step sees is the GLOBAL batch:
//
//   global batch = world x micro x accum     (data-parallel ranks x rows per micro-batch x
//                                             micro-batches per optimizer step)
//
// Gradient accumulation runs `accum` forward/backward passes on small micro-batches, adds their
// gradients up in .grad(), and steps the optimizer once. Done right, the step is the SAME
// computation as one step on the whole global batch: it trades time (accum passes one after
// the other) for memory (activations of one micro-batch at a time), never the math. Three
// things must be right, and this lab's tests check each against serial training:
//   - the loss scaling: every micro-batch's mean loss is weighted by its share of the global
//     batch, so that the summed gradients are the gradient of the mean over the global batch;
//   - the communication: DDP all-reduces once per optimizer step, on the last micro-batch; the
//     others run inside ddp.no_sync();
//   - the counting: the learning-rate schedule advances once per OPTIMIZER step, and the rule
//     that scales the learning rate with the batch uses the global batch.
//
// Data parallelism comes from lab 04's reference DistributedDataParallel (labs/04_ddp/ddp.hpp):
// its no_sync() guard and its end-of-backward all-reduce. The schedule itself is common's
// dtl::warmup_cosine_lr and dtl::set_lr (dtl/optim.hpp).
//
// Error messages: every dtl::Error raised for a bad argument contains "<name>=<value>" of that
// argument, e.g. "accum=0" or "base_batch=-4" (the tests look for exactly that), unless a
// function names other words below.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "ddp.hpp"        // defines: lab04::DistributedDataParallel (no_sync, comm)
#include "dtl/model.hpp"  // defines: model::GPT
#include "dtl/optim.hpp"  // defines: warmup_cosine_lr, set_lr

namespace dtl::lab05 {

using lab04::DistributedDataParallel;
using model::GPT;

// ---------------------------------------------------------------- Task 1: the global batch

// Sequences per optimizer step when `world` data-parallel ranks each run `accum` micro-batches
// of `micro` sequences. Raises dtl::Error unless all three are >= 1 ("world=...",
// "micro=...", "accum=...": the first broken one, in that order).
int64_t global_batch(int64_t world, int64_t micro, int64_t accum);

// ---------------------------------------------------------------- Task 2: scaling rules

// The learning rate for `batch` given one tuned at `base_batch`:
//   linear: the lr grows in proportion to the batch (Goyal et al. 2017: "when the minibatch
//           size is multiplied by k, multiply the learning rate by k"), for SGD;
//   sqrt:   the lr grows with the square root of the batch (Krizhevsky 2014; Hoffer et al.
//           2017; for Adam-style optimizers Malladi et al. 2022), which keeps the variance of
//           the update constant rather than its mean.
// Both give base_lr at batch == base_batch, and scale down too (batch < base_batch).
// Raise dtl::Error unless base_lr > 0 and finite ("base_lr=..."), base_batch >= 1
// ("base_batch=...") and batch >= 1 ("batch=...").
double linear_scaled_lr(double base_lr, int64_t base_batch, int64_t batch);
double sqrt_scaled_lr(double base_lr, int64_t base_batch, int64_t batch);

// ---------------------------------------------------------------- Task 3: the schedule

enum class LrScaling { None, Linear, Sqrt };
inline const char* to_string(LrScaling s) {
  return s == LrScaling::None ? "none" : s == LrScaling::Linear ? "linear" : "sqrt";
}

// A learning-rate plan tuned once at base_batch and reused at any global batch.
struct LrSchedule {
  double base_lr = 3e-3;    // the peak lr that was tuned at base_batch
  int64_t base_batch = 16;  // sequences per optimizer step of that tuning run
  LrScaling scaling = LrScaling::Linear;
  int64_t warmup_steps = 0;   // optimizer steps of linear warm-up
  int64_t total_steps = 1;    // optimizer steps of the whole run (warm-up included)
  double min_lr_ratio = 0.1;  // the lr decays to peak * min_lr_ratio at step total_steps - 1
};

// The learning rate of optimizer step `step` (0-based) of a run whose global batch is `batch`:
// the peak is base_lr scaled from base_batch to batch by the schedule's rule (None: base_lr),
// and the shape is dtl::warmup_cosine_lr's (dtl/optim.hpp: linear warm-up over warmup_steps,
// cosine decay to peak * min_lr_ratio at total_steps - 1; later steps stay there). Use it:
// the lesson here is which step and which batch go in, not the cosine.
// Raises dtl::Error unless step >= 0 ("step=..."), total_steps >= 1 ("total_steps=..."),
// warmup_steps >= 0 ("warmup_steps=...") and 0 <= min_lr_ratio <= 1 ("min_lr_ratio=..."),
// and as the scaling functions do for base_lr, base_batch and batch.
double scheduled_lr(const LrSchedule& schedule, int64_t batch, int64_t step);

// ---------------------------------------------------------------- Task 4: the loss scale

// The factor by which one micro-batch's MEAN loss (model->loss(rows), the mean over its
// micro_rows sequences) is multiplied before its backward(), such that:
//   - every rank runs its micro-batches (any number, any sizes, zero rows never) and sums their
//     gradients in .grad();
//   - then DistributedDataParallel averages .grad() over the `world` ranks (it divides the sum
//     by world: ddp.hpp);
//   - and the result is exactly the gradient of the mean loss over all global_rows sequences
//     of the global batch, whatever the micro-batch and shard sizes are.
// Raises dtl::Error unless world >= 1 ("world=..."), global_rows >= 1 ("global_rows=...") and
// 0 <= micro_rows <= global_rows ("micro_rows=...").
double micro_batch_loss_scale(int64_t micro_rows, int64_t global_rows, int64_t world);

// ---------------------------------------------------------------- Tasks 5-6: the trainer

struct AccumulationOptions {
  int64_t accum_steps = 1;  // micro-batches per optimizer step, on every rank
  LrSchedule schedule;      // the lr of each optimizer step (see scheduled_lr)
  // true: the first accum_steps - 1 backwards of a step run inside ddp.no_sync(), so the
  // gradients are all-reduced once per optimizer step. false: every backward all-reduces (the
  // same parameters come out, with accum_steps times the traffic: the demo's comparison).
  bool no_sync = true;
};

// What one optimizer step did on this rank.
struct StepStats {
  int64_t step = 0;                 // the step's index: optimizer_steps() before it
  double lr = 0;                    // the learning rate the optimizer stepped with
  double loss = 0;                  // mean loss over this rank's rows, before the update
  int64_t local_rows = 0;           // rows of the global batch this rank trained on
  std::vector<int64_t> micro_rows;  // rows of each of this rank's micro-batches, in order
};

// Data-parallel training with gradient accumulation. Every rank of ddp.comm() builds one over
// its replica and calls step() with the same global batch:
//
//   DistributedDataParallel ddp(model.ptr(), comm);
//   auto opt = dtl::make_adamw(*model);
//   AccumulationTrainer trainer(model, ddp, *opt, options);
//   for (int64_t s = 0; s < steps; ++s) trainer.step(sampler.global_batch_at(s));
//
// The rows, every rank by the course's one splitting rule (dtl/split.hpp):
//   this rank's rows     split_range(B, world, rank) of the global batch's B rows, where world
//                        and rank are ddp.comm()'s (DDP may run on a sub-communicator);
//   its micro-batch k    split_range(local rows, accum_steps, k) of those, k = 0 .. accum - 1.
// So with B = global_batch(world, micro, accum) every micro-batch has exactly `micro` rows;
// otherwise they differ by one row (within a rank and across ranks), and the loss scale of
// micro_batch_loss_scale keeps the step exact.
class AccumulationTrainer {
 public:
  // Keeps references to ddp and optimizer (they must outlive the trainer); communicates
  // nothing. Raises dtl::Error when options.accum_steps < 1 ("accum_steps=..."), or when ddp
  // does not wrap this model (the message contains "ddp").
  AccumulationTrainer(GPT model, DistributedDataParallel& ddp, torch::optim::Optimizer& optimizer,
                      AccumulationOptions options);

  // One optimizer step on `global_batch` ([B, T + 1] int64 tokens, the same on every rank):
  //   1. the lr of this step, scheduled_lr(schedule, B, optimizer_steps()), set on every
  //      parameter group of the optimizer (dtl::set_lr);
  //   2. zero the gradients; for each micro-batch k of this rank: forward (model->loss), scale
  //      the mean loss by micro_batch_loss_scale(its rows, B, world), backward; with no_sync,
  //      every backward but the last inside ddp.no_sync();
  //   3. optimizer.step(), and optimizer_steps() grows by one.
  // Afterwards every rank's parameters equal those of serial training (dtl::train_step on the
  // whole global batch, with the optimizer's lr set to the same scheduled value), up to float
  // rounding, for any world size, accum_steps and B. Communicates only through ddp: with
  // no_sync, exactly one all-reduce per DDP bucket per call, the same as with accum_steps 1.
  // Raises dtl::Error, on every rank alike, before communicating or changing anything
  // (parameters, gradients, lr, optimizer_steps()), when global_batch is not a 2-D int64
  // tensor ("global_batch") or when it has fewer than world x accum_steps rows, so that some
  // micro-batch would be empty (the message contains "empty micro-batch").
  StepStats step(const torch::Tensor& global_batch);

  // Optimizer steps completed: the schedule's position (NOT the number of micro-batches).
  int64_t optimizer_steps() const { return optimizer_steps_; }
  const AccumulationOptions& options() const { return options_; }

 private:
  GPT model_;
  DistributedDataParallel* ddp_;
  torch::optim::Optimizer* optimizer_;
  AccumulationOptions options_;
  int64_t optimizer_steps_ = 0;
};

}  // namespace dtl::lab05
