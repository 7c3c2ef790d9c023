// labs/05_grad_accumulation/grad_accumulation.hpp — the interface of lab 05 (the seam the tests
// call; do not edit).
//
// defines: global_batch, linear_scaled_lr, sqrt_scaled_lr, LrScaling, LrSchedule, scheduled_lr,
// micro_batch_loss_scale, masked_lm_loss_sum, NoiseScaleTerms, noise_scale_terms,
// NoiseScaleEstimator, AccumulationOptions, StepStats, AccumulationTrainer.
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
#include <optional>
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

// A learning-rate plan tuned once at base_batch and reused at any global batch. The default
// rule is the square root: the course trains with AdamW (dtl::make_adamw), and linear scaling
// is the rule for SGD (see scaled_lr above).
struct LrSchedule {
  double base_lr = 3e-3;    // the peak lr that was tuned at base_batch
  int64_t base_batch = 16;  // sequences per optimizer step of that tuning run
  LrScaling scaling = LrScaling::Sqrt;
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

// ---------------------------------------------------------------- Task 5: token-weighted loss

// With padding or packed documents some targets do not count (a pad, a document boundary), and
// the loss of a step is the mean over the COUNTED targets of the whole global batch. A mean per
// micro-batch weighted by rows is then wrong (a micro-batch of mostly padding counts as much as
// a full one), and so is each micro-batch's own mean: the weight of micro-batch k must be its
// counted targets over the global count. The trainer therefore back-propagates each
// micro-batch's SUM over its counted targets times world / (counted targets of the global
// batch): a sum, not a mean, so a micro-batch with no counted target adds 0 (its mean would be
// 0 / 0 = NaN and poison every gradient).
//
// The sum of the cross-entropy of logits [b, T, V] against targets [b, T] (int64) over the
// positions (i, t) where loss_mask [b, T] (bool) is true. A 0-dim tensor on logits' graph
// (backward works, and gives zeros, when no position counts). Raises dtl::Error when loss_mask
// is not a bool tensor of targets' shape ("loss_mask"), or logits is not [b, T, V] ("logits").
torch::Tensor masked_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets,
                                 const torch::Tensor& loss_mask);

// ---------------------------------------------------------------- Task 6: the gradient noise scale

// How large can the batch grow before a larger one stops buying fewer steps? About the
// gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
// arXiv:1812.06162), whose simple form is
//
//   B_simple = tr(Sigma) / |G|^2       (per-example gradient covariance over true gradient^2)
//
// A gradient averaged over b examples has E|G_b|^2 = |G|^2 + tr(Sigma) / b, so two batch sizes
// give two equations for the two unknowns (their Appendix A.1). With |G_small|^2 measured at
// batch B_small and |G_big|^2 at B_big > B_small:
//
//   |G|^2 ~= (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
//   S     ~= (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)        (S estimates tr(Sigma))
//
// Data parallelism measures both for free: each rank's local gradient is a small batch, the
// all-reduced one the big batch.

// One step's estimates of |G|^2 (grad_sq) and tr(Sigma) (trace). Each is unbiased and noisy:
// either can come out negative on one step.
struct NoiseScaleTerms {
  double grad_sq = 0;
  double trace = 0;
};

// The two estimates above from one measurement. B_small == B_big (one rank: there is no small
// batch) gives no estimate: std::nullopt. Batches are doubles: the trainer's B_small is a
// harmonic mean of the ranks' rows (see step()). Raises dtl::Error unless small_sq_norm and
// big_sq_norm are finite and >= 0 ("small_sq_norm=...", "big_sq_norm=..."), small_batch is
// finite and > 0 ("small_batch=...") and big_batch is finite and >= small_batch
// ("big_batch=...").
std::optional<NoiseScaleTerms> noise_scale_terms(double small_sq_norm, double small_batch,
                                                 double big_sq_norm, double big_batch);

// The running estimate. Single-step terms are too noisy to divide, so, as the paper does, the
// numerator and the denominator are each averaged over steps (an exponential moving average,
// avg = decay x avg + (1 - decay) x term, both starting at 0) and only the averages divided:
// b_simple() = trace() / grad_sq(), NOT an average of per-step ratios. (Both averages carry the
// same start-up bias 1 - decay^count, which cancels in the ratio.)
class NoiseScaleEstimator {
 public:
  // Raises dtl::Error unless 0 <= decay < 1 ("decay=..."); decay 0 keeps the last step only.
  explicit NoiseScaleEstimator(double decay = 0.9);

  void add(const NoiseScaleTerms& terms);  // one step's terms into both averages
  // trace() / grad_sq(); std::nullopt before the first add() or while either average is <= 0
  // (a negative or zero estimate of a positive quantity says only that the noise is not
  // resolved yet).
  std::optional<double> b_simple() const;
  double grad_sq() const { return grad_sq_; }  // the averages so far
  double trace() const { return trace_; }
  int64_t count() const { return count_; }  // add() calls so far
  double decay() const { return decay_; }

 private:
  double decay_;
  double grad_sq_ = 0;
  double trace_ = 0;
  int64_t count_ = 0;
};

// ---------------------------------------------------------------- Tasks 7-8: the trainer

struct AccumulationOptions {
  int64_t accum_steps = 1;  // micro-batches per optimizer step, on every rank
  LrSchedule schedule;      // the lr of each optimizer step (see scheduled_lr)
  // true: the first accum_steps - 1 backwards of a step run inside ddp.no_sync(), so the
  // gradients are all-reduced once per optimizer step. false: every backward all-reduces (the
  // same parameters come out, with accum_steps times the traffic: the demo's comparison).
  bool no_sync = true;
  // true: every step() measures the gradient noise scale (see step()); needs no_sync.
  bool measure_noise_scale = false;
  double noise_scale_decay = 0.9;  // the NoiseScaleEstimator's
};

