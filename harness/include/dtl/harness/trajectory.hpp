// dtl/harness/trajectory.hpp — defines: bench::SerialTrajectory.
//
// What a benchmark of a parallel trainer checks every timed step against: the flat parameters of
// single-process AdamW on the whole global batch after each step, computed once up front (every
// rank computes them itself, without communication). A trainer that skips work, or does it only
// at the benchmark's size, fails the benchmark ("wrong result") instead of winning it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/model.hpp"    // defines: model::GPT, GPTConfig
#include "dtl/optim.hpp"    // defines: OptimConfig, make_adamw
#include "dtl/runtime.hpp"  // defines: world()
#include "dtl/train.hpp"    // defines: train_step

namespace dtl::bench {

struct SerialTrajectory {
  model::GPTConfig cfg;
  std::shared_ptr<Comm> comm;  // a dup of the world: the benchmark's own traffic
  data::SyntheticCorpus corpus;
  data::GlobalBatchSampler sampler;
  int64_t rows_per_rank;
  std::vector<torch::Tensor> want;  // flat parameters after step 1, 2, ... (on comm's device)

  SerialTrajectory(const model::GPTConfig& config, const OptimConfig& oc, int steps,
                   int64_t rows_per_rank_, uint64_t corpus_seed)
      : cfg(config),
        comm(world().dup()),
        corpus(config.vocab_size, corpus_seed),
        sampler(corpus, rows_per_rank_ * comm->size(), config.seq_len),
        rows_per_rank(rows_per_rank_) {
    model::GPT model(cfg);
    auto opt = make_adamw(*model, oc);
    for (int s = 0; s < steps; ++s) {
      train_step(model, *opt, sampler.global_batch_at(s));
      std::vector<torch::Tensor> flat;
      for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
      want.push_back(torch::cat(flat).to(comm->device()));
    }
  }
  // This rank's rows of step s's global batch.
  torch::Tensor rows(int s) const {
    const int64_t r = comm->rank();
    return sampler.rows(s, r * rows_per_rank, (r + 1) * rows_per_rank).to(comm->device());
  }
  // Whether flat parameters after step s (0-based) are the serial run's, to float tolerance.
  bool matches(const torch::Tensor& got, int s) const {
    return torch::allclose(got, want[static_cast<size_t>(s)], 1e-3, 1e-4);
  }
};

}  // namespace dtl::bench
