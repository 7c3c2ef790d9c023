// Tests of the harness's checks: they must fail when they should, and say where.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "dtl/harness/checks.hpp"
#include "dtl/harness/prefill.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"

namespace {

using ::testing::HasSubstr;

TEST(Checks, CloseReportsWorstElement) {
  auto expected = torch::zeros({2, 3});
  auto actual = expected.clone();
  actual[1][2] = 0.5;
  actual[0][1] = 1e-3;
  auto r = dtl::testing::tensors_close(actual, expected, 1e-5, 1e-6);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("2 of 6 elements differ"));
  EXPECT_THAT(r.message(), HasSubstr("flat index 5 [1,2]"));
  EXPECT_THAT(r.message(), HasSubstr("actual 0.5"));
  EXPECT_TRUE(dtl::testing::tensors_close(expected + 1e-7, expected));
}

TEST(Checks, CloseRejectsShapeDtypeAndNaN) {
  EXPECT_THAT(dtl::testing::tensors_close(torch::zeros({2}), torch::zeros({3})).message(), HasSubstr("shape"));
  EXPECT_THAT(dtl::testing::tensors_close(torch::zeros({2}), torch::zeros({2}, torch::kFloat64)).message(),
              HasSubstr("dtype"));
  auto nan = torch::full({1}, NAN);
  EXPECT_FALSE(dtl::testing::tensors_close(nan, torch::zeros({1})));
  EXPECT_TRUE(dtl::testing::tensors_close(nan, nan.clone()));
}

// An element left at the test's pre-fill is named "never written"; a wrong element that was
// written is not, and another test's pre-fill value says nothing here.
TEST(Checks, ElementsLeftAtThePrefillAreNeverWritten) {
  auto out = dtl::testing::prefilled({6}, -1, torch::kFloat32);
  out.slice(0, 0, 4).copy_(torch::arange(4).to(torch::kFloat32));  // two never written
  auto expected = torch::arange(6).to(torch::kFloat32);
  auto r = dtl::testing::tensors_equal(out, expected);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("2 of them still hold the test's pre-fill -1: never written"));
  out.slice(0, 4, 6).fill_(7);  // written, and wrong
  EXPECT_THAT(dtl::testing::tensors_equal(out, expected).message(),
              ::testing::Not(HasSubstr("never written")));
  // An expected -1 is no unwritten element.
  expected[5] = -1;
  out = dtl::testing::prefilled({6}, -1, torch::kFloat32);
  out.slice(0, 0, 5).copy_(expected.slice(0, 0, 5) + 1);
  EXPECT_THAT(dtl::testing::tensors_close(out, expected).message(), ::testing::Not(HasSubstr("never written")));
}

TEST(Checks, AnotherTestsPrefillSaysNothing) {
  auto out = torch::full({3}, -1.0f);  // not prefilled() here: -1 is just a wrong value
  auto r = dtl::testing::tensors_equal(out, torch::zeros({3}));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), ::testing::Not(HasSubstr("never written")));
}

TEST(Checks, EqualIsBitwise) {
  EXPECT_TRUE(dtl::testing::tensors_equal(torch::arange(5), torch::arange(5)));
  EXPECT_FALSE(dtl::testing::tensors_equal(torch::ones({3}), torch::ones({3}) + 1e-7));
  EXPECT_THAT(dtl::testing::tensors_equal(torch::full({1}, -0.0), torch::zeros({1})).message(),
              HasSubstr("bits differ"));
}

