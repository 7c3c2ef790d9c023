// labs/05_grad_accumulation/tests/grad_accumulation_test_util.hpp — the oracle and helpers
// shared by the public tests (grad_accumulation_test.cpp) and the grading tests
// (grading/05_grad_accumulation/).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp.hpp"
#include "dtl/comm.hpp"
#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/harness/checks.hpp"  // defines: serial, flat_params
#include "dtl/model.hpp"           // defines: GPT, GPTConfig
#include "dtl/optim.hpp"           // defines: OptimConfig, make_adamw, set_lr
#include "dtl/runtime.hpp"         // defines: world()
#include "dtl/train.hpp"           // defines: train_step (the single-process ground truth)
#include "grad_accumulation.hpp"

namespace lab05_test {

using dtl::Comm;
using dtl::OpType;
using dtl::lab04::DDPOptions;
using dtl::lab04::DistributedDataParallel;
using dtl::lab05::AccumulationOptions;
using dtl::lab05::AccumulationTrainer;
using dtl::lab05::LrScaling;
using dtl::lab05::LrSchedule;
using dtl::lab05::StepStats;
using dtl::model::GPT;
using dtl::model::GPTConfig;

using dtl::testing::device;      // the Runtime's device
using dtl::testing::fresh_comm;  // a dup of the world per test

// Builds the optimizer of one side of a comparison (the trainer's and the serial oracle's).
using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(GPT&)>;

// AdamW with weight decay; eps 1e-6 because Adam divides by sqrt(v) + eps, which amplifies the
// last-bit differences between a serial sum and a sum of micro-batches for tiny gradients.
inline MakeOptimizer adamw() {
  return [](GPT& m) -> std::unique_ptr<torch::optim::Optimizer> {
    dtl::OptimConfig oc;
    oc.eps = 1e-6;
    oc.weight_decay = 0.1;
    return dtl::make_adamw(*m, oc);
  };
}
// Plain SGD: the update is proportional to the gradient, so a wrong loss weight shows up in
// full (Adam divides most of a uniform scale error away).
inline MakeOptimizer sgd() {
  return [](GPT& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1));
  };
}

// Buckets small enough that the tiny GPT (~110 KiB of gradients) has several of them.
inline DDPOptions small_buckets() {
  DDPOptions o;
  o.first_bucket_bytes = 8 << 10;
  o.bucket_cap_bytes = 24 << 10;
  return o;
}

// A schedule with warm-up and decay inside a few steps, so a wrong step count changes the lr
// of every step after the first.
inline LrSchedule short_schedule(double base_lr = 2e-3, LrScaling scaling = LrScaling::Linear,
                                 int64_t base_batch = 8) {
  LrSchedule s;
  s.base_lr = base_lr;
  s.base_batch = base_batch;
  s.scaling = scaling;
  s.warmup_steps = 2;
  s.total_steps = 5;
  s.min_lr_ratio = 0.1;
  return s;
}

// The lr the tests expect, written independently of the student's scheduled_lr: the peak
// scaled from base_batch to batch, shaped by common's warm-up + cosine.
inline double expected_lr(const LrSchedule& s, int64_t batch, int64_t step) {
  const double k = static_cast<double>(batch) / static_cast<double>(s.base_batch);
  dtl::OptimConfig c;
  c.lr = s.base_lr * (s.scaling == LrScaling::Linear ? k
                      : s.scaling == LrScaling::Sqrt ? std::sqrt(k)
                                                     : 1.0);
  c.warmup_steps = s.warmup_steps;
  c.min_lr_ratio = s.min_lr_ratio;
  return dtl::warmup_cosine_lr(c, step, s.total_steps);
}

