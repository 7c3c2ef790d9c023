// labs/14_zero/tests/zero_test_util.hpp — shared by the public tests (zero_test.cpp) and the
// grading tests (grading/14_zero/): the data-parallel oracle, a ZeRO run, a measured state.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <malloc.h>  // mallinfo2: the process's heap, beyond what the tracker sees

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

// A ModelStateBytes from the code under test, every field observed (dtl/harness/observe.hpp):
// assert on this copy.
inline dtl::lab14::ModelStateBytes observed(const dtl::lab14::ModelStateBytes& s,
                                            const char* file = __builtin_FILE(),
                                            int line = __builtin_LINE()) {
  using dtl::testing::observe;
  const auto src = dtl::testing::Source::kComputed;
  dtl::lab14::ModelStateBytes o;
  o.params = observe(s.params, "ModelStateBytes.params", src, file, line);
  o.grads = observe(s.grads, "ModelStateBytes.grads", src, file, line);
  o.optimizer = observe(s.optimizer, "ModelStateBytes.optimizer", src, file, line);
  return o;
}

// A ZeroOptimizer's units as the student's code defines them, observed: each unit's name and
// parameter names.
inline std::vector<dtl::Unit> observed_units(const ZeroOptimizer& zero,
                                             const char* file = __builtin_FILE(),
                                             int line = __builtin_LINE()) {
  std::vector<std::pair<std::string, std::vector<std::string>>> units;
  for (const dtl::Unit& u : zero.units()) units.emplace_back(u.name, u.params);
  units = dtl::testing::observe(std::move(units), "the units (name, parameters)",
                                dtl::testing::Source::kComputed, file, line);
  std::vector<dtl::Unit> out;
  for (auto& [name, params] : units) out.push_back(dtl::Unit{name, params});
  return out;
}

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

// One step; zero_grad_after_loss: zero_grad() between loss() and backward() instead of first.
inline void zero_step(ZeroOptimizer& zero, const torch::Tensor& rows,
                      bool zero_grad_after_loss = false) {
  if (!zero_grad_after_loss) zero.zero_grad();
  torch::Tensor loss = zero.loss(rows);
  if (zero_grad_after_loss) zero.zero_grad();
  loss.backward();
  zero.step();
}

// `steps` ZeRO steps at `stage` with `rows_per_rank` rows on every rank == the serial oracle,
// and every rank holds the same parameters.
inline void expect_zero_equals_serial(const GPTConfig& cfg, int stage, int steps,
                                      const dtl::OptimConfig& oc, int64_t rows_per_rank = 2,
                                      double rtol = 1e-4, double atol = 2e-5,
                                      bool zero_grad_after_loss = false) {
  auto comm = fresh_comm();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 14);
  dtl::data::GlobalBatchSampler sampler(corpus, rows_per_rank * comm->size(), cfg.seq_len);
  const torch::Tensor expected = serial_params(cfg, sampler, steps, oc);
  GPT model(cfg);
  model->to(device());
  ZeroOptimizer zero(model, *comm, stage, oc);
  for (int s = 0; s < steps; ++s) zero_step(zero, my_rows(sampler, s, *comm), zero_grad_after_loss);
  const torch::Tensor got = zero.full_parameters();
  const std::string where = "stage " + std::to_string(stage) + " on " +
                            std::to_string(comm->size()) + " ranks, " + cfg.to_string();
  DTL_EXPECT_CLOSE(got, expected, rtol, atol) << where;
  DTL_EXPECT_SAME_ON_ALL_RANKS(got) << where << ": the ranks drifted apart";
}

// Live bytes this rank holds (the tracker; CPU only) above those before the model existed:
// after construction and one step, and at the end of the next step's backward (before its
// step(): stages 2-3 must have dropped every full gradient by then). Stage 0: the model with
// plain AdamW, gradients averaged.
struct MeasuredState {
  int64_t after_step = 0, after_backward = 0;
  // The same moments as the process's heap sees them (glibc's in-use bytes, mmapped blocks
  // included): state kept outside LibTorch's allocator shows here, not in the tracker.
  int64_t heap_after_step = 0, heap_after_backward = 0;
};

// Bytes glibc's malloc has handed out and not had back (small blocks and mmapped ones).
inline int64_t heap_bytes() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

