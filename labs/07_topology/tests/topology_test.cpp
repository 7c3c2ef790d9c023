// Public tests of lab 07, run at world sizes 1-4 (./lab test 07).
//
// Oracles: nccl-tests' formulas (dtl::bus_factor) for the bandwidths; the least-squares line
// for the fit, and the network emulator's own settings for a fit of measured transfers; the
// built-in Comm::all_reduce for the hierarchical all-reduce, and Comm::stats() for which bytes
// travel on which sub-Comm; the closed-form models and the emulator's charges for Task 4.
#include "topology.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/net.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "dtl/split.hpp"
#include "tests/topology_test_util.hpp"

namespace {

using namespace lab07_test;  // NOLINT: fresh_comm, NetGuard, contribution, same_reduction, ...
using dtl::testing::error_of;
using dtl::lab07::AllReduceAlgorithm;
using dtl::lab07::Bandwidth;
using dtl::lab07::Hierarchy;
using dtl::lab07::Sample;
using ::testing::HasSubstr;

// ================================================================ Task 1: bus bandwidth

TEST(BusBandwidth, AlgbwIsBytesOverSecondsAndBusbwUsesTheNcclTestsFactor) {
  const std::vector<OpType> ops = {OpType::AllReduce, OpType::ReduceScatter, OpType::AllGather,
                                   OpType::AllToAll,  OpType::Broadcast,     OpType::Reduce};
  for (OpType op : ops)
    for (int n : {2, 3, 4, 8, 16})
      for (double S : {0.0, 4096.0, 1e9}) {
        const Bandwidth b = observed(dtl::lab07::bus_bandwidth(op, S, 0.01, n));
        EXPECT_PRED2(rel_close, b.algbw, S / 0.01) << dtl::to_string(op) << " n=" << n;
        EXPECT_PRED2(rel_close, b.busbw, S / 0.01 * dtl::bus_factor(op, n))
            << dtl::to_string(op) << " n=" << n << " S=" << S;
      }
  // nccl-tests' own reading: 8 ranks all-reduce 1 GB in 10 ms -> algbw 100 GB/s, busbw 175 GB/s.
  const Bandwidth b = observed(dtl::lab07::bus_bandwidth(OpType::AllReduce, 1e9, 0.01, 8));
  EXPECT_NEAR(b.algbw, 100e9, 1e-3);
  EXPECT_NEAR(b.busbw, 175e9, 1e-3);
  // A point-to-point transfer: the link carried exactly S.
  EXPECT_PRED2(rel_close, OBSERVE(dtl::lab07::bus_bandwidth(OpType::SendRecv, 1e6, 1e-3, 2).busbw),
               1e9);
}

TEST(BusBandwidth, OneRank) {
  // n = 1: nothing crosses a link in an all-reduce (factor 0); a broadcast's factor is 1.
  EXPECT_EQ(OBSERVE(dtl::lab07::bus_bandwidth(OpType::AllReduce, 1e6, 1e-3, 1).busbw), 0.0);
  EXPECT_EQ(OBSERVE(dtl::lab07::bus_bandwidth(OpType::AllGather, 1e6, 1e-3, 1).busbw), 0.0);
  EXPECT_PRED2(rel_close, OBSERVE(dtl::lab07::bus_bandwidth(OpType::Broadcast, 1e6, 1e-3, 1).busbw),
               1e9);
}

TEST(BusBandwidth, RejectsBadInput) {
  using dtl::lab07::bus_bandwidth;
  EXPECT_THAT(error_of([] { bus_bandwidth(OpType::AllReduce, 1e6, 0.0, 4); }), HasSubstr("seconds"));
  EXPECT_THAT(error_of([] { bus_bandwidth(OpType::AllReduce, 1e6, -1.0, 4); }), HasSubstr("seconds"));
  EXPECT_THAT(error_of([] { bus_bandwidth(OpType::AllReduce, -1.0, 1.0, 4); }), HasSubstr("bytes"));
  EXPECT_THAT(error_of([] { bus_bandwidth(OpType::AllReduce, 1e6, 1.0, 0); }), HasSubstr("ranks"));
  EXPECT_THAT(error_of([] { bus_bandwidth(OpType::Barrier, 1e6, 1.0, 4); }), HasSubstr("op"));
}

// ================================================================ Task 2: the alpha-beta fit

std::vector<Sample> on_line(double alpha, double beta, const std::vector<double>& sizes) {
  std::vector<Sample> s;
  for (double S : sizes) s.push_back(Sample{S, alpha + S / beta});
  return s;
}

TEST(FitAlphaBeta, RecoversAnExactLine) {
  // The emulator's eth-2node inter-node link (x1000): 50 ms, 3.125 MB/s; and an NVLink-like one.
  for (auto [alpha, beta] : {std::pair{50e-3, 3.125e6}, std::pair{5e-6, 200e9},
                             std::pair{0.0, 1e9}}) {
    const auto fit =
        observed(dtl::lab07::fit_alpha_beta(on_line(alpha, beta, {4096, 65536, 1 << 20, 4 << 20})));
    EXPECT_NEAR(fit.alpha, alpha, 1e-9 * (alpha + 1e-6)) << "alpha " << alpha;
    EXPECT_PRED3(within_rtol, fit.beta, beta, 1e-9) << "beta " << beta;
  }
  // Two distinct sizes are enough, however many times each was measured.
  const auto two = observed(dtl::lab07::fit_alpha_beta({{1000, 2e-3}, {1000, 2e-3}, {3000, 4e-3}}));
  EXPECT_NEAR(two.alpha, 1e-3, 1e-12);
  EXPECT_PRED2(rel_close, two.beta, 1e6);
}

TEST(FitAlphaBeta, IsTheLeastSquaresLine) {
  // Noisy points: the fit must be the least-squares line, not a line through two of them.
  const std::vector<Sample> s = {{1e3, 1.2e-3}, {1e4, 1.9e-3}, {1e5, 11.5e-3}, {1e6, 99e-3},
                                 {1e6, 103e-3}};
  const auto [intercept, slope] = least_squares(s);
  const auto fit = observed(dtl::lab07::fit_alpha_beta(s));
  EXPECT_PRED3(within_rtol, fit.beta, 1 / slope, 1e-9);
  EXPECT_PRED3(within_rtol, fit.alpha, intercept, 1e-9);
}

TEST(FitAlphaBeta, ClampsANegativeInterceptAtZero) {
  // A line through (1000, 0.5 ms) and (2000, 1.5 ms) meets the time axis at -0.5 ms.
  const auto fit = observed(dtl::lab07::fit_alpha_beta({{1000, 0.5e-3}, {2000, 1.5e-3}}));
  EXPECT_EQ(fit.alpha, 0.0);
  EXPECT_PRED2(rel_close, fit.beta, 1e6);
}

TEST(FitAlphaBeta, RejectsSamplesWithoutALine) {
  using dtl::lab07::fit_alpha_beta;
  EXPECT_THAT(error_of([] { fit_alpha_beta({}); }), HasSubstr("distinct"));
  EXPECT_THAT(error_of([] { fit_alpha_beta({{4096, 1e-3}, {4096, 2e-3}}); }), HasSubstr("distinct"));
  EXPECT_THAT(error_of([] { fit_alpha_beta({{1000, 2e-3}, {2000, 1e-3}}); }), HasSubstr("slope"));
  EXPECT_THAT(error_of([] { fit_alpha_beta({{1000, 1e-3}, {2000, 1e-3}}); }), HasSubstr("slope"));
  EXPECT_THAT(error_of([] { fit_alpha_beta({{-1, 1e-3}, {2000, 2e-3}}); }), HasSubstr("sample"));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error_of([&] { fit_alpha_beta({{1000, nan}, {2000, 2e-3}}); }), HasSubstr("sample"));
}