// A large tensor is compared by its digest: any change of its bytes must change it. Every single
// bit of a word-aligned stretch and of the tail, and pairs of sign flips (the differences a
// weak word-wise hash cancels), at every alignment of the second flip; equal bytes, equal digest.
TEST(Checks, LargeTensorDigestSeesEveryChange) {
  namespace t = dtl::testing;
  const int64_t n = t::TensorBits::kWholeBytes / 4 + 3;  // over the threshold, with a tail
  const auto base = torch::randn({n}, torch::TensorOptions().dtype(torch::kFloat32));
  const auto digest_of = [](const torch::Tensor& x) {
    const auto b = t::TensorBits::of(x);
    EXPECT_FALSE(b.whole);
    return b.digest;
  };
  const uint64_t d0 = digest_of(base);
  EXPECT_EQ(digest_of(base.clone()), d0);
  std::set<uint64_t> seen{d0};
  auto flipped = [&](std::initializer_list<std::pair<int64_t, int>> bits) {
    auto x = base.clone();
    auto* words = static_cast<uint32_t*>(x.data_ptr());
    for (auto [i, bit] : bits) words[i] ^= uint32_t{1} << bit;
    return digest_of(x);
  };
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{7}, n / 2, n - 4, n - 1})
    for (int bit = 0; bit < 32; ++bit) EXPECT_TRUE(seen.insert(flipped({{i, bit}})).second) << i << " " << bit;
  for (int64_t j = 1; j <= 16; ++j)
    EXPECT_TRUE(seen.insert(flipped({{1, 31}, {1 + j, 31}})).second) << "sign flips at 1 and " << 1 + j;
}

TEST(Checks, SameOnAllRanksDetectsTheOddRankOut) {
  auto& w = dtl::world();
  EXPECT_TRUE(dtl::testing::same_on_all_ranks(torch::arange(10)));
  auto t = torch::zeros({4});
  if (w.rank() == w.size() - 1) t[2] = 1;
  auto r = dtl::testing::same_on_all_ranks(t);
  if (w.size() == 1) {
    EXPECT_TRUE(r);
  } else {
    ASSERT_FALSE(r);
    EXPECT_THAT(r.message(), HasSubstr("ranks [" + std::to_string(w.size() - 1) + "] differ"));
  }
  // A shape mismatch is reported, not truncated.
  auto s = dtl::testing::same_on_all_ranks(torch::zeros({w.rank() == 0 ? 3 : 2}));
  EXPECT_EQ(static_cast<bool>(s), w.size() == 1);
}

TEST(Checks, SerialRestoresTheGlobalRng) {
  torch::manual_seed(99);
  auto before = torch::rand({3});
  torch::manual_seed(99);
  auto a = dtl::testing::serial(7, [] { return torch::rand({3}); });
  auto b = dtl::testing::serial(7, [] { return torch::rand({3}); });
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(torch::rand({3}), before)) << "serial() disturbed the caller's RNG";
}

TEST(Checks, FlatParamsAndModuleComparison) {
  torch::manual_seed(1);
  torch::nn::Linear a(3, 2), b(3, 2);
  EXPECT_EQ(dtl::testing::flat_params(*a).numel(), 8);
  EXPECT_EQ(dtl::testing::flat_grads(*a).abs().sum().item<float>(), 0.0f);
  torch::NoGradGuard g;
  for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  dtl::testing::expect_modules_close(*a, *b);
}

TEST(Checks, ParamsCloseNamesTheParameter) {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::Linear(4, 2));
  auto expected = dtl::testing::flat_params(*net).clone();
  EXPECT_TRUE(dtl::testing::params_close(*net, expected));
  {
    torch::NoGradGuard no_grad;
    net->named_parameters()["1.weight"][1][3] += 1.0;  // the last layer's weight, row 1, col 3
  }
  auto r = dtl::testing::params_close(*net, expected);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("worst in parameter 1.weight[1,3]"));
}

TEST(Perf, MeasureIsCollectiveAndOrdered) {
  auto m = dtl::measure([] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }, 1, 5);
  ASSERT_EQ(m.seconds.size(), 5u);
  EXPECT_GE(m.min, 0.002);
  EXPECT_LE(m.min, m.median);
  EXPECT_LE(m.median, m.max);
  // Every rank got the same (max-over-ranks) numbers.
  DTL_EXPECT_SAME_ON_ALL_RANKS(torch::tensor(m.seconds, torch::kFloat64));
  EXPECT_DOUBLE_EQ(dtl::sum_over_ranks(1.0), dtl::world().size());
  EXPECT_DOUBLE_EQ(dtl::max_over_ranks(dtl::world().rank()), dtl::world().size() - 1);
}

}  // namespace
