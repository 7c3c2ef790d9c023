// labs/05_grad_accumulation/tests/grad_accumulation_test_util.hpp — the oracle and helpers
// shared by the public tests (grad_accumulation_test.cpp) and the grading tests
// (grading/05_grad_accumulation/).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp.hpp"
#include "dtl/comm.hpp"
#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/harness/checks.hpp"  // defines: serial, flat_params
#include "dtl/model.hpp"           // defines: GPT, GPTConfig
#include "dtl/optim.hpp"           // defines: OptimConfig, make_adamw, set_lr
#include "dtl/runtime.hpp"         // defines: world()
#include "dtl/split.hpp"           // defines: split_range, Range
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

// The loss mask of step `step` ([B, T] bool): None for an unmasked run.
using MaskAt = std::function<torch::Tensor(int step)>;

inline torch::Tensor serial_masked_loss(GPT& m, const torch::Tensor& tokens,
                                        const torch::Tensor& mask);  // below

// The ground truth: `steps` serial steps on the whole global batch in one process (without a
// mask dtl::train_step; with one the mean over the counted targets, serial_masked_loss), the lr
// of step s set to scheduled_lr(schedule, B, s) first. Returns the flat parameters after the
// last step and, through `losses`, each step's loss.
inline torch::Tensor serial_params(const GPTConfig& cfg,
                                   const dtl::data::GlobalBatchSampler& sampler, int steps,
                                   const LrSchedule& schedule, const MakeOptimizer& make_opt,
                                   std::vector<double>* losses = nullptr,
                                   const MaskAt& mask_at = nullptr) {
  return dtl::testing::serial(1, [&] {
    GPT m(cfg);
    m->to(device());
    auto opt = make_opt(m);
    for (int s = 0; s < steps; ++s) {
      dtl::set_lr(*opt, expected_lr(schedule, sampler.global_batch(), s));
      const torch::Tensor batch = sampler.global_batch_at(s).to(device());
      double loss = 0;
      if (mask_at) {
        opt->zero_grad();
        const torch::Tensor l = serial_masked_loss(m, batch, mask_at(s).to(device()));
        l.backward();
        opt->step();
        loss = l.item<double>();
      } else {
        loss = dtl::train_step(m, *opt, batch);
      }
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
  o.local_tokens = observe(s.local_tokens, "StepStats.local_tokens", Source::kComputed, file, line);
  o.micro_rows = observe(s.micro_rows, "StepStats.micro_rows", Source::kComputed, file, line);
  o.small_sq_norm =
      observe(s.small_sq_norm, "StepStats.small_sq_norm", Source::kComputed, file, line);
  o.small_batch = observe(s.small_batch, "StepStats.small_batch", Source::kComputed, file, line);
  o.big_sq_norm = observe(s.big_sq_norm, "StepStats.big_sq_norm", Source::kComputed, file, line);
  o.b_simple = observe(s.b_simple, "StepStats.b_simple", Source::kComputed, file, line);
  return o;
}

// What a trained run leaves behind, on this rank.
struct TrainedRun {
  torch::Tensor params;               // flat, after the last step
  std::vector<StepStats> stats;       // one per step (observed)
  std::vector<double> global_losses;  // mean loss over the global batch's counted targets
  int64_t all_reduces = 0;            // on the DDP's Comm, during the steps (measured)
  int64_t all_reduce_bytes = 0;
  int64_t buckets = 0;          // lab 04's reference DDP: the driver's own is the same
  int64_t optimizer_steps = 0;  // observed
};

// `steps` steps of the student's trainer on `comm` (every rank of comm calls it).
inline TrainedRun run_trainer(Comm& comm, const GPTConfig& cfg,
                              const dtl::data::GlobalBatchSampler& sampler, int steps,
                              AccumulationOptions options, const MakeOptimizer& make_opt,
                              DDPOptions ddp_options = small_buckets(),
                              const MaskAt& mask_at = nullptr) {
  GPT model(cfg);
  model->to(device());
  DistributedDataParallel ddp(model.ptr(), comm, ddp_options);
  auto opt = make_opt(model);
  AccumulationTrainer trainer(model, ddp, *opt, options);
  comm.reset_stats();
  TrainedRun run;
  for (int s = 0; s < steps; ++s) {
    const torch::Tensor batch = sampler.global_batch_at(s).to(device());
    run.stats.push_back(observed(mask_at ? trainer.step(batch, mask_at(s).to(device()))
                                         : trainer.step(batch)));
  }
  const dtl::CommStats st = MEASURED(comm.stats());
  run.all_reduces = st[OpType::AllReduce].count;
  run.all_reduce_bytes = st[OpType::AllReduce].bytes;
  // The global loss from each rank's target-weighted mean (after the counting above).
  for (const StepStats& s : run.stats) {
    torch::Tensor sums =
        torch::tensor({s.loss * static_cast<double>(s.local_tokens),
                       static_cast<double>(s.local_tokens)},
                      torch::TensorOptions().dtype(torch::kFloat64).device(device()));
    comm.all_reduce(sums);
    run.global_losses.push_back(sums[0].item<double>() / sums[1].item<double>());
  }
  run.params = dtl::testing::flat_params(*model);
  run.buckets = static_cast<int64_t>(ddp.buckets().size());
  run.optimizer_steps = OBSERVE(trainer.optimizer_steps());
  return run;
}

// ---------------------------------------------------------------- token-weighted losses

// The serial oracle of a masked run: the mean cross-entropy over the counted targets of the
// whole global batch, written independently of the lab's functions (torch's ignore_index: an
// ignored target is -100 in the TARGETS, not in the tokens the model embeds).
inline torch::Tensor serial_masked_loss(GPT& m, const torch::Tensor& tokens,
                                        const torch::Tensor& mask) {
  const int64_t T = tokens.size(1) - 1;
  const torch::Tensor targets =
      tokens.narrow(1, 1, T).masked_fill(mask.logical_not(), -100).reshape({-1});
  const torch::Tensor logits = m->forward(tokens.narrow(1, 0, T));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}), targets);
}