// Two emulated nodes; the measured transfers must give back the emulator's alpha and beta.
// Links slow enough that each transfer's emulated window (11-77 ms) dwarfs the real copy and a
// loaded machine's late wake-ups (a few ms); one attempt takes about a second.
TEST(FitAlphaBeta, RecoversTheEmulatedIntraAndInterNodeLinks) {
  auto comm = fresh_comm();
  const int n = comm->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  if (comm->backend() != "mpi") GTEST_SKIP() << "the network emulator shapes the MPI backend only";
  const LinkModel intra{10e-3, 20e6}, inter{25e-3, 5e6};
  const std::string links = "intra=20MB/s,10ms;inter=5MB/s,25ms";
  struct Case {
    const char* name;
    std::string spec;
    int src, dst;
    LinkModel expected;
  };
  // Ranks 0 and 1 share node 0; rank 2 sits on node 1. With 2 ranks, a second spec puts them on
  // two nodes.
  std::vector<Case> cases = {{"intra-node", links + ";ranks_per_node=2", 0, 1, intra}};
  if (n >= 3)
    cases.push_back({"inter-node", links + ";ranks_per_node=2", 0, 2, inter});
  else
    cases.push_back({"inter-node", links + ";ranks_per_node=1", 0, 1, inter});
  for (const auto& c : cases) {
    NetGuard net(c.spec);
    // Timed transfers of the student's process: MEASURED, with the same tolerance.
    const LinkModel fit = observed(fit_emulated_link(*comm, c.src, c.dst, c.expected, 0.25),
                                   dtl::testing::Source::kMeasured);
    EXPECT_NEAR(fit.alpha, c.expected.alpha, 0.25 * c.expected.alpha)
        << c.name << " link (" << c.spec << "): fitted alpha " << fit.alpha * 1e3 << " ms";
    EXPECT_NEAR(fit.beta, c.expected.beta, 0.25 * c.expected.beta)
        << c.name << " link (" << c.spec << "): fitted beta " << fit.beta / 1e6 << " MB/s";
    // The figures above are timed in the process under test. The fit is also a result the
    // driver checks: on samples measured here, fit_alpha_beta gives their least-squares line.
    std::vector<Sample> samples =
        dtl::lab07::measure_link(*comm, c.src, c.dst, {16 << 10, 64 << 10, 256 << 10});
    if (comm->rank() != c.src) continue;
    std::vector<double> seconds;
    for (const Sample& s : samples) seconds.push_back(s.seconds);
    seconds = MEASURED(seconds);
    for (size_t i = 0; i < samples.size(); ++i) samples[i].seconds = seconds[i];
    const auto [intercept, slope] = least_squares(samples);
    const LinkModel line = observed(dtl::lab07::fit_alpha_beta(samples));
    EXPECT_PRED3(within_rtol, line.beta, 1 / slope, 1e-9) << c.name << ": the least-squares slope";
    EXPECT_NEAR(line.alpha, std::max(intercept, 0.0), 1e-9 * std::abs(intercept) + 1e-15)
        << c.name << ": the least-squares intercept (clamped at 0)";
  }
}

