// Lab 20: the capstone. A planner for a real training run (what fits, what it costs, which plan)
// and a trainer composed of the earlier labs' reference pieces. Your code goes here; the
// contract is training_stack.hpp, the given pieces (clusters, models, published runs,
// calibration, the checkpoint glue) are in catalogue.cpp. Tasks in order: README.md.
#include "training_stack.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>
#include <tuple>

#include "dtl/data.hpp"        // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"       // defines: DTL_CHECK, DTL_UNIMPLEMENTED
#include "dtl/log.hpp"         // defines: Progress
#include "dtl/mesh.hpp"        // defines: DeviceMesh
#include "dtl/perf.hpp"        // defines: median, measure_matmul_flops
#include "dtl/split.hpp"       // defines: split_range (the blocks of a pipeline stage)
#include "dtl/trace.hpp"       // defines: DTL_SCOPE

namespace dtl::lab20 {

// ================================================================ Task 1: what fits

std::string invalid_reason(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                           int64_t global_batch) {
  // TODO(lab20): the rules of the header, in its order, each message with its numbers and its
  // word; "" when the plan can run. The model's own problems: catch validate()'s dtl::Error.
  DTL_UNIMPLEMENTED("lab 20: invalid_reason (Task 1)");
}

int64_t params_per_gpu(const GPTConfig& model, const Plan& plan) {
  // TODO(lab20): one layer's parameters on one GPU (which tensors tensor parallelism splits,
  // which it replicates: read model.hpp's Block), the vocabulary-parallel embedding, and the
  // fullest pipeline stage: a helper for the layers of stage r (plan.first_stage_layers and
  // last_stage_layers on the edges when set, the rest split evenly) serves Tasks 1 and 2.
  // Check yourself: with tp = pp = 1 it is model::num_parameters.
  DTL_UNIMPLEMENTED("lab 20: params_per_gpu (Task 1)");
}

Memory memory_per_gpu(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                      int64_t global_batch, const CostModel& cost) {
  // TODO(lab20): the model state through lab14::model_state_bytes with mixed_precision(); one
  // layer's activations per micro-batch under each policy (the header's R, S, C); what each
  // pipeline stage holds at its schedule's peak (lab 12); one micro-batch's logits. Every stage
  // is a GPU: return the fullest one's parts.
  DTL_UNIMPLEMENTED("lab 20: memory_per_gpu (Task 1)");
}

// ================================================================ Task 2: what it costs

StepTime step_time(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                   int64_t global_batch, const CostModel& cost) {
  // TODO(lab20): a helper for "an all-reduce of B bytes over a group of k ranks `stride` apart"
  // (a lab07::Topology and its two cost models) carries every collective. Then one layer's
  // compute, its tensor- and context-parallel collectives, the logits, the sends, the slowest
  // stage (its layers, and the head if it is the last), the pipeline with lab12::bubble_formula, and the data-parallel reduction per ZeRO
  // stage.
  DTL_UNIMPLEMENTED("lab 20: step_time (Task 2)");
}

Estimate estimate(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                  int64_t global_batch, const CostModel& cost) {
  // TODO(lab20): check_plan, memory_per_gpu, step_time, then the figures plans are compared by.
  DTL_UNIMPLEMENTED("lab 20: estimate (Task 2)");
}

// ================================================================ Task 3: which plan

PlanReport plan(const GPTConfig& model, const Cluster& cluster, int64_t global_batch,
                const CostModel& cost) {
  // TODO(lab20): every candidate of the header, estimated; the fastest that fits; the simplest
  // within 5% of it; every plan with its verdict, in the header's order.
  DTL_UNIMPLEMENTED("lab 20: plan (Task 3)");
}

// ================================================================ Task 4: does it train

void average_gradients(const std::vector<torch::Tensor>& params, Comm& dp) {
  // TODO(lab20): the mean over dp of every gradient there is (one collective is enough).
  DTL_UNIMPLEMENTED("lab 20: average_gradients (Task 4)");
}

TrainResult train(const Plan& plan, const TrainOptions& options, Comm& world) {
  // TODO(lab20): check what cannot be built (before any communication); the mesh
  // (DeviceMesh::megatron) and its groups; the composition the plan asks for, from the earlier
  // labs' references (the header lists which); then the loop: this replica's rows of each
  // step's global batch, the learning rate of the step, the step itself (where do the gradients
  // get averaged, and over which group?), the global loss, progress line, trace scope,
  // checkpoints (save_training_state / load_training_state). tp and pp together have no ready
  // executor: a stage of lab 09's pieces, run in lab 12's one_f_one_b order over its links.
  // Checkpoints any plan can resume: a SerialBox for each of this rank's parameters (its serial
  // name, the box it is of the serial tensor, whether this rank is the one that writes it).
  DTL_UNIMPLEMENTED("lab 20: train (Task 4)");
}

}  // namespace dtl::lab20
