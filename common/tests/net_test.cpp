// Tests of the network emulator: spec parsing, cost formulas, and — the one place in the suite
// where time is asserted — that emulated transfers take alpha + B/beta: never less (a strict
// floor, guaranteed by sleeping), and a median within 10% (+2 ms). A shared CI machine has
// bursts of load (a 50 us sleep occasionally takes 5 ms here), so a ceiling or an overlap
// property is measured up to three times and holds if one measurement shows it; the floor
// must hold in every one.
#include <gmock/gmock.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dtl/error.hpp"
#include "dtl/perf.hpp"
#include "dtl/net.hpp"
#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"

namespace {

using dtl::net::Spec;
using ::testing::HasSubstr;

// Sets an emulator spec on every rank for one test, restores "none" afterwards.
struct NetGuard {
  explicit NetGuard(const std::string& spec) { dtl::net::set(Spec::parse(spec)); }
  ~NetGuard() { dtl::net::set(Spec{}); }
};

std::string error_of(const std::string& spec) {
  try {
    Spec::parse(spec);
  } catch (const dtl::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(NetSpec, PresetsParseAndDescribeThemselves) {
  for (auto& p : dtl::net::presets()) {
    Spec s = Spec::parse(p.name);
    EXPECT_EQ(s.enabled, p.name != "none") << p.name;
    EXPECT_FALSE(p.represents.empty()) << p.name;
  }
  Spec ib = Spec::parse("ib-2node");
  EXPECT_EQ(ib.name, "ib-2node");
  EXPECT_DOUBLE_EQ(ib.inter.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(ib.inter.latency, 10e-6);
  EXPECT_DOUBLE_EQ(ib.time_scale, 1000);
  EXPECT_EQ(ib.nodes, 2);
  EXPECT_THAT(ib.describe(), HasSubstr("inter 25 GB/s + 10 us"));
  EXPECT_DOUBLE_EQ(Spec::parse("ib-2node;time_scale=1").time_scale, 1);
  EXPECT_FALSE(Spec::parse("").enabled);
  EXPECT_FALSE(Spec::parse("none").enabled);
}

TEST(NetSpec, CustomSyntax) {
  Spec s = Spec::parse("intra=200MB/s,3ms; inter=1.5e9,10us ;ranks_per_node=2");
  EXPECT_TRUE(s.enabled);
  EXPECT_DOUBLE_EQ(s.intra.bandwidth, 200e6);
  EXPECT_DOUBLE_EQ(s.intra.latency, 3e-3);
  EXPECT_DOUBLE_EQ(s.inter.bandwidth, 1.5e9);
  EXPECT_DOUBLE_EQ(s.inter.latency, 10e-6);
  EXPECT_EQ(s.ranks_per_node, 2);
  EXPECT_EQ(s.node_of(0, 4), 0);
  EXPECT_EQ(s.node_of(3, 4), 1);
  Spec two = Spec::parse("intra=1GB,1us;nodes=2");
  EXPECT_DOUBLE_EQ(two.inter.bandwidth, 1e9) << "inter defaults to intra";
  EXPECT_EQ(two.node_of(2, 5), 0);  // ceil(5/2) = 3 ranks per node
  EXPECT_EQ(two.node_of(3, 5), 1);
}

TEST(NetSpec, BadSpecsNameTheField) {
  EXPECT_THAT(error_of("infiniband"), HasSubstr("unknown preset 'infiniband'"));
  EXPECT_THAT(error_of("intra=fast,1ms"), HasSubstr("bad bandwidth 'fast' in intra=fast,1ms"));
  EXPECT_THAT(error_of("intra=1GB/s,soon"), HasSubstr("bad latency 'soon'"));
  EXPECT_THAT(error_of("intra=1GB/s"), HasSubstr("intra needs BANDWIDTH,LATENCY"));
  EXPECT_THAT(error_of("intra=1GB/s,1us;ranks_per_node=0"), HasSubstr("ranks_per_node=0 must be a positive integer"));
  EXPECT_THAT(error_of("intra=1GB/s,1us;speed=3"), HasSubstr("unknown field 'speed'"));
  EXPECT_THAT(error_of("inter=1GB/s,1us"), HasSubstr("intra=BW,LAT is required"));
  EXPECT_THAT(error_of("intra=-5MB/s,1us"), HasSubstr("bad bandwidth"));
}

TEST(NetCost, FormulasOfBandwidthOptimalAlgorithms) {
  NetGuard net("intra=100MB/s,1ms;inter=10MB/s,5ms;ranks_per_node=2");
  const double S = 1e6;
  // One node (ranks 0,1): ring all-reduce 2(n-1) alpha + 2(n-1)/n S/beta.
  EXPECT_NEAR(dtl::net::collective_cost("all_reduce", S, {0, 1}), 2 * 1e-3 + 1.0 * S / 100e6, 1e-12);
  // Spanning two nodes: the inter-node link is the bottleneck.
  EXPECT_NEAR(dtl::net::collective_cost("all_reduce", S, {0, 1, 2, 3}), 6 * 5e-3 + 1.5 * S / 10e6, 1e-12);
  EXPECT_NEAR(dtl::net::collective_cost("all_gather", S, {0, 1}), 1e-3 + 0.5 * S / 100e6, 1e-12);
  EXPECT_NEAR(dtl::net::collective_cost("broadcast", S, {0, 1, 2}), 2 * 5e-3 + S / 10e6, 1e-12);
  EXPECT_EQ(dtl::net::collective_cost("all_reduce", S, {3}), 0.0);
  EXPECT_NEAR(dtl::net::p2p_cost(S, 0, 1), 1e-3 + S / 100e6, 1e-12);
  EXPECT_NEAR(dtl::net::p2p_cost(S, 1, 2), 5e-3 + S / 10e6, 1e-12);
  EXPECT_EQ(dtl::net::p2p_cost(S, 2, 2), 0.0);
  NetGuard scaled("intra=100MB/s,1ms;time_scale=10");
  EXPECT_NEAR(dtl::net::p2p_cost(S, 0, 1), 10 * (1e-3 + S / 100e6), 1e-12);
}

// Median time of `fn` over repeats, all ranks in step.
double median_seconds(const std::function<void()>& fn, int iters = 5) {
  return dtl::measure(fn, 1, iters).median;
}

// Measures `fn` (a collective: every rank calls this) until its median is within the ceiling,
// at most three times; the floor is checked on every measurement.
void expect_emulated(const std::function<void()>& fn, double expected, const std::string& what,
                     bool participates = true) {
  double measured = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    measured = median_seconds(fn);
    if (participates) {
      EXPECT_GE(measured, expected) << what << ": finished before alpha + B/beta";
    }
    // Every rank must take the same decision, or the next attempt's collectives mismatch.
    int ok = !participates || measured <= expected * 1.10 + 2e-3;
    if (dtl::sum_over_ranks(ok) == dtl::world().size()) return;
  }
  if (participates) {
    EXPECT_LE(measured, expected * 1.10 + 2e-3) << what << ": more than 10% (+2 ms) over alpha + B/beta";
  }
}

TEST(NetTiming, PointToPointPaysAlphaPlusBytesOverBeta) {
  auto& w = dtl::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // Ranks 0 and 1 on one node, or on two nodes: the same exchange pays intra or inter cost.
  for (int rpn : {2, 1}) {
    NetGuard net(fmt::format("intra=20MB/s,10ms;inter=10MB/s,20ms;ranks_per_node={}", rpn));
    auto comm = w.split(w.rank() < 2 ? 0 : -1, w.rank());
    const int64_t bytes = 1'000'000;
    auto out = torch::ones({bytes / 4}), in = torch::empty({bytes / 4});
    double expected = rpn == 2 ? 10e-3 + bytes / 20e6 : 20e-3 + bytes / 10e6;
    expect_emulated([&] { if (comm) comm->sendrecv(out, 1 - comm->rank(), in, 1 - comm->rank()); },
                    expected, rpn == 2 ? "intra-node sendrecv" : "inter-node sendrecv", comm != nullptr);
  }
}

TEST(NetTiming, SendersQueueOnTheirEgressLink) {
  auto& w = dtl::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  NetGuard net("intra=20MB/s,5ms");
  // Two async sends from rank 0 on two Comms contend for rank 0's one egress link: the second
  // finishes one transfer time after the first, not at the same time.
  auto a = w.split(w.rank() < 2 ? 0 : -1, w.rank());
  auto b = w.split(w.rank() < 2 ? 0 : -1, w.rank());
  const int64_t bytes = 600'000;
  const double one = 5e-3 + bytes / 20e6;
  auto x = torch::ones({bytes / 4}), y = torch::ones({bytes / 4});
  expect_emulated([&] {
    if (!a) return;
    if (a->rank() == 0) {
      auto wa = a->send_async(x, 1), wb = b->send_async(y, 1);
      wa.wait();
      wb.wait();
    } else {
      auto ra = a->recv_async(x, 0), rb = b->recv_async(y, 0);
      ra.wait();
      rb.wait();
    }
  }, 2 * one, "two queued sends", a != nullptr);
}

TEST(NetTiming, AllReducePaysTheRingCost) {
  auto& w = dtl::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  NetGuard net("intra=20MB/s,5ms;inter=10MB/s,10ms;ranks_per_node=2");
  auto t = torch::ones({250'000});  // 1 MB
  std::vector<int> members(w.size());
  for (int i = 0; i < w.size(); ++i) members[i] = i;
  double expected = dtl::net::collective_cost("all_reduce", 1e6, members);
  const int n = w.size();
  const bool inter = n > 2;
  EXPECT_NEAR(expected, 2 * (n - 1) * (inter ? 10e-3 : 5e-3) + 2.0 * (n - 1) / n * 1e6 / (inter ? 10e6 : 20e6), 1e-12);
  expect_emulated([&] { w.all_reduce(t); }, expected, "all_reduce");
}

TEST(NetTiming, AsyncAllReduceHidesUnderCompute) {
  auto& w = dtl::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // Real compute: a matmul loop, calibrated with every rank computing at once.
  auto a = torch::randn({128, 128});
  int reps = 1;
  auto compute = [&] {
    auto c = a;
    for (int i = 0; i < reps; ++i) c = torch::mm(c, a).tanh_();
    return c;
  };
  // ~150 ms blocks: the real transfer's progress (a few ms on a busy machine) stays small
  // next to the emulated time it should hide under.
  while (median_seconds([&] { compute(); }, 3) < 0.15 && reps < (1 << 16)) reps *= 2;
  const double t_compute = median_seconds([&] { compute(); }, 3);
  NetGuard net("intra=20MB/s,2ms");
  auto g = torch::ones({static_cast<int64_t>(t_compute * 20e6 / (2.0 * (w.size() - 1) / w.size()) / 4)});
  const double t_comm = median_seconds([&] { w.all_reduce(g); }, 3);
  // The compute inside the overlapped step is timed too: on a loaded machine (4 ranks on 2
  // cores next to other jobs) it can run slower than the calibration, and the property under
  // test is the overlap, not the machine's steadiness.
  double t_step = 0, t_compute_in_step = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::vector<double> in_step;
    t_step = median_seconds([&] {
      auto work = w.all_reduce_async(g);
      dtl::Timer t;
      compute();
      in_step.push_back(dtl::max_over_ranks(t.seconds()));
      work.wait();
    }, 3);
    // measure() runs one untimed warm-up first: its compute is not part of the median step.
    t_compute_in_step = dtl::median(std::vector<double>(in_step.begin() + 1, in_step.end()));
    int ok = t_step < 0.8 * (t_compute_in_step + t_comm);
    if (dtl::sum_over_ranks(ok) == w.size()) break;
  }
  // Overlapped: close to max(compute, comm), clearly below their sum.
  EXPECT_LT(t_step, 0.8 * (t_compute_in_step + t_comm))
      << "compute " << t_compute_in_step << " s (calibrated " << t_compute << " s), comm " << t_comm
      << " s, step " << t_step << " s";
  EXPECT_GE(t_step, 0.95 * std::max(t_compute_in_step, t_comm));
}

TEST(NetTiming, OffByDefault) {
  EXPECT_FALSE(dtl::net::enabled());
  EXPECT_EQ(dtl::net::collective_cost("all_reduce", 1e9, {0, 1}), 0.0);
}

}  // namespace
