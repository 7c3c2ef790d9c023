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

torch::Tensor masked_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets,
                                 const torch::Tensor& loss_mask) {
  DTL_CHECK(logits.defined() && targets.defined() && logits.dim() == 3 && targets.dim() == 2 &&
                logits.size(0) == targets.size(0) && logits.size(1) == targets.size(1),
            "masked_lm_loss_sum: logits must be [b, T, V] and targets [b, T]");
  DTL_CHECK(loss_mask.defined() && loss_mask.scalar_type() == torch::kBool &&
                loss_mask.sizes() == targets.sizes(),
            "masked_lm_loss_sum: loss_mask must be a bool tensor of the targets' shape [b, T]");
  // Per-target losses, then a masked SUM: an ignored target contributes exactly 0, and a
  // micro-batch with no counted target gives 0 (with a zero gradient), never 0 / 0.
  const torch::Tensor per_target = torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(2)}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (per_target * loss_mask.reshape({-1}).to(per_target.scalar_type())).sum();
}

std::optional<NoiseScaleTerms> noise_scale_terms(double small_sq_norm, double small_batch,
                                                 double big_sq_norm, double big_batch) {
  DTL_CHECK(std::isfinite(small_sq_norm) && small_sq_norm >= 0,
            fmt::format("noise_scale_terms: small_sq_norm={} must be finite and >= 0",
                        small_sq_norm));
  DTL_CHECK(std::isfinite(big_sq_norm) && big_sq_norm >= 0,
            fmt::format("noise_scale_terms: big_sq_norm={} must be finite and >= 0", big_sq_norm));
  DTL_CHECK(std::isfinite(small_batch) && small_batch > 0,
            fmt::format("noise_scale_terms: small_batch={} must be finite and > 0", small_batch));
  DTL_CHECK(std::isfinite(big_batch) && big_batch >= small_batch,
            fmt::format("noise_scale_terms: big_batch={} must be finite and >= small_batch={}",
                        big_batch, small_batch));
  // Two batch sizes, two unknowns: E|G_b|^2 = |G|^2 + tr(Sigma) / b. One batch size (one rank)
  // cannot separate the true gradient from the noise.
  if (big_batch == small_batch) return std::nullopt;
  NoiseScaleTerms t;
  t.grad_sq = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch);
  t.trace = (small_sq_norm - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch);
  return t;
}

NoiseScaleEstimator::NoiseScaleEstimator(double decay) : decay_(decay) {
  DTL_CHECK(decay >= 0 && decay < 1,
            fmt::format("NoiseScaleEstimator: decay={} must be in [0, 1)", decay));
}

void NoiseScaleEstimator::add(const NoiseScaleTerms& terms) {
  // Average numerator and denominator separately: a single step's |G|^2 can be near zero or
  // negative, and the average of such ratios is dominated by its worst step.
  grad_sq_ = decay_ * grad_sq_ + (1 - decay_) * terms.grad_sq;
  trace_ = decay_ * trace_ + (1 - decay_) * terms.trace;
  ++count_;
}

std::optional<double> NoiseScaleEstimator::b_simple() const {
  if (count_ == 0 || grad_sq_ <= 0 || trace_ <= 0) return std::nullopt;
  return trace_ / grad_sq_;
}

namespace {

// Sum over the parameters of |.grad()|^2, in float64.
double grad_sq_norm(const std::vector<torch::Tensor>& params) {
  double total = 0;
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) total += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  return total;
}

// The two norms of the noise scale, at the end of a step whose backwards all ran inside
// no_sync (see the header); leaves .grad() all-reduced, as a synchronised backward would.
void measure_noise_scale(DistributedDataParallel& ddp, int64_t rows, NoiseScaleEstimator& noise,
                         StepStats& stats) {
  Comm& comm = ddp.comm();
  const int64_t world = comm.size();
  const std::vector<torch::Tensor>& params = ddp.parameters();
  // Local: .grad() is world x local_rows / B times this rank's local mean gradient (the loss
  // scale), and it exists only now, before DDP's all-reduce overwrites it with the average.
  const double unscale = static_cast<double>(rows) /
                         static_cast<double>(world * stats.local_rows);
  const double local_sq_norm = grad_sq_norm(params) * unscale * unscale;
  // Big: a synchronised backward that adds exactly zero runs DDP's hooks, which all-reduce
  // what no_sync accumulated (one all-reduce per bucket, as the last micro-batch's would).
  torch::Tensor zero = torch::zeros({}, params.front().options());
  for (const torch::Tensor& p : params) zero = zero + (p * 0).sum();
  zero.backward();
  stats.big_sq_norm = grad_sq_norm(params);
  // Small: the mean over the ranks of the local squared norms, one scalar all-reduce; its
  // batch is the harmonic mean of the ranks' rows (every rank knows the split).
  torch::Tensor sum = torch::tensor({local_sq_norm},
                                    torch::TensorOptions().dtype(torch::kFloat64).device(
                                        params.front().device()));
  comm.all_reduce(sum);
  stats.small_sq_norm = sum.item<double>() / static_cast<double>(world);
  double inverse_rows = 0;
  for (int64_t r = 0; r < world; ++r)
    inverse_rows += 1.0 / static_cast<double>(split_range(rows, world, r).size());
  stats.small_batch = static_cast<double>(world) / inverse_rows;
  const std::optional<NoiseScaleTerms> terms = noise_scale_terms(
      stats.small_sq_norm, stats.small_batch, stats.big_sq_norm, static_cast<double>(rows));
  if (terms) noise.add(*terms);
  stats.b_simple = noise.b_simple();
}

}  // namespace

