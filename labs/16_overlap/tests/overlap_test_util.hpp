// labs/16_overlap/tests/overlap_test_util.hpp — shared by the public tests (overlap_test.cpp)
// and the grading tests (grading/16_overlap/): trace events by hand, tracing and a slow network
// for the length of a scope, a collective-matmul problem with its serial answer.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
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

// overlap_from_chrome's result from the code under test, observed (each entry's rank and four
// figures): in the autograder's split run the assertions on it are checked on the student's
// numbers.
inline std::vector<dtl::lab16::RankOverlap> observed(const std::vector<dtl::lab16::RankOverlap>& r,
                                                     const char* file = __builtin_FILE(),
                                                     int line = __builtin_LINE()) {
  std::vector<std::pair<int, std::vector<double>>> list;
  for (const auto& o : r) list.push_back({o.rank, {o.wall, o.compute, o.comm, o.exposed_comm}});
  list = dtl::testing::observe(std::move(list),
                               "the ranks' overlap (rank, wall, compute, comm, exposed)",
                               dtl::testing::Source::kComputed, file, line);
  std::vector<dtl::lab16::RankOverlap> out;
  for (const auto& [rank, v] : list) {
    dtl::lab16::RankOverlap o;
    o.rank = rank;
    if (v.size() == 4)
      o.wall = v[0], o.compute = v[1], o.comm = v[2], o.exposed_comm = v[3];
    else
      ADD_FAILURE_AT(file, line) << "an entry recorded with " << v.size() << " figures";
    out.push_back(o);
  }
  return out;
}

inline dtl::lab16::BucketTiming observed(dtl::lab16::BucketTiming t,
                                         const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE()) {
  t.buckets = dtl::testing::observe(t.buckets, "BucketTiming.buckets",
                                    dtl::testing::Source::kComputed, file, line);
  dtl::testing::observe_fields<double>("BucketTiming (total, exposed)", {&t.total, &t.exposed},
                                       dtl::testing::Source::kComputed, file, line);
  return t;
}

// The runtime's summary of a trace the student's process recorded: its times are that
// process's (MEASURED).
inline dtl::trace::Summary measured(dtl::trace::Summary s, const char* file = __builtin_FILE(),
                                    int line = __builtin_LINE()) {
  dtl::testing::observe_fields<double>("Summary (wall, compute, comm, exposed_comm)",
                                       {&s.wall, &s.compute, &s.comm, &s.exposed_comm},
                                       dtl::testing::Source::kMeasured, file, line);
  return s;
}

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

// The spans (start, end) of events recorded in the student's process (MEASURED: trace times).
struct Span {
  double start = 0, end = 0;
};
inline std::vector<Span> measured_spans(const std::vector<dtl::trace::Event>& evs,
                                        const char* file = __builtin_FILE(),
                                        int line = __builtin_LINE()) {
  std::vector<std::pair<double, double>> list;
  for (const auto& e : evs) list.emplace_back(e.start, e.end);
  list = dtl::testing::observe(std::move(list), "the events' spans",
                               dtl::testing::Source::kMeasured, file, line);
  std::vector<Span> out;
  for (const auto& [start, end] : list) out.push_back(Span{start, end});
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
