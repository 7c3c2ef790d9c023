// Lab 16 public tests: exposed communication read from Chrome traces (the runtime's own
// trace::summary is the oracle), the bucket model's numbers and its U shape, and the collective
// matmul: equal to the serial matmul, bitwise equal in both modes, its messages, and its
// transfers in flight while it computes (under the emulator's latency floor). Run: ./lab test 16.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "overlap_test_util.hpp"

namespace lab16_test {
namespace {

using dtl::lab16::BackwardProfile;
using dtl::lab16::best_bucket_cap;
using dtl::lab16::bucket_timing;
using dtl::lab16::overlap_from_chrome;
using dtl::lab16::overlap_report;
using dtl::testing::expect_error_mentions;
using dtl::trace::Event;

// ---------------------------------------------------------------- Task 1: reading a trace

TEST(TraceReading, HandCases) {
  std::vector<Event> evs = {
      ev(0, "compute", 0.000, 0.010),        // rank 0: compute [0, 10] ms
      ev(0, "comm world", 0.005, 0.015),     //         comm [5, 15]: 5 ms exposed
      ev(1, "compute", 0.000, 0.020),        // rank 1: comm entirely under compute
      ev(1, "comm world", 0.002, 0.008),
      ev(2, "comm world", 0.000, 0.004),     // rank 2: two comm tracks overlapping: 6 ms of comm
      ev(2, "comm world/dup", 0.002, 0.006),
      ev(2, "compute", 0.010, 0.010),        //         a zero-length compute event
  };
  const auto r = observed(overlap_from_chrome(dtl::trace::chrome_json(evs)));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].rank, 0);
  EXPECT_NEAR(r[0].wall, 0.015, 1e-12);
  EXPECT_NEAR(r[0].compute, 0.010, 1e-12);
  EXPECT_NEAR(r[0].comm, 0.010, 1e-12);
  EXPECT_NEAR(r[0].exposed_comm, 0.005, 1e-12);
  EXPECT_NEAR(r[1].exposed_comm, 0.0, 1e-12);
  EXPECT_NEAR(r[1].hidden_comm(), 0.006, 1e-12);
  EXPECT_NEAR(r[2].comm, 0.006, 1e-12) << "two ops in flight at once count once";
  EXPECT_NEAR(r[2].exposed_comm, 0.006, 1e-12);
  EXPECT_NEAR(r[2].compute, 0.0, 1e-12);
}

TEST(TraceReading, WindowClipsEveryEvent) {
  std::vector<Event> evs = {ev(0, "compute", 0.000, 0.010), ev(0, "comm world", 0.005, 0.015)};
  const auto r = observed(overlap_from_chrome(dtl::trace::chrome_json(evs), 0.008, 0.012));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NEAR(r[0].wall, 0.004, 1e-12);
  EXPECT_NEAR(r[0].compute, 0.002, 1e-12);
  EXPECT_NEAR(r[0].comm, 0.004, 1e-12);
  EXPECT_NEAR(r[0].exposed_comm, 0.002, 1e-12);
}

// Random timelines of three ranks, several Comm tracks each: the same numbers as the runtime's
// trace::summary, over the whole trace and over a window.
TEST(TraceReading, MatchesTheRuntimesSummary) {
  std::mt19937 rng(16);
  std::uniform_real_distribution<double> at(0, 1), len(0, 0.2);
  std::vector<Event> evs;
  const char* tracks[] = {"compute", "comm world", "comm world/dup", "compute"};
  for (int rank = 0; rank < 3; ++rank)
    for (int k = 0; k < 40; ++k) {
      const double s = at(rng);
      evs.push_back(ev(rank, tracks[k % 4], s, s + len(rng)));
    }
  for (auto [from, to] : {std::pair<double, double>{-1, -1}, {0.25, 0.7}}) {
    const auto got = observed(overlap_from_chrome(dtl::trace::chrome_json(evs), from, to));
    ASSERT_EQ(got.size(), 3u);
    for (int rank = 0; rank < 3; ++rank) {
      std::vector<Event> mine;
      for (const auto& e : evs)
        if (e.rank == rank) mine.push_back(e);
      const auto want = dtl::trace::summary(mine, from, to);
      EXPECT_NEAR(got[rank].wall, want.wall, 1e-9) << "rank " << rank << ", window " << from;
      EXPECT_NEAR(got[rank].compute, want.compute, 1e-9) << "rank " << rank << ", window " << from;
      EXPECT_NEAR(got[rank].comm, want.comm, 1e-9) << "rank " << rank << ", window " << from;
      EXPECT_NEAR(got[rank].exposed_comm, want.exposed_comm, 1e-9) << "rank " << rank << ", window " << from;
    }
  }
}

