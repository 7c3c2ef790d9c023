// labs/15_fsdp/tests/fsdp_test_util.hpp — shared by the public tests (fsdp_test.cpp) and the
// grading tests (grading/15_fsdp/): the DDP oracle, an FSDP run, what a backward leaves gathered.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ddp.hpp"  // lab 04's reference DDP: the trajectory FSDP must follow
#include "dtl/comm.hpp"
#include "dtl/data.hpp"            // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/harness/checks.hpp"  // defines: fresh_comm, device, DTL_EXPECT_CLOSE, flat_params
#include "dtl/hooks.hpp"
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "fsdp.hpp"

namespace lab15_test {

using dtl::Comm;
using dtl::OpType;
using dtl::lab15::BackwardPrefetch;
using dtl::lab15::FlatParameter;
using dtl::lab15::FSDPConfig;
using dtl::lab15::FullyShardedDataParallel;
using dtl::lab15::GPT;
using dtl::lab15::GPTConfig;
using dtl::lab15::ShardingStrategy;
using dtl::testing::device;
using dtl::testing::fresh_comm;

// The formulas' results from the code under test, observed (dtl/harness/observe.hpp) as one
// list of their fields: in the autograder's split run the assertions on them are checked on the
// student's numbers.
inline dtl::lab15::StepTraffic observed(dtl::lab15::StepTraffic t,
                                        const char* file = __builtin_FILE(),
                                        int line = __builtin_LINE()) {
  dtl::testing::observe_fields<int64_t>("StepTraffic (all_gather, reduce_scatter, all_reduce)",
                                        {&t.all_gather, &t.reduce_scatter, &t.all_reduce},
                                        dtl::testing::Source::kComputed, file, line);
  return t;
}
inline dtl::lab15::ParamBytes observed(dtl::lab15::ParamBytes b,
                                       const char* file = __builtin_FILE(),
                                       int line = __builtin_LINE()) {
  dtl::testing::observe_fields<int64_t>("ParamBytes (sharded, unsharded)",
                                        {&b.sharded, &b.unsharded},
                                        dtl::testing::Source::kComputed, file, line);
  return b;
}
// A wrap policy's units as the student's code defines them, observed: names and parameter names.
inline std::vector<dtl::Unit> observed(const std::vector<dtl::Unit>& units,
                                       const char* file = __builtin_FILE(),
                                       int line = __builtin_LINE()) {
  std::vector<std::pair<std::string, std::vector<std::string>>> pairs;
  for (const dtl::Unit& u : units) pairs.emplace_back(u.name, u.params);
  pairs = dtl::testing::observe(std::move(pairs), "the units (name, parameters)",
                                dtl::testing::Source::kComputed, file, line);
  std::vector<dtl::Unit> out;
  for (auto& [name, params] : pairs) out.push_back(dtl::Unit{name, params});
  return out;
}

// A FlatParameter's pieces as the student's code cut them, observed as one list: the layout,
// the values, and the two properties the tests assert on (computed where the pieces live).
struct ObservedPiece {
  int64_t param = 0, param_offset = 0, shard_offset = 0, numel = 0;
  torch::Tensor view;               // detached
  bool leaf_requires_grad = false;  // a leaf requiring grad
  bool shares_shard = false;        // its memory is the shard's at shard_offset
};
inline std::vector<ObservedPiece> observed_pieces(const FlatParameter& f,
                                                  const char* file = __builtin_FILE(),
                                                  int line = __builtin_LINE()) {
  std::vector<std::pair<std::vector<int64_t>, torch::Tensor>> list;
  for (const auto& p : f.pieces()) {
    const bool shares = p.view.data_ptr<float>() == f.shard().data_ptr<float>() + p.shard_offset;
    list.emplace_back(std::vector<int64_t>{p.param, p.param_offset, p.shard_offset, p.numel,
                                           p.view.is_leaf() && p.view.requires_grad(), shares},
                      p.view.detach());
  }
  list = dtl::testing::observe(std::move(list), "the pieces (layout, view)",
                               dtl::testing::Source::kComputed, file, line);
  std::vector<ObservedPiece> out;
  for (const auto& [meta, view] : list) {
    if (meta.size() != 6) {
      ADD_FAILURE_AT(file, line) << "a piece recorded with " << meta.size() << " fields";
      continue;
    }
    out.push_back(
        ObservedPiece{meta[0], meta[1], meta[2], meta[3], view, meta[4] != 0, meta[5] != 0});
  }
  return out;
}

// AdamW with weight decay: the rule FSDP's per-parameter pieces must keep (matrices decay,
// biases and LayerNorm gains do not). eps 1e-6; eps >= 1 shows a gradient summed over the ranks.
inline dtl::OptimConfig adamw(double eps = 1e-6, double weight_decay = 0.1) {
  return dtl::testing::equality_adamw(eps, weight_decay);
}

// The tiny GPT (2 heads, 16 tokens) with the given layers, width, head and vocabulary.
inline GPTConfig config(int64_t layers = 3, int64_t d = 32, bool tied = true, int64_t vocab = 64) {
  GPTConfig c = dtl::testing::gpt_config(layers, d, /*heads=*/2, vocab, /*seq_len=*/16);
  c.tied_head = tied;
  return c;
}

using dtl::testing::my_rows;

// A data setup every rank shares: `rows_per_rank` rows each, the same corpus.
struct Data {
  dtl::data::SyntheticCorpus corpus;
  dtl::data::GlobalBatchSampler sampler;
  Data(const GPTConfig& cfg, int world, int64_t rows_per_rank = 2)
      : corpus(cfg.vocab_size, 15), sampler(corpus, rows_per_rank * world, cfg.seq_len) {}
};

// The oracle: lab 04's DDP with AdamW (make_adamw: weight decay on >= 2-D parameters) for
// `steps` steps, `backwards` micro-batches each (the same rows twice: accumulation). The flat
// parameters after them.
inline torch::Tensor ddp_params(const GPTConfig& cfg, const Data& data, int steps,
                                const dtl::OptimConfig& oc, int backwards = 1) {
  auto comm = fresh_comm();
  GPT model(cfg);
  model->to(device());
  dtl::lab04::DistributedDataParallel ddp(model.ptr(), *comm);
  auto opt = dtl::make_adamw(*model, oc);
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    for (int k = 0; k < backwards; ++k) model->loss(my_rows(data.sampler, s, *comm)).backward();
    opt->step();
  }
  return dtl::testing::flat_params(*model);
}

