// Public tests of lab 03, run at world sizes 1-5 (./lab test 03).
//
// Oracles: the Comm built-ins (MPI's own collectives) on the same random data; closed-form
// formulas for the cost model; Comm::stats() for how many messages and bytes an algorithm sends.
// Each test uses a fresh Comm (world().dup()): its stats start at zero, and a buggy algorithm
// that leaves a message unreceived cannot break the next test.
#include "ring_allreduce.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "tests/ring_test_util.hpp"

namespace {

using namespace lab03_test;  // NOLINT: fresh_comm, random_tensor, reduced_equal, ...
using dtl::lab03::Algorithm;
using dtl::lab03::chunk_range;

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kInt64,
                                                torch::kBFloat16};

// ================================================================ Task 1: the cost model

constexpr double kAlpha = 5e-6;  // 5 us per message
constexpr double kBeta = 10e9;   // 10 GB/s, in bytes per second

bool rel_close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b)); }

TEST(AlphaBeta, RingAllReduceFormula) {
  for (int n : {2, 3, 4, 8, 16})
    for (double S : {0.0, 1024.0, 1e9}) {
      const double expected = 2.0 * (n - 1) * kAlpha + 2.0 * (n - 1) / n * S / kBeta;
      EXPECT_PRED2(rel_close,
                   OBSERVE(dtl::lab03::alpha_beta_time(Algorithm::RingAllReduce, n, S, kAlpha, kBeta)),
                   expected)
          << "n=" << n << " S=" << S;
    }
  // Worked example: 4 ranks, 1 GB, 10 us, 10 GB/s: 6 x 10 us + 1.5 x 0.1 s = 0.15006 s.
  EXPECT_NEAR(OBSERVE(dtl::lab03::alpha_beta_time(Algorithm::RingAllReduce, 4, 1e9, 1e-5, 10e9)),
              0.15006, 1e-12);
  EXPECT_EQ(OBSERVE(dtl::lab03::alpha_beta_time(Algorithm::RingAllReduce, 1, 1e9, kAlpha, kBeta)), 0.0)
      << "one rank communicates nothing";
}

TEST(AlphaBeta, RingReduceScatterAndAllGatherAreHalfTheAllReduce) {
  for (int n : {2, 3, 5, 8})
    for (auto algo : {Algorithm::RingReduceScatter, Algorithm::RingAllGather}) {
      const double S = 64e6;
      const double expected = (n - 1) * kAlpha + (n - 1.0) / n * S / kBeta;
      EXPECT_PRED2(rel_close, OBSERVE(dtl::lab03::alpha_beta_time(algo, n, S, kAlpha, kBeta)), expected)
          << dtl::lab03::to_string(algo) << " n=" << n;
    }
}

TEST(AlphaBeta, RecursiveDoublingFormula) {
  const double S = 1e6, round = kAlpha + S / kBeta;
  // n -> rounds: lg n for powers of two, floor(lg n) + 2 otherwise (fold in and out).
  const std::vector<std::pair<int, int>> rounds = {{1, 0}, {2, 1}, {3, 3}, {4, 2},  {5, 4},
                                                   {6, 4}, {7, 4}, {8, 3}, {12, 5}, {16, 4}};
  for (auto [n, k] : rounds)
    EXPECT_PRED2(
        rel_close,
        OBSERVE(dtl::lab03::alpha_beta_time(Algorithm::RecursiveDoublingAllReduce, n, S, kAlpha, kBeta)),
        k * round)
        << "n=" << n << " should take " << k << " rounds";
}

TEST(AlphaBeta, LatencyBoundVersusBandwidthBound) {
  // 8 ranks: 3 rounds of recursive doubling beat 14 ring steps on a small message, and the
  // ring's 1.75 S on the wire beats recursive doubling's 3 S on a large one.
  auto t = [](Algorithm a, double S) {
    return OBSERVE(dtl::lab03::alpha_beta_time(a, 8, S, kAlpha, kBeta));
  };
  EXPECT_LT(t(Algorithm::RecursiveDoublingAllReduce, 1024), t(Algorithm::RingAllReduce, 1024));
  EXPECT_LT(t(Algorithm::RingAllReduce, 64 << 20),
            t(Algorithm::RecursiveDoublingAllReduce, 64 << 20));
}