AccumulationTrainer::AccumulationTrainer(GPT model, DistributedDataParallel& ddp,
                                         torch::optim::Optimizer& optimizer,
                                         AccumulationOptions options)
    : model_(std::move(model)),
      ddp_(&ddp),
      optimizer_(&optimizer),
      options_(options),
      noise_(options.noise_scale_decay) {
  DTL_CHECK(options_.accum_steps >= 1,
            fmt::format("AccumulationTrainer: accum_steps={} must be >= 1", options_.accum_steps));
  DTL_CHECK(&ddp.module() == model_.ptr().get(),
            "AccumulationTrainer: the ddp wrapper given does not wrap this model");
  DTL_CHECK(options_.no_sync || !options_.measure_noise_scale,
            "AccumulationTrainer: measure_noise_scale needs no_sync (the local gradient exists "
            "only between no_sync backwards)");
}

StepStats AccumulationTrainer::step(const torch::Tensor& global_batch) {
  return step_impl(global_batch, nullptr);
}

StepStats AccumulationTrainer::step(const torch::Tensor& global_batch,
                                    const torch::Tensor& loss_mask) {
  return step_impl(global_batch, &loss_mask);
}

StepStats AccumulationTrainer::step_impl(const torch::Tensor& global_batch,
                                         const torch::Tensor* loss_mask) {
  // Validate first, on every rank alike (every rank holds the same global batch), so a bad
  // call raises everywhere before any collective: no rank is left waiting in an all-reduce.
  DTL_CHECK(global_batch.defined() && global_batch.dim() == 2 &&
                global_batch.scalar_type() == torch::kInt64,
            "AccumulationTrainer::step: global_batch must be a 2-D int64 tensor [B, T + 1]");
  const Comm& comm = ddp_->comm();
  const int64_t world = comm.size();
  const int64_t accum = options_.accum_steps;
  const int64_t rows = global_batch.size(0);
  const int64_t targets_per_row = global_batch.size(1) - 1;
  DTL_CHECK(rows >= world * accum,
            fmt::format("AccumulationTrainer::step: global_batch has {} rows, fewer than world={} "
                        "x accum_steps={}: some rank would get an empty micro-batch",
                        rows, world, accum));
  const bool masked = loss_mask != nullptr;
  int64_t global_tokens = rows * targets_per_row;
  if (masked) {
    DTL_CHECK(loss_mask->defined() && loss_mask->scalar_type() == torch::kBool &&
                  loss_mask->dim() == 2 && loss_mask->size(0) == rows &&
                  loss_mask->size(1) == targets_per_row,
              fmt::format("AccumulationTrainer::step: loss_mask must be a bool tensor [{}, {}]",
                          rows, targets_per_row));
    // Counted afresh every step: each global batch has its own padding.
    global_tokens = loss_mask->sum().item<int64_t>();
    DTL_CHECK(global_tokens > 0,
              "AccumulationTrainer::step: the loss_mask has no counted target in the global batch");
  }
  const bool measure = options_.measure_noise_scale && world > 1 && !masked;

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
  double loss_sum = 0;  // sum over this rank's counted targets of their loss
  for (int64_t k = 0; k < accum; ++k) {
    const Range micro = split_range(mine.size(), accum, k);
    const torch::Tensor tokens = local.narrow(0, micro.begin, micro.size());
    const bool last = k + 1 == accum;
    // Every backward but the last only accumulates into .grad(): DDP's hooks stay silent
    // inside no_sync, and the last, synchronised backward all-reduces the accumulated sum.
    // (Without no_sync every backward would all-reduce the partial sum: the same result,
    // accum x the traffic.) The guard must be alive during backward(), where the hooks run.
    // Measuring the noise scale keeps the last one local too: see below.
    std::optional<DistributedDataParallel::NoSync> guard;
    if (options_.no_sync && (!last || measure)) guard.emplace(ddp_->no_sync());
    if (masked) {
      // A token sum over the global count: each micro-batch weighs by its counted targets,
      // whatever its rows. DDP divides by world; the scale undoes it.
      const torch::Tensor mask = loss_mask->narrow(0, mine.begin + micro.begin, micro.size());
      const torch::Tensor sum = masked_lm_loss_sum(
          model_->forward(tokens.narrow(1, 0, targets_per_row)),
          tokens.narrow(1, 1, targets_per_row), mask);
      (sum * (static_cast<double>(world) / static_cast<double>(global_tokens))).backward();
      loss_sum += sum.item<double>();
      stats.local_tokens += mask.sum().item<int64_t>();
    } else {
      const torch::Tensor loss = model_->loss(tokens);
      (loss * micro_batch_loss_scale(micro.size(), rows, world)).backward();
      loss_sum += loss.item<double>() * static_cast<double>(micro.size() * targets_per_row);
      stats.local_tokens += micro.size() * targets_per_row;
    }
    stats.micro_rows.push_back(micro.size());
  }
  stats.loss = stats.local_tokens > 0 ? loss_sum / static_cast<double>(stats.local_tokens) : 0.0;

  if (measure) measure_noise_scale(*ddp_, rows, noise_, stats);

  // 3. One optimizer step for the whole global batch, and the schedule's position with it.
  optimizer_->step();
  ++optimizer_steps_;
  return stats;
}

}  // namespace dtl::lab05
