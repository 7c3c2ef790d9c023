// grad_accumulation.cpp — lab 05: YOUR code. Replace every TODO(lab05) block, in order.
//
// Read grad_accumulation.hpp first: each function's comment there is its specification,
// including the "<name>=<value>" words its error messages must contain.
// Run the public tests with `./lab test 05` (world sizes 1, 2, 3 and 4).
#include "grad_accumulation.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <utility>

#include "dtl/error.hpp"  // defines: DTL_CHECK, DTL_UNIMPLEMENTED
#include "dtl/split.hpp"  // defines: split_range

namespace dtl::lab05 {

int64_t global_batch(int64_t world, int64_t micro, int64_t accum) {
  // TODO(lab05): validate world, micro and accum (DTL_CHECK, message with "world=<value>" and
  // so on), then return the number of sequences one optimizer step sees.
  DTL_UNIMPLEMENTED("lab 05: global_batch");
}

double linear_scaled_lr(double base_lr, int64_t base_batch, int64_t batch) {
  // TODO(lab05): validate (base_lr finite and > 0, both batches >= 1), then scale base_lr from
  // base_batch to batch by Goyal et al.'s rule.
  DTL_UNIMPLEMENTED("lab 05: linear_scaled_lr");
}

double sqrt_scaled_lr(double base_lr, int64_t base_batch, int64_t batch) {
  // TODO(lab05): the same validation; the square-root rule.
  DTL_UNIMPLEMENTED("lab 05: sqrt_scaled_lr");
}

double scheduled_lr(const LrSchedule& schedule, int64_t batch, int64_t step) {
  // TODO(lab05): validate step and the schedule's fields; the peak lr is base_lr scaled to
  // `batch` by schedule.scaling; then let dtl::warmup_cosine_lr (dtl/optim.hpp) shape it: fill
  // an OptimConfig with the peak, warmup_steps and min_lr_ratio. Do not write the cosine again.
  DTL_UNIMPLEMENTED("lab 05: scheduled_lr");
}

double micro_batch_loss_scale(int64_t micro_rows, int64_t global_rows, int64_t world) {
  // TODO(lab05): validate, then return the factor of the header's comment. Work it out for a
  // global batch of 5 rows on one rank in two micro-batches of 3 and 2 rows: which weights make
  // 3-row mean and 2-row mean add up to the 5-row mean? Then: what does DDP do to the sum?
  DTL_UNIMPLEMENTED("lab 05: micro_batch_loss_scale");
}

torch::Tensor masked_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets,
                                 const torch::Tensor& loss_mask) {
  // TODO(lab05): validate the shapes and the mask's dtype; the per-target cross-entropy
  // (torch::nn::functional::cross_entropy with reduction kNone on [b x T, V] and [b x T]),
  // zeroed where the mask is false, summed. Why a sum and not a mean: see the header.
  DTL_UNIMPLEMENTED("lab 05: masked_lm_loss_sum");
}

std::optional<NoiseScaleTerms> noise_scale_terms(double small_sq_norm, double small_batch,
                                                 double big_sq_norm, double big_batch) {
  // TODO(lab05): validate; no estimate when the two batches are equal; otherwise the header's
  // two formulas (McCandlish et al. 2018, Appendix A.1).
  DTL_UNIMPLEMENTED("lab 05: noise_scale_terms");
}

NoiseScaleEstimator::NoiseScaleEstimator(double decay) : decay_(decay) {
  // TODO(lab05): validate decay.
  DTL_UNIMPLEMENTED("lab 05: NoiseScaleEstimator constructor");
}

void NoiseScaleEstimator::add(const NoiseScaleTerms& terms) {
  // TODO(lab05): one step into each moving average, and count it.
  DTL_UNIMPLEMENTED("lab 05: NoiseScaleEstimator::add");
}

std::optional<double> NoiseScaleEstimator::b_simple() const {
  // TODO(lab05): the ratio of the averages, or no estimate (when? see the header).
  DTL_UNIMPLEMENTED("lab 05: NoiseScaleEstimator::b_simple");
}

AccumulationTrainer::AccumulationTrainer(GPT model, DistributedDataParallel& ddp,
                                         torch::optim::Optimizer& optimizer,
                                         AccumulationOptions options)
    : model_(std::move(model)),
      ddp_(&ddp),
      optimizer_(&optimizer),
      options_(options),
      noise_(options.noise_scale_decay) {
  // TODO(lab05): validate options_.accum_steps, that ddp wraps this model (compare the address
  // of ddp.module() with model_.ptr().get()), and measure_noise_scale against no_sync.
  DTL_UNIMPLEMENTED("lab 05: AccumulationTrainer constructor");
}

// Given: both steps are one (a null mask: every target counts).
StepStats AccumulationTrainer::step(const torch::Tensor& global_batch) {
  return step_impl(global_batch, nullptr);
}

StepStats AccumulationTrainer::step(const torch::Tensor& global_batch,
                                    const torch::Tensor& loss_mask) {
  return step_impl(global_batch, &loss_mask);
}

StepStats AccumulationTrainer::step_impl(const torch::Tensor& global_batch,
                                         const torch::Tensor* loss_mask) {
  // TODO(lab05): one optimizer step, in the header's order:
  //   0. validate global_batch (2-D int64, at least world x accum rows) and the loss mask when
  //      there is one BEFORE anything else, with world and rank taken from ddp_->comm();
  //   1. lr of this step from scheduled_lr: which batch, which step? set it (dtl::set_lr);
  //   2. zero_grad; this rank's rows and its micro-batches (dtl::split_range, twice); for each
  //      micro-batch: loss = model_->loss(rows), backward of loss x micro_batch_loss_scale(...)
  //      (with a mask: masked_lm_loss_sum over the micro-batch x world / the global batch's
  //      counted targets); every backward but the last inside ddp_->no_sync() when
  //      options_.no_sync (a std::optional<DistributedDataParallel::NoSync> that you emplace()
  //      or not is handy: the guard must be alive while backward() runs);
  //   2b. when the noise scale is measured (the header's list): the last backward local too,
  //      the local norm, the zero backward, the big norm, one scalar all-reduce, the estimator;
  //   3. optimizer step; count it.
  // Fill StepStats as you go (loss: the mean over this rank's counted targets, so weight each
  // micro-batch's mean loss by its targets).
  DTL_UNIMPLEMENTED("lab 05: AccumulationTrainer::step");
}

}  // namespace dtl::lab05