TEST(AlphaBeta, RejectsBadArguments) {
  using dtl::lab03::alpha_beta_time;
  EXPECT_THAT(error_of([] { alpha_beta_time(Algorithm::RingAllReduce, 4, 1e6, kAlpha, 0.0); }),
              ::testing::HasSubstr("beta"));
  EXPECT_THAT(error_of([] { alpha_beta_time(Algorithm::RingAllReduce, 4, -1.0, kAlpha, kBeta); }),
              ::testing::HasSubstr("bytes"));
  EXPECT_THAT(error_of([] { alpha_beta_time(Algorithm::RingAllReduce, 4, 1e6, -1.0, kBeta); }),
              ::testing::HasSubstr("alpha"));
  EXPECT_NE(error_of([] { alpha_beta_time(Algorithm::RingAllReduce, 0, 1e6, kAlpha, kBeta); }),
            "(no dtl::Error)");
}

// ================================================================ Task 2: ring reduce-scatter

TEST(RingReduceScatter, MatchesBuiltinOnEqualChunks) {
  auto comm = fresh_comm();
  const int n = comm->size();
  for (auto dtype : kDtypes)
    for (auto op : {ReduceOp::Sum, ReduceOp::Max})
      for (int64_t chunk : {1, 3, 1000}) {
        auto input = random_tensor(chunk * n, dtype);
        auto before = input.clone();
        auto expected = torch::empty({chunk}, device_options(dtype));
        comm->reduce_scatter(expected, input, op);
        auto output = prefilled({chunk}, -1, device_options(dtype));
        dtl::lab03::ring_reduce_scatter(*comm, output, input, op);
        EXPECT_TRUE(reduced_equal(output, expected, op)) << label(dtype, op, chunk * n);
        DTL_EXPECT_EQUAL(input, before)
            << "the input must stay untouched, " << label(dtype, op, chunk * n);
      }
}

TEST(RingReduceScatter, UnevenSizesFollowTheChunkLayout) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  for (auto dtype : {torch::kFloat32, torch::kInt64})
    for (int64_t numel : test_sizes(n)) {
      auto input = random_tensor(numel, dtype);
      auto full = input.clone();
      comm->all_reduce(full);
      const auto mine = chunk_range(numel, n, r);
      auto output = prefilled({mine.size()}, -1, device_options(dtype));
      dtl::lab03::ring_reduce_scatter(*comm, output, input);
      EXPECT_TRUE(reduced_equal(output, full.slice(0, mine.begin, mine.end), ReduceOp::Sum))
          << label(dtype, ReduceOp::Sum, numel) << ": rank " << r << " must hold elements ["
          << mine.begin << ", " << mine.end << ")";
    }
}

TEST(RingReduceScatter, AverageDividesOnce) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  for (auto dtype : {torch::kFloat64, torch::kInt64}) {
    const int64_t numel = 5 * n + 2;
    auto input = random_tensor(numel, dtype);
    auto full = input.clone();
    comm->all_reduce(full, ReduceOp::Avg);
    const auto mine = chunk_range(numel, n, r);
    auto output = torch::empty({mine.size()}, device_options(dtype));
    dtl::lab03::ring_reduce_scatter(*comm, output, input, ReduceOp::Avg);
    EXPECT_TRUE(reduced_equal(output, full.slice(0, mine.begin, mine.end), ReduceOp::Avg))
        << label(dtype, ReduceOp::Avg, numel);
  }
}

// The traffic tests check the result too (on random input): counters are measured inside the
// process under test, so a test must never pass on them alone.
TEST(RingReduceScatter, SendsEveryChunkButItsOwnToOneNeighbour) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const int64_t numel = 1001;  // not divisible by 2..5; chunks of 4 KiB at most
  auto input = random_tensor(numel, torch::kFloat32);
  auto full = input.clone();
  comm->all_reduce(full);
  comm->reset_stats();  // count only what the ring sends
  const auto mine = chunk_range(numel, n, r);
  auto output = prefilled({mine.size()}, -1, device_options());
  dtl::lab03::ring_reduce_scatter(*comm, output, input);
  EXPECT_TRUE(reduced_equal(output, full.slice(0, mine.begin, mine.end), ReduceOp::Sum));
  const auto s = MEASURED(comm->stats());
  EXPECT_EQ(s[OpType::SendRecv].count, n - 1) << "one sendrecv per ring step, n-1 steps";
  EXPECT_EQ(collectives_used(s), "") << "build it from sendrecv only";
  // Over all ranks, the chain of every chunk has n-1 hops: (n-1) x S bytes in total.
  EXPECT_EQ(dtl::sum_over_ranks(static_cast<double>(s[OpType::SendRecv].bytes)),
            (n - 1) * numel * 4.0);
  EXPECT_LE(MEASURED(sendrecv_destinations(*comm)).size(), 1u) << "a ring talks to one neighbour only";
}

