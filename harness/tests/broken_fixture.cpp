// Deliberately broken multi-rank tests, run only by expect_failure.sh (never in the normal
// suite) to prove the harness: a hang must end in a diagnosis, and a failure on a rank other
// than 0 must reach rank 0's report and the exit code.
#include <gtest/gtest.h>

#include "dtl/runtime.hpp"

// The tests run in this order; the hang comes last, so a run of them all shows what the
// watchdog's report keeps of the tests before it (grading/tests/summary_check.sh).

// Passes: its result must survive a later test's hang.
TEST(BrokenFixture, Passes) { EXPECT_GE(dtl::world().size(), 1); }

// Every rank fails the same check, each message naming its own rank: a summary shows it once.
TEST(BrokenFixture, EveryRankFailsAlike) {
  dtl::Comm& world = dtl::world();
  EXPECT_EQ(world.size(), 0) << "world size " << world.size() << ", batch 5 (this is rank "
                             << world.rank() << ")";
}

// Only the last rank fails: rank 0 must report it as "[rank r/n]" and the job must exit 1.
TEST(BrokenFixture, LastRankFails) {
  dtl::Comm& world = dtl::world();
  EXPECT_NE(world.rank(), world.size() - 1) << "deliberate failure on the last rank";
}

// The last rank skips a collective every other rank enters: without the watchdog, a hang.
TEST(BrokenFixture, LastRankSkipsAllReduce) {
  dtl::Comm& world = dtl::world();
  auto t = torch::ones({4});
  world.all_reduce(t);                                        // op #1 on every rank
  if (world.rank() != world.size() - 1) world.all_reduce(t);  // op #2, missing on the last rank
}