// What one optimizer step did on this rank.
struct StepStats {
  int64_t step = 0;                 // the step's index: optimizer_steps() before it
  double lr = 0;                    // the learning rate the optimizer stepped with
  double loss = 0;                  // mean loss over this rank's counted targets, before the
                                    // update (0 when it has none); without a mask every target
                                    // counts, so this is also the mean over its rows
  int64_t local_rows = 0;           // rows of the global batch this rank trained on
  int64_t local_tokens = 0;         // counted targets in those rows
  std::vector<int64_t> micro_rows;  // rows of each of this rank's micro-batches, in order
  // The noise scale measurement (see step()), when it ran (measure_noise_scale, world > 1, no loss
  // mask); otherwise all 0 and b_simple empty. Equal on every rank.
  double small_sq_norm = 0;        // mean over the ranks of |local mean gradient|^2
  double small_batch = 0;          // its batch: the harmonic mean of the ranks' local rows
  double big_sq_norm = 0;          // |all-reduced gradient|^2 (its batch: the global rows)
  std::optional<double> b_simple;  // the trainer's running estimate after this step
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
  // nothing. Raises dtl::Error when options.accum_steps < 1 ("accum_steps=..."), when ddp
  // does not wrap this model (the message contains "ddp"), when measure_noise_scale is set
  // without no_sync ("no_sync": every backward would all-reduce, and the local gradient never
  // exists) and as NoiseScaleEstimator does for noise_scale_decay ("decay=...").
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
  //
  // With measure_noise_scale and world > 1, step 2 measures the noise scale's two norms, each
  // at the one moment it exists:
  //   - every backward of the step runs inside no_sync, the last one too; .grad() then holds
  //     this rank's accumulated LOCAL gradient, which is world x local_rows / B times the
  //     gradient of the mean loss over its local_rows rows (the loss scale put that factor
  //     in): undo it, and its squared norm is this rank's |G_small|^2 at batch local_rows;
  //   - then one synchronised backward that adds exactly zero to every gradient, e.g. of the
  //     sum over ddp.parameters() of (p * 0).sum(): DDP all-reduces the accumulated .grad() in
  //     it (one all-reduce per bucket, as always). |.grad()|^2 after it is |G_big|^2, at batch
  //     B (the loss scale made it the global-batch mean's gradient);
  //   - one all-reduce of one float64 on ddp.comm() averages the local squared norms over the
  //     ranks: small_sq_norm. Shards may differ by a row, and E|G_b|^2 = |G|^2 + tr(Sigma) / b,
  //     so the average over ranks has batch 1 / mean(1 / local_rows), the harmonic mean of the
  //     ranks' rows: small_batch (each rank knows every rank's rows: no communication);
  //   - noise_scale_terms(small_sq_norm, small_batch, big_sq_norm, B) into the trainer's
  //     NoiseScaleEstimator, and b_simple its estimate after that.
  // All norms are over ddp.parameters() (a tied weight once), summed in float64. The
  // parameters come out as without the measurement; it costs one scalar all-reduce per step
  // (bucket count + 1 all-reduces in all) and a pass over the gradients. At world 1 (no small
  // batch) and in a step with a loss mask nothing is measured: no extra communication, no
  // estimate, the StepStats' noise fields stay 0.
  //
  // Raises dtl::Error, on every rank alike, before communicating or changing anything
  // (parameters, gradients, lr, optimizer_steps(), the noise estimate), when global_batch is
  // not a 2-D int64 tensor ("global_batch") or when it has fewer than world x accum_steps rows,
  // so that some micro-batch would be empty (the message contains "empty micro-batch").
  StepStats step(const torch::Tensor& global_batch);

  // The same step with a loss mask ([B, T] bool beside the [B, T + 1] tokens: loss_mask[i][t]
  // says whether the target tokens[i][t + 1] counts). The loss is the mean cross-entropy over
  // the counted targets of the WHOLE global batch: each micro-batch back-propagates
  // masked_lm_loss_sum over its rows times world / (counted targets of the global batch),
  // with no_sync as above. Every rank holds the whole mask, so the global count needs no
  // communication. A micro-batch (or a whole rank) with no counted target still runs its
  // backward, of a zero loss: DDP needs every rank's synchronised backward. step(global_batch)
  // is this step with every target counted. Raises as step(global_batch) does, and when
  // loss_mask is not a bool tensor of shape [B, T] ("loss_mask") or counts no target at all
  // ("no counted target").
  StepStats step(const torch::Tensor& global_batch, const torch::Tensor& loss_mask);

  // Optimizer steps completed: the schedule's position (NOT the number of micro-batches).
  int64_t optimizer_steps() const { return optimizer_steps_; }
  const AccumulationOptions& options() const { return options_; }
  // The running noise scale estimate (empty until a measured step).
  const NoiseScaleEstimator& noise_scale() const { return noise_; }

 private:
  GPT model_;
  DistributedDataParallel* ddp_;
  torch::optim::Optimizer* optimizer_;
  AccumulationOptions options_;
  NoiseScaleEstimator noise_;
  int64_t optimizer_steps_ = 0;
  // Both step()s (loss_mask null: every target counts). Private: restructure it as you like.
  StepStats step_impl(const torch::Tensor& global_batch, const torch::Tensor* loss_mask);
};

}  // namespace dtl::lab05
