// labs/07_topology/tests/topology_test_util.hpp — helpers shared by the public tests
// (topology_test.cpp) and the grading tests (grading/07_topology/).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/net.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "topology.hpp"

namespace lab07_test {

using dtl::Comm;
using dtl::OpType;
using dtl::ReduceOp;
using dtl::lab07::LinkModel;
using dtl::lab07::Topology;

using dtl::testing::device;          // the Runtime's device
using dtl::testing::device_options;  // dtype + the Runtime's device
using dtl::testing::fresh_comm;      // a dup of the world per test

// The student's results as the tests observe them (dtl/harness/observe.hpp), field by field: in
// the autograder's split run the assertions are checked on these values in the driver.
inline dtl::lab07::Bandwidth observed(const dtl::lab07::Bandwidth& b,
                                      const char* file = __builtin_FILE(),
                                      int line = __builtin_LINE()) {
  using dtl::testing::observe;
  const auto src = dtl::testing::Source::kComputed;
  return {observe(b.algbw, "Bandwidth.algbw", src, file, line),
          observe(b.busbw, "Bandwidth.busbw", src, file, line)};
}
// A fitted link: a result of the fit (kComputed), or of transfers the student's process timed
// (kMeasured).
inline LinkModel observed(const LinkModel& l,
                          dtl::testing::Source src = dtl::testing::Source::kComputed,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using dtl::testing::observe;
  return {observe(l.alpha, "LinkModel.alpha", src, file, line),
          observe(l.beta, "LinkModel.beta", src, file, line)};
}

// Sets a network-emulator spec on every rank for one scope and turns it off afterwards.
struct NetGuard {
  explicit NetGuard(const std::string& spec) { dtl::net::set(dtl::net::Spec::parse(spec)); }
  ~NetGuard() { dtl::net::set(dtl::net::Spec{}); }
  NetGuard(const NetGuard&) = delete;
  NetGuard& operator=(const NetGuard&) = delete;
};

// This rank's contribution (torch's RNG is seeded with seed + rank, so ranks differ). Integer
// values are small enough that sums over 4 ranks never overflow, and 16-bit floats carry small
// integers, whose sums are exact: only float32/float64 sums and averages depend on the order
// in which the additions happen.
// Drawn on the CPU, then moved to the Runtime's device (a CUDA run reduces the same numbers).
inline torch::Tensor contribution(int64_t numel, torch::ScalarType dtype) {
  if (dtype == torch::kFloat32 || dtype == torch::kFloat64)
    return torch::randn({numel}, dtype).to(device());
  const int64_t hi = dtype == torch::kInt64 ? (int64_t{1} << 40)
                     : dtype == torch::kInt32 ? 1'000'000
                     : dtype == torch::kUInt8 ? 60
                                              : 30;  // int8, float16, bfloat16
  const int64_t lo = dtype == torch::kUInt8 ? 0 : -hi;
  return torch::randint(lo, hi + 1, {numel}, torch::kInt64).to(dtype).to(device());
}

// The hierarchical result against Comm::all_reduce's: bitwise wherever the arithmetic is exact
// (integers, max and min, 16-bit floats holding small integers), within a tolerance for float32
// and float64 sums and averages (another order of additions).
inline ::testing::AssertionResult same_reduction(const torch::Tensor& actual,
                                                 const torch::Tensor& expected, ReduceOp op) {
  const auto dtype = expected.scalar_type();
  const bool order_matters = (dtype == torch::kFloat32 || dtype == torch::kFloat64) &&
                             (op == ReduceOp::Sum || op == ReduceOp::Avg);
  if (!order_matters) return dtl::testing::tensors_equal(actual, expected);
  if (dtype == torch::kFloat64) return dtl::testing::tensors_close(actual, expected, 1e-12, 1e-12);
  return dtl::testing::tensors_close(actual, expected, 1e-5, 1e-5);
}

inline std::string label(torch::ScalarType dtype, ReduceOp op, int64_t numel, int k) {
  return std::string(c10::toString(dtype)) + " " + dtl::to_string(op) + " numel " +
         std::to_string(numel) + " ranks_per_node " + std::to_string(k);
}

// The ranks_per_node values a Comm of n ranks accepts, among 1..4.
inline std::vector<int> layouts(int n) {
  std::vector<int> ks;
  for (int k = 1; k <= std::min(n, 4); ++k)
    if (n % k == 0) ks.push_back(k);
  return ks;
}

// Sizes that catch the classic bugs: empty, fewer elements than ranks, not divisible by k.
inline std::vector<int64_t> test_sizes(int n) {
  std::vector<int64_t> s = {0, 1, 2, n - 1, n + 1, 7, 13, 1001};
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

// |actual - expected| <= rtol |expected| (two names: gtest's EXPECT_PRED needs one signature).
inline bool within_rtol(double actual, double expected, double rtol) {
  return std::abs(actual - expected) <= rtol * std::max(std::abs(expected), 1e-300);
}
inline bool rel_close(double actual, double expected) { return within_rtol(actual, expected, 1e-12); }

// The least-squares line through the samples, {intercept, slope}, from the 2x2 normal equations
// in long double (another route than the centred sums a solution would use).
inline std::pair<double, double> least_squares(const std::vector<dtl::lab07::Sample>& s) {
  long double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& p : s) {
    const long double x = p.bytes, y = p.seconds;
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const long double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  return {static_cast<double>((sy - slope * sx) / n), static_cast<double>(slope)};
}

// The two models written out once more, as the tests' oracle (the header's formulas).
inline double ring(int n, double bytes, const LinkModel& l) {
  return n <= 1 ? 0.0 : 2.0 * (n - 1) * l.alpha + 2.0 * (n - 1) / n * bytes / l.beta;
}
inline double expected_flat(const Topology& t, double S) {
  return ring(t.world(), S, t.nodes > 1 ? t.inter : t.intra);
}
inline double expected_hierarchical(const Topology& t, double S) {
  const int k = t.ranks_per_node, m = t.nodes;
  const double intra = k <= 1 ? 0.0 : 2.0 * ((k - 1) * t.intra.alpha + (k - 1.0) / k * S / t.intra.beta);
  return intra + ring(m, S / k, t.inter);
}

// Measures the link src -> dst under the current emulator and fits it with fit_alpha_beta, up
// to three times until alpha and beta are both within `tolerance` of `expected`: a loaded
// 2-core machine has bursts in which a 1 ms sleep takes several. Every rank sees the same
// times (measure takes the slowest rank), and the decision is agreed over all ranks anyway,
// so every rank measures the same number of times. The number of attempts depends on timing,
// so nothing is observed inside the loop: the caller observes the final fit (MEASURED), and a
// driver that needed another number of attempts than the worker stays in step.
inline LinkModel fit_emulated_link(Comm& comm, int src, int dst, const LinkModel& expected,
                                   double tolerance) {
  const std::vector<int64_t> sizes = {16 << 10, 64 << 10, 256 << 10};
  LinkModel fit;
  for (int attempt = 0; attempt < 3; ++attempt) {
    fit = dtl::lab07::fit_alpha_beta(dtl::lab07::measure_link(comm, src, dst, sizes));
    const bool ok = std::abs(fit.alpha / expected.alpha - 1) <= tolerance &&
                    std::abs(fit.beta / expected.beta - 1) <= tolerance;
    if (dtl::sum_over_ranks(ok ? 1.0 : 0.0) == dtl::world().size()) break;
  }
  return fit;
}

}  // namespace lab07_test
