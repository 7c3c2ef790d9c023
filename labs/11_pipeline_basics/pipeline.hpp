// pipeline.hpp — lab 11: the interface the tests call (do not edit).
//
// defines: num_units, unit_costs, partition, imbalance, PipelineStage, StepStats,
//          fill_drain_step
//
// Pipeline parallelism cuts the model, not the batch: stage s of p owns a contiguous run of
// the model's units, receives activations from stage s-1, sends its output to stage s+1, and in
// backward passes the gradient of each activation back the same way. The global batch is split
// into m micro-batches so that stages can work at once; with the fill-drain (GPipe) schedule
// every stage runs all m forwards, then all m backwards, and sits idle for p-1 of every m+p-1
// time slots (the bubble). Done right, one pipelined step is the SAME computation as a serial
// step on the global batch: the tests check the parameters against single-process training.
//
// The course GPT as a chain of units (dtl/model.hpp):
//   unit 0            the embedding: wte(tokens) + wpe(positions)
//   units 1..L        the L transformer blocks ("blocks.0" .. "blocks.L-1")
//   unit L+1          the head: ln_f, then the lm head (tied: x @ wte^T)
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtl/comm.hpp"   // defines: Comm
#include "dtl/model.hpp"  // defines: GPTConfig, Block
#include "dtl/split.hpp"  // defines: Range

namespace dtl::lab11 {

using model::GPTConfig;

// ---------------------------------------------------------------- Task 1: where to cut

// n_layer + 2: the embedding, the blocks, the head. (Given.)
int64_t num_units(const GPTConfig& cfg);

// Forward FLOPs per token of each unit, the cost the partition balances (given): embedding
// 2d (a lookup and an add; nearly free), block 24 d^2 + 4 T d (the four projections and the
// attention scores at full context T = seq_len), head 2 d V (the logits). For GPT-3 175B the
// head costs a third of a block; with a small d and a large vocabulary, more than a block.
std::vector<double> unit_costs(const GPTConfig& cfg);

// The units cut into `stages` runs as evenly as split_range cuts items, ignoring their costs
// (given): the baseline partition() improves on, and what tests use so as not to depend on it.
std::vector<Range> even_parts(const GPTConfig& cfg, int stages);

// Throws dtl::Error containing "parts" unless parts has `stages` entries that partition
// num_units(cfg) units (each non-empty, contiguous, in order). (Given.)
void check_parts(const GPTConfig& cfg, const std::vector<Range>& parts, int stages);

// Cuts units with the given costs into `stages` contiguous, non-empty runs, in order (stage 0
// first), so that the largest stage cost (the pipeline's clock: every stage waits for the
// slowest) is as small as possible. Any optimal partition is accepted. Throws dtl::Error whose
// message contains "stages" when stages < 1, "more stages than units" when stages exceeds the
// number of units, and "cost" when a cost is negative or not finite.
std::vector<Range> partition(const std::vector<double>& costs, int stages);

// max stage cost / mean stage cost of a partition of `costs` (1 = perfectly balanced; the
// slowest stage sets the pace, the others idle for the difference). Throws dtl::Error
// containing "partition" unless `parts` are non-empty, contiguous, in order and cover every unit
// exactly once.
double imbalance(const std::vector<double>& costs, const std::vector<Range>& parts);

// ---------------------------------------------------------------- Task 2: a stage

// One pipeline stage: this rank is stage comm.rank() of comm.size() and owns units
// parts[comm.rank()] of the course GPT, built and initialised exactly as the serial model's
// parameters of the same names (dtl::model::init_parameters), on the Runtime's device. Every
// rank constructs its stage with the same `parts` (one per rank). With a tied head and more than
// one stage, the first stage (wte) and the last (the head) each hold the embedding matrix: the
// last stage keeps a copy, initialised identically, whose gradient must be summed with the first
// stage's before every optimizer step (Megatron-LM's "embedding group"; Task 3). The
// constructor is collective (it creates that group with Comm::split).
// Throws dtl::Error containing "parts" unless parts has comm.size() entries that partition
// num_units(cfg) units (each non-empty, contiguous, in order).
class PipelineStage {
 public:
  PipelineStage(const GPTConfig& cfg, Comm& comm, const std::vector<Range>& parts);
  // (Given, for lab 12's interleaved chunks.) A container for `units`, built and initialised as
  // above, that calls itself stage `stage` of `stages`: not collective, no embedding group, and
  // meant for run_units only (forward/backward address ranks by stage number).
  PipelineStage(const GPTConfig& cfg, Comm& comm, Range units, int stage, int stages);
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  int stage() const;
  int num_stages() const;
  bool is_first() const;
  bool is_last() const;
  Range units() const;  // the units this stage owns
  Comm& comm() const;   // the pipeline's Comm (stage s is rank s)
  const GPTConfig& config() const;