// The ground truth: `steps` serial steps (dtl::train_step on the whole global batch, one
// process), the lr of step s set to scheduled_lr(schedule, B, s) first. Returns the flat
// parameters after the last step and, through `losses`, each step's loss.
inline torch::Tensor serial_params(const GPTConfig& cfg,
                                   const dtl::data::GlobalBatchSampler& sampler, int steps,
                                   const LrSchedule& schedule, const MakeOptimizer& make_opt,
                                   std::vector<double>* losses = nullptr) {
  return dtl::testing::serial(1, [&] {
    GPT m(cfg);
    m->to(device());
    auto opt = make_opt(m);
    for (int s = 0; s < steps; ++s) {
      dtl::set_lr(*opt, expected_lr(schedule, sampler.global_batch(), s));
      const float loss = dtl::train_step(m, *opt, sampler.global_batch_at(s).to(device()));
      if (losses) losses->push_back(loss);
    }
    return dtl::testing::flat_params(*m);
  });
}

// A StepStats from the student's trainer, every field observed (dtl/harness/observe.hpp): in the
// autograder's split run, assertions on it are checked on the values the student's code returned.
inline StepStats observed(const StepStats& s, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  using dtl::testing::observe;
  using dtl::testing::Source;
  StepStats o;
  o.step = observe(s.step, "StepStats.step", Source::kComputed, file, line);
  o.lr = observe(s.lr, "StepStats.lr", Source::kComputed, file, line);
  o.loss = observe(s.loss, "StepStats.loss", Source::kComputed, file, line);
  o.local_rows = observe(s.local_rows, "StepStats.local_rows", Source::kComputed, file, line);
  o.micro_rows = observe(s.micro_rows, "StepStats.micro_rows", Source::kComputed, file, line);
  return o;
}

// What a trained run leaves behind, on this rank.
struct TrainedRun {
  torch::Tensor params;               // flat, after the last step
  std::vector<StepStats> stats;       // one per step (observed)
  std::vector<double> global_losses;  // mean loss over the global batch, per step
  int64_t all_reduces = 0;            // on the DDP's Comm, during the steps (measured)
  int64_t all_reduce_bytes = 0;
  int64_t buckets = 0;          // lab 04's reference DDP: the driver's own is the same
  int64_t optimizer_steps = 0;  // observed
};

// `steps` steps of the student's trainer on `comm` (every rank of comm calls it).
inline TrainedRun run_trainer(Comm& comm, const GPTConfig& cfg,
                              const dtl::data::GlobalBatchSampler& sampler, int steps,
                              AccumulationOptions options, const MakeOptimizer& make_opt,
                              DDPOptions ddp_options = small_buckets()) {
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), comm, ddp_options);
  auto opt = make_opt(model);
  AccumulationTrainer trainer(model, ddp, *opt, options);
  comm.reset_stats();
  TrainedRun run;
  for (int s = 0; s < steps; ++s) {
    run.stats.push_back(observed(trainer.step(sampler.global_batch_at(s).to(device()))));
  }
  const dtl::CommStats st = MEASURED(comm.stats());
  run.all_reduces = st[OpType::AllReduce].count;
  run.all_reduce_bytes = st[OpType::AllReduce].bytes;
  // The global loss from each rank's row-weighted mean (after the counting above).
  for (const StepStats& s : run.stats) {
    torch::Tensor sum =
        torch::tensor({s.loss * static_cast<double>(s.local_rows)},
                      torch::TensorOptions().dtype(torch::kFloat64).device(device()));
    comm.all_reduce(sum);
    run.global_losses.push_back(sum.item<double>() / static_cast<double>(sampler.global_batch()));
  }
  run.params = dtl::testing::flat_params(*model);
  run.buckets = static_cast<int64_t>(ddp.buckets().size());
  run.optimizer_steps = OBSERVE(trainer.optimizer_steps());
  return run;
}

inline std::string describe(const Comm& comm, int64_t rows, int64_t accum) {
  return "global batch " + std::to_string(rows) + " on " + std::to_string(comm.size()) +
         " ranks, accum_steps " + std::to_string(accum);
}

}  // namespace lab05_test