// ================================================================ Task 3: hierarchical all-reduce

TEST(Hierarchy, GroupsConsecutiveRanksIntoNodes) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  for (int k : layouts(n)) {
    Hierarchy h(*comm, k);
    EXPECT_EQ(OBSERVE(h.ranks_per_node()), k);
    EXPECT_EQ(OBSERVE(h.nodes()), n / k);
    ASSERT_EQ(OBSERVE(h.local().size()), k) << "k=" << k;
    ASSERT_EQ(OBSERVE(h.cross().size()), n / k) << "k=" << k;
    EXPECT_EQ(OBSERVE(h.local().rank()), r % k) << "k=" << k;
    EXPECT_EQ(OBSERVE(h.cross().rank()), r / k) << "k=" << k;
    const std::vector<int> local = OBSERVE(h.local().world_ranks());
    const std::vector<int> cross = OBSERVE(h.cross().world_ranks());
    for (int i = 0; i < k; ++i)  // my node: ranks (r/k)k .. (r/k)k + k-1
      EXPECT_EQ(local.at(i), comm->world_ranks()[(r / k) * k + i]) << "k=" << k;
    for (int j = 0; j < n / k; ++j)  // my local index on every node
      EXPECT_EQ(cross.at(j), comm->world_ranks()[j * k + r % k]) << "k=" << k;
  }
}

TEST(Hierarchy, RejectsALayoutThatDoesNotDivideTheRanks) {
  auto comm = fresh_comm();
  const int n = comm->size();
  EXPECT_THAT(error_of([&] { Hierarchy h(*comm, 0); }), HasSubstr("ranks_per_node"));
  const int k = n + 1;  // never divides n
  const std::string msg = error_of([&] { Hierarchy h(*comm, k); });
  EXPECT_THAT(msg, HasSubstr("ranks_per_node=" + std::to_string(k) + " does not divide " +
                             std::to_string(n) + " ranks"));
  auto t = torch::ones({8}, device_options());
  EXPECT_THAT(error_of([&] { dtl::lab07::hierarchical_all_reduce(*comm, k, t); }),
              HasSubstr("ranks_per_node=" + std::to_string(k)));
  const dtl::CommStats st = MEASURED(comm->stats());
  EXPECT_EQ(st.total_count(), 0) << "a rejected call must not split or send anything: "
                                 << st.to_string();
}