// ================================================================ Task 3: ring all-gather

TEST(RingAllGather, MatchesBuiltinOnEqualChunks) {
  auto comm = fresh_comm();
  const int n = comm->size();
  for (auto dtype : kDtypes)
    for (int64_t chunk : {1, 3, 1000}) {
      auto input = random_tensor(chunk, dtype);
      auto expected = torch::empty({chunk * n}, device_options(dtype));
      comm->all_gather(expected, input);
      auto output = prefilled({chunk * n}, -1, device_options(dtype));
      dtl::lab03::ring_all_gather(*comm, output, input);
      DTL_EXPECT_EQUAL(output, expected) << label(dtype, ReduceOp::Sum, chunk * n);
    }
}

TEST(RingAllGather, UnevenChunksReassembleTheWhole) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  for (auto dtype : {torch::kFloat32, torch::kInt64, torch::kBFloat16})
    for (int64_t numel : test_sizes(n)) {
      // The same tensor on every rank (same seed); each rank contributes its chunk of it.
      auto whole = dtl::testing::serial(42 + numel, [&] { return random_tensor(numel, dtype); });
      const auto mine = chunk_range(numel, n, r);
      auto input = whole.slice(0, mine.begin, mine.end).clone();
      auto output = prefilled({numel}, -1, device_options(dtype));
      dtl::lab03::ring_all_gather(*comm, output, input);
      DTL_EXPECT_EQUAL(output, whole) << c10::toString(dtype) << " numel " << numel;
    }
}

TEST(RingAllGather, InputMayBeItsOwnSliceOfTheOutput) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const int64_t numel = 4 * n + 3;
  auto whole = dtl::testing::serial(7, [&] { return torch::randn({numel}); });
  const auto mine = chunk_range(numel, n, r);
  auto output = prefilled({numel}, -1, device_options());
  output.slice(0, mine.begin, mine.end).copy_(whole.slice(0, mine.begin, mine.end));
  dtl::lab03::ring_all_gather(*comm, output, output.slice(0, mine.begin, mine.end));
  DTL_EXPECT_EQUAL(output, whole);
}

TEST(RingAllGather, ForwardsEveryChunkButOneToOneNeighbour) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const int64_t numel = 1001;
  auto whole = dtl::testing::serial(11, [&] { return random_tensor(numel, torch::kFloat32); });
  const auto mine = chunk_range(numel, n, r);
  auto output = prefilled({numel}, -1, device_options());
  dtl::lab03::ring_all_gather(*comm, output, whole.slice(0, mine.begin, mine.end).clone());
  DTL_EXPECT_EQUAL(output, whole);
  const auto s = MEASURED(comm->stats());
  EXPECT_EQ(s[OpType::SendRecv].count, n - 1);
  EXPECT_EQ(collectives_used(s), "");
  EXPECT_EQ(dtl::sum_over_ranks(static_cast<double>(s[OpType::SendRecv].bytes)),
            (n - 1) * numel * 4.0);
  EXPECT_LE(MEASURED(sendrecv_destinations(*comm)).size(), 1u);
}

// ================================================================ Task 4: ring all-reduce

// An all-reduce implementation against Comm::all_reduce, over every size class, dtype and op.
template <typename AllReduce>
void expect_matches_builtin(AllReduce&& all_reduce) {
  auto comm = fresh_comm();
  for (auto dtype : kDtypes)
    for (auto op : {ReduceOp::Sum, ReduceOp::Max})
      for (int64_t numel : test_sizes(comm->size())) {
        auto t = random_tensor(numel, dtype);
        auto expected = t.clone();
        comm->all_reduce(expected, op);
        all_reduce(*comm, t, op);
        EXPECT_TRUE(reduced_equal(t, expected, op)) << label(dtype, op, numel);
      }
}

TEST(RingAllReduce, MatchesBuiltinForManySizesDtypesAndOps) {
  expect_matches_builtin([](Comm& c, const torch::Tensor& t, ReduceOp op) {
    dtl::lab03::ring_all_reduce(c, t, op);
  });
}

