// The split run (dtl/harness/observe.hpp) on a toy "lab": `answer()` and `layer()` play the code
// under test, DTL_FIXTURE_MODE chooses how the worker's copy behaves. split_check.sh runs the
// worker (--dtl_record) and the driver (--dtl_check) and asserts on the driver's verdict:
//   honest  the worker is right                      -> the driver passes every test
//   cheat   the worker is wrong AND tampers with its own oracle, so its own report passes
//           (what code that attacks its process could do)  -> the driver fails every check of a
//                                                            wrong value, naming it
//   crash   the worker aborts inside Split.Crash      -> the driver fails that test ("ended
//           inside") and the ones after it ("did not reach")
// Never part of the normal suite: without a split flag every test passes (observe is identity).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "dtl/harness/checks.hpp"
#include "dtl/harness/observe.hpp"
#include "dtl/runtime.hpp"

namespace {

std::string mode() {
  const char* m = std::getenv("DTL_FIXTURE_MODE");
  return m ? m : "honest";
}
bool cheating() { return mode() == "cheat"; }

int answer() { return cheating() ? 41 : 42; }
// The oracle the test computes in its own process: a cheating worker bends it to its answer.
int oracle() { return cheating() ? 41 : 42; }

torch::Tensor layer(const torch::Tensor& x) { return cheating() ? x * 3 : x * 2; }
torch::Tensor layer_oracle(const torch::Tensor& x) { return cheating() ? x * 3 : x * 2; }

}  // namespace

TEST(Split, ObservedScalar) { EXPECT_EQ(OBSERVE(answer()), oracle()); }

TEST(Split, ObservedTensorAndInputs) {
  // Inputs drawn from torch's generator: the worker and the driver must draw the same.
  auto x = torch::randn({5, 7});
  DTL_EXPECT_CLOSE(layer(x), layer_oracle(x));
  // A large tensor goes as its digest.
  auto big = torch::arange(int64_t{1} << 19, torch::kFloat64);
  DTL_EXPECT_EQUAL(layer(big), layer_oracle(big));
  DTL_EXPECT_SAME_ON_ALL_RANKS(layer(big));
}

TEST(Split, ErrorMessage) {
  dtl::testing::expect_error_mentions(
      [] { throw dtl::Error(cheating() ? "no" : "tp=3 does not divide n_heads=8"); },
      cheating() ? "no" : "does not divide");
}

TEST(Split, Crash) {
  if (mode() == "crash") std::abort();
  EXPECT_EQ(OBSERVE(answer()), oracle());
}

TEST(Split, AfterTheCrash) { EXPECT_EQ(OBSERVE(answer() + 1), oracle() + 1); }