TEST(HierarchicalAllReduce, MatchesTheBuiltinAtEveryLayout) {
  auto comm = fresh_comm();
  const int n = comm->size();
  for (int k : layouts(n))
    for (auto dtype : {torch::kFloat32, torch::kInt64, torch::kBFloat16})
      for (auto op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg})
        for (int64_t numel : test_sizes(n)) {
          auto input = contribution(numel, dtype);
          auto expected = input.clone();
          comm->all_reduce(expected, op);
          auto t = input.clone();
          dtl::lab07::hierarchical_all_reduce(*comm, k, t, op);
          EXPECT_TRUE(same_reduction(t, expected, op)) << label(dtype, op, numel, k);
          DTL_EXPECT_SAME_ON_ALL_RANKS(t);
        }
}

TEST(HierarchicalAllReduce, IntegerAverageTruncatesOnceLikeTheBuiltin) {
  // Ranks hold 1, 2, 1, 0: the average is trunc(4 / 4) = 1. Averaging in each phase instead
  // (4 ranks, 2 per node) truncates twice: trunc((trunc(3/2) + trunc(1/2)) / 2) = 0.
  auto comm = fresh_comm();
  const int n = comm->size();
  const int64_t values[] = {1, 2, 1, 0};
  for (int k : layouts(n)) {
    auto t = torch::full({5}, values[comm->rank() % 4], device_options(torch::kInt64));
    auto expected = t.clone();
    comm->all_reduce(expected, ReduceOp::Avg);
    dtl::lab07::hierarchical_all_reduce(*comm, k, t, ReduceOp::Avg);
    DTL_EXPECT_EQUAL(t, expected) << "ranks_per_node " << k;
  }
}

TEST(HierarchicalAllReduce, ResultLandsInNonContiguousViews) {
  auto comm = fresh_comm();
  const int n = comm->size();
  for (int k : layouts(n)) {
    auto base = contribution(6 * 7, torch::kInt64).view({6, 7});
    auto expected = base.t().contiguous();
    comm->all_reduce(expected);
    auto t = base.t();  // a transposed view: not contiguous
    ASSERT_FALSE(t.is_contiguous());
    dtl::lab07::hierarchical_all_reduce(*comm, k, t);
    DTL_EXPECT_EQUAL(t, expected) << "ranks_per_node " << k;
  }
}

TEST(HierarchicalAllReduce, OnlyOneChunkCrossesNodes) {
  auto comm = fresh_comm();
  const int n = comm->size();
  for (int k : layouts(n)) {
    Hierarchy h(*comm, k);
    comm->reset_stats();  // forget the splits: from here on, nothing may use comm itself
    const int64_t numel = 1001;  // not divisible by 2, 3 or 4
    auto t = torch::ones({numel}, device_options());
    h.all_reduce(t);
    EXPECT_TRUE(
        OBSERVE(torch::equal(t, torch::full({numel}, static_cast<float>(n), device_options()))));
    const auto local = MEASURED(h.local().stats()), cross = MEASURED(h.cross().stats());
    const int64_t S = numel * 4,
                  chunk = dtl::split_range(numel, k, OBSERVE(h.local().rank())).size() * 4;
    EXPECT_EQ(local[OpType::ReduceScatter].count, 1) << "k=" << k << ": " << local.to_string();
    EXPECT_EQ(local[OpType::ReduceScatter].bytes, S) << "k=" << k;
    EXPECT_EQ(local[OpType::AllGather].count, 1) << "k=" << k << ": " << local.to_string();
    EXPECT_EQ(local[OpType::AllGather].bytes, S) << "k=" << k;
    EXPECT_EQ(local.total_count(), 2) << "k=" << k << ": " << local.to_string();
    EXPECT_EQ(cross[OpType::AllReduce].count, 1) << "k=" << k << ": " << cross.to_string();
    EXPECT_EQ(cross[OpType::AllReduce].bytes, chunk)
        << "k=" << k << ": only this rank's chunk of S/k bytes may cross nodes";
    EXPECT_EQ(cross.total_count(), 1) << "k=" << k << ": " << cross.to_string();
    const dtl::CommStats parent = MEASURED(comm->stats());
    EXPECT_EQ(parent.total_count(), 0)
        << "k=" << k << ": nothing travels on the parent Comm: " << parent.to_string();
  }
}