TEST(RingAllReduce, IntegerSumsAreExactAndAverageMatches) {
  auto comm = fresh_comm();
  for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{300007}}) {
    auto t = random_tensor(numel, torch::kInt64);
    auto expected = t.clone();
    comm->all_reduce(expected);
    dtl::lab03::ring_all_reduce(*comm, t);
    DTL_EXPECT_EQUAL(t, expected) << "int64 sums are exact in any order, numel " << numel;
  }
  for (auto dtype : {torch::kFloat32, torch::kInt64}) {
    auto t = random_tensor(777, dtype);
    auto expected = t.clone();
    comm->all_reduce(expected, ReduceOp::Avg);
    dtl::lab03::ring_all_reduce(*comm, t, ReduceOp::Avg);
    EXPECT_TRUE(reduced_equal(t, expected, ReduceOp::Avg)) << label(dtype, ReduceOp::Avg, 777);
  }
}

TEST(RingAllReduce, LargeTensorEveryRankHoldsTheSameBits) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const int64_t numel = (3 << 19) + 1;  // 6 MiB of float32: big enough to be pipelined
  auto t = random_tensor(numel, torch::kFloat32);
  auto expected = t.clone();
  comm->all_reduce(expected);
  comm->reset_stats();
  dtl::lab03::ring_all_reduce(*comm, t);
  EXPECT_TRUE(reduced_equal(t, expected, ReduceOp::Sum));
  // Replicas of a model must not drift apart: the result is bitwise identical everywhere.
  DTL_EXPECT_SAME_ON_ALL_RANKS(t);
  const auto s = MEASURED(comm->stats());
  EXPECT_EQ(dtl::sum_over_ranks(static_cast<double>(s[OpType::SendRecv].bytes)),
            2.0 * (n - 1) * numel * 4)
      << "the ring sends each chunk n-1 times in each phase";
}

TEST(RingAllReduce, WritesIntoTheCallersTensorAndViews) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  // A contiguous 2-D tensor: same storage, same shape, reduced values.
  auto t = torch::arange(7 * 13, device_options(torch::kFloat64)).reshape({7, 13}) + r;
  const void* storage = t.data_ptr();
  dtl::lab03::ring_all_reduce(*comm, t);
  EXPECT_TRUE(OBSERVE(t.data_ptr() == storage)) << "the result must land in the tensor's own storage";
  EXPECT_EQ(OBSERVE(t.sizes().vec()), (std::vector<int64_t>{7, 13}));
  DTL_EXPECT_EQUAL(t,
                   torch::arange(7 * 13, device_options(torch::kFloat64)).reshape({7, 13}) * n + n * (n - 1) / 2.0);
  // A non-contiguous view (every other column): the view sees the result, the columns in
  // between stay untouched.
  auto base = torch::full({5, 8}, 100.0f + r, device_options());
  auto view = base.slice(1, 0, 8, 2);
  ASSERT_FALSE(view.is_contiguous());
  dtl::lab03::ring_all_reduce(*comm, view, ReduceOp::Max);
  DTL_EXPECT_EQUAL(base.slice(1, 0, 8, 2), torch::full({5, 4}, 100.0f + (n - 1), device_options()));
  DTL_EXPECT_EQUAL(base.slice(1, 1, 8, 2), torch::full({5, 4}, 100.0f + r, device_options()));
}

TEST(RingAllReduce, TwoNMinusOneStepsAndBandwidthOptimalBytes) {
  const std::vector<int64_t> sizes = {1000, 1001};  // chunks of at most 4 KiB: one message/step
  for (int64_t numel : sizes) {
    auto comm = fresh_comm();
    const int n = comm->size(), r = comm->rank();
    auto t = random_tensor(numel, torch::kFloat32);
    auto expected = t.clone();
    comm->all_reduce(expected);
    comm->reset_stats();
    dtl::lab03::ring_all_reduce(*comm, t);
    EXPECT_TRUE(reduced_equal(t, expected, ReduceOp::Sum)) << "numel " << numel;
    const auto s = MEASURED(comm->stats());
    EXPECT_EQ(s[OpType::SendRecv].count, 2 * (n - 1))
        << "n-1 reduce-scatter + n-1 all-gather steps";
    EXPECT_EQ(collectives_used(s), "") << "build it from sendrecv only";
    EXPECT_LE(MEASURED(sendrecv_destinations(*comm)).size(), 1u) << "a ring talks to one neighbour only";
    const double S = numel * 4.0, sent = static_cast<double>(s[OpType::SendRecv].bytes);
    EXPECT_EQ(dtl::sum_over_ranks(sent), 2.0 * (n - 1) * S) << "numel " << numel;
    if (numel % n == 0) {
      EXPECT_EQ(sent, 2.0 * (n - 1) / n * S) << "each rank sends 2(n-1)/n x S";
    } else {
      // Each rank sends every chunk but one in each phase: 2S minus two chunks.
      const auto [lo, hi] = chunk_extremes(numel, n);
      EXPECT_GE(sent, 2 * S - 2 * hi * 4.0) << "rank " << r;
      EXPECT_LE(sent, 2 * S - 2 * lo * 4.0) << "rank " << r;
    }
  }
}