// A trace the runtime records for real: compute scopes and asynchronous all-reduces.
TEST(TraceReading, ReadsARecordedTrace) {
  auto comm = fresh_comm();
  Tracing on;
  torch::Tensor t = torch::ones({1 << 16}, dtl::testing::device_options());
  for (int k = 0; k < 3; ++k) {
    dtl::Work w = comm->all_reduce_async(t);
    {
      DTL_SCOPE("busy");
      torch::Tensor a = torch::randn({128, 128}, dtl::testing::device_options());
      for (int i = 0; i < 8; ++i) a = a.matmul(a).tanh();
    }
    w.wait();
  }
  // The trace is this process's (its times MEASURED, through the runtime's summary of it); the
  // code under test reads it.
  const auto mine = dtl::trace::events();
  const auto got = observed(overlap_from_chrome(dtl::trace::chrome_json(mine)));
  const auto want = measured(dtl::trace::summary(mine));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_GT(got[0].comm, 0.0);
  EXPECT_NEAR(got[0].compute, want.compute, 1e-6);
  EXPECT_NEAR(got[0].comm, want.comm, 1e-6);
  EXPECT_NEAR(got[0].exposed_comm, want.exposed_comm, 1e-6);
}

TEST(TraceReading, ReportHasOneLinePerRank) {
  std::vector<Event> evs = {ev(0, "compute", 0, 0.010), ev(0, "comm world", 0.005, 0.015),
                            ev(3, "compute", 0, 0.002)};
  const std::string report =
      OBSERVE(overlap_report(overlap_from_chrome(dtl::trace::chrome_json(evs))));
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), 3) << report;  // a header, two ranks
  EXPECT_NE(report.find("50%"), std::string::npos) << "rank 0 hides half its comm:\n" << report;
  EXPECT_NE(report.find("5.00"), std::string::npos) << "rank 0's 5 ms exposed:\n" << report;
  // A quarter hidden: comm [7.5, 17.5] ms under compute [0, 10] ms. The share is the hidden one.
  evs = {ev(1, "compute", 0, 0.010), ev(1, "comm world", 0.0075, 0.0175)};
  const std::string quarter =
      OBSERVE(overlap_report(overlap_from_chrome(dtl::trace::chrome_json(evs))));
  EXPECT_NE(quarter.find("25%"), std::string::npos) << "2.5 of 10 ms hidden:\n" << quarter;
  EXPECT_EQ(quarter.find("75%"), std::string::npos) << "75% is the exposed share, not the hidden one:\n"
                                                   << quarter;
  EXPECT_NE(quarter.find("7.50"), std::string::npos) << "7.5 ms exposed:\n" << quarter;
}

TEST(TraceReading, BadTracesAreNamed) {
  expect_error_mentions([] { overlap_from_chrome("{not json"); }, "trace");
  expect_error_mentions([] { overlap_from_chrome("{\"events\": []}"); }, "trace");
  expect_error_mentions([] { overlap_from_chrome(dtl::trace::chrome_json({}), 2.0, 1.0); }, "window");
}

// ---------------------------------------------------------------- Task 2: the bucket model