  // This stage's parameters, for its optimizer.
  torch::nn::Module& module();
  // (name, parameter) of this stage under the serial GPT's names ("wte.weight",
  // "blocks.2.attn.qkv.weight", "ln_f.bias"), in unit order. The last stage of a tied model
  // lists its copy of the embedding as "wte.weight" too.
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  // The group of the first and last stage that share the tied embedding: non-null on those two
  // stages of a tied model with more than one stage, null otherwise. (Given.)
  Comm* embedding_group() const;

  // Runs this stage's units on x: unit 0 maps tokens [mb, T] to [mb, T, d], blocks map
  // [mb, T, d] to itself, the head maps [mb, T, d] to logits [mb, T, V]. (Given.)
  torch::Tensor run_units(const torch::Tensor& x);

  // Task 2a. Forward of the next micro-batch, `tokens` [mb, T + 1] int64 (every stage passes
  // the same micro-batch: the first stage embeds tokens[:, :T], the last scores against
  // tokens[:, 1:]). A stage other than the first receives its input activation [mb, T, d]
  // (float32) from stage - 1 with Comm::recv; a stage other than the last sends its output to
  // stage + 1 with Comm::send. Keeps what backward needs (the input as a leaf that requires
  // grad, the output) and counts the micro-batch as in flight. Returns the micro-batch's mean
  // loss (lm_loss) on the last stage, an undefined tensor on the others.
  torch::Tensor forward(const torch::Tensor& tokens);

  // Task 2b. Backward of micro-batch `micro` (0 = the first forwarded since the last
  // finish_step; any in-flight micro-batch, in the same order on every stage). The last stage
  // backpropagates loss x loss_scale; another stage receives the gradient of its output from
  // stage + 1 and backpropagates it. A stage other than the first then sends the gradient of its
  // input to stage - 1. Gradients accumulate in the parameters' .grad; the micro-batch's saved
  // tensors are released. Throws dtl::Error containing "micro" when that micro-batch is not in
  // flight.
  void backward(int64_t micro, double loss_scale);

  int64_t in_flight() const;       // micro-batches forwarded and not yet backpropagated
  int64_t peak_in_flight() const;  // the most at once since the last finish_step
  // Forgets the step's micro-batch numbering and resets peak_in_flight (call after the
  // optimizer step; throws dtl::Error containing "in flight" if a micro-batch still is).
  void finish_step();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// ---------------------------------------------------------------- Task 3: fill-drain

struct StepStats {
  double loss = 0;  // mean loss over the global batch (the same on every stage)
  int64_t micro_batches = 0;
  int64_t peak_in_flight = 0;  // on this stage: m under fill-drain
  double forward_seconds = 0;  // this stage's forward phase, waits for activations included
  double backward_seconds = 0;
};

// One training step with the fill-drain (GPipe) schedule: the global batch [B, T + 1] (the
// same on every stage) is cut into `micro_batches` equal micro-batches of B / m rows; every
// stage runs the forwards of micro-batches 0..m-1, then the backwards of m-1..0, each loss
// scaled by 1/m so the gradients are those of the mean loss over the global batch; the tied
// embedding's gradient is summed over embedding_group(); then optimizer.step() and
// finish_step(). The optimizer holds stage.module()'s parameters; the step clears gradients
// first. Afterwards every stage's parameters equal the serial model's after one train_step on
// the global batch, up to float rounding. The loss is the last stage's, broadcast to all.
// Throws dtl::Error containing "micro_batches" unless m >= 1 and m divides B.
StepStats fill_drain_step(PipelineStage& stage, torch::optim::Optimizer& optimizer,
                          const torch::Tensor& global_batch, int64_t micro_batches);

}  // namespace dtl::lab11
