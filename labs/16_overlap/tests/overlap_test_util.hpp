// labs/16_overlap/tests/overlap_test_util.hpp — shared by the public tests (overlap_test.cpp)
// and the grading tests (grading/16_overlap/): trace events by hand, tracing and a slow network
// for the length of a scope, a collective-matmul problem with its serial answer.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/harness/checks.hpp"  // defines: fresh_comm, device_options, DTL_EXPECT_CLOSE
#include "dtl/net.hpp"
#include "dtl/runtime.hpp"
#include "dtl/trace.hpp"
#include "overlap.hpp"

namespace lab16_test {

using dtl::OpType;
using dtl::testing::fresh_comm;

// A trace event of `rank` on `track` ("compute", or "comm <name>" for a Comm), in seconds.
inline dtl::trace::Event ev(int rank, const std::string& track, double start, double end) {
  dtl::trace::Event e;
  e.rank = rank;
  e.track = track;
  e.cat = track == "compute" ? "compute" : "comm";
  e.name = e.cat;
  e.start = start;
  e.end = end;
  return e;
}

// Tracing on, with this rank's events cleared, for the life of the object; off (and cleared)
// after. The emulator and the runtime record into the same buffer the tests read.
struct Tracing {
  Tracing() {
    dtl::trace::enable(true);
    dtl::trace::clear();
  }
  ~Tracing() {
    dtl::trace::enable(false);
    dtl::trace::clear();
  }
};

// The network emulator set to `spec` on every rank for the life of the object.
struct SlowLinks {
  dtl::net::Spec before;
  explicit SlowLinks(const std::string& spec) : before(dtl::net::current()) {
    dtl::net::set(dtl::net::Spec::parse(spec));
  }
  ~SlowLinks() { dtl::net::set(before); }
};

// This rank's events whose name starts with `prefix`, by start time.
inline std::vector<dtl::trace::Event> named(const std::vector<dtl::trace::Event>& evs,
                                            const std::string& prefix) {
  std::vector<dtl::trace::Event> out;
  for (const auto& e : evs)
    if (e.name.rfind(prefix, 0) == 0) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  return out;
}

// A sequence-sharded x: the full [n R, K] drawn on the CPU from a fixed seed (the same on every
// rank), this rank's R rows, a [N, K] weight, and the serial answer x_full @ weight^T.
struct Problem {
  torch::Tensor x_local, weight, expected;
  Problem(const dtl::Comm& comm, int64_t R, int64_t K, int64_t N) {
    torch::manual_seed(1600 + R * 7 + K);
    const torch::Tensor x_full = torch::randn({comm.size() * R, K});
    const torch::Tensor w = torch::randn({N, K});
    expected = x_full.matmul(w.t()).to(dtl::testing::device());
    x_local = x_full.narrow(0, comm.rank() * R, R).clone().to(dtl::testing::device());
    weight = w.to(dtl::testing::device());
  }
};

// n gradients of `bytes` each, the last registered ready first, at a steady rate over `backward`
// seconds; an all-reduce of alpha + beta * bytes.
inline dtl::lab16::BackwardProfile steady_profile(int n, int64_t bytes, double backward, double alpha,
                                                  double beta) {
  dtl::lab16::BackwardProfile p;
  for (int i = 0; i < n; ++i) {
    p.grad_bytes.push_back(bytes);
    p.ready_at.push_back(backward * (n - i) / n);
  }
  p.backward = backward;
  p.alpha = alpha;
  p.beta = beta;
  return p;
}

}  // namespace lab16_test
