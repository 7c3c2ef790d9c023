// labs/19_parallel_state/parallel_state.hpp — the interface of lab 19 (the seam the tests call;
// do not edit).
//
// defines: rank_groups, RankGenerator, ParallelConfig, ParallelState, ParallelPlan,
// from_megatron_args, from_deepspeed_config.
//
// Every large training framework starts the same way: it arranges the world's ranks on a grid of
// parallel dimensions and builds one process group per line of the grid. Megatron-LM does it in
// megatron/core/parallel_state.py (initialize_model_parallel, with its RankGenerator and
// generate_masked_orthogonal_rank_groups), DeepSpeed in deepspeed/utils/groups.py and the
// `mpu` it borrows from Megatron. Read that file first and every other file of a framework
// becomes easier: "the tp group", "the dp-cp group", "the embedding group" are lines of one grid.
//
// The grid: dimensions listed in an order string, the first varying fastest. Megatron's default
// "tp-cp-ep-dp-pp" puts a tensor-parallel group on consecutive ranks (one node, the fastest
// links) and the pipeline's stages farthest apart:
//
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))        (ep = 1)
//
// Megatron-Core builds two grids over the same ranks: the dense one (tp, cp, dp, pp; ep = 1) for
// attention and dense layers, and the expert one (tp, ep, expert dp, pp; cp = 1) for
// mixture-of-experts layers, whose expert-parallel ranks come out of the dense layers' dp x cp.
//
// This lab: the rank arithmetic (Task 1), the groups and sub-communicators of both grids (Task 2),
// and the translation of a Megatron command line and of a DeepSpeed JSON config into the
// course's parallel plan, with the checks those frameworks make (Task 3). The lecture note is a
// reading guide to both frameworks. Words the tests look for in error messages are listed with
// each function ("...").
#pragma once

#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtl/comm.hpp"   // defines: Comm
#include "dtl/error.hpp"  // defines: DTL_CHECK
#include "dtl/model.hpp"  // defines: model::GPTConfig

namespace dtl::lab19 {

using model::GPTConfig;

// ---------------------------------------------------------------- Task 1: the rank generator

// Megatron's generate_masked_orthogonal_rank_groups: `sizes` are the grid's dimensions, fastest
// first (their product is the world), `mask` says which dimensions a group spans. Returns every
// group: the ranks that agree on every unmasked coordinate, each group listed by increasing
// coordinate of its masked dimensions (the first masked dimension fastest), the groups ordered
// by their unmasked coordinates (the first unmasked dimension fastest). Example, sizes {2, 3, 4}
// (tp, dp, pp), mask {false, true, false}: the dp groups [0, 2, 4] [1, 3, 5] [6, 8, 10] ...
// [19, 21, 23]. Raises dtl::Error unless sizes and mask have the same length ("mask") and every
// size is >= 1 ("size").
std::vector<std::vector<int>> rank_groups(const std::vector<int>& sizes, const std::vector<bool>& mask);

// Megatron's RankGenerator(tp, ep, dp, pp, cp, order): the grid of those sizes laid out in
// `order` (tokens "tp", "cp", "ep", "dp", "pp" joined by '-', first fastest; a token missing
// from the order is appended at the end when its size is 1, and is an error otherwise; the
// missing ones are appended in Megatron's order tp, pp, dp, ep, cp, as its name_to_size lists
// them: "pp-tp-dp" becomes "pp-tp-dp-ep-cp", "tp-pp" becomes "tp-pp-dp-ep-cp").
// world_size() is the product. get_ranks("tp-dp") are the groups spanning tp and dp, in the
// order rank_groups gives them. Raises dtl::Error when a size is < 1 ("size"), when ep > 1 and
// cp > 1 together (one grid has one of them: "ep"), when the order repeats or does not know a
// token, or lacks a dimension of size > 1 ("order"), and when get_ranks names a token the order
// does not have ("token").
class RankGenerator {
 public:
  RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order = "tp-cp-ep-dp-pp");
  int world_size() const;
  const std::string& order() const;  // with the appended tokens, e.g. "tp-pp-dp-ep-cp"
  std::vector<std::vector<int>> get_ranks(const std::string& token) const;
  int size(const std::string& token) const;

