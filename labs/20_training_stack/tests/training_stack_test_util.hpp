// labs/20_training_stack/tests/training_stack_test_util.hpp — shared by the public tests
// (training_stack_test.cpp) and the grading tests (grading/20_training_stack/): the
// single-process oracle of the trainer, the planner's test cases, small helpers.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtl/data.hpp"               // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/harness/checks.hpp"     // defines: serial, device, expect_error_mentions
#include "dtl/harness/scratch.hpp"    // defines: ScratchDir
#include "dtl/harness/observe.hpp"    // defines: OBSERVE
#include "dtl/optim.hpp"              // defines: make_adamw
#include "dtl/runtime.hpp"
#include "dtl/train.hpp"              // defines: train_step
#include "training_stack.hpp"

namespace lab20_test {

using dtl::Comm;
using dtl::lab20::Checkpointing;
using dtl::lab20::Cluster;
using dtl::lab20::CostModel;
using dtl::lab20::Estimate;
using dtl::lab20::GPTConfig;
using dtl::lab20::Plan;
using dtl::lab20::TrainOptions;
using dtl::lab20::TrainResult;
using dtl::lab20::cluster;
using dtl::lab20::estimate;
using dtl::lab20::invalid_reason;
using dtl::lab20::memory_per_gpu;
using dtl::lab20::model_by_name;
using dtl::lab20::params_per_gpu;
using dtl::lab20::step_time;

// Lab 07's ring all-reduce of `bytes` over n ranks on one link (alpha, beta), by hand: the oracle of
// the step-time tests.
inline double ring(int n, double bytes, double alpha, double beta) {
  return 2 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / beta;
}
using dtl::testing::expect_error_mentions;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The planner's tests are arithmetic: they run once, at world size 1.
#define LAB20_SINGLE_PROCESS()                                                              \
  do {                                                                                      \
    if (dtl::world().size() > 1) GTEST_SKIP() << "arithmetic only: runs at world size 1";  \
  } while (0)

inline Plan plan_of(const std::string& text) { return dtl::lab20::parse_plan(text); }

// ---------------------------------------------------------------- observations
//
// In the autograder's split run (dtl/harness/observe.hpp) the driver checks the student's
// numbers: the planner's results are OBSERVEd as lists of their fields; the trainer's losses
// are observed, its throughput (timed in the student's process) MEASURED.

using dtl::testing::Source;

// An Estimate as 27 numbers: the plan (tp, pp, dp, cp, zero, checkpointing, micro_batch,
// virtual_stages, first and last stage layers), the memory (3), the step time (8), fits, and
// the five figures.
inline std::vector<double> estimate_values(const Estimate& e) {
  const Plan& p = e.plan;
  const auto& m = e.memory;
  const auto& t = e.time;
  return {double(p.tp),
          double(p.pp),
          double(p.dp),
          double(p.cp),
          double(p.zero_stage),
          double(static_cast<int>(p.checkpointing)),
          double(p.micro_batch),
          double(p.virtual_stages),
          double(p.first_stage_layers),
          double(p.last_stage_layers),
          m.states,
          m.activations,
          m.logits,
          t.compute,
          t.tp_comm,
          t.cp_comm,
          t.p2p,
          t.bubble,
          t.dp_comm,
          t.dp_exposed,
          t.total,
          e.fits ? 1.0 : 0.0,
          e.memory_gb_per_gpu,
          e.step_s,
          e.tokens_per_s,
          e.tflops_per_gpu,
          e.mfu};
}
inline Estimate estimate_from(const std::vector<double>& v, const char* file, int line) {
  Estimate e;
  if (v.size() != 27) {
    ADD_FAILURE_AT(file, line) << "an Estimate recorded with " << v.size() << " numbers";
    return e;
  }
  Plan& p = e.plan;
  p.tp = int(v[0]), p.pp = int(v[1]), p.dp = int(v[2]), p.cp = int(v[3]), p.zero_stage = int(v[4]);
  p.checkpointing = static_cast<Checkpointing>(int(v[5]));
  p.micro_batch = int64_t(v[6]), p.virtual_stages = int(v[7]);
  p.first_stage_layers = int(v[8]), p.last_stage_layers = int(v[9]);
  e.memory = {v[10], v[11], v[12]};
  e.time = {v[13], v[14], v[15], v[16], v[17], v[18], v[19], v[20]};
  e.fits = v[21] != 0;
  e.memory_gb_per_gpu = v[22], e.step_s = v[23], e.tokens_per_s = v[24];
  e.tflops_per_gpu = v[25], e.mfu = v[26];
  return e;
}
inline Estimate observed(const Estimate& e, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  return estimate_from(
      dtl::testing::observe(estimate_values(e), "an Estimate", Source::kComputed, file, line), file,
      line);
}
// The Memory and StepTime parts alone, the same way.
inline dtl::lab20::Memory observed(const dtl::lab20::Memory& m, const char* file = __builtin_FILE(),
                                   int line = __builtin_LINE()) {
  Estimate e;
  e.memory = m;
  return observed(e, file, line).memory;
}
inline dtl::lab20::StepTime observed(const dtl::lab20::StepTime& t,
                                     const char* file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
  Estimate e;
  e.time = t;
  return observed(e, file, line).time;
}

// A planner's report: every ranked plan (its Estimate and verdict) and the fastest throughput.
inline dtl::lab20::PlanReport observed(const dtl::lab20::PlanReport& r,
                                       const char* file = __builtin_FILE(),
                                       int line = __builtin_LINE()) {
  std::vector<std::pair<std::vector<double>, std::string>> list;
  for (const auto& ranked : r.plans)
    list.emplace_back(estimate_values(ranked.estimate), ranked.verdict);
  auto v = dtl::testing::observe(std::make_pair(std::move(list), r.fastest_tokens_per_s),
                                 "the plans (estimate, verdict) and the fastest", Source::kComputed,
                                 file, line);
  dtl::lab20::PlanReport o;
  for (const auto& [values, verdict] : v.first)
    o.plans.push_back({estimate_from(values, file, line), verdict});
  o.fastest_tokens_per_s = v.second;
  return o;
}

// A trainer's result: losses, first step and checkpoint observed; tokens/s and MFU MEASURED.
inline TrainResult observed(const TrainResult& r, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  TrainResult o;
  const auto v =
      dtl::testing::observe(std::make_pair(r.losses, std::make_pair(r.first_step, r.checkpoint)),
                            "the losses, first step and checkpoint", Source::kComputed, file, line);
  o.losses = v.first;
  o.first_step = v.second.first;
  o.checkpoint = v.second.second;
  const auto timed = dtl::testing::observe(std::make_pair(r.tokens_per_s, r.mfu),
                                           "tokens/s and MFU", Source::kMeasured, file, line);
  o.tokens_per_s = timed.first;
  o.mfu = timed.second;
  return o;
}

// A cost model with the given constants and software (usable memory as the default).
inline CostModel cost(double eps, double kappa, double omega, bool flash = false, bool sp = false) {
  CostModel c;
  c.compute_efficiency = eps;
  c.memory_passes = kappa;
  c.dp_overlap = omega;
  c.flash_attention = flash;
  c.sequence_parallel = sp;
  return c;
}

// The trainer's test setting: the tiny GPT (2 layers, d 32, 2 heads, vocab 64, 16 tokens), a
// global batch of 24 (it divides over 1 to 4 replicas, in micro-batches of 2), AdamW with eps 1e-6 (so reduction-order rounding does not blow up through
// 1/sqrt(v)) and weight decay on the matrices.
inline TrainOptions train_options(int64_t steps = 4, double weight_decay = 0.1) {
  TrainOptions o;
  o.model = dtl::testing::gpt_config(2, 32, 2, 64, 16);
  o.optim.lr = 3e-3;
  o.optim.eps = 1e-6;
  o.optim.weight_decay = weight_decay;
  o.global_batch = 24;
  o.steps = steps;
  o.peak_flops = 1e10;  // a number: measuring the machine's matmul rate would cost a second
  return o;
}

// AdamW divides by sqrt(v): a gradient k times too large gives the same update, so a loss not
// divided by the number of micro-batches passes unseen. With an eps larger than the gradients
// the update is about lr g / eps, and the scale shows.
inline TrainOptions scale_sensitive(TrainOptions o) {
  o.optim.eps = 0.1;
  return o;
}

// The oracle: single-process dtl::train_step on the whole global batch, the same data, the same
// optimizer; the loss of every step. Every rank computes it on its own (no communication).
inline std::vector<double> serial_losses(const TrainOptions& o) {
  return dtl::testing::serial(0, [&] {
    dtl::lab20::GPTConfig cfg = o.model;
    dtl::model::GPT model(cfg);
    model->to(dtl::testing::device());
    auto opt = dtl::make_adamw(*model, o.optim);
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, o.data_seed);
    dtl::data::GlobalBatchSampler sampler(corpus, o.global_batch, cfg.seq_len);
    std::vector<double> losses;
    for (int64_t k = 0; k < o.steps; ++k) {
      dtl::set_lr(*opt, dtl::warmup_cosine_lr(o.optim, k, o.steps));
      losses.push_back(dtl::train_step(model, *opt, sampler.global_batch_at(k).to(dtl::testing::device())));
    }
    return losses;
  });
}

