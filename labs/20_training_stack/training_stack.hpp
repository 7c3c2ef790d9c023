// labs/20_training_stack/training_stack.hpp — the interface of lab 20, the capstone (the seam the
// tests call; do not edit).
//
// defines: (given, catalogue.cpp) Cluster, cluster, cluster_names, model_by_name, model_names,
// Plan, parse_plan, CostModel, mixed_precision, model_flops_per_token, hardware_flops_per_token,
// PublishedRun, published_runs, calibration_rows, cost_for, published_tokens_per_s, calibrate,
// HookedOptimizer, SerialBox, save_training_state, load_training_state;
// (yours, training_stack.cpp) invalid_reason, params_per_gpu, Memory, memory_per_gpu, StepTime,
// step_time, Estimate, estimate, Ranked, PlanReport, plan, average_gradients, TrainOptions,
// TrainResult, train.
//
// Everything the course built, used together. A practitioner planning a run asks, in order:
//
//   1. what fits    memory per GPU: the model state (lab 14's ZeRO formulas, mixed precision),
//                   the activations (Korthikanti et al. 2022's count, lab 06 and lab 13's
//                   recomputation policies), the micro-batches a pipeline holds (lab 12)
//   2. what it costs   time per step: compute at an achievable fraction of peak, the
//                   tensor-parallel and context-parallel collectives on NVLink or the network
//                   (lab 07's ring models with topology), the pipeline's point-to-point sends
//                   and bubble (lab 12), the data-parallel reduction of the gradients
//   3. which plan   every (tp, cp, pp, dp) x ZeRO stage x checkpointing x micro-batch x
//                   virtual stages the cluster allows; the fastest that fits, unless a simpler
//                   one is within 5% of it (simpler runs break less and are easier to debug)
//   4. does it train   the chosen structure, built from the earlier labs' reference pieces,
//                   follows single-process training step for step
//
// Every tensor lives on the device of the Comm it is used with (Comm::device()).
//
// Units: bytes, seconds, FLOPs, FLOP/s, bytes per second (decimal: 25 GB/s is 25e9), except the
// reported memory_gb_per_gpu, which is in GiB (2^30 bytes: an "80 GB" GPU holds 80 GiB).
// Symbols: L layers, h = d_model, a = n_head, f = ff(), V = vocab_size, T = seq_len, B the global
// batch (sequences per step), b the micro-batch, t, c, p, d the tensor-, context-, pipeline- and
// data-parallel sizes (Megatron's order: t fastest, then c, d, p), v virtual stages per pipeline
// rank, z the ZeRO stage, n = t c p d GPUs, g = gpus_per_node.
//
// Words the tests look for in error messages are listed with each function ("...").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpointing.hpp"       // lab 13: Policy (none, selective, full), checkpoint
#include "dtl/comm.hpp"            // defines: Comm
#include "dtl/model.hpp"           // defines: model::GPTConfig, GPT
#include "dtl/optim.hpp"           // defines: OptimConfig
#include "pipeline_schedules.hpp"  // lab 12: bubble_formula, schedules, ModelChunks, execute
#include "topology.hpp"            // lab 07: LinkModel, Topology, flat_ring_time, hierarchical_time
#include "tp_transformer.hpp"      // lab 09: TensorParallelGPT, ParallelBlock, VocabParallelEmbedding,
                                   // vocab_parallel_cross_entropy (and lab 08's copy_to_tp)
#include "zero.hpp"                // lab 14: Precision, model_state_bytes, ZeroOptimizer

