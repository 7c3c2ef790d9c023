// A deliberately broken multi-rank test: the last rank skips a collective that every other
// rank enters. Run by expect_watchdog.sh, which requires the job to end non-zero within its
// timeout with a diagnosis naming the op and the ranks. Not part of the normal suite.
#include <gtest/gtest.h>

#include "dtl/runtime.hpp"

TEST(WatchdogFixture, LastRankSkipsAllReduce) {
  dtl::Comm& world = dtl::world();
  auto t = torch::ones({4});
  world.all_reduce(t);  // everyone: op #1
  if (world.rank() != world.size() - 1) world.all_reduce(t);  // op #2, missing on the last rank
}
