// dtl/harness/prefill.hpp — defines: prefilled.
//
// An output buffer a test hands to the code under test, filled first with a value the correct
// result never holds there. When the comparison fails (tensors_close, tensors_equal and the
// DTL_EXPECT_* macros of checks.hpp), the differing elements that still hold that value are
// counted and named: "k of them still hold the test's pre-fill -1: never written". A student
// whose loop stops one chunk early reads what happened, not just "6 elements differ".
#pragma once

#include <torch/torch.h>

namespace dtl::testing {

// torch::full(sizes, value, options), remembered for the running test's comparisons.
torch::Tensor prefilled(at::IntArrayRef sizes, double value, const torch::TensorOptions& options);

}  // namespace dtl::testing
