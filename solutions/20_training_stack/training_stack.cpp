// Lab 20 reference: a planner for a real training run (memory, time, the choice) and a trainer
// composed of the earlier labs' reference pieces. The contract is training_stack.hpp; the
// given pieces (clusters, models, published runs, calibration, checkpoint glue) are in
// catalogue.cpp.
#include "training_stack.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: DTL_CHECK
#include "dtl/log.hpp"      // defines: Progress
#include "dtl/mesh.hpp"     // defines: DeviceMesh
#include "dtl/perf.hpp"     // defines: median, measure_matmul_flops
#include "dtl/split.hpp"    // defines: split_range
#include "dtl/trace.hpp"    // defines: DTL_SCOPE

namespace dtl::lab20 {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t micro_batches(const Plan& p, int64_t global_batch) {
  return global_batch / (static_cast<int64_t>(p.dp) * p.micro_batch);
}

// The stages Plan::first_stage_layers and last_stage_layers do not set, and the layers each of
// them holds: the rest of the layers split evenly (0 stages when pp = 2 sets both). Without
// either, every stage is counted at ceil(L / p).
struct EvenStages {
  int count = 0;
  int64_t layers = 0;
};
EvenStages even_stages(const GPTConfig& cfg, const Plan& p) {
  const int set = (p.first_stage_layers > 0) + (p.last_stage_layers > 0);
  if (set == 0) return {p.pp, ceil_div(cfg.n_layer, p.pp)};
  EvenStages e;
  e.count = p.pp - set;
  if (e.count > 0) e.layers = (cfg.n_layer - p.first_stage_layers - p.last_stage_layers) / e.count;
  return e;
}

// The layers of pipeline stage r (a valid plan).
int64_t layers_of_stage(const GPTConfig& cfg, const Plan& p, int r) {
  if (p.pp == 1) return cfg.n_layer;
  if (r == 0 && p.first_stage_layers > 0) return p.first_stage_layers;
  if (r == p.pp - 1 && p.last_stage_layers > 0) return p.last_stage_layers;
  return even_stages(cfg, p).layers;
}

// The (micro-batch, chunk) pairs pipeline rank r holds at its peak: its warm-up forwards plus the
// one of the steady state (lab 12's schedules, Megatron's counts). With m = p the interleaved
// schedule runs every forward first.
double pairs_in_flight(const Plan& p, int r, double m) {
  const double pp = p.pp, v = p.virtual_stages;
  if (p.virtual_stages == 1) return std::min(m, pp - r);
  if (m == pp) return v * m;
  return std::min(v * m, 2 * (pp - r - 1) + (v - 1) * pp + 1);
}

// One layer's parameters on one GPU: what tensor parallelism splits, and what it replicates.
int64_t layer_params(const GPTConfig& cfg, int tp) {
  const int64_t h = cfg.d_model, f = cfg.ff();
  int64_t n = (4 * h * h + 2 * h * f) / tp + 4 * h;  // matrices split; two LayerNorms replicated
  if (cfg.bias) n += (3 * h + f) / tp + 2 * h;        // qkv, fc biases split; the two proj biases not
  return n;
}

// Korthikanti et al. 2022's activation bytes of one layer for one micro-batch on one GPU.
struct LayerActivations {
  double none = 0, selective = 0, full = 0;
  double scores = 0;  // s C / t: the attention scores' share of `none`
  double of(Checkpointing c) const {
    return c == Checkpointing::kNone ? none : c == Checkpointing::kSelective ? selective : full;
  }
};
LayerActivations layer_activations(const GPTConfig& cfg, const Plan& p, const CostModel& cost) {
  const double h = static_cast<double>(cfg.d_model), f = static_cast<double>(cfg.ff());
  const double a = static_cast<double>(cfg.n_head), T = static_cast<double>(cfg.seq_len);
  const double D = cfg.dropout > 0 ? 1 : 0;
  const double s = static_cast<double>(p.micro_batch) * T / p.cp;  // tokens of a micro-batch here
  const double t = p.tp, t_rep = cost.sequence_parallel ? p.tp : 1;
  const double R = (8 + 2 * D) * h;                                  // replicated by TP
  const double S = 8 * h + 4 * f;                                    // split by TP
  const double C = cost.flash_attention ? 0 : (2 + 3 * D) * a * T;   // a token's scores
  LayerActivations A;
  A.scores = s * C / t;
  A.selective = s * (R / t_rep + S / t);
  A.none = A.selective + A.scores;
  A.full = s * 2 * h / t_rep;
  return A;
}

// The lab 07 cost of an all-reduce of `bytes` over a group of k ranks `stride` ranks apart.
double allreduce_time(const Cluster& cl, int k, int stride, double bytes) {
  if (k <= 1) return 0;
  const int per_node = stride >= cl.gpus_per_node ? 1 : std::gcd(k, cl.gpus_per_node / stride);
  lab07::Topology topo;
  topo.intra = cl.nvlink;
  topo.inter = cl.network;
  topo.ranks_per_node = per_node;
  topo.nodes = k / per_node;
  return std::min(lab07::flat_ring_time(topo, bytes), lab07::hierarchical_time(topo, bytes));
}

}  // namespace

// ================================================================ Task 1: what fits

