// labs/12_pipeline_schedules/tests/schedules_test_util.hpp — helpers shared by the public tests
// (pipeline_schedules_test.cpp) and the grading tests (grading/12_pipeline_schedules/).
//
// Oracles: the bubble formula and Megatron's warm-up counts for the schedules; for execution,
// serial training of the course GPT on the same global batches (lab 11's helpers: batch,
// even_parts, adamw), compared parameter by parameter under the serial names.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dtl/harness/checks.hpp"
#include "dtl/optim.hpp"
#include "dtl/train.hpp"
#include "pipeline_schedules.hpp"
#include "tests/pipeline_test_util.hpp"  // lab 11's: batch, even_parts, adamw

namespace lab12_test {

using dtl::Range;
using dtl::lab12::Action;
using dtl::lab12::Schedule;
using dtl::model::GPTConfig;
using lab11_test::adamw;
using lab11_test::batch;
using lab11_test::even_parts;

// Actions written as text, "F0 F1 B0 B1" or "F0.1" (micro 0, chunk 1): the tests' literal lists.
inline std::vector<Action> parse(const std::string& text) {
  std::vector<Action> out;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    Action a;
    a.kind = word[0] == 'F' ? Action::Forward : Action::Backward;
    const size_t dot = word.find('.');
    a.micro = std::stoll(word.substr(1, dot == std::string::npos ? std::string::npos : dot - 1));
    a.chunk = dot == std::string::npos ? 0 : std::stoi(word.substr(dot + 1));
    out.push_back(a);
  }
  return out;
}

inline std::string text(const std::vector<Action>& actions, int v) {
  std::string out;
  for (const Action& a : actions) out += (out.empty() ? "" : " ") + dtl::lab12::describe(a, v);
  return out;
}

// A schedule from the code under test as the tests compare it: one text per rank, observed
// (dtl/harness/observe.hpp).
inline std::vector<std::string> observed(const Schedule& s, int v,
                                         const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE()) {
  std::vector<std::string> texts;
  for (const auto& actions : s) texts.push_back(text(actions, v));
  return dtl::testing::observe(std::move(texts), "the schedule, one text per rank",
                               dtl::testing::Source::kComputed, file, line);
}

// Fixed schedules for the executor's tests, independent of the student's generators (Task 1):
// "GPipe", "1F1B" and "interleaved" (v = 2) for p = 1-4 ranks and m = 2p micro-batches, the
// orders Megatron's schedules.py produces.
inline Schedule fixed_schedule(const std::string& name, int p) {
  if (name == "GPipe") {
    std::string all;
    for (const char* kind : {"F", "B"})
      for (int k = 0; k < 2 * p; ++k) all += (all.empty() ? "" : " ") + (kind + std::to_string(k));
    return Schedule(static_cast<size_t>(p), parse(all));
  }
  if (name == "1F1B") {
    if (p == 1) return {parse("F0 B0 F1 B1")};
    if (p == 2) return {parse("F0 F1 B0 F2 B1 F3 B2 B3"),
                        parse("F0 B0 F1 B1 F2 B2 F3 B3")};
    if (p == 3) return {parse("F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"),
                        parse("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5"),
                        parse("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5")};
    if (p == 4) return {parse("F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"),
                        parse("F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"),
                        parse("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7"),
                        parse("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7")};
  }
  if (name == "interleaved") {
    if (p == 1) return {parse("F0.0 F0.1 B0.1 F1.0 B0.0 F1.1 B1.1 B1.0")};
    if (p == 2) return {parse("F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0"),
                        parse("F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0")};
    if (p == 3) return {parse("F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 F3.0 F4.0 B0.1 F5.0 B1.1 F3.1 B2.1 F4.1 B0.0 F5.1 B1.0 B2.0 B3.1 B4.1 B5.1 B3.0 B4.0 B5.0"),
                        parse("F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 B0.1 F3.0 B1.1 F4.0 B2.1 F5.0 B0.0 F3.1 B1.0 F4.1 B2.0 F5.1 B3.1 B4.1 B5.1 B3.0 B4.0 B5.0"),
                        parse("F0.0 F1.0 F2.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 F3.1 B3.1 F4.1 B4.1 F5.1 B5.1 B3.0 B4.0 B5.0")};
    if (p == 4) return {parse("F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0"),
                        parse("F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 B0.1 F5.0 B1.1 F6.0 B2.1 F7.0 B3.1 F4.1 B0.0 F5.1 B1.0 F6.1 B2.0 F7.1 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0"),
                        parse("F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 B0.1 F3.1 B1.1 F4.0 B2.1 F5.0 B3.1 F6.0 B0.0 F7.0 B1.0 F4.1 B2.0 F5.1 B3.0 F6.1 B4.1 F7.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0"),
                        parse("F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4.0 B5.0 B6.0 B7.0")};
  }
  ADD_FAILURE() << "no fixed schedule " << name << " for p=" << p;
  return {};
}

