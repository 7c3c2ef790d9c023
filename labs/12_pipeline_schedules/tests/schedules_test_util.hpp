// labs/12_pipeline_schedules/tests/schedules_test_util.hpp — helpers shared by the public tests
// (pipeline_schedules_test.cpp) and the grading tests (grading/12_pipeline_schedules/).
//
// Oracles: the bubble formula and Megatron's warm-up counts for the schedules; for execution,
// serial training of the course GPT on the same global batches (lab 11's helpers: batch,
// even_parts, adamw), compared parameter by parameter under the serial names.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

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
                                                const std::string& what) {
  dtl::Comm& world = dtl::world();
  const auto expected = dtl::testing::serial(1, [&] {
    dtl::model::GPT full(cfg);
    auto opt = dtl::make_adamw(*full, adamw());
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s)
      losses.push_back(dtl::train_step(full, *opt, batch(cfg, rows, s)));
    std::map<std::string, torch::Tensor> params;
    for (auto& p : full->named_parameters()) params[p.key()] = p.value().detach().clone();
    return std::make_pair(losses, params);
  });
  dtl::lab12::ModelChunks chunks(cfg, world, v, even_parts(cfg, world.size() * v));
  dtl::lab12::PipelineLinks links(world);
  auto opt = dtl::make_adamw(chunks.module(), adamw());
  const torch::Device device = dtl::Runtime::get().device();
  for (int s = 0; s < steps; ++s) {
    const auto res =
        dtl::lab12::execute(schedule, chunks, links, *opt, batch(cfg, rows, s).to(device));
    EXPECT_NEAR(res.loss, expected.first[static_cast<size_t>(s)], 1e-5) << what << ", step " << s;
  }
  for (auto& [name, p] : chunks.named_parameters()) {
    auto it = expected.second.find(name);
    ASSERT_NE(it, expected.second.end()) << "the serial GPT has no parameter " << name;
    EXPECT_TRUE(dtl::testing::tensors_close(p.detach().cpu(), it->second, 1e-4, 2e-5))
        << name << " on rank " << world.rank() << ", " << what;
  }
}

}  // namespace lab12_test