std::string invalid_reason(const GPTConfig& model, const Cluster& cluster, const Plan& p,
                           int64_t global_batch) {
  try {
    model.validate();
  } catch (const dtl::Error& e) {
    return e.what();
  }
  const std::pair<const char*, int64_t> sizes[] = {
      {"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"cp", p.cp}, {"micro_batch", p.micro_batch},
      {"virtual_stages", p.virtual_stages}};
  for (const auto& [name, value] : sizes)
    if (value < 1) return fmt::format("{}={} must be >= 1", name, value);
  if (p.zero_stage < 0 || p.zero_stage > 3)
    return fmt::format("zero_stage={} must be 0, 1, 2 or 3", p.zero_stage);
  if (p.gpus() != cluster.gpus)
    return fmt::format("tp={} x cp={} x pp={} x dp={} = {} is not the cluster's {} GPUs", p.tp,
                       p.cp, p.pp, p.dp, p.gpus(), cluster.gpus);
  if (model.n_head % p.tp != 0)
    return fmt::format("tp={} does not divide n_head={} (attention heads are tensor "
                       "parallelism's unit)", p.tp, model.n_head);
  if (model.ff() % p.tp != 0)
    return fmt::format("tp={} does not divide d_ff={}", p.tp, model.ff());
  if (model.seq_len % p.cp != 0)
    return fmt::format("cp={} does not divide seq_len={}", p.cp, model.seq_len);
  if (p.pp > model.n_layer)
    return fmt::format("pp={} stages for n_layer={} layers", p.pp, model.n_layer);
  if (global_batch < 1 || global_batch % (static_cast<int64_t>(p.dp) * p.micro_batch) != 0)
    return fmt::format("global_batch={} is not a multiple of dp={} x micro_batch={}",
                       global_batch, p.dp, p.micro_batch);
  // The edge stages' layers (Megatron's --decoder-first/last-pipeline-num-layers): the other
  // stages share the rest evenly.
  if (p.first_stage_layers < 0 || p.last_stage_layers < 0)
    return fmt::format("first_layers={} and last_layers={} must be >= 0 (0: the even split)",
                       p.first_stage_layers, p.last_stage_layers);
  const bool skewed = p.first_stage_layers > 0 || p.last_stage_layers > 0;
  if (skewed && p.pp == 1)
    return fmt::format("first_layers={} and last_layers={} need pp > 1", p.first_stage_layers,
                       p.last_stage_layers);
  const EvenStages even = even_stages(model, p);
  if (skewed) {
    const int64_t rest = model.n_layer - p.first_stage_layers - p.last_stage_layers;
    if (even.count == 0 ? rest != 0 : rest < even.count || rest % even.count != 0)
      return fmt::format("first_layers={} and last_layers={} leave {} of n_layer={} layers to the "
                         "other {} stage(s), which must split them evenly, at least one each",
                         p.first_stage_layers, p.last_stage_layers, rest, model.n_layer,
                         even.count);
  }
  if (p.virtual_stages > 1) {
    if (p.pp == 1) return fmt::format("virtual_stages={} needs pp > 1", p.virtual_stages);
    // The evenly split stages' chunks are equal; an edge stage set apart may hold fewer layers
    // than its v chunks' share (Llama 3: the first chunk of the first stage holds only the
    // embedding).
    if (even.count > 0 && even.layers % p.virtual_stages != 0)
      return fmt::format("virtual_stages={} does not divide the {} layers of a stage",
                         p.virtual_stages, even.layers);
    if (micro_batches(p, global_batch) % p.pp != 0)
      return fmt::format("{} micro-batches are not a multiple of pp={} (the interleaved schedule "
                         "needs it)", micro_batches(p, global_batch), p.pp);
  }
  return "";
}

namespace {

// Parameters on one GPU of pipeline stage r.
int64_t stage_params(const GPTConfig& cfg, const Plan& p, int r) {
  const int64_t h = cfg.d_model, layer = layer_params(cfg, p.tp);
  const int64_t embedding = ceil_div(cfg.vocab_size, p.tp) * h;  // vocabulary-parallel, padded
  const int64_t positions = cfg.seq_len * h, ln_f = 2 * h;
  if (p.pp == 1)
    return cfg.n_layer * layer + embedding + positions + ln_f + (cfg.tied_head ? 0 : embedding);
  int64_t n = layers_of_stage(cfg, p, r) * layer;
  if (r == 0) n += embedding + positions;
  // The last stage holds the head: the tied embedding's copy, or the untied head; same size.
  if (r == p.pp - 1) n += ln_f + embedding;
  return n;
}

}  // namespace

int64_t params_per_gpu(const GPTConfig& cfg, const Plan& p) {
  int64_t most = 0;
  for (int r = 0; r < p.pp; ++r) most = std::max(most, stage_params(cfg, p, r));
  return most;
}

Memory memory_per_gpu(const GPTConfig& cfg, const Cluster&, const Plan& p, int64_t global_batch,
                      const CostModel& cost) {
  const LayerActivations A = layer_activations(cfg, p, cost);
  const double m = static_cast<double>(micro_batches(p, global_batch));
  // One micro-batch's fp32 logits over this rank's share of the vocabulary.
  const double s = static_cast<double>(p.micro_batch) * static_cast<double>(cfg.seq_len) / p.cp;
  const double logits = 4 * s * static_cast<double>(ceil_div(cfg.vocab_size, p.tp));
  // Every pipeline stage: its model state and what it holds at its schedule's peak. With an even
  // split the first stage is the fullest; with fewer layers there, the second may be.
  Memory fullest;
  for (int r = 0; r < p.pp; ++r) {
    Memory mem;
    // Model state: lab 14's ZeRO accounting, sharded over the data- (and context-) parallel ranks.
    const int64_t N = stage_params(cfg, p, r);
    mem.states = static_cast<double>(
        lab14::model_state_bytes(p.zero_stage, {N}, p.dp * p.cp, mixed_precision()).total());
    if (p.zero_stage == 3) mem.states += 2.0 * 2 * static_cast<double>(layer_params(cfg, p.tp));
    // Activations: the (micro-batch, chunk) pairs in flight, each chunk L_r / v layers.
    const double Lr = static_cast<double>(layers_of_stage(cfg, p, r));
    mem.activations = pairs_in_flight(p, r, m) * Lr / p.virtual_stages * A.of(p.checkpointing);
    if (p.checkpointing == Checkpointing::kFull && Lr > 0) mem.activations += A.none;  // recomputed
    mem.logits = logits;
    if (mem.total() > fullest.total()) fullest = mem;
  }
  return fullest;
}

// ================================================================ Task 2: what it costs

StepTime step_time(const GPTConfig& cfg, const Cluster& cl, const Plan& p, int64_t global_batch,
                   const CostModel& cost) {
  const double h = static_cast<double>(cfg.d_model), f = static_cast<double>(cfg.ff());
  const double T = static_cast<double>(cfg.seq_len), t = p.tp;
  const double b = static_cast<double>(p.micro_batch);
  const double s = b * T / p.cp;
  const double V_t = static_cast<double>(ceil_div(cfg.vocab_size, p.tp));
  const int64_t m = micro_batches(p, global_batch);
  const double flops = cl.peak_flops * cost.compute_efficiency;
  const bool full = p.checkpointing == Checkpointing::kFull;
  const bool selective = p.checkpointing == Checkpointing::kSelective;

  // Compute: the matmuls at eps of peak, the elementwise work at HBM speed (kappa passes over
  // what a layer's forward writes).
  const LayerActivations A = layer_activations(cfg, p, cost);
  const double F = (2 * s * (4 * h * h + 2 * h * f) + 4 * s * T * h) / t;
  const double F_core = 4 * s * T * h / t;
  const double passes = full ? 4 : 3;
  const double layer = (passes * F + (selective ? F_core : 0)) / flops +
                       cost.memory_passes * (passes * A.none + (selective ? A.scores : 0)) /
                           cl.hbm_bandwidth;
  const double logits = 3 * 2 * s * h * V_t / flops;

  // Tensor parallelism: 2 collectives forward, 2 backward (+2 recomputed) per layer.
  const double tp_layer = (full ? 6 : 4) * allreduce_time(cl, p.tp, 1, 2 * s * h);
  // Context parallelism: all-gathers of K and V (half an all-reduce of the gathered bytes).
  const double cp_layer =
      p.cp > 1 ? (full ? 3 : 2) * allreduce_time(cl, p.cp, p.tp, 4 * b * T * h / t) / 2 : 0;
  // Pipeline: an activation forward and a gradient back per chunk and micro-batch.
  double p2p = 0;
  if (p.pp > 1) {
    const bool same_node = p.tp * p.cp * p.dp < cl.gpus_per_node;
    p2p = 2.0 * p.virtual_stages * (same_node ? cl.nvlink : cl.network).time(2 * s * h / t);
  }
  // The slowest stage sets the pace: the last one (it has the head) unless another holds more
  // layers than the head is worth.
  double Ls = 0, slowest = -1;
  bool has_head = false;
  for (int r = p.pp - 1; r >= 0; --r) {
    const double Lr = static_cast<double>(layers_of_stage(cfg, p, r));
    const double t_r = Lr * (layer + tp_layer + cp_layer) + (r == p.pp - 1 ? logits : 0);
    if (t_r > slowest) slowest = t_r, Ls = Lr, has_head = r == p.pp - 1;
  }
  const double stage_logits = has_head ? logits : 0;
  const double stage = Ls * (layer + tp_layer + cp_layer) + stage_logits + p2p;
  const double pipeline = static_cast<double>(m) * stage /
                          (1 - lab12::bubble_formula(p.pp, m, p.virtual_stages));

  // Data parallelism: fp32 gradients reduced, bf16 parameters gathered, over dp x cp.
  const double N = static_cast<double>(params_per_gpu(cfg, p));
  auto ar = [&](double bytes) { return allreduce_time(cl, p.dp * p.cp, p.tp, bytes); };
  double dp = 0;
  if (p.zero_stage == 0)
    dp = ar(4 * N);
  else if (p.zero_stage < 3)
    dp = ar(4 * N) / 2 + ar(2 * N) / 2;
  else
    dp = static_cast<double>(m) * (2 * ar(2 * N) / 2 + ar(4 * N) / 2);

  StepTime st;
  st.compute = static_cast<double>(m) * (Ls * layer + stage_logits);
  st.tp_comm = static_cast<double>(m) * Ls * tp_layer;
  st.cp_comm = static_cast<double>(m) * Ls * cp_layer;
  st.p2p = static_cast<double>(m) * p2p;
  st.bubble = pipeline - static_cast<double>(m) * stage;
  st.dp_comm = dp;
  st.dp_exposed = (1 - cost.dp_overlap) * dp;
  st.total = pipeline + st.dp_exposed;
  return st;
}

Estimate estimate(const GPTConfig& cfg, const Cluster& cl, const Plan& p, int64_t global_batch,
                  const CostModel& cost) {
  check_plan(cfg, cl, p, global_batch);
  Estimate e;
  e.plan = p;
  e.memory = memory_per_gpu(cfg, cl, p, global_batch, cost);
  e.time = step_time(cfg, cl, p, global_batch, cost);
  e.fits = e.memory.total() <= cost.usable_memory * cl.memory_bytes;
  e.memory_gb_per_gpu = e.memory.total() / kGiB;
  e.step_s = e.time.total;
  e.tokens_per_s = static_cast<double>(global_batch * cfg.seq_len) / e.step_s;
  const double n = cl.gpus;
  e.tflops_per_gpu = e.tokens_per_s * hardware_flops_per_token(cfg, p.checkpointing) / n / 1e12;
  e.mfu = e.tokens_per_s * model_flops_per_token(cfg) / (n * cl.peak_flops);
  return e;
}

// ================================================================ Task 3: which plan

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

// Simpler first: fewer GPUs holding one replica, no interleaving, less ZeRO, less recomputation;
// then faster; then smaller.
auto simplicity(const Estimate& e) {
  const Plan& p = e.plan;
  return std::make_tuple(p.tp * p.cp * p.pp, p.virtual_stages, p.zero_stage,
                         static_cast<int>(p.checkpointing), -e.tokens_per_s, p.micro_batch, p.tp,
                         p.pp, p.cp);
}

}  // namespace

