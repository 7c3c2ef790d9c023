// Grading-only tests of lab 07 (hidden until the due date; ./lab grade 07 runs them).
//
// Beyond the public tests: every dtype and reduce op, large and prime sizes, shaped and offset
// views, a hierarchy over a sub-communicator (the layout counts the sub-Comm's ranks, not the
// world's), calls interleaved with the built-ins, a Comm's cached hierarchy dropped with the
// Comm, every bad-input word of the header, and the formulas at many more points.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "dtl/split.hpp"
#include "tests/topology_test_util.hpp"
#include "topology.hpp"

namespace {

using namespace lab07_test;  // NOLINT: fresh_comm, contribution, same_reduction, ...
using dtl::testing::error_of;
using dtl::lab07::AllReduceAlgorithm;
using dtl::lab07::Hierarchy;
using dtl::lab07::Sample;
using ::testing::HasSubstr;

const std::vector<torch::ScalarType> kAllDtypes = {
    torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16,
    torch::kInt32,   torch::kInt64,   torch::kInt8,    torch::kUInt8};
const std::vector<ReduceOp> kAllOps = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

void expect_matches_builtin(Comm& comm, int k, const torch::Tensor& input, ReduceOp op,
                            const std::string& what) {
  auto expected = input.clone();
  comm.all_reduce(expected, op);
  auto t = input.clone();
  dtl::lab07::hierarchical_all_reduce(comm, k, t, op);
  EXPECT_TRUE(same_reduction(t, expected, op)) << what;
}

// ================================================================ hierarchical all-reduce

TEST(GradeHierarchical, EveryDtypeAndOp) {
  auto comm = fresh_comm();
  for (int k : layouts(comm->size()))
    for (auto dtype : kAllDtypes)
      for (auto op : kAllOps)
        for (int64_t numel : {int64_t{5}, int64_t{64}})
          expect_matches_builtin(*comm, k, contribution(numel, dtype), op,
                                 label(dtype, op, numel, k));
}

TEST(GradeHierarchical, LargeAndPrimeSizes) {
  auto comm = fresh_comm();
  for (int k : layouts(comm->size()))
    for (int64_t numel : {int64_t{65521}, int64_t{1000003}}) {
      expect_matches_builtin(*comm, k, contribution(numel, torch::kFloat32), ReduceOp::Sum,
                             label(torch::kFloat32, ReduceOp::Sum, numel, k));
      expect_matches_builtin(*comm, k, contribution(numel, torch::kInt64), ReduceOp::Avg,
                             label(torch::kInt64, ReduceOp::Avg, numel, k));
      auto t = contribution(numel, torch::kFloat64);
      dtl::lab07::hierarchical_all_reduce(*comm, k, t, ReduceOp::Sum);
      DTL_EXPECT_SAME_ON_ALL_RANKS(t);
    }
}

TEST(GradeHierarchical, ShapedAndOffsetViews) {
  auto comm = fresh_comm();
  for (int k : layouts(comm->size())) {
    // A 3-D tensor, and a strided slice that starts at an offset into its storage.
    auto cube = contribution(2 * 3 * 5, torch::kInt32).view({2, 3, 5});
    expect_matches_builtin(*comm, k, cube, ReduceOp::Sum, "3-D int32, k=" + std::to_string(k));
    auto storage = contribution(40, torch::kInt64);
    auto view = storage.slice(0, 3, 40, 3);  // 13 elements, stride 3, offset 3
    auto expected = view.contiguous();
    comm->all_reduce(expected, ReduceOp::Max);
    auto untouched = storage.clone();
    dtl::lab07::hierarchical_all_reduce(*comm, k, view, ReduceOp::Max);
    DTL_EXPECT_EQUAL(view, expected) << "k=" << k;
    // Elements outside the view keep their values.
    auto mask = torch::ones({40}, device_options(torch::kBool));
    mask.slice(0, 3, 40, 3).fill_(false);
    DTL_EXPECT_EQUAL(storage.masked_select(mask), untouched.masked_select(mask)) << "k=" << k;
  }
}

TEST(GradeHierarchical, OnASubCommunicator) {
  // The ranks 1..n-1 of the world as a Comm of their own (rank 0 sits out): nodes are counted in
  // the sub-Comm's ranks.
  auto& w = dtl::world();
  if (w.size() < 3) GTEST_SKIP() << "needs 3 ranks";
  auto sub = w.split(w.rank() == 0 ? -1 : 0, w.rank(), "world/without-0");
  if (!sub) return;
  const int n = sub->size();
  for (int k : layouts(n)) {
    Hierarchy h(*sub, k);
    EXPECT_EQ(OBSERVE(h.local().rank()), sub->rank() % k);
    EXPECT_EQ(OBSERVE(h.cross().rank()), sub->rank() / k);
    EXPECT_EQ(OBSERVE(h.local().world_ranks().front()), 1 + (sub->rank() / k) * k);
    expect_matches_builtin(*sub, k, contribution(17, torch::kInt64), ReduceOp::Sum,
                           "sub-Comm, k=" + std::to_string(k));
  }
}

TEST(GradeHierarchical, InterleavedWithTheBuiltinsOnOneComm) {
  // Collectives of the parent Comm between hierarchical calls: the hierarchy's messages must
  // never be mistaken for the parent's (it runs on its own sub-Comms).
  auto comm = fresh_comm();
  const int n = comm->size();
  for (int round = 0; round < 3; ++round)
    for (int k : layouts(n)) {
      auto a = contribution(33, torch::kInt64), b = contribution(33, torch::kInt64);
      auto a_ref = a.clone();
      comm->all_reduce(a_ref);
      auto work = dtl::lab07::Hierarchy(*comm, k);  // a second hierarchy: more sub-Comms
      work.all_reduce(a);
      auto b_ref = b.clone();
      comm->all_reduce(b_ref, ReduceOp::Min);
      dtl::lab07::hierarchical_all_reduce(*comm, k, b, ReduceOp::Min);
      DTL_EXPECT_EQUAL(a, a_ref) << "round " << round << " k=" << k;
      DTL_EXPECT_EQUAL(b, b_ref) << "round " << round << " k=" << k;
    }
}

TEST(GradeHierarchical, ADestroyedCommDoesNotHandItsHierarchyToANewOne) {
  // Comms come and go (one per test here, one per training job in real code). A new Comm may
  // reuse a dead one's address: the cache must notice and build a new hierarchy for it.
  const int n = dtl::world().size();
  for (int round = 0; round < 4; ++round) {
    auto comm = fresh_comm();
    auto t = torch::full({6}, comm->rank() + 1, device_options(torch::kInt64));
    dtl::lab07::hierarchical_all_reduce(*comm, n, t);
    DTL_EXPECT_EQUAL(t, torch::full({6}, n * (n + 1) / 2, device_options(torch::kInt64))) << "round " << round;
    EXPECT_GE(MEASURED(comm->stats())[OpType::Split].count, 1)
        << "round " << round << ": a new Comm needs its own hierarchy (split of that Comm)";
  }
}

TEST(GradeHierarchical, EveryBadInputWord) {
  auto comm = fresh_comm();
  const int n = comm->size();
  EXPECT_THAT(error_of([&] { Hierarchy h(*comm, -2); }), HasSubstr("ranks_per_node"));
  EXPECT_THAT(error_of([&] { dtl::lab07::hierarchical_all_reduce(*comm, 0, torch::ones({2}, device_options())); }),
              HasSubstr("ranks_per_node"));
  if (n >= 2) {
    for (int k = 2; k <= n + 2; ++k) {
      if (n % k == 0) continue;
      EXPECT_THAT(error_of([&] { dtl::lab07::hierarchical_all_reduce(*comm, k, torch::ones({2}, device_options())); }),
                  HasSubstr("ranks_per_node=" + std::to_string(k) + " does not divide " +
                            std::to_string(n) + " ranks"));
    }
  }
  Hierarchy h(*comm, n);
  EXPECT_THAT(error_of([&] { h.all_reduce(torch::Tensor()); }), HasSubstr("tensor"));
  EXPECT_THAT(error_of([&] { h.all_reduce(torch::zeros({3}, device_options(torch::kComplexFloat))); }),
              HasSubstr("dtype"));
  // Nothing was sent by the rejected calls: the hierarchy's Comms are still in step.
  auto t = torch::ones({4}, device_options(torch::kInt64));
  h.all_reduce(t);
  DTL_EXPECT_EQUAL(t, torch::full({4}, n, device_options(torch::kInt64)));
}

// ================================================================ formulas

TEST(GradeBusBandwidth, EveryOpAtManyPoints) {
  const std::vector<OpType> ops = {OpType::AllReduce, OpType::ReduceScatter, OpType::AllGather,
                                   OpType::AllToAll,  OpType::Broadcast,     OpType::Reduce,
                                   OpType::Send,      OpType::Recv,          OpType::SendRecv};
  for (OpType op : ops)
    for (int n : {2, 3, 5, 7, 64, 1024})
      for (double t : {1e-6, 0.37, 12.0}) {
        const double S = 123456789.0;
        const auto b = observed(dtl::lab07::bus_bandwidth(op, S, t, n));
        EXPECT_PRED2(rel_close, b.algbw, S / t);
        EXPECT_PRED3(within_rtol, b.busbw, S / t * dtl::bus_factor(op, n), 1e-12)
            << dtl::to_string(op) << " n=" << n;
      }
  // n = 1, as nccl-tests computes it: factor 0 for the (n-1)/n ops, 1 for reduce and send.
  EXPECT_EQ(OBSERVE(dtl::lab07::bus_bandwidth(OpType::ReduceScatter, 1e6, 1.0, 1).busbw), 0.0);
  EXPECT_EQ(OBSERVE(dtl::lab07::bus_bandwidth(OpType::AllToAll, 1e6, 1.0, 1).busbw), 0.0);
  EXPECT_PRED2(rel_close, OBSERVE(dtl::lab07::bus_bandwidth(OpType::Reduce, 1e6, 1.0, 1).busbw),
               1e6);
  EXPECT_EQ(OBSERVE(dtl::lab07::bus_bandwidth(OpType::AllReduce, 0.0, 1.0, 4).busbw), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THAT(error_of([&] { dtl::lab07::bus_bandwidth(OpType::AllReduce, inf, 1.0, 4); }),
              HasSubstr("bytes"));
  EXPECT_THAT(error_of([&] { dtl::lab07::bus_bandwidth(OpType::AllReduce, 1.0, inf, 4); }),
              HasSubstr("seconds"));
  EXPECT_THAT(error_of([] { dtl::lab07::bus_bandwidth(OpType::Split, 1.0, 1.0, 4); }),
              HasSubstr("op"));
  EXPECT_THAT(error_of([] { dtl::lab07::bus_bandwidth(OpType::Broadcast, 1.0, 1.0, -3); }),
              HasSubstr("ranks"));
}

TEST(GradeFitAlphaBeta, ManySamplesAndLargeSizes) {
  // 40 samples, 1 GB to 10 GB, with a deterministic wobble: the exact least-squares answer.
  std::vector<Sample> s;
  for (int i = 0; i < 40; ++i) {
    const double S = 1e9 + 2.25e8 * i;
    s.push_back({S, 20e-6 + S / 150e9 + 1e-4 * std::sin(1.7 * i)});
  }
  const auto [intercept, slope] = least_squares(s);
  const auto fit = observed(dtl::lab07::fit_alpha_beta(s));
  EXPECT_PRED3(within_rtol, fit.beta, 1 / slope, 1e-9);
  EXPECT_NEAR(fit.alpha, std::max(0.0, intercept), 1e-9);
  // Large sizes close together: 1e12 + 0..4 MB, alpha 10 us, beta 25 GB/s.
  std::vector<Sample> close;
  for (int i = 0; i < 5; ++i) {
    const double S = 1e12 + 1e6 * i;
    close.push_back({S, 10e-6 + S / 25e9});
  }
  const auto f2 = observed(dtl::lab07::fit_alpha_beta(close));
  EXPECT_PRED3(within_rtol, f2.beta, 25e9, 1e-4);
}

TEST(GradeCostModel, ManyTopologiesAndTheChooser) {
  for (int k : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 16})
      for (double S : {0.0, 1.0, 4096.0, 3e6, 13.5e9}) {
        const Topology t{{3e-6, 150e9}, {12e-6, 12.5e9}, k, m};
        const double f = expected_flat(t, S), h = expected_hierarchical(t, S);
        EXPECT_PRED3(within_rtol, OBSERVE(dtl::lab07::flat_ring_time(t, S)), f, 1e-9)
            << "k=" << k << " m=" << m << " S=" << S;
        EXPECT_PRED3(within_rtol, OBSERVE(dtl::lab07::hierarchical_time(t, S)), h, 1e-9)
            << "k=" << k << " m=" << m << " S=" << S;
        const auto pick = OBSERVE(dtl::lab07::choose_algorithm(t, S));
        const auto expected_pick = h < f * (1 - 1e-6)   ? AllReduceAlgorithm::Hierarchical
                                   : f < h * (1 - 1e-6) ? AllReduceAlgorithm::FlatRing
                                   : (k == 1 || m == 1 || S == 0.0)
                                       ? AllReduceAlgorithm::FlatRing  // the same ring: a tie
                                       : pick;                         // too close to call
        EXPECT_EQ(pick, expected_pick) << "k=" << k << " m=" << m << " S=" << S;
      }
  // One rank in all: nothing to do.
  const Topology one{{1e-6, 1e9}, {1e-6, 1e9}, 1, 1};
  EXPECT_EQ(OBSERVE(dtl::lab07::flat_ring_time(one, 1e9)), 0.0);
  EXPECT_EQ(OBSERVE(dtl::lab07::hierarchical_time(one, 1e9)), 0.0);
  // One rank per node: no intra-node link needed.
  const Topology spread{{}, {1e-6, 1e9}, 1, 4};
  const double spread_hier = OBSERVE(dtl::lab07::hierarchical_time(spread, 1e9));
  EXPECT_PRED2(rel_close, spread_hier, OBSERVE(dtl::lab07::flat_ring_time(spread, 1e9)));
  Topology bad{{1e-6, -1.0}, {1e-6, 1e9}, 2, 2};
  EXPECT_THAT(error_of([&] { dtl::lab07::flat_ring_time(bad, 1e9); }), HasSubstr("beta"));
  bad = Topology{{1e-6, 1e9}, {-1.0, 1e9}, 2, 2};
  EXPECT_THAT(error_of([&] { dtl::lab07::choose_algorithm(bad, 1e9); }), HasSubstr("alpha"));
}

}  // namespace