inline void fsdp_step(FullyShardedDataParallel& fsdp, const torch::Tensor& rows, int backwards = 1) {
  fsdp.zero_grad();
  for (int k = 0; k < backwards; ++k) fsdp.loss(rows).backward();
  fsdp.step();
}

// `steps` FSDP steps == the DDP oracle, every rank holding the same parameters.
inline void expect_fsdp_equals_ddp(const GPTConfig& cfg, const FSDPConfig& fc, int steps,
                                   const dtl::OptimConfig& oc, const std::string& what,
                                   FullyShardedDataParallel::Policy policy = dtl::lab15::transformer_policy,
                                   int backwards = 1, double rtol = 1e-4, double atol = 2e-5) {
  auto comm = fresh_comm();
  Data data(cfg, comm->size());
  const torch::Tensor expected = ddp_params(cfg, data, steps, oc, backwards);
  GPT model(cfg);
  model->to(device());
  FullyShardedDataParallel fsdp(model, *comm, fc, oc, policy);
  for (int s = 0; s < steps; ++s) fsdp_step(fsdp, my_rows(data.sampler, s, *comm), backwards);
  const torch::Tensor got = fsdp.full_parameters();
  const std::string where = what + " on " + std::to_string(comm->size()) + " ranks, " + cfg.to_string();
  DTL_EXPECT_CLOSE(got, expected, rtol, atol) << where;
  DTL_EXPECT_SAME_ON_ALL_RANKS(got) << where << ": the ranks drifted apart";
}

inline FSDPConfig with(ShardingStrategy s, int ranks_per_node = 0) {
  FSDPConfig c;
  c.strategy = s;
  c.ranks_per_node = ranks_per_node;
  return c;
}