PlanReport plan(const GPTConfig& cfg, const Cluster& cl, int64_t global_batch,
                const CostModel& cost) {
  cfg.validate();
  const int n = cl.gpus;
  std::vector<Estimate> all;
  for (int tp : divisors(n)) {
    if (cfg.n_head % tp != 0 || cfg.ff() % tp != 0) continue;
    for (int cp : {1, 2, 4, 8, 16}) {
      if ((n / tp) % cp != 0 || cfg.seq_len % cp != 0) continue;
      for (int pp : divisors(n / (tp * cp))) {
        if (pp > cfg.n_layer) continue;
        const int dp = n / (tp * cp * pp);
        if (global_batch % dp != 0) continue;
        const int64_t Ls = ceil_div(cfg.n_layer, pp);
        for (int64_t mb = 1; mb <= 64; mb *= 2) {
          if ((global_batch / dp) % mb != 0) continue;
          const int64_t m = global_batch / (dp * mb);
          std::vector<int> vs = {1};
          for (int v = 2; v <= 8 && pp > 1; ++v)
            if (Ls % v == 0 && m % pp == 0) vs.push_back(v);
          for (int v : vs)
            for (int zero = 0; zero <= 3; ++zero)
              for (Checkpointing ckpt :
                   {Checkpointing::kNone, Checkpointing::kSelective, Checkpointing::kFull}) {
                Plan p;
                p.tp = tp;
                p.cp = cp;
                p.pp = pp;
                p.dp = dp;
                p.micro_batch = mb;
                p.virtual_stages = v;
                p.zero_stage = zero;
                p.checkpointing = ckpt;
                all.push_back(estimate(cfg, cl, p, global_batch, cost));
              }
        }
      }
    }
  }
  DTL_CHECK(!all.empty(), fmt::format("no plan: no (tp, cp, pp, dp) of {} GPUs fits {} and a "
                                      "global batch of {}", n, cfg.to_string(), global_batch));
  double fastest = 0, smallest = INFINITY;
  for (const Estimate& e : all) {
    if (e.fits) fastest = std::max(fastest, e.tokens_per_s);
    smallest = std::min(smallest, e.memory_gb_per_gpu);
  }
  const double usable = cost.usable_memory * cl.memory_bytes / kGiB;
  DTL_CHECK(fastest > 0, fmt::format("no plan fits: the smallest needs {:.1f} GiB per GPU, "
                                     "{:.1f} GiB usable", smallest, usable));

  // The chosen one: the simplest among those within 5% of the fastest.
  const Estimate* chosen = nullptr;
  for (const Estimate& e : all)
    if (e.fits && e.tokens_per_s >= 0.95 * fastest &&
        (chosen == nullptr || simplicity(e) < simplicity(*chosen)))
      chosen = &e;

  PlanReport report;
  report.fastest_tokens_per_s = fastest;
  report.plans.push_back({*chosen, "chosen: the simplest within 5% of the fastest"});
  std::vector<const Estimate*> fitting, too_big;
  for (const Estimate& e : all)
    if (&e != chosen) (e.fits ? fitting : too_big).push_back(&e);
  std::stable_sort(fitting.begin(), fitting.end(), [](const Estimate* x, const Estimate* y) {
    return x->tokens_per_s > y->tokens_per_s;
  });
  std::stable_sort(too_big.begin(), too_big.end(), [](const Estimate* x, const Estimate* y) {
    return x->memory_gb_per_gpu < y->memory_gb_per_gpu;
  });
  for (const Estimate* e : fitting) {
    const std::string verdict =
        e->tokens_per_s >= 0.95 * fastest
            ? "within 5% of the fastest, less simple"
            : fmt::format("slower by {:.1f}%",
                          100 * (1 - e->tokens_per_s / chosen->tokens_per_s));
    report.plans.push_back({*e, verdict});
  }
  for (const Estimate* e : too_big)
    report.plans.push_back(
        {*e, fmt::format("does not fit: {:.1f} GiB > {:.1f} GiB", e->memory_gb_per_gpu, usable)});
  return report;
}