// Four gradients of 100 B, ready at 10, 20, 30, 40 ms (the last registered first: index 3 at
// 10 ms), backward 40 ms, alpha 5 ms, beta 0.1 ms per byte (10 ms per gradient).
TEST(BucketModel, HandComputed) {
  BackwardProfile p;
  p.grad_bytes = {100, 100, 100, 100};
  p.ready_at = {0.040, 0.030, 0.020, 0.010};
  p.backward = 0.040;
  p.alpha = 0.005;
  p.beta = 1e-4;
  // One gradient per bucket, 15 ms each: [10,25], then each waits for the one before:
  // [25,40] [40,55] [55,70].
  auto t = observed(bucket_timing(p, 100, 100));
  EXPECT_EQ(t.buckets, 4);
  EXPECT_NEAR(t.total, 0.070, 1e-12);
  EXPECT_NEAR(t.exposed, 0.030, 1e-12);
  // Two per bucket: buckets {3,2} ready at 20 ms -> [20,45]; {1,0} ready 40 -> [45,70].
  t = observed(bucket_timing(p, 200, 200));
  EXPECT_EQ(t.buckets, 2);
  EXPECT_NEAR(t.total, 0.070, 1e-12);
  // One bucket: starts when backward ends, all of it exposed: 40 + 5 + 40.
  t = observed(bucket_timing(p, 1000, 1000));
  EXPECT_EQ(t.buckets, 1);
  EXPECT_NEAR(t.total, 0.085, 1e-12);
  EXPECT_NEAR(t.exposed, 0.045, 1e-12);
  // A small first bucket, then one for the rest: {3} [10,25]; {2,1,0} ready 40 -> [40,75].
  t = observed(bucket_timing(p, 100, 1000));
  EXPECT_EQ(t.buckets, 2);
  EXPECT_NEAR(t.total, 0.075, 1e-12);
  // Communication that ends before backward does: the step still lasts the whole backward.
  BackwardProfile early;
  early.grad_bytes = {100, 100};
  early.ready_at = {0.010, 0.005};
  early.backward = 0.040;
  early.alpha = 0.001;
  early.beta = 1e-5;  // 1 ms per gradient: {1} [5, 7] ms, {0} [10, 12] ms
  t = observed(bucket_timing(early, 100, 100));
  EXPECT_NEAR(t.total, 0.040, 1e-12) << "total = max(backward, the last bucket's end)";
  EXPECT_NEAR(t.exposed, 0.0, 1e-12);
}

// A realistic backward: 48 gradients of 64 KiB ready at a steady rate over 120 ms, an
// all-reduce of 3 ms latency and 100 MB/s. Tiny buckets pay the latency 48 times; one bucket
// exposes everything; in between the totals dip: the U the sweep measures.
TEST(BucketModel, UShapeAndBestCap) {
  const BackwardProfile p = steady_profile(48, 64 << 10, 0.120, 0.003, 1e-8);
  std::vector<int64_t> caps;
  for (int64_t cap = 64 << 10; cap <= (int64_t{48} * 64 << 10); cap *= 2) caps.push_back(cap);
  std::vector<double> totals;
  for (int64_t cap : caps) totals.push_back(bucket_timing(p, cap, cap).total);
  totals = OBSERVE(totals);
  ASSERT_EQ(totals.size(), caps.size());
  const size_t best = static_cast<size_t>(std::min_element(totals.begin(), totals.end()) - totals.begin());
  EXPECT_GT(best, 0u) << "the smallest cap must not be the best: it pays the latency per gradient";
  EXPECT_LT(best, caps.size() - 1) << "the largest cap must not be the best: it starts after backward";
  EXPECT_GT(totals.front(), totals[best] * 1.05);
  EXPECT_GT(totals.back(), totals[best] * 1.05);
  EXPECT_EQ(OBSERVE(best_bucket_cap(p, caps)), caps[best]);
}

