// dtl/data.hpp — defines: data::SyntheticCorpus, data::GlobalBatchSampler.
//
// Training data with a known answer. SyntheticCorpus is a seeded sparse first-order Markov
// chain over `vocab_size` tokens: each token has `branching` possible successors. Its entropy
// rate H = sum_i pi_i H(P_i) is computable, and it is the lowest cross-entropy loss any model
// can reach on its text, so a training curve can be judged against a floor ("loss 1.21, floor
// 1.08") instead of against a guess.
//
// GlobalBatchSampler makes the global batch of a step a pure function of (seed, step): row i
// of step s is sequence s * global_batch + i. Every world size sees the same global batch, and
// a rank generates only its own rows, so distributed training can be compared bit for bit with
// serial training on the same global batch.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>

namespace dtl {
namespace data {

class SyntheticCorpus {
 public:
  // Throws dtl::Error when vocab_size < 2 or branching is not in [1, vocab_size].
  SyntheticCorpus(int64_t vocab_size, uint64_t seed, int branching = 4);

  int64_t vocab_size() const;
  int branching() const;
  uint64_t seed() const;

  // Row-stochastic [V, V] float64 transition matrix. Each token i has `branching` distinct
  // successors, always including (i + 1) % V so the chain is irreducible (every token is
  // reachable from every other), with random positive weights.
  const torch::Tensor& transition() const;
  // [V] float64 stationary distribution: pi P = pi, sum pi = 1, solved as a linear system
  // (no power iteration, so it is right even when the chain is periodic).
  const torch::Tensor& stationary() const;
  // Entropy rate in nats/token, sum_i pi_i H(P_i): the cross-entropy loss floor.
  double entropy_rate() const;

  // Sequence number `index` of the stream: int64 [len] tokens, a pure function of (seed,
  // index). The first token is drawn from the stationary distribution, the rest follow the
  // chain. Uses its own small RNG (xoshiro256**), never torch's global generator.
  torch::Tensor sequence(int64_t index, int64_t len) const;
  // The same tokens written to out[0 .. len); for filling batches without a tensor per row.
  void fill_sequence(int64_t index, int64_t len, int64_t* out) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;  // immutable and shared: copies are cheap
};

// Global batches whose content never depends on the world size: row i of step s is
// corpus.sequence(s * global_batch + i, seq_len + 1) (seq_len inputs plus one shifted target).
class GlobalBatchSampler {
 public:
  GlobalBatchSampler(const SyntheticCorpus& corpus, int64_t global_batch, int64_t seq_len);

  int64_t global_batch() const { return global_batch_; }
  int64_t seq_len() const { return seq_len_; }
  const SyntheticCorpus& corpus() const { return corpus_; }

  // [global_batch, seq_len + 1] int64.
  torch::Tensor global_batch_at(int64_t step) const;
  // Rows [begin, end) of global_batch_at(step), [end - begin, seq_len + 1], without
  // generating the other rows. 0 <= begin <= end <= global_batch.
  torch::Tensor rows(int64_t step, int64_t begin, int64_t end) const;

 private:
  SyntheticCorpus corpus_;
  int64_t global_batch_;
  int64_t seq_len_;
};

}  // namespace data
}  // namespace dtl