// ================================================================ Task 4: does it train

void average_gradients(const std::vector<torch::Tensor>& params, Comm& dp) {
  if (dp.size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  // One collective for all of them: flatten, average, copy back.
  std::vector<torch::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape({-1}));
  torch::Tensor bucket = torch::cat(flat);
  dp.all_reduce(bucket, ReduceOp::Avg);
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(bucket.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

namespace {

// What every composition offers the training loop: one step on this replica's rows at a
// learning rate (the mean loss over the rows), and the parameters and optimizer a checkpoint
// saves.
struct Trainer {
  std::function<double(const torch::Tensor& rows, double lr)> step;
  std::vector<std::string> names;  // the serial GPT's names (lab 09, 11 and 12 keep them)
  std::vector<torch::Tensor> params;
  torch::optim::Optimizer* adamw = nullptr;  // null when lab 14's ZeroOptimizer owns the state
  std::vector<std::shared_ptr<void>> keep;   // the modules and optimizers the closures use
};

void set_named(Trainer& tr, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  for (const auto& [name, p] : named) {
    tr.names.push_back(name);
    tr.params.push_back(p);
  }
}

// Where each parameter of this rank sits in the serial GPT, for checkpoints any plan can load.
// Tensor parallelism splits a tensor along one dimension (lab 09): the dimension where the
// parameter is smaller than the serial tensor, tp rank r's box starting at r times its size
// there. The fused qkv is viewed as [3, d, ...] (q, k, v sections), where a rank's heads are one
// box. Pipeline stages hold whole tensors; data-parallel replicas hold the same boxes.
std::vector<SerialBox> serial_boxes(const Trainer& tr, const GPTConfig& cfg, Comm& tp, Comm& pp,
                                    Comm& dp) {
  std::map<std::string, std::vector<int64_t>> shapes;  // the serial GPT's, by name
  {
    model::GPT serial(cfg);
    for (const auto& item : serial->named_parameters())
      shapes[item.key()] = item.value().sizes().vec();
  }
  std::vector<SerialBox> boxes;
  for (size_t i = 0; i < tr.params.size(); ++i) {
    SerialBox b;
    b.name = tr.names[i];
    const auto it = shapes.find(b.name);
    DTL_CHECK(it != shapes.end(),
              fmt::format("train: '{}' is no parameter of the serial GPT", b.name));
    b.shape = it->second;
    b.box = tr.params[i].sizes().vec();
    if (b.name.find(".attn.qkv.") != std::string::npos) {  // [3d, ...] as [3, d, ...]
      b.shape[0] /= 3;
      b.shape.insert(b.shape.begin(), 3);
      b.box[0] /= 3;
      b.box.insert(b.box.begin(), 3);
    }
    b.offset.assign(b.shape.size(), 0);
    bool split = false;
    for (size_t d = 0; d < b.shape.size(); ++d)
      if (b.box[d] != b.shape[d]) {
        b.offset[d] = tp.rank() * b.box[d];
        split = true;
      }
    // The lowest rank holding the box writes it: replica 0; tp rank 0 of a replicated tensor;
    // the first stage's embedding, not the tied head's copy on the last stage.
    b.writes = dp.rank() == 0 && (split || tp.rank() == 0) &&
               (b.name != "wte.weight" || pp.rank() == 0);
    boxes.push_back(std::move(b));
  }
  return boxes;
}

// Runs `loss_of` over the m micro-batches of `rows`, each loss scaled by 1/m so the gradients
// are those of the mean over the rows; returns that mean.
double accumulate(const torch::Tensor& rows, int64_t micro_batch,
                  const std::function<torch::Tensor(const torch::Tensor&)>& loss_of) {
  const int64_t m = rows.size(0) / micro_batch;
  double sum = 0;
  for (int64_t k = 0; k < m; ++k) {
    DTL_SCOPE(fmt::format("forward+backward mb={}", k));
    torch::Tensor loss = loss_of(rows.narrow(0, k * micro_batch, micro_batch));
    (loss / static_cast<double>(m)).backward();
    sum += loss.item<double>();
  }
  return sum / static_cast<double>(m);
}

// tp = pp = 1: the serial GPT, data parallel with plain averaging or lab 14's ZeRO.
Trainer data_parallel(const Plan& plan, const TrainOptions& o, Comm& dp) {
  Trainer tr;
  auto model = std::make_shared<model::GPT>(o.model);
  (*model)->to(dp.device());
  tr.keep.push_back(model);
  auto loss_of = [model, ckpt = plan.checkpointing](const torch::Tensor& mb) {
    return ckpt == Checkpointing::kNone ? (*model)->loss(mb) : lab13::gpt_loss(*model, mb, ckpt);
  };
  if (plan.zero_stage == 0) {
    std::shared_ptr<torch::optim::AdamW> adam = make_adamw(**model, o.optim);
    tr.keep.push_back(adam);
    tr.adamw = adam.get();
    set_named(tr, [&] {
      std::vector<std::pair<std::string, torch::Tensor>> named;
      for (const auto& item : (*model)->named_parameters()) named.emplace_back(item.key(), item.value());
      return named;
    }());
    tr.step = [model, adam, loss_of, &dp, mb = plan.micro_batch](const torch::Tensor& rows,
                                                                 double lr) {
      set_lr(*adam, lr);
      adam->zero_grad();
      const double loss = accumulate(rows, mb, loss_of);
      average_gradients((*model)->parameters(), dp);  // the only reduction: over the replicas
      adam->step();
      return loss;
    };
  } else {
    auto zero = std::make_shared<lab14::ZeroOptimizer>(*model, dp, plan.zero_stage, o.optim);
    tr.keep.push_back(zero);
    // Stage 1 leaves the forward to the model (so lab 13's recomputation applies); stages 2-3
    // run it through the optimizer, which reduce-scatters each unit's gradient in backward.
    auto zero_loss = [zero, loss_of, stage = plan.zero_stage](const torch::Tensor& mb) {
      return stage == 1 ? loss_of(mb) : zero->loss(mb);
    };
    tr.step = [zero, zero_loss, mb = plan.micro_batch](const torch::Tensor& rows, double lr) {
      zero->set_lr(lr);
      zero->zero_grad();
      const double loss = accumulate(rows, mb, zero_loss);
      zero->step();
      return loss;
    };
  }
  return tr;
}

// tp > 1: lab 09's tensor-parallel GPT over the tp group, averaged over dp.
Trainer tensor_parallel(const Plan& plan, const TrainOptions& o, Comm& tp, Comm& dp) {
  Trainer tr;
  torch::Device device = tp.device();
  model::GPT serial(o.model);
  serial->to(device);
  auto model = std::make_shared<lab09::TensorParallelGPT>(*serial, tp);
  tr.keep.push_back(model);
  std::shared_ptr<torch::optim::AdamW> adam = make_adamw(**model, o.optim);
  tr.keep.push_back(adam);
  tr.adamw = adam.get();
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : (*model)->named_parameters()) named.emplace_back(item.key(), item.value());
  set_named(tr, named);
  // Full recomputation: the model's forward with each block through lab 13's checkpoint (the
  // block's all-reduces run again in backward, on every tp rank in the same order).
  auto loss_of = [model, &tp, full = plan.checkpointing == Checkpointing::kFull](
                     const torch::Tensor& tokens) {
    if (!full) return (*model)->loss(tokens);
    auto& m = **model;
    const int64_t T = tokens.size(1) - 1;
    const torch::Tensor idx = tokens.narrow(1, 0, T);
    torch::Tensor x = m.wte(idx) + m.wpe(torch::arange(T, idx.options()));
    for (const auto& block : *m.blocks) {
      auto blk = block->as<lab09::ParallelBlock>();
      x = lab13::checkpoint(
          [blk](const std::vector<torch::Tensor>& in) { return blk->forward(in[0]); }, {x});
    }
    x = m.ln_f(x);
    const torch::Tensor logits =
        m.config().tied_head
            ? torch::nn::functional::linear(lab08::copy_to_tp(x, tp), m.wte->weight)
            : m.lm_head(x);
    return lab09::vocab_parallel_cross_entropy(logits, tokens.narrow(1, 1, T), tp);
  };
  tr.step = [model, adam, loss_of, &dp, mb = plan.micro_batch](const torch::Tensor& rows,
                                                               double lr) {
    set_lr(*adam, lr);
    adam->zero_grad();
    const double loss = accumulate(rows, mb, loss_of);
    // Over dp only: the tp ranks hold different shards, and their replicated tensors
    // (LayerNorms, biases after the reduction) already agree.
    average_gradients((*model)->parameters(), dp);
    adam->step();
    return loss;
  };
  return tr;
}

// pp > 1: lab 12's chunks, links and executor over the pp group, averaged over dp at the step.
Trainer pipeline_parallel(const Plan& plan, const TrainOptions& o, Comm& pp, Comm& dp) {
  Trainer tr;
  const int p = plan.pp, v = plan.virtual_stages;
  auto chunks = std::make_shared<lab12::ModelChunks>(o.model, pp, v, lab11::even_parts(o.model, p * v));
  auto links = std::make_shared<lab12::PipelineLinks>(pp);
  std::shared_ptr<torch::optim::AdamW> adam = make_adamw(chunks->module(), o.optim);
  // execute() calls step() after its backward passes and after summing the tied embedding's two
  // copies along the pipeline: the last moment to average over the replicas.
  auto hooked = std::make_shared<HookedOptimizer>(
      *adam, [chunks, &dp] { average_gradients(chunks->module().parameters(), dp); });
  tr.keep = {chunks, links, adam, hooked};
  tr.adamw = adam.get();
  set_named(tr, chunks->named_parameters());
  const int64_t rows = o.global_batch / plan.dp, m = rows / plan.micro_batch;
  const lab12::Schedule schedule = v == 1 ? lab12::one_f_one_b(p, m) : lab12::interleaved(p, m, v);
  tr.step = [chunks, links, hooked, adam, schedule](const torch::Tensor& my_rows, double lr) {
    set_lr(*adam, lr);
    return lab12::execute(schedule, *chunks, *links, *hooked, my_rows).loss;
  };
  return tr;
}

// tp > 1 and pp > 1: lab 09's tensor-parallel pieces cut into pipeline stages (an even split of
// the blocks; the embedding on the first stage, ln_f and the head on the last), run in the order
// of lab 12's 1F1B schedule over lab 12's links. Every message is a [b, T, d] activation or its
// gradient, identical on the tp ranks of a stage: each tp rank talks to its own tp rank of the
// next stage (the pp group is one tp coordinate), as Megatron does without its scatter-gather
// optimisation. lab 12's execute() runs lab 11's serial units only, hence this small executor.
struct TensorPipelineStage {
  const GPTConfig cfg;
  const bool first, last;
  torch::nn::Module holder;  // every parameter of this rank, for AdamW
  lab09::VocabParallelEmbedding wte{nullptr};  // first stage: the embedding
  torch::nn::Embedding wpe{nullptr};
  std::vector<lab09::ParallelBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};          // last stage
  lab09::VocabParallelEmbedding head{nullptr};  // last stage, tied head: its own copy of wte
  decltype(lab09::TensorParallelGPTImpl::lm_head) lm_head{nullptr};  // last stage, untied
  std::vector<std::pair<std::string, torch::Tensor>> named;

  TensorPipelineStage(const GPTConfig& c, Comm& tp, Comm& pp)
      : cfg(c), first(pp.rank() == 0), last(pp.rank() == pp.size() - 1) {
    model::GPT serial(cfg);
    serial->to(tp.device());
    // Built from the whole tensor-parallel model (the same shards lab 09 makes), of which this
    // stage keeps its pieces; the rest is freed when `full` goes.
    lab09::TensorParallelGPT full(*serial, tp);
    auto keep = [&](const std::string& prefix, torch::nn::Module& m) {
      for (const auto& item : m.named_parameters()) {
        named.emplace_back(prefix + item.key(), item.value());
        holder.register_parameter(fmt::format("p{}", named.size()), item.value());
      }
    };
    const Range mine = split_range(cfg.n_layer, pp.size(), pp.rank());
    if (first) {
      wte = full->wte;
      wpe = full->wpe;
      keep("wte.", *wte);
      keep("wpe.", *wpe);
    }
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      blocks.emplace_back(std::dynamic_pointer_cast<lab09::ParallelBlockImpl>(
          full->blocks->ptr(static_cast<size_t>(i))));
      keep(fmt::format("blocks.{}.", i), *blocks.back());
    }
    if (last) {
      ln_f = full->ln_f;
      keep("ln_f.", *ln_f);
      if (!cfg.tied_head) {
        lm_head = full->lm_head;
        keep("lm_head.", *lm_head);
      } else {
        head = lab09::VocabParallelEmbedding(serial->wte->weight, tp);
        keep("wte.", *head);  // the tied head's copy: the embedding's serial name
      }
    }
  }

  // Micro-batch tokens [b, T + 1] in; out: the activation for the next stage, or (last) the loss.
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& tokens, Comm& tp) {
    const int64_t T = tokens.size(1) - 1;
    torch::Tensor x = input;
    if (first) {
      const torch::Tensor idx = tokens.narrow(1, 0, T);
      x = wte(idx) + wpe(torch::arange(T, idx.options()));
    }
    for (auto& block : blocks) x = block(x);
    if (!last) return x;
    const torch::Tensor h = ln_f(x);
    const torch::Tensor logits =
        cfg.tied_head ? torch::nn::functional::linear(lab08::copy_to_tp(h, tp), head->weight)
                      : lm_head(h);
    return lab09::vocab_parallel_cross_entropy(logits, tokens.narrow(1, 1, T), tp);
  }

  // The tied embedding's two copies (first and last stage) get the sum of their gradients;
  // a middle stage contributes zeros. Collective over pp.
  void sum_tied_grads(Comm& tp, Comm& pp) {
    if (!cfg.tied_head) return;
    const torch::Tensor copy = first ? wte->weight : last ? head->weight : torch::Tensor();
    // Every stage knows the shard's shape: lab 09 splits the vocabulary evenly over tp.
    torch::Tensor sum =
        torch::zeros({cfg.vocab_size / tp.size(), cfg.d_model},
                     torch::TensorOptions().dtype(torch::kFloat32).device(pp.device()));
    if (copy.defined() && copy.grad().defined()) sum.copy_(copy.grad());
    pp.all_reduce(sum);
    if (copy.defined()) copy.mutable_grad() = sum;
  }
};