TEST(HierarchicalAllReduce, BuildsItsSubCommunicatorsOnce) {
  auto comm = fresh_comm();
  const int n = comm->size();
  auto t = torch::ones({10}, device_options());
  dtl::lab07::hierarchical_all_reduce(*comm, n, t);
  const int64_t splits = MEASURED(comm->stats())[OpType::Split].count;
  EXPECT_GE(splits, 1) << "the first call builds the hierarchy by splitting comm";
  for (int i = 0; i < 3; ++i) dtl::lab07::hierarchical_all_reduce(*comm, n, t);
  EXPECT_EQ(MEASURED(comm->stats())[OpType::Split].count, splits)
      << "later calls with the same (comm, ranks_per_node) must reuse the hierarchy";
  DTL_EXPECT_EQUAL(t, torch::full({10}, std::pow(static_cast<float>(n), 4.0f), device_options()));
  // Another ranks_per_node gets its own hierarchy, and both stay cached.
  dtl::lab07::hierarchical_all_reduce(*comm, 1, t);
  const int64_t both = MEASURED(comm->stats())[OpType::Split].count;
  if (n > 1) {
    EXPECT_GT(both, splits) << "ranks_per_node=1 needs its own groups";
  }
  dtl::lab07::hierarchical_all_reduce(*comm, n, t);
  dtl::lab07::hierarchical_all_reduce(*comm, 1, t);
  EXPECT_EQ(MEASURED(comm->stats())[OpType::Split].count, both);
  // Another Comm gets its own hierarchy too (and the right answer).
  auto other = fresh_comm();
  auto u = torch::ones({3}, device_options());
  dtl::lab07::hierarchical_all_reduce(*other, n, u);
  EXPECT_GE(MEASURED(other->stats())[OpType::Split].count, 1);
  DTL_EXPECT_EQUAL(u, torch::full({3}, static_cast<float>(n), device_options()));
}

TEST(HierarchicalAllReduce, RejectsTensorsItCannotMove) {
  auto comm = fresh_comm();
  EXPECT_THAT(error_of([&] { dtl::lab07::hierarchical_all_reduce(*comm, 1, torch::Tensor()); }),
              HasSubstr("tensor"));
  EXPECT_THAT(
      error_of([&] { dtl::lab07::hierarchical_all_reduce(*comm, 1, torch::ones({4}, device_options(torch::kBool))); }),
      HasSubstr("dtype"));
}

// ================================================================ Task 4: cost models, chooser

// eth-2node's real links: NVLink in the node, 25 Gb/s Ethernet between nodes.
Topology eth(int k, int m) { return Topology{{5e-6, 200e9}, {50e-6, 3.125e9}, k, m}; }
// A PCIe-only node with one 200 Gb/s NIC per GPU: the network is faster than the node.
Topology pcie_nic_per_gpu(int k, int m) { return Topology{{10e-6, 20e9}, {10e-6, 25e9}, k, m}; }

TEST(CostModel, FlatRingAndHierarchicalFormulas) {
  for (auto make : {eth, pcie_nic_per_gpu})
    for (auto [k, m] : {std::pair{1, 1}, {4, 1}, {1, 4}, {2, 2}, {8, 2}, {4, 3}, {8, 16}})
      for (double S : {0.0, 1024.0, 16.0 * (1 << 20), 13.5e9}) {
        const Topology t = make(k, m);
        EXPECT_PRED3(within_rtol, OBSERVE(dtl::lab07::flat_ring_time(t, S)), expected_flat(t, S),
                     1e-9)
            << "k=" << k << " m=" << m << " S=" << S;
        EXPECT_PRED3(within_rtol, OBSERVE(dtl::lab07::hierarchical_time(t, S)),
                     expected_hierarchical(t, S), 1e-9)
            << "k=" << k << " m=" << m << " S=" << S;
      }
  // Worked example (notes/07): 2 nodes x 2 ranks over 25 GbE, 16 MiB.
  const double S = 16.0 * (1 << 20);
  EXPECT_NEAR(OBSERVE(dtl::lab07::flat_ring_time(eth(2, 2), S)), 6 * 50e-6 + 1.5 * S / 3.125e9,
              1e-12);
  EXPECT_NEAR(OBSERVE(dtl::lab07::hierarchical_time(eth(2, 2), S)),
              2 * (5e-6 + 0.5 * S / 200e9) + 2 * 50e-6 + 1.0 * (S / 2) / 3.125e9, 1e-12);
}