 private:
  std::vector<std::string> tokens_;
  std::vector<int> sizes_;
  std::string order_;
};

// ---------------------------------------------------------------- Task 2: ParallelState

struct ParallelConfig {
  int tp = 1, cp = 1, ep = 1, pp = 1;
  int dp = 0;  // 0: world / (tp x cp x pp); otherwise it must be that
  std::string order = "tp-cp-ep-dp-pp";
};

// The groups of initialize_model_parallel over the ranks of `world`, by Megatron's names for
// them (the tokens of get_ranks), from two generators: the dense RankGenerator(tp, 1, dp, pp, cp,
// order) and the expert RankGenerator(tp, ep, dp x cp / ep, pp, 1, order):
//   dense:  "tp" "cp" "dp" "pp" "dp-cp" "tp-cp" "tp-dp" "tp-dp-cp" "tp-pp" (the model-parallel
//           group), and "embedding" (the first and last rank of each pp group; just the first
//           when pp = 1) and "position_embedding" (the first rank of each pp group);
//   expert: "ep" "expert_dp" (the expert generator's dp) "tp-ep" "tp-ep-pp".
// Construction is collective over `world`: after the checks, one sub-Comm per name, made with
// world.split in the order above (group_names() order); this rank's sub-Comm of a name orders its
// members as the group lists them. Ranks in no "embedding" / "position_embedding" group (middle
// pipeline stages) get none of that name. Raises dtl::Error, before any communication, when
// tp x cp x pp does not divide the world ("world"), when dp is given and is not world / (tp x cp
// x pp) ("dp"), when ep does not divide dp x cp ("ep"), or as RankGenerator does; and, as
// Megatron's initialize_model_parallel refuses them, when pp > 1, the order does not end in
// "pp" and the expert grid's data-parallel size dp x cp / ep differs from dp ("pp-last":
// Megatron's "When not using pp-last rank ordering, the data parallel size of the attention and
// moe layers must be the same"), and when the two grids' "pp" groups differ ("pipeline": the
// attention and the experts of one layer must live on the same pipeline stage).
class ParallelState {
 public:
  ParallelState(Comm& world, const ParallelConfig& config);
  ~ParallelState();
  ParallelState(const ParallelState&) = delete;
  ParallelState& operator=(const ParallelState&) = delete;

  int size(const std::string& dim) const;  // "tp" "cp" "ep" "dp" "pp" "expert_dp"
  // This rank's coordinate on a dense dimension ("tp" "cp" "dp" "pp") or on the expert grid's
  // "ep" and "expert_dp".
  int coord(const std::string& dim) const;
  static const std::vector<std::string>& group_names();
  // Every group of one name, as the generators list them.
  const std::vector<std::vector<int>>& groups(const std::string& name) const;
  // This rank's group of one name (world ranks), empty when it is in none.
  std::vector<int> group_of(const std::string& name) const;
  // This rank's sub-Comm of one name; raises dtl::Error when it is in no such group ("group").
  Comm& comm(const std::string& name) const;
  bool has(const std::string& name) const;  // whether this rank is in a group of that name

  struct State;  // yours: define it in parallel_state.cpp

 private:
  std::unique_ptr<State> s_;
};

// ---------------------------------------------------------------- Task 3: config translation