TEST(BucketModel, TiesGoToTheSmallestCap) {
  BackwardProfile p;  // no latency, no bandwidth cost: every cap is as good
  p.grad_bytes = {10, 10, 10};
  p.ready_at = {0.3, 0.2, 0.1};
  p.backward = 0.3;
  EXPECT_EQ(OBSERVE(best_bucket_cap(p, {40, 20, 10, 30})), 10);
}

TEST(BucketModel, BadProfilesAreNamed) {
  BackwardProfile p;
  p.grad_bytes = {10, 10};
  p.ready_at = {0.1};
  p.backward = 0.2;
  expect_error_mentions([&] { bucket_timing(p, 10, 10); }, "ready_at");
  p.ready_at = {0.1, 0.3};
  expect_error_mentions([&] { bucket_timing(p, 10, 10); }, "ready_at");
  p.ready_at = {0.1, 0.05};
  p.alpha = -1;
  expect_error_mentions([&] { bucket_timing(p, 10, 10); }, "alpha");
  p.alpha = 0;
  p.beta = -1;
  expect_error_mentions([&] { bucket_timing(p, 10, 10); }, "beta");
  p.beta = 0;
  expect_error_mentions([&] { best_bucket_cap(p, {}); }, "caps");
}

// ---------------------------------------------------------------- Task 3: a collective matmul

TEST(CollectiveMatmul, EqualsTheSerialMatmulInBothModes) {
  auto comm = fresh_comm();
  for (auto [R, K, N] : {std::tuple<int64_t, int64_t, int64_t>{4, 8, 6}, {3, 5, 7}, {1, 16, 2}}) {
    const Problem pb(*comm, R, K, N);
    const torch::Tensor x_before = pb.x_local.clone();
    const torch::Tensor plain = dtl::lab16::allgather_matmul(pb.x_local, pb.weight, *comm, false);
    const torch::Tensor ring = dtl::lab16::allgather_matmul(pb.x_local, pb.weight, *comm, true);
    DTL_EXPECT_CLOSE(plain, pb.expected) << "R " << R << " K " << K << " N " << N;
    DTL_EXPECT_EQUAL(ring, OBSERVE(plain))
        << "the overlapped mode must compute exactly the same chunks";
    DTL_EXPECT_EQUAL(pb.x_local, x_before) << "x_local is the caller's: never receive into it";
  }
}

TEST(CollectiveMatmul, CommunicatesAsPromised) {
  const int n = dtl::world().size();
  const int64_t R = 5, K = 6, N = 4;
  for (bool overlap : {false, true}) {
    auto comm = fresh_comm();
    const Problem pb(*comm, R, K, N);
    comm->reset_stats();
    const torch::Tensor y = dtl::lab16::allgather_matmul(pb.x_local, pb.weight, *comm, overlap);
    const auto st = MEASURED(comm->stats());
    const std::string mode = overlap ? "overlap" : "no overlap";
    // The counters are measured in the process under test; the product is checked too.
    DTL_EXPECT_CLOSE(y, pb.expected) << mode;
    const int64_t chunk = R * K * 4;
    if (!overlap && n > 1) {
      EXPECT_EQ(st[OpType::AllGather].count, 2) << mode << ": the row check and x";
      EXPECT_EQ(st[OpType::AllGather].bytes, 8 * n + n * chunk) << mode;
      EXPECT_EQ(st.total_count(), 2) << mode;
    } else {
      EXPECT_EQ(st[OpType::AllGather].count, 1) << mode << ": the row check only";
      EXPECT_EQ(st[OpType::SendRecv].count, n - 1) << mode;
      EXPECT_EQ(st[OpType::SendRecv].bytes, (n - 1) * chunk) << mode << ": one chunk per step";
      EXPECT_EQ(st.total_count(), 1 + (n - 1)) << mode;
    }
  }
}

