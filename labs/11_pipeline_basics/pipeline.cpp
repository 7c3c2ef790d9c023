// pipeline.cpp — lab 11: your pipeline. Edit this file only (stage.cpp and stage_state.hpp are
// given: read them first; pipeline.hpp is the contract the tests check).
#include "pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "dtl/error.hpp"
#include "stage_state.hpp"

namespace dtl::lab11 {

// ---------------------------------------------------------------- Task 1

std::vector<Range> partition(const std::vector<double>& costs, int stages) {
  // TODO(lab11): check the arguments (the header lists the words), then find the contiguous
  // cut into `stages` non-empty runs whose most expensive run is as cheap as possible. Trying
  // every cut is exponential; ask instead: what is the best way to put the first i units into
  // k stages, if you know the best way for every shorter prefix into k - 1 stages?
  (void)costs;
  (void)stages;
  DTL_UNIMPLEMENTED("lab 11: partition (Task 1)");
}

double imbalance(const std::vector<double>& costs, const std::vector<Range>& parts) {
  // TODO(lab11): validate that parts cover the units contiguously, then max stage cost over the
  // mean stage cost.
  (void)costs;
  (void)parts;
  DTL_UNIMPLEMENTED("lab 11: imbalance (Task 1)");
}

// ---------------------------------------------------------------- Task 2

torch::Tensor PipelineStage::forward(const torch::Tensor& tokens) {
  // TODO(lab11): the input (tokens on the first stage, else an activation received from the
  // previous stage: what shape must the buffer have, and what must you ask of it so that
  // backward leaves you the gradient to send back?), run_units, then the loss on the last
  // stage or a send to the next. Save what backward(micro) will need in s_->saved under
  // s_->next_micro, and keep s_->peak up to date.
  (void)tokens;
  DTL_UNIMPLEMENTED("lab 11: PipelineStage::forward (Task 2)");
}

void PipelineStage::backward(int64_t micro, double loss_scale) {
  // TODO(lab11): take micro-batch `micro` out of s_->saved (an error if it is not there), start
  // backward from the scaled loss on the last stage or from the gradient the next stage sends,
  // and send the gradient of your input to the previous stage.
  (void)micro;
  (void)loss_scale;
  DTL_UNIMPLEMENTED("lab 11: PipelineStage::backward (Task 2)");
}

// ---------------------------------------------------------------- Task 3

StepStats fill_drain_step(PipelineStage& stage, torch::optim::Optimizer& optimizer,
                          const torch::Tensor& global_batch, int64_t micro_batches) {
  // TODO(lab11): check micro_batches, clear gradients, run every forward then every backward
  // (in the header's order; why must every stage use the same one?), sum the tied
  // embedding's gradient over stage.embedding_group() when there is one, step, finish_step,
  // and report the loss on every stage.
  (void)stage;
  (void)optimizer;
  (void)global_batch;
  (void)micro_batches;
  DTL_UNIMPLEMENTED("lab 11: fill_drain_step (Task 3)");
}

}  // namespace dtl::lab11
