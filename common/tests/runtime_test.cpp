// Tests of Runtime: identity, threads, seeding, options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"

namespace {

TEST(Runtime, IdentityMatchesMpi) {
  auto& rt = dtl::Runtime::get();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(rt.rank(), rank);
  EXPECT_EQ(rt.world_size(), size);
  EXPECT_EQ(rt.world().rank(), rank);
  EXPECT_EQ(rt.world().size(), size);
  EXPECT_EQ(rt.world().backend(), "mpi");
  EXPECT_EQ(rt.device(), torch::Device(torch::kCPU));
  EXPECT_GE(rt.local_rank(), 0);
  EXPECT_LT(rt.local_rank(), rt.local_size());
  EXPECT_LE(rt.local_size(), rt.world_size());
  std::vector<int> all(size);
  for (int i = 0; i < size; ++i) all[i] = i;
  EXPECT_EQ(rt.world().world_ranks(), all);
}

TEST(Runtime, OversubscribedRanksGetFewerThreads) {
  auto& rt = dtl::Runtime::get();
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  if (rt.options().threads == 0) {
    EXPECT_EQ(rt.intra_op_threads(), std::max(1, cores / rt.local_size()));
  }
  EXPECT_EQ(torch::get_num_threads(), rt.intra_op_threads());
}

TEST(Runtime, RanksAreSeededDifferentlyButDeterministically) {
  auto& rt = dtl::Runtime::get();
  torch::manual_seed(rt.seed() + rt.rank());
  auto mine = torch::rand({4}, torch::kFloat64);
  torch::manual_seed(rt.seed() + rt.rank());
  DTL_EXPECT_EQUAL(torch::rand({4}, torch::kFloat64), mine);
  auto all = torch::empty({rt.world_size(), 4}, torch::kFloat64);
  rt.world().all_gather(all, mine);
  for (int p = 1; p < rt.world_size(); ++p)
    EXPECT_FALSE(torch::equal(all[p], all[0])) << "rank " << p << " drew rank 0's numbers";
}

TEST(Runtime, OnlyOneRuntime) {
  try {
    dtl::Runtime second(dtl::RuntimeOptions{});
    FAIL() << "a second Runtime was created";
  } catch (const dtl::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("only one dtl::Runtime"));
  }
  dtl::world().barrier();
}

TEST(Runtime, OptionsFromEnvironmentAndFlags) {
  setenv("DTL_SEED", "77", 1);
  setenv("DTL_DEVICE", "cuda", 1);
  auto o = dtl::RuntimeOptions::from_env();
  unsetenv("DTL_SEED");
  unsetenv("DTL_DEVICE");
  EXPECT_EQ(o.seed, 77u);
  EXPECT_EQ(o.device, "cuda");
  CLI::App app;
  o.add_to(app);
  const char* argv[] = {"prog", "--seed", "5", "--device", "cpu", "--trace", "t.json"};
  app.parse(7, const_cast<char**>(argv));
  EXPECT_EQ(o.seed, 5u);
  EXPECT_EQ(o.device, "cpu");
  EXPECT_EQ(o.trace, "t.json");
  CLI::App bad;
  dtl::RuntimeOptions o2;
  o2.add_to(bad);
  const char* bad_argv[] = {"prog", "--device", "tpu"};
  EXPECT_THROW(bad.parse(3, const_cast<char**>(bad_argv)), CLI::ValidationError);
}

TEST(Runtime, ErrorsCarryTheRank) {
  try {
    DTL_CHECK(1 + 1 == 3, "arithmetic is broken");
    FAIL();
  } catch (const dtl::Error& e) {
    std::string msg = e.what();
    EXPECT_THAT(msg, ::testing::HasSubstr("arithmetic is broken"));
    if (dtl::world().size() > 1) {
      EXPECT_THAT(msg, ::testing::HasSubstr("[rank " + std::to_string(dtl::world().rank()) + "/"));
    }
  }
  // With arguments, the message is a fmt format string (what the skeletons' TODOs ask for).
  const int tp = 3, heads = 8;
  try {
    DTL_CHECK(heads % tp == 0, "tp={} does not divide n_heads={}", tp, heads);
    FAIL();
  } catch (const dtl::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("tp=3 does not divide n_heads=8"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("check `heads % tp == 0` failed"));
  }
  try {
    DTL_UNIMPLEMENTED("lab 00: nothing");
  } catch (const dtl::NotImplemented& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("not implemented: lab 00: nothing"));
  }
}

}  // namespace