// A padded batch: row i counts its first len_i targets, len_i between 1 and T varying with the
// row and the step (so every step has its own count), except the rows of `empty` (a whole
// micro-batch, or a whole rank), which count none.
inline torch::Tensor padded_mask(int64_t rows, int64_t T, int step, dtl::Range empty) {
  torch::Tensor mask = torch::zeros({rows, T}, torch::kBool);
  for (int64_t i = 0; i < rows; ++i) {
    if (i >= empty.begin && i < empty.end) continue;
    const int64_t len = 1 + (i * 5 + step * 3) % T;
    mask[i].narrow(0, 0, len).fill_(true);
  }
  return mask;
}

// ---------------------------------------------------------------- the gradient noise scale

// What the trainer measures in one step, computed serially: the mean over the `world` shards
// of |the gradient of the shard's mean loss|^2, the harmonic mean of the shards' rows, and
// |the global-batch mean loss's gradient|^2; then the step itself (train_step), as in
// serial_params.
struct NoiseNorms {
  double small_sq_norm = 0;
  double small_batch = 0;
  double big_sq_norm = 0;
};

inline double sq_norm_of_grads(GPT& m) {
  double total = 0;
  for (const torch::Tensor& p : m->parameters())
    if (p.grad().defined()) total += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  return total;
}

inline std::vector<NoiseNorms> serial_noise_norms(const GPTConfig& cfg,
                                                  const dtl::data::GlobalBatchSampler& sampler,
                                                  int steps, const LrSchedule& schedule,
                                                  const MakeOptimizer& make_opt, int64_t world) {
  std::vector<NoiseNorms> out;
  dtl::testing::serial(1, [&] {
    GPT m(cfg);
    m->to(device());
    auto opt = make_opt(m);
    const int64_t rows = sampler.global_batch();
    for (int s = 0; s < steps; ++s) {
      const torch::Tensor batch = sampler.global_batch_at(s).to(device());
      NoiseNorms n;
      double inverse_rows = 0;
      for (int64_t r = 0; r < world; ++r) {
        const dtl::Range shard = dtl::split_range(rows, world, r);
        opt->zero_grad();
        m->loss(batch.narrow(0, shard.begin, shard.size())).backward();
        n.small_sq_norm += sq_norm_of_grads(m) / static_cast<double>(world);
        inverse_rows += 1.0 / static_cast<double>(shard.size());
      }
      n.small_batch = static_cast<double>(world) / inverse_rows;
      dtl::set_lr(*opt, expected_lr(schedule, rows, s));
      dtl::train_step(m, *opt, batch);  // leaves the global batch's gradient in .grad()
      n.big_sq_norm = sq_norm_of_grads(m);
      out.push_back(n);
    }
    return torch::zeros({1});
  });
  return out;
}

// The running B_simple after each measured step, from McCandlish et al.'s A.1 estimates averaged
// with `decay` (numerator and denominator separately), written independently of the lab's.
inline std::vector<std::optional<double>> expected_b_simple(const std::vector<NoiseNorms>& norms,
                                                            double big_batch, double decay) {
  std::vector<std::optional<double>> out;
  double g = 0, tr = 0;
  for (const NoiseNorms& n : norms) {
    const double bs = n.small_batch, bb = big_batch;
    g = decay * g + (1 - decay) * (bb * n.big_sq_norm - bs * n.small_sq_norm) / (bb - bs);
    tr = decay * tr + (1 - decay) * (n.small_sq_norm - n.big_sq_norm) / (1 / bs - 1 / bb);
    out.push_back(g > 0 && tr > 0 ? std::optional<double>(tr / g) : std::nullopt);
  }
  return out;
}

inline std::string describe(const Comm& comm, int64_t rows, int64_t accum) {
  return "global batch " + std::to_string(rows) + " on " + std::to_string(comm.size()) +
         " ranks, accum_steps " + std::to_string(accum);
}

}  // namespace lab05_test
