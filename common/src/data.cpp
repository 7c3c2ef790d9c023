// SyntheticCorpus and GlobalBatchSampler of dtl/data.hpp.
#include "dtl/data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "dtl/error.hpp"

namespace dtl {
namespace data {
namespace {

// splitmix64: one step of a counter-based generator. Used to expand a 64-bit key into the
// state of a xoshiro generator and to mix (seed, index) into a key.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t mix(uint64_t x) { return splitmix64(x); }

// Independent random streams: one for building the chain, one per sequence index. The domain
// constants keep the two families from ever sharing a key.
constexpr uint64_t kChainDomain = 0x636861696e000001ULL;     // "chain"
constexpr uint64_t kSequenceDomain = 0x7365710000000002ULL;  // "seq"

uint64_t stream_key(uint64_t seed, uint64_t domain, uint64_t index) {
  return mix(mix(seed ^ domain) + index);
}

// xoshiro256** (Blackman & Vigna): small, fast, statistically strong; its whole state is four
// words, so making one per sequence costs nothing.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t key) {
    for (uint64_t& word : s_) word = splitmix64(key);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1): safe to take the log of.
  double open_uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  int64_t below(int64_t n) {
    return std::min<int64_t>(static_cast<int64_t>(uniform() * static_cast<double>(n)), n - 1);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace

struct SyntheticCorpus::Impl {
  int64_t vocab = 0;
  int branching = 0;
  uint64_t seed = 0;
  // Sparse form used for sampling: successors of token i are succ[i*b .. i*b + b), chosen
  // with cumulative probabilities cum[i*b .. i*b + b) (the last one is exactly 1).
  std::vector<int64_t> succ;
  std::vector<double> cum;
  std::vector<double> cum_pi;  // cumulative stationary distribution, for the first token
  torch::Tensor transition;    // dense [V, V] float64
  torch::Tensor stationary;    // [V] float64
  double entropy_rate = 0.0;
};

SyntheticCorpus::SyntheticCorpus(int64_t vocab_size, uint64_t seed, int branching) {
  DTL_CHECK(vocab_size >= 2,
            fmt::format("SyntheticCorpus: vocab_size={} must be >= 2", vocab_size));
  DTL_CHECK(branching >= 1 && branching <= vocab_size,
            fmt::format("SyntheticCorpus: branching={} must be in [1, vocab_size={}]", branching,
                        vocab_size));
  auto impl = std::make_shared<Impl>();
  const int64_t V = vocab_size, b = branching;
  impl->vocab = V;
  impl->branching = branching;
  impl->seed = seed;
  impl->succ.resize(static_cast<size_t>(V * b));
  impl->cum.resize(static_cast<size_t>(V * b));
  impl->transition = torch::zeros({V, V}, torch::kFloat64);
  auto P = impl->transition.accessor<double, 2>();

  Xoshiro256 rng(stream_key(seed, kChainDomain, 0));
  std::vector<int64_t> candidates;
  std::vector<double> weights(static_cast<size_t>(b));
  std::vector<double> row_entropy(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) {
    int64_t* succ = impl->succ.data() + i * b;
    double* cum = impl->cum.data() + i * b;
    // The ring edge i -> i+1 makes the chain irreducible; the other b-1 successors are a
    // uniform random subset of the remaining tokens (partial Fisher-Yates shuffle).
    const int64_t ring = (i + 1) % V;
    succ[0] = ring;
    candidates.clear();
    for (int64_t t = 0; t < V; ++t) {
      if (t != ring) candidates.push_back(t);
    }
    for (int64_t j = 1; j < b; ++j) {
      const int64_t pick = (j - 1) + rng.below(static_cast<int64_t>(candidates.size()) - (j - 1));
      std::swap(candidates[static_cast<size_t>(j - 1)], candidates[static_cast<size_t>(pick)]);
      succ[j] = candidates[static_cast<size_t>(j - 1)];
    }
    // Exponential weights, normalised: a Dirichlet(1, ..., 1) row, so rows range from nearly
    // deterministic to nearly uniform over their successors.
    double total = 0.0;
    for (int64_t j = 0; j < b; ++j) {
      weights[static_cast<size_t>(j)] = -std::log(rng.open_uniform());
      total += weights[static_cast<size_t>(j)];
    }
    double running = 0.0, h = 0.0;
    for (int64_t j = 0; j < b; ++j) {
      const double p = weights[static_cast<size_t>(j)] / total;
      P[i][succ[j]] = p;
      running += p;
      cum[j] = running;
      h -= p * std::log(p);
    }
    cum[b - 1] = 1.0;  // no rounding gap at the top: every u in [0, 1) finds a successor
    row_entropy[static_cast<size_t>(i)] = h;
  }

  // Stationary distribution: pi (P - I) = 0 has rank V - 1 for an irreducible chain, so
  // replace one equation of (P^T - I) pi = 0 by the normalisation sum(pi) = 1 and solve.
  torch::Tensor A = impl->transition.t() - torch::eye(V, torch::kFloat64);
  A[V - 1].fill_(1.0);
  torch::Tensor rhs = torch::zeros({V, 1}, torch::kFloat64);
  rhs[V - 1][0] = 1.0;
  impl->stationary = torch::linalg_solve(A, rhs)  // ATen's: torch/linalg.h is gone in 2.x
                         .reshape({V}).contiguous();

  auto pi = impl->stationary.accessor<double, 1>();
  impl->cum_pi.resize(static_cast<size_t>(V));
  double running = 0.0, rate = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    running += std::max(pi[i], 0.0);
    impl->cum_pi[static_cast<size_t>(i)] = running;
    rate += pi[i] * row_entropy[static_cast<size_t>(i)];
  }
  for (double& c : impl->cum_pi) c /= running;
  impl->cum_pi.back() = 1.0;
  impl->entropy_rate = rate;
  impl_ = std::move(impl);
}

int64_t SyntheticCorpus::vocab_size() const { return impl_->vocab; }
int SyntheticCorpus::branching() const { return impl_->branching; }
uint64_t SyntheticCorpus::seed() const { return impl_->seed; }
const torch::Tensor& SyntheticCorpus::transition() const { return impl_->transition; }
const torch::Tensor& SyntheticCorpus::stationary() const { return impl_->stationary; }
double SyntheticCorpus::entropy_rate() const { return impl_->entropy_rate; }

void SyntheticCorpus::fill_sequence(int64_t index, int64_t len, int64_t* out) const {
  DTL_CHECK(index >= 0, fmt::format("SyntheticCorpus: sequence index={} must be >= 0", index));
  DTL_CHECK(len >= 0, fmt::format("SyntheticCorpus: sequence len={} must be >= 0", len));
  if (len == 0) return;
  const Impl& c = *impl_;
  const int64_t b = c.branching;
  Xoshiro256 rng(stream_key(c.seed, kSequenceDomain, static_cast<uint64_t>(index)));
  // First token ~ pi: a binary search in the cumulative distribution.
  const double u0 = rng.uniform();
  int64_t token = std::upper_bound(c.cum_pi.begin(), c.cum_pi.end(), u0) - c.cum_pi.begin();
  token = std::min(token, c.vocab - 1);
  out[0] = token;
  for (int64_t t = 1; t < len; ++t) {
    // Next token ~ P[token, :]: a linear scan over the few cumulative successor weights.
    const double u = rng.uniform();
    const double* cum = c.cum.data() + token * b;
    int64_t j = 0;
    while (j < b - 1 && u >= cum[j]) ++j;
    token = c.succ[static_cast<size_t>(token * b + j)];
    out[t] = token;
  }
}

torch::Tensor SyntheticCorpus::sequence(int64_t index, int64_t len) const {
  DTL_CHECK(len >= 0, fmt::format("SyntheticCorpus: sequence len={} must be >= 0", len));
  torch::Tensor out = torch::empty({len}, torch::kInt64);
  fill_sequence(index, len, out.data_ptr<int64_t>());
  return out;
}

GlobalBatchSampler::GlobalBatchSampler(const SyntheticCorpus& corpus, int64_t global_batch,
                                       int64_t seq_len)
    : corpus_(corpus), global_batch_(global_batch), seq_len_(seq_len) {
  DTL_CHECK(global_batch > 0,
            fmt::format("GlobalBatchSampler: global_batch={} must be > 0", global_batch));
  DTL_CHECK(seq_len > 0, fmt::format("GlobalBatchSampler: seq_len={} must be > 0", seq_len));
}

torch::Tensor GlobalBatchSampler::global_batch_at(int64_t step) const {
  return rows(step, 0, global_batch_);
}

torch::Tensor GlobalBatchSampler::rows(int64_t step, int64_t begin, int64_t end) const {
  DTL_CHECK(step >= 0, fmt::format("GlobalBatchSampler: step={} must be >= 0", step));
  DTL_CHECK(0 <= begin && begin <= end && end <= global_batch_,
            fmt::format("GlobalBatchSampler: rows [{}, {}) must satisfy 0 <= begin <= end <= "
                        "global_batch={}",
                        begin, end, global_batch_));
  const int64_t width = seq_len_ + 1;
  torch::Tensor out = torch::empty({end - begin, width}, torch::kInt64);
  int64_t* data = out.data_ptr<int64_t>();
  for (int64_t r = begin; r < end; ++r) {
    corpus_.fill_sequence(step * global_batch_ + r, width, data + (r - begin) * width);
  }
  return out;
}

}  // namespace data
}  // namespace dtl