// Most (micro, chunk) pairs forwarded and not yet backpropagated at once in one rank's list.
inline int64_t peak_in_flight(const std::vector<Action>& actions) {
  int64_t now = 0, peak = 0;
  for (const Action& a : actions) peak = std::max(peak, now += a.kind == Action::Forward ? 1 : -1);
  return peak;
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Module&)>;

// SGD: its step is proportional to the gradient, so a gradient off by a factor (the 1/m of the
// loss dropped) shows; AdamW with a small eps divides it out.
inline std::unique_ptr<torch::optim::Optimizer> sgd(torch::nn::Module& m) {
  return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.5));
}

// The model for execution: 6 blocks (8 units), so p x v <= 8 virtual stages can be cut.
inline GPTConfig model6(bool tied = true) {
  GPTConfig cfg = GPTConfig::tiny();
  cfg.n_layer = 6;
  cfg.tied_head = tied;
  return cfg;
}

// `steps` executed steps of `schedule` (v chunks per rank, units cut evenly into p v runs)
// against serial train_steps on the same global batches of `rows` rows: losses and every
// parameter by its serial name.
inline void expect_execution_trains_like_serial(const GPTConfig& cfg, const Schedule& schedule,
                                                int v, int64_t rows, int steps,
                                                const std::string& what,
                                                const MakeOptimizer& make = nullptr) {
  dtl::Comm& world = dtl::world();
  const MakeOptimizer make_optimizer =
      make ? make : [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return dtl::make_adamw(m, adamw());
  };
  const auto expected = dtl::testing::serial(1, [&] {
    dtl::model::GPT full(cfg);
    auto opt = make_optimizer(*full);
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s)
      losses.push_back(dtl::train_step(full, *opt, batch(cfg, rows, s)));
    std::map<std::string, torch::Tensor> params;
    for (auto& p : full->named_parameters()) params[p.key()] = p.value().detach().clone();
    return std::make_pair(losses, params);
  });
  dtl::lab12::ModelChunks chunks(cfg, world, v, even_parts(cfg, world.size() * v));
  dtl::lab12::PipelineLinks links(world);
  auto opt = make_optimizer(chunks.module());
  const torch::Device device = dtl::Runtime::get().device();
  for (int s = 0; s < steps; ++s) {
    const auto res =
        dtl::lab12::execute(schedule, chunks, links, *opt, batch(cfg, rows, s).to(device));
    EXPECT_NEAR(OBSERVE(res.loss), expected.first[static_cast<size_t>(s)], 1e-5)
        << what << ", step " << s;
  }
  for (auto& [name, p] : chunks.named_parameters()) {
    auto it = expected.second.find(name);
    ASSERT_NE(it, expected.second.end()) << "the serial GPT has no parameter " << name;
    EXPECT_TRUE(dtl::testing::tensors_close(p.detach().cpu(), it->second, 1e-4, 2e-5))
        << name << " on rank " << world.rank() << ", " << what;
  }
}

}  // namespace lab12_test
