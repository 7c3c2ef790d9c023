// pipeline_test_util.hpp — lab 11: helpers shared by the public and the grading tests.
//
// defines: lab11_test::tiny4, batch, even_parts, adamw, expect_valid_partition, max_stage_cost,
//          brute_force_best, serial_gradients, sum_embedding_grad, expect_named_close, where,
//          expect_training_matches_serial
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "dtl/data.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "dtl/train.hpp"
#include "pipeline.hpp"

namespace lab11_test {

using dtl::Range;
using dtl::lab11::PipelineStage;
using dtl::model::GPTConfig;

// The tests' model: tiny, with 4 blocks so that 6 units can be cut for up to 4 stages.
inline GPTConfig tiny4() {
  GPTConfig cfg = GPTConfig::tiny();
  cfg.n_layer = 4;
  return cfg;
}

// The global batch of `rows` rows at `step` (the same on every rank).
inline torch::Tensor batch(const GPTConfig& cfg, int64_t rows, int64_t step) {
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 7);
  return dtl::data::GlobalBatchSampler(corpus, rows, cfg.seq_len).global_batch_at(step);
}

// Units split evenly, ignoring their costs: the stage tests must not depend on your partition().
using dtl::lab11::even_parts;

// AdamW for equality with serial training; eps 1e-6 as in lab 02's tests (Adam amplifies the
// last-bit differences of a gradient summed in another order when the gradient is near eps).
inline dtl::OptimConfig adamw() {
  dtl::OptimConfig oc;
  oc.eps = 1e-6;
  oc.weight_decay = 0.1;
  return oc;
}

// A partition from the code under test, observed (dtl/harness/observe.hpp): assert on this copy.
inline std::vector<Range> observed(const std::vector<Range>& parts,
                                   const char* file = __builtin_FILE(),
                                   int line = __builtin_LINE()) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const Range& r : parts) runs.emplace_back(r.begin, r.end);
  runs = dtl::testing::observe(std::move(runs), "the partition's [begin, end) runs",
                               dtl::testing::Source::kComputed, file, line);
  std::vector<Range> out;
  for (const auto& [begin, end] : runs) out.push_back(Range{begin, end});
  return out;
}

// `parts`: observed.
inline void expect_valid_partition(const std::vector<Range>& parts, int64_t n, int p) {
  ASSERT_EQ(static_cast<int>(parts.size()), p) << "one run per stage";
  int64_t next = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    EXPECT_EQ(parts[s].begin, next)
        << "stage " << s << " must start where stage " << s - 1 << " ends";
    EXPECT_GT(parts[s].end, parts[s].begin) << "stage " << s << " is empty";
    next = parts[s].end;
  }
  EXPECT_EQ(next, n) << "the stages must cover every unit";
}

inline double max_stage_cost(const std::vector<double>& costs, const std::vector<Range>& parts) {
  double worst = 0;
  for (const Range& r : parts) {
    double c = 0;
    for (int64_t u = r.begin; u < r.end; ++u) c += costs.at(static_cast<size_t>(u));
    worst = std::max(worst, c);
  }
  return worst;
}

// Every way to cut costs[from..] into p non-empty runs: the smallest largest run.
inline double brute_force_best(const std::vector<double>& costs, int p, size_t from = 0) {
  const size_t n = costs.size();
  if (p == 1) {
    double c = 0;
    for (size_t i = from; i < n; ++i) c += costs[i];
    return c;
  }
  double best = std::numeric_limits<double>::infinity(), first = 0;
  for (size_t end = from + 1; end + static_cast<size_t>(p - 1) <= n; ++end) {
    first += costs[end - 1];
    best = std::min(best, std::max(first, brute_force_best(costs, p - 1, end)));
  }
  return best;
}

// The serial model's gradients (of the mean loss over `global`) by parameter name.
inline std::map<std::string, torch::Tensor> serial_gradients(const GPTConfig& cfg,
                                                             const torch::Tensor& global) {
  return dtl::testing::serial(1, [&] {
    dtl::model::GPT full(cfg);
    full->loss(global).backward();
    std::map<std::string, torch::Tensor> grads;
    for (auto& p : full->named_parameters()) grads[p.key()] = p.value().grad().clone();
    return grads;
  });
}

// What fill_drain_step does for the tied embedding (for tests that drive a stage by hand).
inline void sum_embedding_grad(PipelineStage& stage, dtl::Comm& group) {
  for (auto& [name, p] : stage.named_parameters())
    if (name == "wte.weight") group.all_reduce(p.mutable_grad());
}

// Every parameter (or gradient) of the stage against the serial one of the same name. The names
// are the stage's as the student's code registered them (observed).
inline void expect_named_close(const PipelineStage& stage,
                               const std::map<std::string, torch::Tensor>& expected, bool grads,
                               double rtol, double atol, const std::string& what) {
  std::vector<std::string> names;
  for (auto& [name, p] : stage.named_parameters()) names.push_back(name);
  for (const std::string& name : OBSERVE(names))
    ASSERT_NE(expected.find(name), expected.end()) << "the serial GPT has no parameter " << name;
  for (auto& [name, p] : stage.named_parameters()) {
    auto it = expected.find(name);
    if (it == expected.end()) continue;  // (the observed names failed above)
    const torch::Tensor got = grads ? p.grad() : p;
    ASSERT_TRUE(OBSERVE(got.defined())) << name << " has no gradient on stage " << stage.stage();
    EXPECT_TRUE(dtl::testing::tensors_close(got.detach().cpu(), it->second, rtol, atol))
        << (grads ? "gradient of " : "") << name << " on stage " << stage.stage() << ", " << what;
  }
}

inline std::string where(const GPTConfig& cfg, int64_t m) {
  return std::to_string(dtl::world().size()) + " stages, " + std::to_string(m) +
         " micro-batches, " + (cfg.tied_head ? "tied" : "untied") + " head";
}

// `steps` fill-drain steps against `steps` serial train_steps on the same global batches.
inline void expect_training_matches_serial(
    const GPTConfig& cfg, int64_t rows, int64_t m, int steps, const std::vector<Range>& parts,
    const std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Module&)>& make =
        nullptr,
    double rtol = 1e-4, double atol = 2e-5) {
  auto make_optimizer =
      make ? make : [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return dtl::make_adamw(m, adamw());
  };
  const auto expected = dtl::testing::serial(1, [&] {
    dtl::model::GPT full(cfg);
    auto opt = make_optimizer(*full);
    for (int s = 0; s < steps; ++s) dtl::train_step(full, *opt, batch(cfg, rows, s));
    std::map<std::string, torch::Tensor> params;
    for (auto& p : full->named_parameters()) params[p.key()] = p.value().detach().clone();
    return params;
  });
  PipelineStage stage(cfg, dtl::world(), parts);
  auto opt = make_optimizer(stage.module());
  for (int s = 0; s < steps; ++s) dtl::lab11::fill_drain_step(stage, *opt, batch(cfg, rows, s), m);
  expect_named_close(stage, expected, /*grads=*/false, rtol, atol,
                     where(cfg, m) + ", after " + std::to_string(steps) + " steps");
}

}  // namespace lab11_test