// Under a network whose every transfer takes at least 50 ms (the emulator's floor), the
// overlapped ring must have each transfer in flight while a chunk's matmul runs; the plain mode
// must have its all-gather done before the first matmul starts.
TEST(CollectiveMatmul, TransfersRunWhileChunksCompute) {
  const int n = dtl::world().size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks: one rank sends nothing";
  auto comm = fresh_comm();
  // Both halves of the oracle hold on the MPI backend only: the emulator shapes MPI transfers,
  // and there a blocking op blocks the host, so a trace's op spans are the transfers' real
  // spans. On NCCL an op's record spans its queueing on the GPU, not the host's matmuls.
  if (comm->backend() != "mpi")
    GTEST_SKIP() << "the network emulator shapes the MPI backend only (and NCCL ops do not "
                    "block the host)";
  const Problem pb(*comm, 64, 64, 64);
  SlowLinks slow("intra=1GB/s,50ms;nodes=1");
  for (bool overlap : {false, true}) {
    Tracing on;
    const torch::Tensor y = dtl::lab16::allgather_matmul(pb.x_local, pb.weight, *comm, overlap);
    const auto evs = dtl::trace::events();
    // A 64-term float32 dot product: chunked and whole sums differ in the last bits.
    DTL_EXPECT_CLOSE(y, pb.expected, 1e-4, 1e-5)
        << "the spans are measured in the process under test; the product is checked too";
    // The spans are this process's trace times (MEASURED).
    const auto matmuls = measured_spans(named(evs, "matmul chunk"));
    ASSERT_EQ(matmuls.size(), static_cast<size_t>(n)) << "one DTL_SCOPE(\"matmul chunk <s>\") per chunk";
    if (!overlap) {
      const auto gathers = measured_spans(named(evs, "all_gather"));
      ASSERT_EQ(gathers.size(), 2u);
      EXPECT_LE(gathers[1].end, matmuls[0].start) << "plain mode: gather, then compute";
      continue;
    }
    const auto sendrecvs = named(evs, "sendrecv");
    // When each transfer was issued (the runtime records it, in the event's args), on the same
    // clock as the matmul's scope: before the chunk's matmul ends, not after it.
    std::vector<double> issued_at;
    for (const auto& t : sendrecvs) {
      const auto args = nlohmann::json::parse(t.args);
      issued_at.push_back(t.start - args.at("issued_ms_before_start").get<double>() / 1e3);
    }
    const auto transfers = measured_spans(sendrecvs);
    const auto issued = MEASURED(issued_at);
    ASSERT_EQ(transfers.size(), static_cast<size_t>(n - 1));
    for (int j = 0; j < n - 1; ++j) {
      EXPECT_LT(issued.at(j), matmuls[j].end)
          << "step " << j << ": issue the transfer (sendrecv_async) before the chunk's matmul, "
          << "not after it: a transfer issued after the compute hides nothing";
      EXPECT_GT(transfers[j].end, matmuls[j].start + 0.001)
          << "step " << j << ": the transfer must still be in flight when the chunk's matmul "
          << "starts (issue it asynchronously first, compute, then wait)";
    }
  }
}

TEST(CollectiveMatmul, BadInputIsNamed) {
  auto comm = fresh_comm();
  auto opt = dtl::testing::device_options();
  expect_error_mentions([&] {
    dtl::lab16::allgather_matmul(torch::ones({4}, opt), torch::ones({2, 4}, opt), *comm, true);
  }, "x_local");
  expect_error_mentions([&] {
    dtl::lab16::allgather_matmul(torch::ones({2, 4}, opt), torch::ones({2, 3}, opt), *comm, true);
  }, "weight");
  expect_error_mentions([&] {
    dtl::lab16::allgather_matmul(torch::ones({2, 4}, opt),
                                 torch::ones({2, 4}, dtl::testing::device_options(torch::kFloat64)),
                                 *comm, false);
  }, "dtype");
  if (comm->size() > 1) {
    const int64_t rows = comm->rank() == 0 ? 3 : 2;
    expect_error_mentions([&] {
      dtl::lab16::allgather_matmul(torch::ones({rows, 4}, opt), torch::ones({2, 4}, opt), *comm, true);
    }, "rows");
  }
}

}  // namespace
}  // namespace lab16_test
