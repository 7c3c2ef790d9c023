// labs/03_ring_allreduce/tests/ring_test_util.hpp — helpers shared by the public tests
// (ring_allreduce_test.cpp) and the grading tests (grading/03_ring_allreduce/).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/harness/prefill.hpp"
#include "dtl/runtime.hpp"
#include "ring_allreduce.hpp"

namespace lab03_test {

using dtl::Comm;
using dtl::OpType;
using dtl::ReduceOp;

using dtl::testing::device;          // the Runtime's device
using dtl::testing::device_options;  // dtype + the Runtime's device
using dtl::testing::fresh_comm;      // a dup of the world per test
using dtl::testing::prefilled;       // an output buffer whose unwritten elements are named

// This rank's random contribution (torch's RNG is seeded with seed + rank, so ranks differ).
// Integers span a wide range, yet every sum over 5 ranks stays exact (no overflow); 16-bit
// floats hold small integers, whose sums are exact too. So only float32/float64 sums and
// averages depend on the order of additions.
// Drawn on the CPU, then moved to the Runtime's device: a CUDA run reduces the same numbers.
inline torch::Tensor random_cpu_tensor(int64_t numel, torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kInt64:
      return torch::randint(-(int64_t{1} << 40), int64_t{1} << 40, {numel}, dtype);
    case torch::kInt32:
      return torch::randint(-1000000, 1000000, {numel}, dtype);
    case torch::kInt8:
      return torch::randint(-20, 21, {numel}, dtype);
    case torch::kUInt8:
      return torch::randint(0, 41, {numel}, dtype);
    case torch::kBFloat16:
    case torch::kFloat16:
      return torch::randint(-8, 9, {numel}).to(dtype);
    default:
      return torch::randn({numel}, dtype);
  }
}
inline torch::Tensor random_tensor(int64_t numel, torch::ScalarType dtype) {
  return random_cpu_tensor(numel, dtype).to(device());
}

inline bool order_dependent(torch::ScalarType dtype, ReduceOp op) {
  return c10::isFloatingType(dtype) && (op == ReduceOp::Sum || op == ReduceOp::Avg);
}

// Float sums may differ from the built-in's in the last bits (another association order);
// everything else (integers, max, min, sums of small integers in 16-bit floats) must be bitwise
// equal. A 16-bit float average rounds sum/n once, which a correct ring reproduces to 1 ulp.
inline ::testing::AssertionResult reduced_equal(const torch::Tensor& actual,
                                                const torch::Tensor& expected, ReduceOp op) {
  const auto dtype = expected.scalar_type();
  if (!order_dependent(dtype, op)) return dtl::testing::tensors_equal(actual, expected);
  if (dtype == torch::kFloat64) return dtl::testing::tensors_close(actual, expected, 1e-12, 1e-12);
  if (dtype == torch::kFloat32) return dtl::testing::tensors_close(actual, expected, 1e-5, 1e-5);
  if (op == ReduceOp::Sum) return dtl::testing::tensors_equal(actual, expected);
  return dtl::testing::tensors_close(actual.to(torch::kFloat32), expected.to(torch::kFloat32), 1e-2,
                                     1e-2);
}

inline std::string label(torch::ScalarType dtype, ReduceOp op, int64_t numel) {
  return std::string(c10::toString(dtype)) + " " + dtl::to_string(op) + " numel " +
         std::to_string(numel);
}

// Sizes that catch the classic bugs: empty, fewer elements than ranks, not divisible by the
// world size (the remainder), primes.
inline std::vector<int64_t> test_sizes(int n) {
  std::vector<int64_t> s = {0, 1, 2, n - 1, n, n + 1, 2 * n - 1, 7, 13, 64, 1001, 4099};
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

// Smallest and largest chunk of `numel` elements over n ranks.
inline std::pair<int64_t, int64_t> chunk_extremes(int64_t numel, int n) {
  int64_t lo = numel, hi = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, dtl::lab03::chunk_range(numel, n, i).size());
    hi = std::max(hi, dtl::lab03::chunk_range(numel, n, i).size());
  }
  return {lo, hi};
}

// Destinations of the sendrecv ops among a Comm's recent ops (its last 16).
inline std::set<int> sendrecv_destinations(const Comm& c) {
  std::set<int> dst;
  for (const auto& rec : c.recent_ops())
    if (rec.op == OpType::SendRecv) dst.insert(rec.peer);
  return dst;
}

// Op types other than point-to-point that a Comm has run ("" when none).
inline std::string collectives_used(const dtl::CommStats& s) {
  std::string used;
  for (const auto& [op, st] : s.ops)
    if (op != OpType::SendRecv && op != OpType::Send && op != OpType::Recv && st.count > 0)
      used += std::string(used.empty() ? "" : ", ") + dtl::to_string(op);
  return used;
}

using dtl::testing::error_of;


// floor(log2 n) for n >= 1.
inline int floor_log2(int n) {
  int lg = 0;
  while ((2 << lg) <= n) ++lg;
  return lg;
}

}  // namespace lab03_test