// ================================================================ Task 5: recursive doubling

TEST(RecursiveDoubling, MatchesBuiltinForManySizesDtypesAndOps) {
  expect_matches_builtin([](Comm& c, const torch::Tensor& t, ReduceOp op) {
    dtl::lab03::recursive_doubling_all_reduce(c, t, op);
  });
}

TEST(RecursiveDoubling, SameBitsEverywhereAndInPlace) {
  auto comm = fresh_comm();
  auto base = torch::randn({6, 9}, torch::kFloat32).to(device());
  auto view = base.t();  // non-contiguous
  auto expected = view.contiguous();
  comm->all_reduce(expected);
  dtl::lab03::recursive_doubling_all_reduce(*comm, view);
  EXPECT_TRUE(reduced_equal(view, expected, ReduceOp::Sum));
  DTL_EXPECT_SAME_ON_ALL_RANKS(base);
  auto avg = random_tensor(100, torch::kInt64), avg_expected = avg.clone();
  comm->all_reduce(avg_expected, ReduceOp::Avg);
  dtl::lab03::recursive_doubling_all_reduce(*comm, avg, ReduceOp::Avg);
  DTL_EXPECT_EQUAL(avg, avg_expected);
}

TEST(RecursiveDoubling, LogarithmicNumberOfMessages) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const int64_t numel = 1000;
  auto t = random_tensor(numel, torch::kFloat32);
  auto expected = t.clone();
  comm->all_reduce(expected);
  comm->reset_stats();
  dtl::lab03::recursive_doubling_all_reduce(*comm, t);
  EXPECT_TRUE(reduced_equal(t, expected, ReduceOp::Sum));
  const auto s = MEASURED(comm->stats());
  EXPECT_EQ(collectives_used(s), "") << "build it from point-to-point calls only";
  const int lg = floor_log2(n);
  const int64_t p2p = s[OpType::SendRecv].count + s[OpType::Send].count + s[OpType::Recv].count;
  if ((1 << lg) == n) {
    EXPECT_EQ(s[OpType::SendRecv].count, lg) << "lg n rounds of one sendrecv each";
    EXPECT_EQ(s[OpType::SendRecv].bytes, lg * numel * 4) << "each round moves the whole tensor";
    EXPECT_EQ(p2p, lg);
  } else {
    EXPECT_LE(p2p, lg + 2) << "lg p rounds plus folding in and out";
    EXPECT_GE(p2p, 1);
  }
}

// ================================================================ bad input

TEST(BadInput, SizeAndDtypeErrorsNameTheConstraint) {
  auto comm = fresh_comm();
  const int n = comm->size();
  dtl::lab03::ring_all_reduce(*comm, torch::ones({3}, device_options()));  // the happy path first
  const int64_t numel = 4 * n + 1;
  const int64_t right_size = chunk_range(numel, n, comm->rank()).size();
  comm->reset_stats();
  EXPECT_THAT(error_of([&] {
                dtl::lab03::ring_reduce_scatter(*comm, torch::empty({right_size + 1}, device_options()),
                                                torch::ones({numel}, device_options()));
              }),
              ::testing::HasSubstr("chunk"));
  EXPECT_THAT(error_of([&] {
                dtl::lab03::ring_all_gather(*comm, torch::empty({numel}, device_options()),
                                            torch::ones({right_size + 2}, device_options()));
              }),
              ::testing::HasSubstr("chunk"));
  EXPECT_THAT(error_of([&] {
                dtl::lab03::ring_reduce_scatter(*comm, torch::empty({right_size}, device_options(torch::kInt64)),
                                                torch::ones({numel}, device_options()));
              }),
              ::testing::HasSubstr("dtype"));
  EXPECT_THAT(error_of([&] { dtl::lab03::ring_all_reduce(*comm, torch::ones({4}, device_options(torch::kBool))); }),
              ::testing::HasSubstr("dtype"));
  EXPECT_EQ(MEASURED(comm->stats()).total_count(), 0) << "a rejected call must not send anything";
}

}  // namespace
