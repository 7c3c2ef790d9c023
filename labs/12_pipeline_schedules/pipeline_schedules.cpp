// labs/12_pipeline_schedules/pipeline_schedules.cpp — your code for lab 12 (see README.md).
//
// Replace every DTL_UNIMPLEMENTED with your implementation. The header
// (pipeline_schedules.hpp) is the contract. Given: Action, describe, ModelChunks, PipelineLinks
// (chunks.cpp), measured_bubble, bubble_formula; lab 11's reference (dtl::lab11::...).
#include "pipeline_schedules.hpp"

#include <fmt/format.h>

#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab12 {

// ---------------------------------------------------------------- Task 1

Schedule gpipe(int p, int64_t m) {
  // TODO(lab12): check p and m; every rank: F0..F(m-1), then B0..B(m-1).
  (void)p, (void)m;
  DTL_UNIMPLEMENTED("lab 12: gpipe (Task 1)");
}

Schedule one_f_one_b(int p, int64_t m) {
  // TODO(lab12): warm-up forwards, one forward / one backward, drain (or: interleaved, v = 1).
  (void)p, (void)m;
  DTL_UNIMPLEMENTED("lab 12: one_f_one_b (Task 1)");
}

Schedule interleaved(int p, int64_t m, int v) {
  // TODO(lab12): the k-th forward and backward of every rank as the header defines them; the
  // warm-up count of rank r; then the same three phases as 1F1B.
  (void)p, (void)m, (void)v;
  DTL_UNIMPLEMENTED("lab 12: interleaved (Task 1)");
}

// ---------------------------------------------------------------- Task 2

SimResult simulate(const Schedule& schedule, int v, const Costs& costs) {
  // TODO(lab12): check every rank's list (each action exactly once); then run each rank's next
  // action as soon as the rank is free and its inputs are done, until all are done; when no
  // rank can start, report the deadlock (each stuck rank, its action, what it waits for).
  (void)schedule, (void)v, (void)costs;
  DTL_UNIMPLEMENTED("lab 12: simulate (Task 2)");
}

// ---------------------------------------------------------------- Task 3

StepResult execute(const Schedule& schedule, ModelChunks& chunks, PipelineLinks& links,
                   torch::optim::Optimizer& optimizer, const torch::Tensor& global_batch,
                   const ExecuteOptions& options) {
  // TODO(lab12): check the schedule (and the order on each link); cut the batch into micro-batches;
  // run this rank's actions in order (receive, compute with chunks.stage(c).run_units, send
  // asynchronously, keep what backward needs); wait for the sends; sum the tied embedding; step;
  // broadcast the loss.
  (void)schedule, (void)chunks, (void)links, (void)optimizer, (void)global_batch, (void)options;
  DTL_UNIMPLEMENTED("lab 12: execute (Task 3)");
}

}  // namespace dtl::lab12
