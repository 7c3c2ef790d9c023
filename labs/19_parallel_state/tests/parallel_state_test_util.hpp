// labs/19_parallel_state/tests/parallel_state_test_util.hpp — shared by the public tests
// (parallel_state_test.cpp) and the grading tests (grading/19_parallel_state/): a ParallelPlan
// observed for the autograder's split run.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dtl/harness/observe.hpp"
#include "parallel_state.hpp"

namespace lab19_test {

// A ParallelPlan from the code under test, observed as one value (dtl/harness/observe.hpp): in
// the split run the assertions on it are checked on the student's plan.
inline dtl::lab19::ParallelPlan observed(const dtl::lab19::ParallelPlan& p,
                                         const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE()) {
  auto v = dtl::testing::observe(
      std::make_pair(
          std::vector<int64_t>{p.world, p.tp, p.cp, p.pp, p.dp, p.virtual_stages,
                               p.sequence_parallel ? 1 : 0, p.micro_batch, p.global_batch,
                               p.grad_accum, p.zero_stage},
          std::make_pair(std::vector<std::string>{p.recompute, p.precision}, p.grad_clip)),
      "the plan", dtl::testing::Source::kComputed, file, line);
  dtl::lab19::ParallelPlan o;
  const auto& n = v.first;
  const auto& s = v.second.first;
  if (n.size() != 11 || s.size() != 2) {
    ADD_FAILURE_AT(file, line) << "a plan recorded in another form";
    return o;
  }
  o.world = static_cast<int>(n[0]), o.tp = static_cast<int>(n[1]), o.cp = static_cast<int>(n[2]);
  o.pp = static_cast<int>(n[3]), o.dp = static_cast<int>(n[4]);
  o.virtual_stages = static_cast<int>(n[5]);
  o.sequence_parallel = n[6] != 0;
  o.micro_batch = n[7], o.global_batch = n[8], o.grad_accum = n[9],
  o.zero_stage = static_cast<int>(n[10]);
  o.recompute = s[0], o.precision = s[1];
  o.grad_clip = v.second.second;
  return o;
}

}  // namespace lab19_test