// The hybrid layouts a world size allows: nodes of 2 ranks where it divides, else 1 rank each.
inline int hybrid_ranks_per_node(int world) { return world % 2 == 0 ? 2 : 1; }

// Which units (other than the root) hold their full parameters, sampled by the test itself at
// every gradient arrival of a backward (GradReadyHooks on every parameter): the most at once.
struct GatheredDuringBackward {
  int most = 0;
  std::vector<std::unique_ptr<dtl::GradReadyHook>> hooks;
  explicit GatheredDuringBackward(FullyShardedDataParallel& fsdp) {
    const auto& flats = fsdp.flat_parameters();
    for (const auto& f : flats)
      for (const auto& p : f.params())
        hooks.push_back(std::make_unique<dtl::GradReadyHook>(p, [this, &flats] {
          int n = 0;
          for (size_t u = 1; u < flats.size(); ++u) n += flats[u].is_unsharded();
          most = std::max(most, n);
        }));
  }
};

// The peak of live bytes above those before, on this rank, during a forward under NoGradGuard of
// a tiny batch (one row of 2 tokens: activations of a few KiB), so what is measured is the
// parameters FSDP gathers. CPU only (the tracking allocator).
inline int64_t forward_peak_bytes(FullyShardedDataParallel& fsdp, const GPTConfig& cfg) {
  dtl::memory::install();
  torch::Tensor rows = torch::randint(cfg.vocab_size, {1, 3}, torch::kLong).to(device());
  torch::NoGradGuard no_grad;
  dtl::memory::reset_peak();
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  fsdp.loss(rows);
  return static_cast<int64_t>(dtl::memory::peak_bytes()) - before;
}

// Whether the ranks with world ranks a and b sit on different nodes of `ranks_per_node`.
inline bool spans_nodes(const Comm& c, int ranks_per_node) {
  const auto& r = c.world_ranks();
  return std::any_of(r.begin(), r.end(), [&](int x) { return x / ranks_per_node != r[0] / ranks_per_node; });
}
// Bytes on the wire of a step on communicators that cross a node boundary.
inline double inter_node_wire_bytes(const FullyShardedDataParallel& fsdp, int ranks_per_node) {
  double bytes = 0;
  if (spans_nodes(fsdp.shard_comm(), ranks_per_node)) bytes += fsdp.shard_comm().stats().total_wire_bytes();
  if (fsdp.replicate_comm() && spans_nodes(*fsdp.replicate_comm(), ranks_per_node))
    bytes += fsdp.replicate_comm()->stats().total_wire_bytes();
  return bytes;
}

// A wrapper's communicators' counters as the student's process counted them (MEASURED): the
// shard group's, and the replicate group's when it is a communicator of its own (empty counters
// otherwise, so both runs observe the same two values whatever the wrapper built).
struct WrapperStats {
  dtl::CommStats shard, replicate;
  int64_t total_count() const { return shard.total_count() + replicate.total_count(); }
};
inline WrapperStats measured_stats(const FullyShardedDataParallel& fsdp,
                                   const char* file = __builtin_FILE(),
                                   int line = __builtin_LINE()) {
  using dtl::testing::observe;
  const auto src = dtl::testing::Source::kMeasured;
  const bool separate = fsdp.replicate_comm() && fsdp.replicate_comm() != &fsdp.shard_comm();
  WrapperStats s;
  s.shard = observe(fsdp.shard_comm().stats(), "the shard group's counters", src, file, line);
  s.replicate = observe(separate ? fsdp.replicate_comm()->stats() : dtl::CommStats{},
                        "the replicate group's counters", src, file, line);
  return s;
}

// The traffic a wrapper's communicators counted, by op.
inline dtl::lab15::StepTraffic counted(const WrapperStats& stats) {
  dtl::lab15::StepTraffic t;
  for (const dtl::CommStats* st : {&stats.shard, &stats.replicate}) {
    t.all_gather += (*st)[OpType::AllGather].bytes;
    t.reduce_scatter += (*st)[OpType::ReduceScatter].bytes;
    t.all_reduce += (*st)[OpType::AllReduce].bytes;
  }
  return t;
}

}  // namespace lab15_test