// train(plan) on the whole world follows the serial losses step for step.
inline void expect_follows_serial(const std::string& plan, const TrainOptions& o,
                                  double rtol = 1e-4) {
  const std::vector<double> want = serial_losses(o);
  auto comm = dtl::testing::fresh_comm();
  const TrainResult got = observed(dtl::lab20::train(plan_of(plan), o, *comm));
  ASSERT_EQ(got.losses.size(), want.size()) << plan;
  EXPECT_EQ(got.first_step, 0) << plan;
  for (size_t k = 0; k < want.size(); ++k)
    EXPECT_NEAR(got.losses[k], want[k], rtol * std::abs(want[k]))
        << plan << ": the loss of step " << k << " differs from single-process training's";
}

// For each tensor of the checkpoint in `dir` (a step-* directory), read from its manifest, how
// many of its elements its chunks do not hold exactly once: 0 when the saved boxes tile it (no
// hole, no element written by two ranks). {"param/wte.weight": 0, "exp_avg/wte.weight": 0, ...}
inline std::map<std::string, int64_t> elements_not_saved_once(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(in);
  std::map<std::string, int64_t> wrong;
  for (auto t = manifest.at("tensors").begin(); t != manifest.at("tensors").end(); ++t) {
    torch::Tensor count = torch::zeros(t->at("shape").get<std::vector<int64_t>>(), torch::kInt32);
    for (const auto& c : t->at("chunks")) {
      if (!c.contains("box_offset")) {
        const int64_t offset = c.at("offset").get<int64_t>(), numel = c.at("numel").get<int64_t>();
        count.view({-1}).narrow(0, offset, numel) += 1;
        continue;
      }
      const auto offset = c.at("box_offset").get<std::vector<int64_t>>();
      const auto shape = c.at("box_shape").get<std::vector<int64_t>>();
      torch::Tensor box = count;
      for (size_t d = 0; d < offset.size(); ++d)
        box = box.narrow(static_cast<int64_t>(d), offset[d], shape[d]);
      box += 1;
    }
    wrong[t.key()] = (count != 1).sum().item<int64_t>();
  }
  return wrong;
}

