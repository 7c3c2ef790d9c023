// labs/14_zero/tests/zero_test_util.hpp — shared by the public tests (zero_test.cpp) and the
// grading tests (grading/14_zero/): the data-parallel oracle, a ZeRO run, a measured state.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/harness/checks.hpp"  // defines: serial, fresh_comm, device, DTL_EXPECT_CLOSE
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "dtl/train.hpp"  // defines: train_step (the single-process ground truth)
#include "zero.hpp"

namespace lab14_test {

using dtl::Comm;
using dtl::OpType;
using dtl::lab14::GPT;
using dtl::lab14::GPTConfig;
using dtl::lab14::ZeroOptimizer;
using dtl::testing::device;
using dtl::testing::fresh_comm;

// AdamW for the equality tests (eps 1e-6; eps >= 1 shows a gradient summed over the ranks).
inline dtl::OptimConfig adamw(double eps = 1e-6) { return dtl::testing::equality_adamw(eps); }

// The tiny GPT's shape (2 heads, 16 tokens) with the given layers, width, head and vocabulary.
inline GPTConfig config(int64_t layers = 2, int64_t d = 32, bool tied = true, int64_t vocab = 64) {
  GPTConfig c = dtl::testing::gpt_config(layers, d, /*heads=*/2, vocab, /*seq_len=*/16);
  c.tied_head = tied;
  return c;
}

// The ground truth: `steps` single-process AdamW steps on the whole global batch; the flat
// parameters after them.
inline torch::Tensor serial_params(const GPTConfig& cfg, const dtl::data::GlobalBatchSampler& sampler,
                                   int steps, const dtl::OptimConfig& oc) {
  return dtl::testing::serial(1, [&] {
    GPT model(cfg);
    model->to(device());
    auto opt = dtl::make_adamw(*model, oc);
    for (int s = 0; s < steps; ++s)
      dtl::train_step(model, *opt, sampler.global_batch_at(s).to(device()));
    return dtl::testing::flat_params(*model);
  });
}

using dtl::testing::my_rows;

inline void zero_step(ZeroOptimizer& zero, const torch::Tensor& rows) {
  zero.zero_grad();
  zero.loss(rows).backward();
  zero.step();
}

// `steps` ZeRO steps at `stage` with `rows_per_rank` rows on every rank == the serial oracle,
// and every rank holds the same parameters.
inline void expect_zero_equals_serial(const GPTConfig& cfg, int stage, int steps,
                                      const dtl::OptimConfig& oc, int64_t rows_per_rank = 2,
                                      double rtol = 1e-4, double atol = 2e-5) {
  auto comm = fresh_comm();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 14);
  dtl::data::GlobalBatchSampler sampler(corpus, rows_per_rank * comm->size(), cfg.seq_len);
  const torch::Tensor expected = serial_params(cfg, sampler, steps, oc);
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, oc);
  for (int s = 0; s < steps; ++s) zero_step(zero, my_rows(sampler, s, *comm));
  const torch::Tensor got = zero.full_parameters();
  const std::string where = "stage " + std::to_string(stage) + " on " +
                            std::to_string(comm->size()) + " ranks, " + cfg.to_string();
  DTL_EXPECT_CLOSE(got, expected, rtol, atol) << where;
  DTL_EXPECT_SAME_ON_ALL_RANKS(got) << where << ": the ranks drifted apart";
}

// Live bytes this rank holds after construction and one step (the tracker; CPU only), above
// those before the model existed. Stage 0: the model with plain AdamW, gradients averaged.
inline int64_t measured_state_bytes(const GPTConfig& cfg, int stage, Comm& comm) {
  dtl::memory::install();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 14);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm.size(), cfg.seq_len);
  const torch::Tensor rows = my_rows(sampler, 0, comm);
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  int64_t held = 0;
  {
    GPT model(cfg);
    if (stage == 0) {
      auto opt = dtl::make_adamw(*model, adamw());
      opt->zero_grad();
      model->loss(rows).backward();
      {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) {
          comm.all_reduce(p.grad());
          p.grad().div_(comm.size());
        }
      }
      opt->step();
      held = static_cast<int64_t>(dtl::memory::current_bytes()) - before;
    } else {
      ZeroOptimizer zero(model, comm, stage, adamw());
      zero_step(zero, rows);
      held = static_cast<int64_t>(dtl::memory::current_bytes()) - before;
    }
  }
  return held;
}

// measured_state_bytes at stages first..3 within 1% of model_state_bytes (a few hundred bytes of
// slack: LayerNorm's and the optimizer's scalars, allocator rounding). CPU only.
inline void expect_state_matches_formula(const GPTConfig& cfg, int first_stage) {
  if (!device().is_cpu()) GTEST_SKIP() << "the tracking allocator counts CPU memory";
  auto comm = fresh_comm();
  GPT probe(cfg);
  const std::vector<int64_t> numels = dtl::lab14::unit_numels(probe);
  for (int stage = first_stage; stage <= 3; ++stage) {
    const int64_t want = dtl::lab14::model_state_bytes(stage, numels, comm->size()).total();
    const int64_t got = measured_state_bytes(cfg, stage, *comm);
    EXPECT_NEAR(static_cast<double>(got), static_cast<double>(want), 0.01 * want)
        << "stage " << stage << " on " << comm->size() << " ranks: measured " << got
        << " B, model_state_bytes says " << want << " B";
  }
}

// The bytes a ring moves per rank for each op (what CommStats::wire_bytes counts).
inline double wire(OpType op, double bytes, int n) {
  if (n == 1) return 0;
  const double f = static_cast<double>(n - 1) / n;
  return op == OpType::AllReduce ? 2 * f * bytes : f * bytes;
}

}  // namespace lab14_test