TEST(CostModel, AreWhatTheEmulatorCharges) {
  // 2 nodes x 4 ranks: the emulator's charge for the flat ring over ranks 0-7, and for the three
  // collectives rank 0 runs in the hierarchy (local 0-3, cross {0, 4}).
  NetGuard net("intra=100MB/s,2ms;inter=10MB/s,7ms;ranks_per_node=4");
  const Topology t = dtl::lab07::emulated_topology(8);
  ASSERT_EQ(OBSERVE(t.ranks_per_node), 4);
  ASSERT_EQ(OBSERVE(t.nodes), 2);
  for (double S : {4096.0, 1e6, 64e6}) {
    const double flat = dtl::net::collective_cost("all_reduce", S, {0, 1, 2, 3, 4, 5, 6, 7});
    const double hier = dtl::net::collective_cost("reduce_scatter", S, {0, 1, 2, 3}) +
                        dtl::net::collective_cost("all_reduce", S / 4, {0, 4}) +
                        dtl::net::collective_cost("all_gather", S, {0, 1, 2, 3});
    EXPECT_PRED3(within_rtol, OBSERVE(dtl::lab07::flat_ring_time(t, S)), flat, 1e-9) << "S=" << S;
    EXPECT_PRED3(within_rtol, OBSERVE(dtl::lab07::hierarchical_time(t, S)), hier, 1e-9)
        << "S=" << S;
  }
}

TEST(CostModel, ChooserPicksTheCheaperModel) {
  // Over 25 GbE the hierarchy wins at every size: fewer inter-node steps and 1/k of the bytes.
  for (double S = 1; S < 1e11; S *= 4)
    EXPECT_EQ(OBSERVE(dtl::lab07::choose_algorithm(eth(2, 2), S)), AllReduceAlgorithm::Hierarchical)
        << "S=" << S;
  // PCIe node, NIC per GPU: the hierarchy's fewer steps win small messages, but its intra-node
  // phases on the slower PCIe link lose large ones. Crossover at 2 MB (notes/07).
  EXPECT_EQ(OBSERVE(dtl::lab07::choose_algorithm(pcie_nic_per_gpu(2, 2), 1e6)),
            AllReduceAlgorithm::Hierarchical);
  EXPECT_EQ(OBSERVE(dtl::lab07::choose_algorithm(pcie_nic_per_gpu(2, 2), 4e6)),
            AllReduceAlgorithm::FlatRing);
  // One node, or one rank per node: the same ring twice; a tie goes to the flat ring.
  EXPECT_EQ(OBSERVE(dtl::lab07::choose_algorithm(eth(8, 1), 1e6)), AllReduceAlgorithm::FlatRing);
  EXPECT_EQ(OBSERVE(dtl::lab07::choose_algorithm(eth(1, 8), 1e6)), AllReduceAlgorithm::FlatRing);
  // And in general the chooser agrees with the models.
  for (auto make : {eth, pcie_nic_per_gpu})
    for (auto [k, m] : {std::pair{2, 2}, {4, 2}, {8, 4}})
      for (double S = 1; S < 1e11; S *= 3) {
        const Topology t = make(k, m);
        const double f = expected_flat(t, S), h = expected_hierarchical(t, S);
        if (std::abs(f - h) < 1e-6 * f) continue;  // too close to call
        EXPECT_EQ(OBSERVE(dtl::lab07::choose_algorithm(t, S)),
                  h < f ? AllReduceAlgorithm::Hierarchical : AllReduceAlgorithm::FlatRing)
            << "k=" << k << " m=" << m << " S=" << S;
      }
}

TEST(CostModel, RejectsBadTopologies) {
  using dtl::lab07::flat_ring_time;
  using dtl::lab07::hierarchical_time;
  Topology t = eth(2, 2);
  t.ranks_per_node = 0;
  EXPECT_THAT(error_of([&] { flat_ring_time(t, 1e6); }), HasSubstr("ranks_per_node"));
  t = eth(2, 2);
  t.nodes = 0;
  EXPECT_THAT(error_of([&] { hierarchical_time(t, 1e6); }), HasSubstr("nodes"));
  t = eth(2, 2);
  t.inter.beta = 0;
  EXPECT_THAT(error_of([&] { flat_ring_time(t, 1e6); }), HasSubstr("beta"));
  t = eth(2, 2);
  t.intra.alpha = -1e-6;
  EXPECT_THAT(error_of([&] { hierarchical_time(t, 1e6); }), HasSubstr("alpha"));
  EXPECT_THAT(error_of([&] { dtl::lab07::choose_algorithm(eth(2, 2), -1); }), HasSubstr("bytes"));
  // A one-node topology needs no inter-node link.
  Topology one_node{{5e-6, 200e9}, {}, 8, 1};
  EXPECT_GT(OBSERVE(flat_ring_time(one_node, 1e6)), 0.0);
}

}  // namespace