// One step of the tp x pp replica on its rows: lab 12's 1F1B order of forwards and backwards.
double run_tensor_pipeline(TensorPipelineStage& st, lab12::PipelineLinks& links, Comm& tp,
                           Comm& pp, const lab12::Schedule& schedule, const torch::Tensor& rows,
                           int64_t micro_batch) {
  const int64_t m = rows.size(0) / micro_batch, T = st.cfg.seq_len;
  const int r = pp.rank(), p = pp.size();
  std::vector<torch::Tensor> inputs(static_cast<size_t>(m)), outputs(static_cast<size_t>(m));
  std::vector<Work> sends;
  double loss_sum = 0;
  const auto act_options = torch::TensorOptions().dtype(torch::kFloat32).device(rows.device());
  for (const lab12::Action& a : schedule[static_cast<size_t>(r)]) {
    const size_t k = static_cast<size_t>(a.micro);
    const torch::Tensor tokens = rows.narrow(0, a.micro * micro_batch, micro_batch);
    if (a.kind == lab12::Action::Forward) {
      DTL_SCOPE(fmt::format("forward mb={}", a.micro));
      torch::Tensor in;
      if (!st.first) {
        in = torch::empty({micro_batch, T, st.cfg.d_model}, act_options);
        links.activations_from_prev().recv(in, (r + p - 1) % p);
        in.requires_grad_();
      }
      inputs[k] = in;
      outputs[k] = st.forward(in, tokens, tp);
      if (st.last)
        loss_sum += outputs[k].item<double>();
      else
        sends.push_back(links.activations_to_next().send_async(outputs[k].detach().contiguous(),
                                                               (r + 1) % p));
    } else {
      DTL_SCOPE(fmt::format("backward mb={}", a.micro));
      if (st.last) {
        (outputs[k] / static_cast<double>(m)).backward();
      } else {
        torch::Tensor grad = torch::empty_like(outputs[k]);
        links.grads_from_next().recv(grad, (r + 1) % p);
        outputs[k].backward(grad);
      }
      if (!st.first)
        sends.push_back(links.grads_to_prev().send_async(inputs[k].grad().contiguous(),
                                                         (r + p - 1) % p));
      inputs[k] = outputs[k] = torch::Tensor();  // the micro-batch's activations go
    }
  }
  for (Work& w : sends) w.wait();
  // The replica's mean loss lives on the last stage: every stage reports it.
  torch::Tensor loss = torch::tensor({loss_sum / static_cast<double>(m)}, torch::kFloat64)
                           .to(rows.device());
  pp.broadcast(loss, p - 1);
  return loss.item<double>();
}

