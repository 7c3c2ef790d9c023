// Shared by lab 06's public and grading tests: the model shapes they sweep, and the student's
// results as the tests observe them (dtl/harness/observe.hpp).
#pragma once

#include <cstdint>

#include "dtl/harness/checks.hpp"  // defines: gpt_config
#include "memory.hpp"

namespace dtl::lab06::testing {

// A course GPT with the given layers, width, heads, vocabulary and context.
inline GPTConfig config(int64_t layers, int64_t d, int64_t heads, int64_t vocab, int64_t seq_len) {
  return dtl::testing::gpt_config(layers, d, heads, vocab, seq_len);
}

// A Breakdown from the code under test, every field observed: in the autograder's split run the
// assertions on it are checked on the student's numbers. Assert on the observed copy; hand the
// lab's API (breakdown_table) the one the code returned.
inline Breakdown observed(const Breakdown& b, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  using dtl::testing::observe;
  const auto src = dtl::testing::Source::kComputed;
  Breakdown o;
  o.params = observe(b.params, "Breakdown.params", src, file, line);
  o.grads = observe(b.grads, "Breakdown.grads", src, file, line);
  o.master = observe(b.master, "Breakdown.master", src, file, line);
  o.optimizer = observe(b.optimizer, "Breakdown.optimizer", src, file, line);
  o.activations = observe(b.activations, "Breakdown.activations", src, file, line);
  o.logits = observe(b.logits, "Breakdown.logits", src, file, line);
  o.peak = observe(b.peak, "Breakdown.peak", src, file, line);
  o.steady_peak = observe(b.steady_peak, "Breakdown.steady_peak", src, file, line);
  return o;
}

// Live bytes as the student's process saw them (measure's result, or the tracker read around
// it): MEASURED, to be compared only with other figures of the same process.
inline Measured measured(const Measured& m, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  using dtl::testing::observe;
  const auto src = dtl::testing::Source::kMeasured;
  Measured o;
  o.before = observe(m.before, "Measured.before", src, file, line);
  o.peak = observe(m.peak, "Measured.peak", src, file, line);
  o.after = observe(m.after, "Measured.after", src, file, line);
  return o;
}

// measure_two_steps's result, both steps observed as measured does.
inline TwoSteps measured(const TwoSteps& s, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  return {measured(s.first, file, line), measured(s.second, file, line)};
}

}  // namespace dtl::lab06::testing