// A run saved under one plan resumes under another: `before` trains the first `saved_at` steps of
// `o` on the first before.gpus() ranks of the world and checkpoints; `after` resumes on the first
// after.gpus() ranks (fewer or more) and trains to o.steps. Both follow single-process training
// (the resumed run from the saved step on), and the checkpoint holds every element of every
// serial tensor and moment exactly once. A constant learning rate after the warm-up, so that the
// short run and the whole run share their schedule.
inline void expect_resumes_under(const std::string& before, const std::string& after,
                                 TrainOptions o, int64_t saved_at, double rtol = 1e-4) {
  o.optim.min_lr_ratio = 1;
  const std::vector<double> want = serial_losses(o);
  auto comm = dtl::testing::fresh_comm();
  dtl::testing::ScratchDir dir(*comm);
  const std::string what = before + " -> " + after;
  // The world's first `ranks` ranks run `plan`; the others wait (for an error too: no hang).
  auto run_on_first = [&](const std::string& plan, const TrainOptions& opt) {
    const int ranks = plan_of(plan).gpus();
    auto group = comm->split(comm->rank() < ranks ? 0 : 1, comm->rank());
    TrainResult r;
    try {
      if (comm->rank() < ranks) r = observed(dtl::lab20::train(plan_of(plan), opt, *group));
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": train(" << plan << ") raised: " << e.what();
    }
    comm->barrier();
    return r;
  };
  TrainOptions first = o;
  first.checkpoint_dir = dir.path();
  first.steps = saved_at;
  const TrainResult a = run_on_first(before, first);
  if (comm->rank() < plan_of(before).gpus()) {
    // EXPECT, not ASSERT: a return here on some ranks only would leave the others alone in the
    // collectives below (the skeleton hung there at 3 ranks until the watchdog).
    EXPECT_EQ(a.losses.size(), static_cast<size_t>(saved_at)) << what;
    for (size_t k = 0; k < std::min(a.losses.size(), want.size()); ++k)
      EXPECT_NEAR(a.losses[k], want[k], rtol * std::abs(want[k])) << what << ": step " << k;
  }
  const std::map<std::string, int64_t> wrong = OBSERVE(
      elements_not_saved_once(dir / fmt::format("step-{:08d}", saved_at)));
  {
    dtl::lab20::GPTConfig cfg = o.model;
    dtl::model::GPT serial(cfg);
    EXPECT_EQ(wrong.size(), 3 * serial->named_parameters().size())
        << what << ": the checkpoint holds param/, exp_avg/ and exp_avg_sq/ of each serial tensor";
    for (const auto& [name, elements] : wrong)
      EXPECT_EQ(elements, 0) << what << ": " << elements << " elements of '" << name
                             << "' are saved twice or never (one writer per box; boxes that tile)";
  }
  TrainOptions second = o;
  second.checkpoint_dir = dir.path();
  const TrainResult b = run_on_first(after, second);
  if (comm->rank() < plan_of(after).gpus()) {
    EXPECT_EQ(b.first_step, saved_at) << what << ": the run must resume at the saved step";
    EXPECT_EQ(b.losses.size(), want.size() - static_cast<size_t>(saved_at)) << what;
    for (size_t k = 0; k < std::min(b.losses.size(), want.size() - saved_at); ++k)
      EXPECT_NEAR(b.losses[k], want[saved_at + k], rtol * std::abs(want[saved_at + k]))
          << what << ": step " << saved_at + k << " after resuming under the other plan";
  }
}

}  // namespace lab20_test