Trainer tensor_pipeline_parallel(const Plan& plan, const TrainOptions& o, Comm& tp, Comm& pp,
                                 Comm& dp) {
  Trainer tr;
  auto st = std::make_shared<TensorPipelineStage>(o.model, tp, pp);
  auto links = std::make_shared<lab12::PipelineLinks>(pp);
  std::shared_ptr<torch::optim::AdamW> adam = make_adamw(st->holder, o.optim);
  tr.keep = {st, links, adam};
  tr.adamw = adam.get();
  set_named(tr, st->named);
  const int64_t m = o.global_batch / plan.dp / plan.micro_batch;
  const lab12::Schedule schedule = lab12::one_f_one_b(plan.pp, m);
  tr.step = [st, links, adam, schedule, &tp, &pp, &dp, mb = plan.micro_batch](
                const torch::Tensor& rows, double lr) {
    set_lr(*adam, lr);
    adam->zero_grad();
    const double loss = run_tensor_pipeline(*st, *links, tp, pp, schedule, rows, mb);
    st->sum_tied_grads(tp, pp);  // the embedding's two copies, along the pipeline
    average_gradients(st->holder.parameters(), dp);  // then over the replicas
    adam->step();
    return loss;
  };
  return tr;
}

// The checks train() makes before any communication.
void check_trainable(const Plan& plan, const TrainOptions& o, const Comm& world) {
  o.model.validate();
  DTL_CHECK(plan.gpus() == world.size(),
            fmt::format("train: tp={} x cp={} x pp={} x dp={} = {} ranks, the world has {}",
                        plan.tp, plan.cp, plan.pp, plan.dp, plan.gpus(), world.size()));
  DTL_CHECK(plan.cp == 1, fmt::format("train: cp={}: context parallelism is planned, not trained "
                                      "here (lab 10's ring attention has no trainer around it)",
                                      plan.cp));
  DTL_CHECK(plan.tp == 1 || plan.pp == 1 || plan.virtual_stages == 1,
            fmt::format("train: virtual_stages={} with tp={} x pp={}: the tensor-parallel "
                        "pipeline runs 1F1B without interleaving", plan.tp, plan.pp,
                        plan.virtual_stages));
  DTL_CHECK(plan.zero_stage >= 0 && plan.zero_stage <= 3,
            fmt::format("train: zero_stage={} must be 0-3", plan.zero_stage));
  DTL_CHECK(plan.zero_stage == 0 || (plan.tp == 1 && plan.pp == 1),
            fmt::format("train: zero_stage={} with tp={} pp={}: lab 14's ZeroOptimizer shards a "
                        "serial GPT only", plan.zero_stage, plan.tp, plan.pp));
  const Checkpointing ckpt = plan.checkpointing;
  DTL_CHECK(ckpt == Checkpointing::kNone || plan.pp == 1,
            fmt::format("train: checkpointing={} with pp={}: lab 12's chunks run their units "
                        "without lab 13's checkpoint", lab13::to_string(ckpt), plan.pp));
  DTL_CHECK(ckpt != Checkpointing::kSelective || plan.tp == 1,
            fmt::format("train: checkpointing=selective with tp={}: lab 09's attention has no "
                        "seam for checkpointing its core", plan.tp));
  DTL_CHECK(ckpt == Checkpointing::kNone || plan.zero_stage <= 1,
            fmt::format("train: checkpointing={} with zero_stage={}: lab 14 runs the forward "
                        "itself from stage 2", lab13::to_string(ckpt), plan.zero_stage));
  DTL_CHECK(o.checkpoint_dir.empty() || plan.zero_stage == 0,
            fmt::format("train: a checkpoint with zero_stage={}: lab 14's ZeroOptimizer keeps its "
                        "AdamW state to itself", plan.zero_stage));
  DTL_CHECK(plan.micro_batch >= 1 && plan.virtual_stages >= 1 && plan.dp >= 1 &&
                o.global_batch % (static_cast<int64_t>(plan.dp) * plan.micro_batch) == 0,
            fmt::format("train: global_batch={} is not a multiple of dp={} x micro_batch={}",
                        o.global_batch, plan.dp, plan.micro_batch));
  DTL_CHECK(plan.virtual_stages == 1 || plan.pp > 1,
            fmt::format("train: virtual_stages={} needs pp > 1", plan.virtual_stages));
  DTL_CHECK(plan.first_stage_layers == 0 && plan.last_stage_layers == 0,
            fmt::format("train: first_layers={} last_layers={}: the trainer splits the blocks "
                        "evenly over the stages (dtl::split_range, lab 11's even_parts)",
                        plan.first_stage_layers, plan.last_stage_layers));
  DTL_CHECK(o.steps >= 0, fmt::format("train: steps={} must be >= 0", o.steps));
}

}  // namespace

