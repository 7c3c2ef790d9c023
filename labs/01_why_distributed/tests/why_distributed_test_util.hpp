// labs/01_why_distributed/tests/why_distributed_test_util.hpp — helpers shared by the public
// tests (why_distributed_test.cpp) and the grading tests (grading/01_why_distributed/).
#pragma once

#include "dtl/harness/observe.hpp"  // defines: OBSERVE
#include "why_distributed.hpp"

namespace dtl::lab01 {

// A StateBytes from the code under test, every field observed (dtl/harness/observe.hpp): in the
// autograder's split run the assertions on it are checked on the values your code produced.
inline StateBytes observed(const StateBytes& s) {
  StateBytes o;
  o.params = OBSERVE(s.params);
  o.grads = OBSERVE(s.grads);
  o.master = OBSERVE(s.master);
  o.optimizer = OBSERVE(s.optimizer);
  return o;
}

}  // namespace dtl::lab01