// Stages 1-3 run the student's ZeroOptimizer: the figures are its process's (MEASURED). Stage 0
// is the oracle, the process's own.
inline MeasuredState measured_state_bytes(const GPTConfig& cfg, int stage, Comm& comm,
                                          const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE()) {
  dtl::memory::install();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 14);
  dtl::data::GlobalBatchSampler sampler(corpus, 2 * comm.size(), cfg.seq_len);
  const torch::Tensor rows = my_rows(sampler, 0, comm);
  const torch::Tensor next_rows = my_rows(sampler, 1, comm);
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  const int64_t heap_before = heap_bytes();
  auto held = [&] { return static_cast<int64_t>(dtl::memory::current_bytes()) - before; };
  auto heap = [&] { return heap_bytes() - heap_before; };
  MeasuredState m;
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
      m.after_step = held();
      m.heap_after_step = heap();
      opt->zero_grad();
      model->loss(next_rows).backward();
      m.after_backward = held();
      m.heap_after_backward = heap();
    } else {
      ZeroOptimizer zero(model, comm, stage, adamw());
      zero_step(zero, rows);
      m.after_step = held();
      m.heap_after_step = heap();
      zero.zero_grad();
      zero.loss(next_rows).backward();
      m.after_backward = held();
      m.heap_after_backward = heap();
    }
  }
  if (stage != 0) {
    using dtl::testing::observe;
    const auto src = dtl::testing::Source::kMeasured;
    m.after_step = observe(m.after_step, "tracked bytes after step()", src, file, line);
    m.after_backward = observe(m.after_backward, "tracked bytes after backward", src, file, line);
    m.heap_after_step = observe(m.heap_after_step, "heap bytes after step()", src, file, line);
    m.heap_after_backward =
        observe(m.heap_after_backward, "heap bytes after backward", src, file, line);
  }
  return m;
}

// measured_state_bytes at `stage`, after the step and at the end of the next backward, within
// 1% of model_state_bytes (a few hundred bytes of slack: LayerNorm's and the optimizer's
// scalars, allocator rounding). CPU only.
inline void expect_state_matches_formula(const GPTConfig& cfg, int stage) {
  if (!device().is_cpu()) GTEST_SKIP() << "the tracking allocator counts CPU memory";
  auto comm = fresh_comm();
  GPT probe(cfg);
  const std::vector<int64_t> numels = dtl::lab14::unit_numels(probe);
  const int64_t want = OBSERVE(dtl::lab14::model_state_bytes(stage, numels, comm->size()).total());
  const MeasuredState got = measured_state_bytes(cfg, stage, *comm);
  EXPECT_NEAR(static_cast<double>(got.after_step), static_cast<double>(want), 0.01 * want)
      << "stage " << stage << " on " << comm->size() << " ranks, after step(): measured "
      << got.after_step << " B, model_state_bytes says " << want << " B";
  EXPECT_NEAR(static_cast<double>(got.after_backward), static_cast<double>(want), 0.01 * want)
      << "stage " << stage << " on " << comm->size() << " ranks, at the end of backward: measured "
      << got.after_backward << " B, model_state_bytes says " << want
      << " B (a full gradient kept until step()?)";
  // The heap holds what the tracker sees plus the objects around it (tensor and autograd
  // metadata, malloc's rounding): 68-82 KiB for the reference at stages 1-3 here, less than the
  // full AdamW state (8 psi: 240 KB for this test's model). Stage 0 is the oracle, not checked.
  if (stage == 0) return;
  const int64_t slack = 160 * 1024;
  EXPECT_LE(got.heap_after_step - got.after_step, slack)
      << "stage " << stage << ": the process's heap grew by " << got.heap_after_step
      << " B after step(), the tracker saw " << got.after_step
      << " B: state kept outside LibTorch's allocator?";
  EXPECT_LE(got.heap_after_backward - got.after_backward, slack)
      << "stage " << stage << ": the process's heap grew by " << got.heap_after_backward
      << " B at the end of backward, the tracker saw " << got.after_backward << " B";
}

// The bytes a ring moves per rank for each op (what CommStats::wire_bytes counts).
inline double wire(OpType op, double bytes, int n) {
  if (n == 1) return 0;
  const double f = static_cast<double>(n - 1) / n;
  return op == OpType::AllReduce ? 2 * f * bytes : f * bytes;
}

}  // namespace lab14_test
