// Tests of dtl/data.hpp: the Markov chain's math, determinism, and world-size independence.
#include "dtl/data.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "dtl/error.hpp"

namespace dtl {
namespace data {
namespace {

template <typename Fn>
void expect_error_mentions(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected dtl::Error mentioning \"" << needle << "\"";
  } catch (const dtl::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// Concatenation of many sequences, visited as transitions (prev -> next) within each one.
template <typename Fn>
void for_each_transition(const SyntheticCorpus& c, int64_t first_index, int64_t n_seq, int64_t len,
                         Fn fn) {
  std::vector<int64_t> buf(static_cast<size_t>(len));
  for (int64_t s = first_index; s < first_index + n_seq; ++s) {
    c.fill_sequence(s, len, buf.data());
    for (size_t t = 1; t < buf.size(); ++t) fn(buf[t - 1], buf[t]);
  }
}

TEST(Data, TransitionRowsAreStochasticAndSparse) {
  for (int branching : {1, 4, 7}) {
    SyntheticCorpus c(64, 1, branching);
    const torch::Tensor& P = c.transition();
    ASSERT_EQ(P.sizes().vec(), (std::vector<int64_t>{64, 64}));
    ASSERT_EQ(P.scalar_type(), torch::kFloat64);
    EXPECT_TRUE(P.ge(0).all().item<bool>());
    EXPECT_LT((P.sum(1) - 1).abs().max().item<double>(), 1e-12);
    EXPECT_TRUE(P.gt(0).sum(1).eq(branching).all().item<bool>()) << "branching " << branching;
    for (int64_t i = 0; i < 64; ++i) EXPECT_GT(P[i][(i + 1) % 64].item<double>(), 0.0);
  }
}

TEST(Data, StationaryDistributionSolvesPiPEqualsPi) {
  for (int64_t V : {2, 64, 256}) {
    SyntheticCorpus c(V, 3, V < 4 ? 2 : 4);
    const torch::Tensor& pi = c.stationary();
    ASSERT_EQ(pi.sizes().vec(), (std::vector<int64_t>{V}));
    EXPECT_LT((torch::matmul(pi, c.transition()) - pi).abs().max().item<double>(), 1e-9);
    EXPECT_NEAR(pi.sum().item<double>(), 1.0, 1e-12);
    EXPECT_TRUE(pi.gt(0).all().item<bool>());
  }
  // branching 1 is the deterministic ring: periodic, pi uniform, entropy 0.
  SyntheticCorpus ring(8, 1, 1);
  EXPECT_LT((ring.stationary() - 1.0 / 8).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(ring.entropy_rate(), 0.0);
}

TEST(Data, EntropyRateMatchesEmpiricalEstimate) {
  SyntheticCorpus c(64, 5);
  auto P = c.transition().accessor<double, 2>();
  double nll = 0.0;
  int64_t n = 0;
  for_each_transition(c, 0, 400, 500, [&](int64_t a, int64_t b) {
    nll -= std::log(P[a][b]);
    ++n;
  });
  const double empirical = nll / static_cast<double>(n);
  EXPECT_GT(c.entropy_rate(), 0.1);
  EXPECT_LT(c.entropy_rate(), std::log(4.0));  // at most uniform over 4 successors
  EXPECT_NEAR(empirical, c.entropy_rate(), 0.02 * c.entropy_rate());
}

TEST(Data, SequencesAreDeterministicAndSeedDependent) {
  SyntheticCorpus a(256, 11), b(256, 11), other(256, 12);
  EXPECT_TRUE(torch::equal(a.sequence(42, 100), b.sequence(42, 100)));
  EXPECT_TRUE(torch::equal(a.sequence(42, 100), a.sequence(42, 100)));
  EXPECT_FALSE(torch::equal(a.sequence(42, 100), a.sequence(43, 100)));
  EXPECT_FALSE(torch::equal(a.sequence(42, 100), other.sequence(42, 100)));
  EXPECT_FALSE(torch::equal(a.transition(), other.transition()));
  // A prefix of a longer draw is the shorter draw.
  EXPECT_TRUE(torch::equal(a.sequence(7, 200).narrow(0, 0, 50), a.sequence(7, 50)));
  torch::Tensor s = a.sequence(0, 1000);
  EXPECT_EQ(s.scalar_type(), torch::kInt64);
  EXPECT_GE(s.min().item<int64_t>(), 0);
  EXPECT_LT(s.max().item<int64_t>(), 256);
  EXPECT_EQ(a.sequence(3, 0).numel(), 0);
}

TEST(Data, RowsEqualTheSliceOfTheGlobalBatch) {
  SyntheticCorpus c(128, 2);
  GlobalBatchSampler sampler(c, 10, 16);
  for (int64_t step : {0, 1, 37}) {
    torch::Tensor full = sampler.global_batch_at(step);
    ASSERT_EQ(full.sizes().vec(), (std::vector<int64_t>{10, 17}));
    for (auto range :
         std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {0, 1}, {3, 7}, {9, 10}, {4, 4}}) {
      torch::Tensor part = sampler.rows(step, range.first, range.second);
      EXPECT_TRUE(torch::equal(part, full.narrow(0, range.first, range.second - range.first)))
          << "step " << step << " rows [" << range.first << ", " << range.second << ")";
    }
    // Row i of step s is sequence s * global_batch + i.
    EXPECT_TRUE(torch::equal(full[3], c.sequence(step * 10 + 3, 17)));
  }
  EXPECT_FALSE(torch::equal(sampler.global_batch_at(0), sampler.global_batch_at(1)));
}

TEST(Data, GlobalBatchIsIdenticalForEveryWorldSize) {
  SyntheticCorpus c(64, 9);
  const int64_t G = 13;  // not divisible by 2, 3 or 4: shards are uneven
  GlobalBatchSampler sampler(c, G, 8);
  for (int64_t step : {0, 5}) {
    torch::Tensor full = sampler.global_batch_at(step);
    for (int64_t world = 1; world <= 4; ++world) {
      // Even-ish shards (the first G % world ranks get one extra row) ...
      std::vector<torch::Tensor> pieces;
      for (int64_t r = 0; r < world; ++r) {
        const int64_t begin = r * (G / world) + std::min(r, G % world);
        const int64_t size = G / world + (r < G % world ? 1 : 0);
        pieces.push_back(sampler.rows(step, begin, begin + size));
      }
      EXPECT_TRUE(torch::equal(torch::cat(pieces), full)) << "world " << world;
      // ... and deliberately lopsided ones, including an empty shard.
      std::vector<int64_t> cuts{0};
      for (int64_t r = 1; r < world; ++r) cuts.push_back(std::min(G, r * r * 2));
      cuts.push_back(G);
      pieces.clear();
      for (size_t r = 0; r + 1 < cuts.size(); ++r) {
        pieces.push_back(sampler.rows(step, cuts[r], std::max(cuts[r], cuts[r + 1])));
      }
      EXPECT_TRUE(torch::equal(torch::cat(pieces), full)) << "lopsided world " << world;
    }
  }
}

TEST(Data, EmpiricalTransitionFrequenciesMatchTheMatrix) {
  const int64_t V = 32;
  SyntheticCorpus c(V, 21);
  std::vector<double> counts(static_cast<size_t>(V * V), 0.0);
  for_each_transition(c, 0, 400, 500,
                      [&](int64_t a, int64_t b) { counts[static_cast<size_t>(a * V + b)] += 1; });
  auto P = c.transition().accessor<double, 2>();
  for (int64_t i = 0; i < V; ++i) {
    double n = 0;
    for (int64_t j = 0; j < V; ++j) n += counts[static_cast<size_t>(i * V + j)];
    ASSERT_GT(n, 500) << "token " << i << " too rare to test";
    for (int64_t j = 0; j < V; ++j) {
      const double p = P[i][j], freq = counts[static_cast<size_t>(i * V + j)] / n;
      if (p == 0.0) {
        EXPECT_EQ(freq, 0.0) << "impossible transition " << i << " -> " << j << " sampled";
      } else {  // 5 binomial standard deviations
        EXPECT_NEAR(freq, p, 5 * std::sqrt(p * (1 - p) / n) + 1e-3) << i << " -> " << j;
      }
    }
  }
}

TEST(Data, BigramCountModelReachesTheEntropyFloor) {
  const int64_t V = 64;
  SyntheticCorpus c(V, 4);
  GlobalBatchSampler sampler(c, 64, 64);
  // "Train": bigram counts over 30 steps of global batches.
  std::vector<double> counts(static_cast<size_t>(V * V), 0.0);
  for (int64_t step = 0; step < 30; ++step) {
    torch::Tensor batch = sampler.global_batch_at(step);
    auto tok = batch.accessor<int64_t, 2>();
    for (int64_t r = 0; r < batch.size(0); ++r) {
      for (int64_t t = 1; t < batch.size(1); ++t) {
        counts[static_cast<size_t>(tok[r][t - 1] * V + tok[r][t])] += 1;
      }
    }
  }
  // "Evaluate" on held-out steps: cross-entropy of the add-0.01-smoothed bigram model.
  double nll = 0.0;
  int64_t n = 0;
  for (int64_t step = 1000; step < 1010; ++step) {
    torch::Tensor batch = sampler.global_batch_at(step);
    auto tok = batch.accessor<int64_t, 2>();
    for (int64_t r = 0; r < batch.size(0); ++r) {
      for (int64_t t = 1; t < batch.size(1); ++t) {
        const int64_t a = tok[r][t - 1], b = tok[r][t];
        double row = 0.0;
        for (int64_t j = 0; j < V; ++j) row += counts[static_cast<size_t>(a * V + j)];
        nll -= std::log((counts[static_cast<size_t>(a * V + b)] + 0.01) / (row + 0.01 * V));
        ++n;
      }
    }
  }
  const double ce = nll / static_cast<double>(n);
  EXPECT_NEAR(ce, c.entropy_rate(), 0.03 * c.entropy_rate())
      << "bigram cross-entropy " << ce << " vs entropy rate " << c.entropy_rate();
}

TEST(Data, BadArgumentsNameTheConstraint) {
  expect_error_mentions([] { SyntheticCorpus c(1, 0); }, "vocab_size=1 must be >= 2");
  expect_error_mentions([] { SyntheticCorpus c(16, 0, 0); },
                        "branching=0 must be in [1, vocab_size=16]");
  expect_error_mentions([] { SyntheticCorpus c(16, 0, 17); },
                        "branching=17 must be in [1, vocab_size=16]");
  SyntheticCorpus c(16, 0);
  expect_error_mentions([&] { c.sequence(-1, 4); }, "index=-1 must be >= 0");
  expect_error_mentions([&] { GlobalBatchSampler s(c, 0, 8); }, "global_batch=0 must be > 0");
  GlobalBatchSampler s(c, 4, 8);
  expect_error_mentions([&] { s.rows(0, 2, 1); }, "rows [2, 1) must satisfy");
  expect_error_mentions([&] { s.rows(0, 0, 5); }, "global_batch=4");
  expect_error_mentions([&] { s.rows(0, -1, 2); }, "rows [-1, 2)");
  expect_error_mentions([&] { s.rows(-1, 0, 2); }, "step=-1 must be >= 0");
}

}  // namespace
}  // namespace data
}  // namespace dtl
