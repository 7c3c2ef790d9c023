// Lab 16 grading tests: more traces (open windows, empty ranks, many ranks), more bucket
// profiles, and the collective matmul on other shapes, dtypes and strided inputs. Only what
// overlap.hpp promises.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/overlap_test_util.hpp"

namespace lab16_test {
namespace {

using dtl::lab16::BackwardProfile;
using dtl::lab16::bucket_timing;
using dtl::lab16::overlap_from_chrome;
using dtl::trace::Event;

TEST(GradeTrace, OpenWindowsAndManyRanks) {
  std::vector<Event> evs = {ev(5, "compute", 0.010, 0.030), ev(5, "comm world", 0.000, 0.040),
                            ev(7, "comm world", 0.100, 0.101), ev(2, "compute", 0.5, 0.6)};
  const auto ranks =
      overlap_from_chrome(dtl::trace::chrome_json(evs), 0.020);  // from 20 ms to each end
  const auto r = observed(ranks);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].rank, 2);
  EXPECT_EQ(r[1].rank, 5);
  EXPECT_EQ(r[2].rank, 7);
  EXPECT_NEAR(r[1].wall, 0.020, 1e-12);
  EXPECT_NEAR(r[1].compute, 0.010, 1e-12);
  EXPECT_NEAR(r[1].comm, 0.020, 1e-12);
  EXPECT_NEAR(r[1].exposed_comm, 0.010, 1e-12);
  EXPECT_NEAR(r[2].comm, 0.001, 1e-12);
  EXPECT_NEAR(r[0].comm, 0.0, 1e-12);
  EXPECT_TRUE(OBSERVE(overlap_from_chrome(dtl::trace::chrome_json({})).empty()));
  const std::string report = OBSERVE(dtl::lab16::overlap_report(ranks));
  EXPECT_NE(report.find('-'), std::string::npos) << "a rank without comm hides nothing: '-'\n" << report;
}

// A window that starts after a rank's last event: that rank's window is empty, its wall 0
// (never negative), nothing computed or communicated in it.
TEST(GradeTrace, AWindowAfterARanksEventsIsEmpty) {
  std::vector<Event> evs = {ev(0, "compute", 0.000, 0.010), ev(0, "comm world", 0.005, 0.020),
                            ev(1, "compute", 0.000, 0.050), ev(1, "comm world", 0.030, 0.060)};
  const auto r = observed(overlap_from_chrome(dtl::trace::chrome_json(evs), 0.040));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].wall, 0.0) << "rank 0's events end at 20 ms, the window starts at 40";
  EXPECT_EQ(r[0].compute, 0.0);
  EXPECT_EQ(r[0].comm, 0.0);
  EXPECT_EQ(r[0].exposed_comm, 0.0);
  EXPECT_NEAR(r[1].wall, 0.020, 1e-12);
  EXPECT_NEAR(r[1].exposed_comm, 0.010, 1e-12);
}

TEST(GradeTrace, TouchingAndNestedIntervals) {
  std::vector<Event> evs = {ev(0, "compute", 0.0, 0.1), ev(0, "compute", 0.1, 0.2),
                            ev(0, "compute", 0.05, 0.06), ev(0, "comm a", 0.15, 0.25),
                            ev(0, "comm b", 0.25, 0.30)};
  auto r = observed(overlap_from_chrome(dtl::trace::chrome_json(evs)));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NEAR(r[0].compute, 0.2, 1e-12);
  EXPECT_NEAR(r[0].comm, 0.15, 1e-12);
  EXPECT_NEAR(r[0].exposed_comm, 0.10, 1e-12);
  EXPECT_NEAR(r[0].wall, 0.30, 1e-12);
}

TEST(GradeBucketModel, FirstBucketAndExposed) {
  BackwardProfile p = steady_profile(10, 1000, 0.100, 0.001, 1e-6);  // 1 ms per 1000 B
  const auto small_first = observed(bucket_timing(p, 1000, 5000));
  const auto even = observed(bucket_timing(p, 5000, 5000));
  EXPECT_EQ(small_first.buckets, 3);  // {9} then two of five... the rest: {8..4}, {3..0}
  EXPECT_EQ(even.buckets, 2);
  EXPECT_NEAR(small_first.exposed, small_first.total - p.backward, 1e-12);
  // The last bucket holds the gradient ready at the very end: 4 or 5 gradients after backward.
  EXPECT_NEAR(even.total, 0.100 + 0.001 + 0.005, 1e-9);
  EXPECT_NEAR(small_first.total, 0.100 + 0.001 + 0.004, 1e-9);
  EXPECT_EQ(OBSERVE(dtl::lab16::best_bucket_cap(p, {5000, 1000, 5000, 2000})), 1000);
}

TEST(GradeMatmul, OtherShapesDtypesAndStrides) {
  auto comm = fresh_comm();
  const Problem pb(*comm, 7, 3, 11);
  for (bool overlap : {false, true}) {
    DTL_EXPECT_CLOSE(dtl::lab16::allgather_matmul(pb.x_local, pb.weight, *comm, overlap), pb.expected);
    // Strided inputs: a transposed copy's transpose, a column slice of a wider tensor.
    const torch::Tensor wide = torch::cat({pb.x_local, pb.x_local}, 1);
    const torch::Tensor strided = wide.narrow(1, 0, 3);
    const torch::Tensor w_t = pb.weight.t().contiguous().t();
    DTL_EXPECT_CLOSE(dtl::lab16::allgather_matmul(strided, w_t, *comm, overlap), pb.expected);
    const torch::Tensor y64 = dtl::lab16::allgather_matmul(pb.x_local.to(torch::kFloat64),
                                                          pb.weight.to(torch::kFloat64), *comm, overlap);
    EXPECT_EQ(OBSERVE(y64.scalar_type()), torch::kFloat64);
    DTL_EXPECT_CLOSE(y64.to(torch::kFloat32), pb.expected);
  }
}

TEST(GradeMatmul, BackToBackCallsLeaveNothingBehind) {
  auto comm = fresh_comm();
  const Problem a(*comm, 4, 8, 5), b(*comm, 2, 8, 5);
  for (int k = 0; k < 3; ++k) {
    DTL_EXPECT_CLOSE(dtl::lab16::allgather_matmul(a.x_local, a.weight, *comm, true), a.expected);
    DTL_EXPECT_CLOSE(dtl::lab16::allgather_matmul(b.x_local, b.weight, *comm, false), b.expected);
  }
}

}  // namespace
}  // namespace lab16_test