namespace dtl::lab20 {

using model::GPTConfig;
using Checkpointing = lab13::Policy;  // kNone, kSelective (the attention core), kFull (whole layers)

// ================================================================ given: clusters and models

// One GPU type in a cluster of `gpus` GPUs, `gpus_per_node` per node. Bandwidths are per GPU and
// per direction: `nvlink` between two GPUs of one node, `network` from a GPU to another node
// (each GPU has its own network adapter on the clusters below). Numbers and their sources are
// in catalogue.cpp.
struct Cluster {
  std::string name;            // "a100-80g"
  int gpus = 0;
  int gpus_per_node = 8;
  double peak_flops = 0;       // dense BF16 tensor-core FLOP/s of one GPU
  double memory_bytes = 0;     // HBM of one GPU
  double hbm_bandwidth = 0;    // bytes/s between HBM and the GPU
  lab07::LinkModel nvlink;     // alpha (s), beta (bytes/s)
  lab07::LinkModel network;
  int nodes() const { return gpus / gpus_per_node; }
  std::string describe() const;  // "1024 x a100-80g (128 nodes of 8; 312 TFLOP/s, 80 GiB, ...)"
};

// A cluster from "NAME:GPUS[,net=GBPS][,per-node=K]": NAME one of cluster_names() ("a100-40g",
// "a100-80g", "h100-80g"), GPUS the GPU count, net= overrides the per-GPU network bandwidth in
// GB/s (e.g. a cluster with slower adapters), per-node= the GPUs per node. Raises dtl::Error
// naming the problem: an unknown name ("unknown cluster", and the known names), a spec without
// ":GPUS" or with an unreadable number ("spec"), GPUS < 1 ("gpus"), GPUS not a multiple of the
// GPUs per node when there is more than one node ("per node"), net <= 0 ("net").
Cluster cluster(const std::string& spec);
std::vector<std::string> cluster_names();

// The models the demo and the validation know, by name: "gpt3-175b", "megatron-1.7b" ...
// "megatron-1t" (Narayanan et al. 2021, Table 1), "megatron-174.6b" (its Table 2) and
// "megatron-162.2b" (its Figure 13), "opt-175b", "bloom-176b", "llama2-70b-like",
// "llama3-405b-like" and "llama3-405b-like-128k" (131,072 tokens), "llama2-7b-like", "tiny",
// "small". Unknown: dtl::Error "unknown model".
GPTConfig model_by_name(const std::string& name);
std::vector<std::string> model_names();

// ================================================================ plans and the cost model

struct Plan {
  int tp = 1, pp = 1, dp = 1, cp = 1;
  int zero_stage = 0;                              // 0 (plain data parallelism) .. 3
  Checkpointing checkpointing = Checkpointing::kNone;
  int64_t micro_batch = 1;                         // sequences per micro-batch, b
  int virtual_stages = 1;                          // v: model chunks per pipeline rank
  // The layers of the first and of the last pipeline stage (Megatron-LM's
  // --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers); the other
  // stages split the rest evenly. 0: not set. Both 0: the even split, every stage counted at
  // ceil(L / p). Fewer layers on the edge stages balance them against the embedding, the head
  // and the first stage's warm-up micro-batches (Llama 3 405B: 7, 14 x 8, 7).
  int first_stage_layers = 0, last_stage_layers = 0;
  int gpus() const { return tp * pp * dp * cp; }
  // "tp=8 pp=4 dp=32 cp=1 zero=1 ckpt=full mb=1 v=1", then " first_layers=7" and
  // " last_layers=7" when set
  std::string describe() const;
};

// Given: a plan from "tp=8,pp=4,dp=32" (keys tp, pp, dp, cp, zero, ckpt (none|selective|full),
// mb, v, first_layers, last_layers; missing keys keep `base`'s values). Unknown keys or values:
// dtl::Error ("fix").
Plan parse_plan(const std::string& text, const Plan& base = {});

// What the planner assumes about the training software, and the constants it calibrates.
// The three calibrated constants are the values calibrate() returns for calibration_rows()
// (three published runs); the tests check that your step_time gives them back.
struct CostModel {
  // Calibrated on three published runs (calibrate()):
  double compute_efficiency = 0.653262;  // eps: the fraction of peak the matmuls run at
  double memory_passes = 2.211554;      // kappa: HBM passes over a layer's activations per
                                        // forward (the memory-bound elementwise work)
  double dp_overlap = 0.424200;          // omega: the share of the data-parallel communication
                                        // hidden behind the backward pass
  // The software stack (stated, not calibrated; each published run sets its own):
  bool flash_attention = true;     // attention never writes its T x T scores to HBM (a fused
                                   // kernel, Dao et al. 2022): no scores in memory or traffic
  bool sequence_parallel = true;   // Megatron's sequence parallelism (Korthikanti et al. 2022):
                                   // the activations tensor parallelism replicates are split too
  double usable_memory = 0.90;     // the share of HBM a plan may fill (the rest: the CUDA
                                   // context, NCCL buffers, the allocator's fragmentation)
};

// Mixed precision as Megatron-LM trains it: bf16 parameters (2 bytes), fp32 gradients (4: they
// are accumulated and reduced in fp32), fp32 master weights and Adam's two moments (12):
// 18 bytes per parameter (Megatron-LM's distributed-optimizer documentation). (Given.)
inline lab14::Precision mixed_precision() { return {2, 4, 12}; }

// FLOPs per token of a training step (2 per multiply-add, matmuls only; attention over the full
// T x T, as Narayanan et al. 2021 and PaLM (Chowdhery et al. 2022, appendix B) count it):
//   a layer's forward  2 (4h^2 + 2hf) + 4 T h      (the four projections; scores and context)
//   the head's forward 2 h V
// model_flops_per_token = 3 (L layer + head): forward and a backward of twice the work. The
// FLOPs MFU is measured in. (Given.)
inline double model_flops_per_token(const GPTConfig& c) {
  const double h = static_cast<double>(c.d_model), f = static_cast<double>(c.ff());
  const double layer = 2 * (4 * h * h + 2 * h * f) + 4 * static_cast<double>(c.seq_len) * h;
  return 3 * (static_cast<double>(c.n_layer) * layer + 2 * h * static_cast<double>(c.vocab_size));
}
// What the GPUs execute, recomputation included (Megatron's "achieved TFLOP/s" counts these):
// kFull runs every layer's forward once more (4 passes instead of 3; Narayanan et al.'s
// equation (3) for f = 4h), kSelective the attention core's 4 T h once more. (Given.)
inline double hardware_flops_per_token(const GPTConfig& c, Checkpointing ckpt) {
  const double h = static_cast<double>(c.d_model), f = static_cast<double>(c.ff());
  const double T = static_cast<double>(c.seq_len), L = static_cast<double>(c.n_layer);
  const double layer = 2 * (4 * h * h + 2 * h * f) + 4 * T * h;
  const double extra = ckpt == Checkpointing::kFull ? layer : ckpt == Checkpointing::kSelective ? 4 * T * h : 0;
  return model_flops_per_token(c) + L * extra;
}

// ================================================================ Task 1: what fits

// Why `plan` cannot run `model` on `cluster` with `global_batch` sequences per step: "" when it
// can, else the first broken rule, with its numbers and these words:
//   the model itself (GPTConfig::validate) ........................ its own message ("n_head")
//   a size < 1 .................. "tp", "pp", "dp", "cp", "micro_batch", "virtual_stages"
//   zero_stage outside 0..3 ........................................ "zero_stage"
//   tp x cp x pp x dp != cluster.gpus ...... "tp=8 x cp=1 x pp=4 x dp=30 = 960 is not the
//                                             cluster's 1024 GPUs" ("GPUs")
//   n_head not divisible by tp ............................... "n_head" (heads are TP's unit)
//   ff() not divisible by tp ...................................................... "d_ff"
//   seq_len not divisible by cp ................................................ "seq_len"
//   pp > n_layer ................................................................ "n_layer"
//   global_batch not divisible by dp x micro_batch ........................ "global_batch"
//   first_ or last_stage_layers < 0, or either set with pp = 1, or the layers they leave
//   (L - first - last) not splitting evenly over the stages left, at least one each (with
//   pp = 2 and both set: first + last != L) ...... "first_layers" and "last_layers" (both)
//   virtual_stages > 1 with pp = 1, or not dividing the layers of an evenly split stage
//   (ceil(L / pp), or the share of a stage the edge layers leave; an edge stage's own layers
//   need not divide: Llama 3's first chunk holds only the embedding) ...... "virtual_stages"
//   virtual_stages > 1 and the micro-batches m not a multiple of pp ........ "micro-batches"
// (the vocabulary need not divide by tp: Megatron pads it, here every size uses ceil(V / t)).
std::string invalid_reason(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                           int64_t global_batch);
// dtl::Error with invalid_reason's message unless it is "". (Given.)
inline void check_plan(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                       int64_t global_batch) {
  const std::string why = invalid_reason(model, cluster, plan, global_batch);
  DTL_CHECK(why.empty(), why);
}

// Parameters on one GPU of the fullest pipeline stage. Stage r holds L_r layers: the plan's
// first_stage_layers (r = 0) and last_stage_layers (r = p - 1) where set, the other stages
// (L - first - last) / (stages left) each; with neither set every stage is counted at
// ceil(L / p) (a bound: an uneven split gives some stages one layer less).
//   a layer   (4h^2 + 2hf)/t + (3h + f)/t + 2h + 4h      the matrices and the column-parallel
//                                                        biases (qkv, fc) are split over t; the
//                                                        row-parallel biases (2h) and the two
//                                                        LayerNorms (4h) are replicated; without
//                                                        cfg.bias the bias terms are 0
//   E = ceil(V / t) h                                    the vocabulary-parallel embedding
//   p = 1:  L layer + E + T h + 2h (+ E when the head is untied)
//   p > 1:  the most of N_r = L_r layer                  over the stages r, where
//                             + [r = 0] (E + T h)        (positions live on the first stage)
//                             + [r = p - 1] (2h + E)     (ln_f; the head: the tied embedding's
//                                                         copy, or the untied head)
//           (even split: max(first, last), the first with the positions)
// With t = p = 1 this is model::num_parameters of the GPT. No checks (plan assumed valid).
int64_t params_per_gpu(const GPTConfig& model, const Plan& plan);

// Bytes on one GPU at the peak of a step. `global_batch` gives the micro-batches per pipeline,
// m = global_batch / (dp micro_batch).
// Every pipeline stage r is a GPU with its own states and activations; the result is the stage
// with the largest total (the first such stage), its three parts as they are there:
//   states       lab14::model_state_bytes(zero_stage, {N_r}, dp x cp, mixed_precision()).total()
//                with N_r the stage's parameters (params_per_gpu's; ZeRO shards over the data-parallel ranks, and Megatron
//                also over the context-parallel ones); stage 3 adds two gathered layers in bf16,
//                2 x 2 x layer (FSDP's prefetch keeps the next layer's parameters while one runs)
//   activations  per layer and micro-batch, with s = b T / c tokens on this GPU and D = 1 when
//                cfg.dropout > 0, else 0 (Korthikanti et al. 2022, 16-bit activations, 1-byte
//                dropout masks):
//                  R = (8 + 2D) h       replicated by tensor parallelism (LayerNorm inputs, the
//                                       inputs of qkv and fc, dropout masks): / t only with
//                                       sequence_parallel, else / 1
//                  S = 8h + 4f          split by tensor parallelism (q, k, v, the projection's
//                                       input, fc's output and GELU's output): / t
//                  C = (2 + 3D) a T     the attention scores of a token (softmax output, with
//                                       dropout its mask and output): / t; 0 with flash_attention
//                  kNone       A = s (R/t' + (S + C)/t)     t' = t with sequence_parallel, else 1
//                  kSelective  A = s (R/t' + S/t)           (the scores are recomputed)
//                  kFull       A = s 2h / t'                (only each layer's input)
//                times the (micro-batch, chunk) pairs stage r holds at its schedule's peak (lab
//                12's one_f_one_b and interleaved, Megatron's warm-up counts), each chunk L_r / v
//                layers (an edge stage's uneven chunks counted at their mean):
//                  v = 1:  L_r min(m, p - r)
//                  v > 1:  (L_r / v) min(v m, 2(p - r - 1) + (v - 1) p + 1) (the warm-up plus
//                          the one in its forward), and v m when m = p (every forward first)
//                and under kFull the layer being recomputed in backward is whole: + A(kNone).
//                With an even split the first stage is the fullest; with first_stage_layers
//                fewer, the second may be.
//   logits       4 s ceil(V / t): one micro-batch's fp32 logits for the loss (on the last stage;
//                counted on every stage: a bound, exact when p = 1)
struct Memory {
  double states = 0, activations = 0, logits = 0;
  double total() const { return states + activations + logits; }
};
Memory memory_per_gpu(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                      int64_t global_batch, const CostModel& cost);

// ================================================================ Task 2: what it costs

// Seconds of one training step (global_batch sequences), with m = global_batch / (dp b)
// micro-batches per pipeline and s = b T / c tokens per micro-batch on a GPU. Every collective
// runs over a group of ranks placed by Megatron's order: a group of size k whose members are
// `stride` ranks apart (tp 1, cp t, dp x cp t, consecutive pipeline stages t c d) has
// per_node = 1 member per node when stride >= g, else gcd(k, g / stride): g / stride when that
// divides k, and otherwise the largest count that splits the group evenly over its nodes (12
// ranks of stride 1 on nodes of 8 are priced as 3 nodes of 4, never as 1 node of 8, which
// would lose 4 ranks); its lab 07 Topology
// is {nvlink, network, per_node, k / per_node} and an all-reduce of B bytes over it takes
// allreduce(B) = min(flat_ring_time, hierarchical_time) (0 for k = 1); a reduce-scatter or an
// all-gather of B bytes (nccl-tests' S: the whole buffer) takes allreduce(B) / 2.
//   layer compute   one micro-batch through one layer, forward FLOPs F = (2 s (4h^2 + 2hf)
//                   + 4 s T h) / t, the attention core's Fc = 4 s T h / t:
//                   (P F + [kSelective] Fc) / (peak x eps) + kappa (P A(kNone) + [kSelective]
//                   s C / t) / hbm_bandwidth, with P = 3 passes (forward, backward = 2
//                   forwards), 4 under kFull
//   tp_comm         per layer and micro-batch, 4 collectives (2 forward, 2 backward; 6 under
//                   kFull: the recomputed forward's 2 again) of the activations, 2 s h bytes,
//                   each allreduce(2 s h) over the tp group (with sequence parallelism each is a
//                   reduce-scatter + an all-gather: the same time)
//   cp_comm         cp > 1: per layer and micro-batch 2 (3 under kFull) all-gathers of K and V,
//                   4 b T h / t bytes, over the cp group (Llama 3's all-gather context
//                   parallelism: forward, backward's reduce-scatter, the recomputation)
//   logits          3 x 2 s h ceil(V / t) / (peak x eps) per micro-batch (last stage)
//   p2p             pp > 1: 2 v transfers per micro-batch (an activation forward and its
//                   gradient back, for each of the v chunks) of 2 s h / t bytes (Megatron's
//                   scatter-gather splits them over the tp ranks), each link.time(bytes) on
//                   nvlink when t c d < g (consecutive stages share a node), else on network
//   stage           one micro-batch through the slowest stage: the most over the stages r of
//                   L_r (layer compute + tp_comm + cp_comm) + [r = p - 1] logits (the last stage
//                   has the head; with an even split it is the slowest), + p2p
//   pipeline        m stage / (1 - lab12::bubble_formula(p, m, v)): 1F1B's bubble of (p - 1)/v
//                   stage times (0 when p = 1)
//   dp_comm         the gradient reduction over the dp x cp group (stride t), with N the
//                   params_per_gpu: z = 0: allreduce(4N) (fp32 gradients); z = 1, 2:
//                   reduce-scatter(4N) + all-gather(2N) (the updated bf16 parameters);
//                   z = 3: per micro-batch, two all-gathers(2N) (forward and backward) and a
//                   reduce-scatter(4N)
//   total           pipeline + (1 - omega) dp_comm
struct StepTime {
  double compute = 0;     // m (Ls layer compute + logits if it has the head), Ls the slowest
                          // stage's layers: this GPU's work for the step
  double tp_comm = 0;     // m Ls tp_comm
  double cp_comm = 0;     // m Ls cp_comm
  double p2p = 0;         // m p2p
  double bubble = 0;      // pipeline - m stage
  double dp_comm = 0;     // the whole reduction
  double dp_exposed = 0;  // (1 - omega) dp_comm
  double total = 0;
};
StepTime step_time(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                   int64_t global_batch, const CostModel& cost);

// Memory and time together, and what a practitioner compares plans by:
//   fits               memory total <= usable_memory x memory_bytes
//   memory_gb_per_gpu  memory total / 2^30
//   step_s             step_time total
//   tokens_per_s       global_batch T / step_s
//   tflops_per_gpu     tokens_per_s hardware_flops_per_token(model, ckpt) / n / 1e12
//   mfu                tokens_per_s model_flops_per_token(model) / (n peak_flops)
// Raises dtl::Error with invalid_reason's message for an invalid plan.
struct Estimate {
  Plan plan;
  Memory memory;
  StepTime time;
  bool fits = false;
  double memory_gb_per_gpu = 0, step_s = 0, tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0;
};
Estimate estimate(const GPTConfig& model, const Cluster& cluster, const Plan& plan,
                  int64_t global_batch, const CostModel& cost);

// ================================================================ Task 3: which plan

// Every plan the planner considers, with its verdict.
struct Ranked {
  Estimate estimate;
  // chosen ..................... "chosen: the simplest within 5% of the fastest"
  // fits, within 5% ............ "within 5% of the fastest, less simple"
  // fits, slower ............... "slower by 12.3%" (against the chosen plan's tokens/s, one
  //                              decimal)
  // does not fit ............... "does not fit: 91.2 GiB > 72.0 GiB" (memory_gb_per_gpu
  //                              against the usable GiB, one decimal)
  std::string verdict;
};
struct PlanReport {
  std::vector<Ranked> plans;  // plans[0] is the chosen one; then every other plan that fits,
                              // fastest first; then those that do not fit, smallest first
  double fastest_tokens_per_s = 0;  // the fastest plan that fits
  const Ranked& chosen() const { return plans.at(0); }
};
// The candidates, every combination of:
//   tp   each divisor of cluster.gpus that divides n_head and ff()
//   cp   1, 2, 4, 8, 16: those dividing gpus / tp and seq_len
//   pp   each divisor of gpus / (tp cp) that is <= n_layer;  dp = gpus / (tp cp pp)
//        (dp must divide global_batch)
//   micro_batch  1, 2, 4, ..., 64: those dividing global_batch / dp
//   virtual_stages  1, and when pp > 1 each v in 2..8 dividing ceil(L / pp) with m a multiple
//        of pp
//   zero_stage 0..3, checkpointing none, selective, full
//   first_ and last_stage_layers 0 (the even split only)
// each estimated. The chosen plan: among the plans that fit and reach at least 0.95 x the
// fastest fitting plan's tokens/s, the least by (tp cp pp, virtual_stages, zero_stage,
// checkpointing none < selective < full), then the most tokens/s, then the smallest
// micro_batch, tp, pp, cp. Raises dtl::Error when nothing fits ("no plan fits", with the
// smallest memory_gb_per_gpu found) or when there is no candidate at all ("no plan").
PlanReport plan(const GPTConfig& model, const Cluster& cluster, int64_t global_batch,
                const CostModel& cost);

// ================================================================ given: published runs

// A published training run: the configuration its authors used and the throughput they report.
struct PublishedRun {
  std::string name;            // "megatron-145.6b"
  std::string model;           // a model_by_name() name
  std::string cluster;         // a cluster() spec
  int64_t global_batch = 0;    // sequences per step
  Plan plan;                   // tp, pp, dp, cp, ZeRO, checkpointing, micro-batch, v as published
  bool flash_attention = false, sequence_parallel = false;  // the run's software
  double tflops_per_gpu = 0;   // as published
  bool counts_recompute = true;  // the published FLOPs include recomputation (Megatron's
                                 // equation (3)); false: model FLOPs (MFU), as Llama 3 reports
  std::string source;          // where the numbers come from
  // Empty for a run whose layout this cost model prices; otherwise why it does not (the run is
  // still predicted and reported, and its error is what the model misses there).
  std::string outside_model;
};
std::vector<PublishedRun> published_runs();
// The three rows calibrate() fits the three constants to; every other row is a prediction
// (held out: none of the constants saw it).
std::vector<std::string> calibration_rows();
// `base` with the run's software (flash_attention, sequence_parallel).
CostModel cost_for(const PublishedRun& run, const CostModel& base = {});
// The published throughput in tokens/s: tflops_per_gpu x 1e12 x gpus / the FLOPs per token the
// authors counted (hardware_ or model_flops_per_token of the model, as counts_recompute says).
double published_tokens_per_s(const PublishedRun& run);
// The three calibrated constants that make step_time reproduce the published tokens/s of the
// three named runs exactly. step_time is affine in (1/eps, kappa, omega), so four evaluations
// per run give its coefficients and one 3 x 3 solve gives the constants. Raises dtl::Error
// unless exactly three known runs are named ("three") or when the system has no solution.
CostModel calibrate(const std::vector<std::string>& rows, const CostModel& base = {});

// The baseline a planner must beat: a model that knows nothing about layouts and predicts every
// run at one fraction of peak. published_mfu(run) is the run's published throughput in model
// FLOPs over its GPUs' peak; constant_mfu(rows) the mean of it over the named runs (fitted on
// the calibration rows, it is the baseline's one constant); baseline_tokens_per_s(run, mfu) =
// mfu x gpus x peak / model_flops_per_token. A planner no better than this on the rows it was
// not fitted on says nothing about layouts. Raises dtl::Error for an unknown run name ("run").
double published_mfu(const PublishedRun& run);
double constant_mfu(const std::vector<std::string>& rows);
double baseline_tokens_per_s(const PublishedRun& run, double mfu);

// An order a paper reports between layouts of one experiment (one model), per GPU fastest
// first: best_first[i] beats best_first[i + 1] in tokens/s per GPU (full_order), or only
// best_first[0] beats every other one (the paper names the best; the rest are read off a
// figure). A run here may have tflops_per_gpu 0: only its place in the order is published.
struct PublishedRanking {
  std::string name;
  std::vector<PublishedRun> best_first;
  bool full_order = true;
  std::string source;
};
std::vector<PublishedRanking> published_rankings();

// ================================================================ Task 4: does it train

// Given: an optimizer that runs `before_step` and then `inner`'s step, over the same parameters
// (its zero_grad clears them). What lab 12's execute() calls after its backward passes: the hook
// is where a pipeline rank averages its gradients over its data-parallel replicas.
class HookedOptimizer : public torch::optim::Optimizer {
 public:
  HookedOptimizer(torch::optim::Optimizer& inner, std::function<void()> before_step);
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  torch::optim::Optimizer* inner_;
  std::function<void()> before_step_;
};

// Where one of this rank's parameters sits in the serial model (model::GPT), so that a checkpoint
// written under one plan loads under any other (PyTorch DCP's chunk metadata, Megatron's
// dist_checkpointing: a global offset per dimension). The parameter is a box of the serial
// tensor: it starts at `offset` and, viewed as `box` (param.view(box)), spans box[d] in each
// dimension d. Examples with tp rank r of t (lab 09's shards; V, d, f divisible by t):
//   wte.weight (and an untied lm_head.weight)  [V, d]    box [V/t, d] at [r V/t, 0]
//   blocks.i.attn.proj.weight                  [d, d]    box [d, d/t] at [0, r d/t]
//   blocks.i.mlp.fc.weight                     [f, d]    box [f/t, d] at [r f/t, 0] (its bias too)
//   blocks.i.mlp.proj.weight                   [d, f]    box [d, f/t] at [0, r f/t]
//   blocks.i.attn.qkv.weight                   [3, d, d] box [3, d/t, d] at [0, r d/t, 0]
//   blocks.i.attn.qkv.bias                     [3, d]    box [3, d/t] at [0, r d/t]
//   LayerNorms, wpe, the row-parallel biases   the whole tensor at 0 on every tp rank
// The fused qkv is stored as [3, d, d] (and its bias as [3, d]: the q, k and v sections) under
// every plan, tp = 1 included: a tp rank's heads are rows of all three sections (lab 09's
// qkv_rows), one box of that view but none of [3d, d]. The bytes are the serial tensor's either
// way. (The vocabulary is not padded here: lab 09 refuses V not divisible by t. A trainer that
// pads it, as Megatron does, must clip its last shard's box to the V real rows.)
struct SerialBox {
  std::string name;             // the serial GPT's parameter name: "blocks.0.mlp.fc.weight"
  std::vector<int64_t> shape;   // the serial tensor's shape as checkpoints store it
  std::vector<int64_t> offset;  // the box's first element, one entry per dimension of shape
  std::vector<int64_t> box;     // the parameter viewed as the box; {} = the parameter's own shape
  // Whether this rank writes the box: exactly one holder of each element does (the lowest rank
  // holding it: the dp replicas, the tp ranks of a replicated tensor and the tied head's copy on
  // the last pipeline stage hold the same box and do not write it). Every holder loads it.
  bool writes = true;
};

// Given: lab 17's checkpoint format for any plan. save_training_state writes, for each serial
// tensor <name>, "param/<name>", "exp_avg/<name>" and "exp_avg_sq/<name>" (AdamW's two moments,
// boxes of the same shape) from the ranks whose SerialBox writes it, so each serial tensor's
// elements are saved exactly once; `step`, AdamW's step count ("adam_step") and the plan's sizes
// as counters; atomic, collective over `comm` (lab 17's save). boxes[i] describes params[i]; a
// rank lists only what it holds (every other serial tensor goes in as an empty box, so that every
// rank lists the same names, as lab 17 asks). A rank holding two parameters of one name (a tied
// copy) gives both the same box. load_training_state loads the latest checkpoint in `dir` into
// every holder of every box, whatever plan and world size saved it (lab 17's resharding load);
// returns its step, or -1 when there is none. A checkpoint of another model ("model", lab 17's
// word) or malformed boxes ("box") raise dtl::Error on every rank. The optimizer must be
// make_adamw's AdamW.
std::string save_training_state(const std::string& dir, int64_t step, const Plan& plan,
                                const std::vector<torch::Tensor>& params,
                                const std::vector<SerialBox>& boxes,
                                torch::optim::Optimizer& adamw, Comm& comm);
int64_t load_training_state(const std::string& dir, const std::vector<torch::Tensor>& params,
                            const std::vector<SerialBox>& boxes, torch::optim::Optimizer& adamw,
                            Comm& comm);

// The mean of every rank's gradient over `dp`, in place, for each of `params` that has one
// (params whose .grad() is undefined are skipped on every rank alike). The reduction a
// data-parallel replica group needs, and only that group: tensor-parallel shards are different
// tensors and must never be averaged together; replicated tensors (LayerNorms) already hold
// the same gradient on every tp rank. Collective over dp.
void average_gradients(const std::vector<torch::Tensor>& params, Comm& dp);

struct TrainOptions {
  GPTConfig model = GPTConfig::tiny();
  OptimConfig optim;            // AdamW (make_adamw: weight decay on matrices only); step k
                                // runs at learning rate warmup_cosine_lr(optim, k, steps)
  int64_t global_batch = 8;     // sequences per step, the same for every plan
  int64_t steps = 8;
  uint64_t data_seed = 20;      // data::SyntheticCorpus(model.vocab_size, data_seed)
  int progress_every = 0;       // rank 0 prints a progress line every k steps (0: never)
  double peak_flops = 0;        // per rank, for MFU (0: dtl::measure_matmul_flops() once)
  std::string checkpoint_dir;   // lab 17 checkpoints here ("": none)
  int64_t checkpoint_every = 0; // after every k-th step (0: only after the last step)
  bool resume = true;           // start from the latest checkpoint in checkpoint_dir, if any
};

struct TrainResult {
  std::vector<double> losses;  // the mean loss over the global batch of each step run here,
                               // the same on every rank
  int64_t first_step = 0;      // the step losses[0] belongs to (the resumed step, or 0)
  double tokens_per_s = 0;     // global_batch seq_len / the median step time
  double mfu = 0;              // tokens_per_s model_flops_per_token / (world peak_flops)
  std::string checkpoint;      // the last checkpoint written ("" if none)
};

// Trains options.model for options.steps steps with `plan` on the ranks of `world`
// (plan.gpus() == world.size(), "world"), every rank the same code. The data of step k is
// data::GlobalBatchSampler(corpus, global_batch, seq_len).global_batch_at(k) whatever the
// plan; data-parallel replica r (its coordinate along dp) trains on rows [r B/dp, (r+1) B/dp)
// in micro-batches of plan.micro_batch rows. The result is single-process training: the loss of
// every step equals dtl::train_step's with make_adamw(options.optim) on the whole global batch
// (at the same learning rate schedule), to float rounding.
//
// The ranks are a dtl::DeviceMesh::megatron(world, tp, cp, pp, dp); the model is built from the
// earlier labs' references:
//   tp = pp = 1   model::GPT; zero_stage 0: make_adamw and average_gradients over dp;
//                 zero_stage 1-3: lab 14's ZeroOptimizer over dp; checkpointing (zero_stage 0
//                 or 1): lab 13's gpt_loss with the plan's policy
//   tp > 1        lab 09's TensorParallelGPT over the tp group, built from the serial GPT;
//   (pp = 1)      make_adamw over its parameters, average_gradients over dp; kFull: every block
//                 through lab 13's checkpoint
//   pp > 1        lab 12's ModelChunks (even_parts over pp x v chunks) and PipelineLinks over
//   (tp = 1)      the pp group, executed with one_f_one_b (v = 1) or interleaved (v > 1) on
//                 this replica's rows; make_adamw over the chunks' parameters wrapped in a
//                 HookedOptimizer that averages the gradients over dp before the step (execute
//                 has summed the tied embedding's two copies by then)
//   tp, pp > 1    lab 09's tensor-parallel pieces cut into pp stages (the blocks split by
//                 dtl::split_range, the embedding and positions on the first stage, ln_f and the
//                 head on the last; a tied head is a copy of the embedding's shard on the last
//                 stage, its gradient summed with the first stage's over pp), run in the order of
//                 lab 12's one_f_one_b over lab 12's PipelineLinks of the pp group; make_adamw
//                 over the stage's parameters, average_gradients over dp
// Unsupported here, dtl::Error before any communication naming what is missing: cp > 1 ("cp");
// first_stage_layers or last_stage_layers set (the blocks split evenly: "first_layers");
// virtual_stages > 1 with tp and pp > 1 ("virtual_stages"); zero_stage > 0 with tp or pp > 1, or
// checkpointing other than none with pp > 1, selective with tp > 1, or any with zero_stage > 1
// ("zero_stage" or "checkpointing"); a checkpoint_dir with zero_stage > 0 ("checkpoint"); an
// invalid plan for the global batch (the micro-batches: "global_batch").
// Rank 0 prints a progress line (step, loss, tokens/s, MFU) every progress_every steps; each
// step is a trace scope "step <k>" (dtl::trace, --trace). With a checkpoint_dir: resume from its
// latest checkpoint when options.resume (losses then start at first_step = the saved step), and
// save after every checkpoint_every-th step and after the last one (save_training_state, each
// parameter described by its SerialBox). A checkpoint of any plan resumes under any other, on any
// number of ranks: the resumed run continues the serial trajectory (to float rounding).
TrainResult train(const Plan& plan, const TrainOptions& options, Comm& world);

}  // namespace dtl::lab20
