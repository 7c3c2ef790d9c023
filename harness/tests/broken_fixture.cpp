// Deliberately broken multi-rank tests, run only by expect_failure.sh (never in the normal
// suite) to prove the harness: a hang must end in a diagnosis, and a failure on a rank other
// than 0 must reach rank 0's report and the exit code.
#include <gtest/gtest.h>

#include "dtl/runtime.hpp"

// The last rank skips a collective every other rank enters: without the watchdog, a hang.
TEST(BrokenFixture, LastRankSkipsAllReduce) {
  dtl::Comm& world = dtl::world();
  auto t = torch::ones({4});
  world.all_reduce(t);                                        // op #1 on every rank
  if (world.rank() != world.size() - 1) world.all_reduce(t);  // op #2, missing on the last rank
}

// Only the last rank fails: rank 0 must report it as "[rank r/n]" and the job must exit 1.
TEST(BrokenFixture, LastRankFails) {
  dtl::Comm& world = dtl::world();
  EXPECT_NE(world.rank(), world.size() - 1) << "deliberate failure on the last rank";
}