// The course's one parallel plan: what every framework's configuration says, in one place.
struct ParallelPlan {
  int world = 1, tp = 1, cp = 1, pp = 1, dp = 1;
  int virtual_stages = 1;          // model chunks per pipeline rank (interleaved 1F1B, lab 12)
  bool sequence_parallel = false;  // lab 10
  int64_t micro_batch = 1;         // sequences per micro-batch per data-parallel rank
  int64_t global_batch = 1;        // sequences per optimizer step
  int64_t grad_accum = 1;          // micro-batches per step: global / (micro x dp)
  int zero_stage = 0;              // 0: none; 1: optimizer state (Megatron's distributed optimizer)
  std::string recompute = "none";  // "none", "selective", "full" (lab 13)
  double grad_clip = 0;            // 0: no clipping
  std::string precision = "fp32";  // "fp32", "bf16", "fp16"
  bool operator==(const ParallelPlan& o) const {
    return world == o.world && tp == o.tp && cp == o.cp && pp == o.pp && dp == o.dp &&
           virtual_stages == o.virtual_stages && sequence_parallel == o.sequence_parallel &&
           micro_batch == o.micro_batch && global_batch == o.global_batch &&
           grad_accum == o.grad_accum && zero_stage == o.zero_stage && recompute == o.recompute &&
           grad_clip == o.grad_clip && precision == o.precision;
  }
  std::string to_string() const {  // one line, every field
    return fmt::format("ParallelPlan(world={} tp={} cp={} pp={} dp={} virtual_stages={} "
                       "sequence_parallel={} micro_batch={} global_batch={} grad_accum={} "
                       "zero_stage={} recompute={} grad_clip={} precision={})",
                       world, tp, cp, pp, dp, virtual_stages, sequence_parallel, micro_batch,
                       global_batch, grad_accum, zero_stage, recompute, grad_clip, precision);
  }
};

// A Megatron-LM command line (the flags of megatron/training/arguments.py, "--flag value" or
// "--flag=value") for `world` ranks training `model`. Understood: --tensor-model-parallel-size,
// --pipeline-model-parallel-size, --context-parallel-size, --sequence-parallel,
// --micro-batch-size, --global-batch-size, --num-layers-per-virtual-pipeline-stage,
// --use-distributed-optimizer (zero_stage 1), --recompute-granularity (selective|full),
// --clip-grad, --bf16, --fp16. Defaults are Megatron's: sizes 1, micro batch 1, global batch =
// micro x dp, clip-grad 1.0, fp32. --sequence-parallel with tp 1 is switched off, as Megatron
// does. Checks, each error naming the flag: an unknown flag or a missing value (the flag); world
// divisible by tp x cp x pp ("--tensor-model-parallel-size"); model.n_head and vocab_size
// divisible by tp ("--tensor-model-parallel-size"); n_layer divisible by pp
// ("--pipeline-model-parallel-size"); n_layer / pp divisible by the layers per virtual stage
// ("--num-layers-per-virtual-pipeline-stage"); seq_len divisible by 2 x cp when cp > 1
// ("--context-parallel-size"; without context parallelism any length goes); the global batch
// divisible by micro x dp ("--global-batch-size"); --bf16 with --fp16 ("--bf16").
ParallelPlan from_megatron_args(const std::vector<std::string>& args, int world, const GPTConfig& model);

// A DeepSpeed JSON config (the docs' "train_batch_size", "train_micro_batch_size_per_gpu",
// "gradient_accumulation_steps", "zero_optimization": {"stage"}, "gradient_clipping", "bf16" /
// "fp16": {"enabled"}) for `world` ranks with tensor and pipeline sizes tp and pp (DeepSpeed
// takes those from the model's mpu, not from its config): dp = world / (tp x pp). Of the three
// batch numbers, any two determine the third (train = micro x accum x dp), one alone means an
// accumulation of 1, all three given must agree (DeepSpeed's _set_batch_related_parameters). Checks, each error naming the key: not JSON ("json"); world divisible by tp x pp
// and the model's heads, vocabulary and layers by tp and pp ("tp", "pp"); the batch arithmetic
// ("train_batch_size"); a stage outside 0-3 ("zero_optimization.stage"); bf16 and fp16 both on
// ("bf16"). recompute is "none" (DeepSpeed's activation checkpointing is configured in code).
ParallelPlan from_deepspeed_config(const std::string& json, int world, int tp, int pp,
                                   const GPTConfig& model);

}  // namespace dtl::lab19