TrainResult train(const Plan& plan, const TrainOptions& o, Comm& world) {
  check_trainable(plan, o, world);
  // Megatron's order: tp fastest, so a tp group is consecutive ranks (one node); then dp; pp
  // outermost.
  DeviceMesh mesh = DeviceMesh::megatron(world, plan.tp, /*cp=*/1, plan.pp, plan.dp);
  Comm& tp = mesh.comm("tp");
  Comm& pp = mesh.comm("pp");
  Comm& dp = mesh.comm("dp");

  Trainer tr = plan.pp > 1 && plan.tp > 1 ? tensor_pipeline_parallel(plan, o, tp, pp, dp)
               : plan.pp > 1              ? pipeline_parallel(plan, o, pp, dp)
               : plan.tp > 1              ? tensor_parallel(plan, o, tp, dp)
                                          : data_parallel(plan, o, dp);

  const torch::Device device = world.device();  // every Comm's tensors live on the run's device
  data::SyntheticCorpus corpus(o.model.vocab_size, o.data_seed);
  data::GlobalBatchSampler sampler(corpus, o.global_batch, o.model.seq_len);
  const int64_t rows = o.global_batch / plan.dp, replica = mesh.coord("dp");
  const double peak = o.peak_flops > 0 ? o.peak_flops : measure_matmul_flops();

  TrainResult result;
  std::vector<SerialBox> boxes;  // where this rank's parameters sit in the serial GPT
  if (!o.checkpoint_dir.empty()) boxes = serial_boxes(tr, o.model, tp, pp, dp);
  if (!o.checkpoint_dir.empty() && o.resume) {
    const int64_t saved = load_training_state(o.checkpoint_dir, tr.params, boxes, *tr.adamw, world);
    if (saved >= 0) result.first_step = saved;
  }
  std::vector<double> seconds;
  Progress progress(fmt::format("train {}x{}x{}", plan.tp, plan.pp, plan.dp),
                    static_cast<int>(o.steps), std::max(1, o.progress_every));
  for (int64_t k = result.first_step; k < o.steps; ++k) {
    const auto start = std::chrono::steady_clock::now();
    double loss = 0;
    {
      DTL_SCOPE(fmt::format("step {}", k));
      const torch::Tensor my_rows =
          sampler.rows(k, replica * rows, (replica + 1) * rows).to(device);
      loss = tr.step(my_rows, warmup_cosine_lr(o.optim, k, o.steps));
      // The global batch's mean loss: the replicas' means averaged (equal rows each).
      torch::Tensor l = torch::tensor({loss}, torch::kFloat64).to(device);
      dp.all_reduce(l, ReduceOp::Avg);
      loss = l.item<double>();
    }
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    result.losses.push_back(loss);
    const double tokens_per_s =
        static_cast<double>(o.global_batch * o.model.seq_len) / median(seconds);
    result.tokens_per_s = tokens_per_s;
    result.mfu = tokens_per_s * model_flops_per_token(o.model) / (world.size() * peak);
    if (o.progress_every > 0)
      progress.update(static_cast<int>(k + 1),
                      fmt::format("loss {:.4f} | {:.0f} tok/s | MFU {:.2f}%", loss, tokens_per_s,
                                  100 * result.mfu));
    const bool last = k + 1 == o.steps;
    if (!o.checkpoint_dir.empty() &&
        (last || (o.checkpoint_every > 0 && (k + 1) % o.checkpoint_every == 0)))
      result.checkpoint =
          save_training_state(o.checkpoint_dir, k + 1, plan, tr.params, boxes, *tr.adamw, world);
  }
  if (o.progress_every > 0 && !result.losses.empty())
    progress.done(fmt::format("loss {:.4f}", result.losses.back()));
  return result;
}

}  // namespace dtl::lab20
