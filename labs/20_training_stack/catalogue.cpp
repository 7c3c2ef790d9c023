// catalogue.cpp — lab 20: the given part (the clusters and models by name, plans as text, the
// published runs and their calibration, and the glue of the trainer: a hooked optimizer and
// lab 17's checkpoint format for it). Your work is in training_stack.cpp.
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt >= 11 declares it here only)

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <sstream>
#include <type_traits>

#include "checkpoint.hpp"  // lab 17: Snapshot, RankTensor, save, load, latest
#include "dtl/error.hpp"
#include "training_stack.hpp"

namespace dtl::lab20 {

// ================================================================ clusters

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Per GPU and per direction. Latencies are orders of magnitude, not measurements (NCCL's
// per-step overhead is microseconds inside a node and ~10 us across a network): they matter for
// small messages only, and every message of a large model's step is megabytes.
struct GpuType {
  const char* name;
  double peak_flops, memory_bytes, hbm_bandwidth;
  double nvlink_bandwidth, network_bandwidth;
  const char* source;
};
const std::array<GpuType, 3> kGpuTypes = {{
    // NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOP/s dense BF16, 40 GB HBM2 at 1,555 GB/s,
    // third-generation NVLink 600 GB/s per GPU (both directions together: 300 each way). A DGX
    // A100 node has one 200 Gb/s HDR InfiniBand adapter per GPU for the cluster network (25
    // GB/s), as Selene in Narayanan et al. 2021, section 5.
    {"a100-40g", 312e12, 40 * kGiB, 1555e9, 300e9, 25e9,
     "A100 datasheet; 200 Gb/s HDR InfiniBand per GPU (DGX A100)"},
    // The same GPU with 80 GB of HBM2e at 2,039 GB/s (A100 datasheet).
    {"a100-80g", 312e12, 80 * kGiB, 2039e9, 300e9, 25e9,
     "A100 datasheet; 200 Gb/s HDR InfiniBand per GPU (DGX A100, Selene)"},
    // NVIDIA H100 SXM5 datasheet: 1,979 TFLOP/s BF16 with 2:4 sparsity, so 989 dense; 80 GB HBM3
    // at 3.35 TB/s; fourth-generation NVLink 900 GB/s (450 each way). 400 Gb/s per GPU to the
    // network (DGX H100's ConnectX-7 adapters; Llama 3's clusters, Dubey et al. 2024, 3.3.1).
    {"h100-80g", 989e12, 80 * kGiB, 3350e9, 450e9, 50e9,
     "H100 SXM5 datasheet; 400 Gb/s per GPU (DGX H100; Dubey et al. 2024)"},
}};
constexpr double kNvlinkLatency = 3e-6, kNetworkLatency = 10e-6;

int parse_int(const std::string& text, const std::string& what, const std::string& spec) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DTL_CHECK(used == text.size() && !text.empty(),
            fmt::format("cluster spec '{}': {} '{}' is not a whole number", spec, what, text));
  return value;
}

double parse_double(const std::string& text, const std::string& what, const std::string& where) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DTL_CHECK(used == text.size() && !text.empty(),
            fmt::format("{}: {} '{}' is not a number", where, what, text));
  return value;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

}  // namespace

std::vector<std::string> cluster_names() {
  std::vector<std::string> names;
  for (const auto& g : kGpuTypes) names.emplace_back(g.name);
  return names;
}

Cluster cluster(const std::string& spec) {
  const size_t colon = spec.find(':');
  DTL_CHECK(colon != std::string::npos,
            fmt::format("cluster spec '{}' has no ':GPUS' (e.g. a100-80g:1024)", spec));
  const std::string name = spec.substr(0, colon);
  const GpuType* type = nullptr;
  for (const auto& g : kGpuTypes)
    if (name == g.name) type = &g;
  DTL_CHECK(type != nullptr, fmt::format("unknown cluster '{}' (known: {})", name,
                                         fmt::join(cluster_names(), ", ")));
  const std::vector<std::string> parts = split(spec.substr(colon + 1), ',');
  DTL_CHECK(!parts.empty(), fmt::format("cluster spec '{}' has no GPU count after ':'", spec));
  Cluster c;
  c.name = name;
  c.gpus = parse_int(parts[0], "GPU count", spec);
  c.peak_flops = type->peak_flops;
  c.memory_bytes = type->memory_bytes;
  c.hbm_bandwidth = type->hbm_bandwidth;
  c.nvlink = {kNvlinkLatency, type->nvlink_bandwidth};
  c.network = {kNetworkLatency, type->network_bandwidth};
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    DTL_CHECK(eq != std::string::npos,
              fmt::format("cluster spec '{}': '{}' is not key=value (net=GBPS, per-node=K)", spec,
                          parts[i]));
    const std::string key = parts[i].substr(0, eq), value = parts[i].substr(eq + 1);
    if (key == "net") {
      const double gbps = parse_double(value, "net", "cluster spec '" + spec + "'");
      DTL_CHECK(gbps > 0, fmt::format("cluster spec '{}': net={} GB/s must be > 0", spec, value));
      c.network.beta = gbps * 1e9;
    } else if (key == "per-node") {
      c.gpus_per_node = parse_int(value, "per-node", spec);
      DTL_CHECK(c.gpus_per_node >= 1,
                fmt::format("cluster spec '{}': per-node={} GPUs per node must be >= 1", spec, value));
    } else {
      DTL_CHECK(false, fmt::format("cluster spec '{}': unknown key '{}' (net, per-node)", spec, key));
    }
  }
  DTL_CHECK(c.gpus >= 1, fmt::format("cluster spec '{}': gpus={} must be >= 1", spec, c.gpus));
  // A partial node is allowed only as the whole cluster (a few GPUs of one node).
  if (c.gpus < c.gpus_per_node) {
    c.gpus_per_node = c.gpus;
  } else {
    DTL_CHECK(c.gpus % c.gpus_per_node == 0,
              fmt::format("cluster spec '{}': {} GPUs are not whole nodes of {} GPUs per node",
                          spec, c.gpus, c.gpus_per_node));
  }
  return c;
}

std::string Cluster::describe() const {
  return fmt::format("{} x {} ({} node(s) of {}; {:.0f} TFLOP/s BF16, {:.0f} GiB at {:.2f} TB/s, "
                     "NVLink {:.0f} GB/s, network {:.1f} GB/s per GPU)",
                     gpus, name, nodes(), gpus_per_node, peak_flops / 1e12,
                     memory_bytes / kGiB, hbm_bandwidth / 1e12, nvlink.beta / 1e9,
                     network.beta / 1e9);
}

// ================================================================ models

namespace {

GPTConfig shape(int64_t layers, int64_t d, int64_t heads, int64_t vocab, int64_t seq,
                double dropout, bool tied = true, bool bias = true, int64_t ff = 0) {
  GPTConfig c;
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = heads;
  c.vocab_size = vocab;
  c.seq_len = seq;
  c.dropout = dropout;
  c.tied_head = tied;
  c.bias = bias;
  c.d_ff = ff;
  return c;
}

// Narayanan et al. 2021, Table 1: parameters (billions), heads, hidden size, layers. All with
// vocabulary 51,200 and sequence 2048; Megatron-LM's default dropout 0.1, a tied head.
struct MegatronRow {
  const char* name;
  int64_t heads, hidden, layers;
};
const std::array<MegatronRow, 10> kMegatron = {{{"megatron-1.7b", 24, 2304, 24},
                                                {"megatron-3.6b", 32, 3072, 30},
                                                {"megatron-7.5b", 32, 4096, 36},
                                                {"megatron-18.4b", 48, 6144, 40},
                                                {"megatron-39.1b", 64, 8192, 48},
                                                {"megatron-76.1b", 80, 10240, 60},
                                                {"megatron-145.6b", 96, 12288, 80},
                                                {"megatron-310.1b", 128, 16384, 96},
                                                {"megatron-529.6b", 128, 20480, 105},
                                                {"megatron-1t", 160, 25600, 128}}};

std::map<std::string, GPTConfig> models() {
  std::map<std::string, GPTConfig> m;
  m["tiny"] = GPTConfig::tiny();
  m["small"] = GPTConfig::small();
  m["gpt3-175b"] = GPTConfig::gpt3_175b();
  m["llama2-7b-like"] = GPTConfig::llama2_7b_like();
  for (const auto& r : kMegatron) m[r.name] = shape(r.layers, r.hidden, r.heads, 51200, 2048, 0.1);
  // Narayanan et al. 2021's other two models, in Megatron's vocabulary: GPT-3's shape (96
  // layers, h 12288, 96 heads: 174.6 B parameters with V = 51,200), compared with ZeRO-3 in
  // Table 2; and the 162.2 B model of Figure 13 (32 layers, h 20480, 128 heads: Megatron-LM's
  // examples/sc21/run_figure_13.sh).
  m["megatron-174.6b"] = shape(96, 12288, 96, 51200, 2048, 0.1);
  m["megatron-162.2b"] = shape(32, 20480, 128, 51200, 2048, 0.1);
  // OPT-175B (Zhang et al. 2022, Table 1; metaseq's opt_job_constants.py and opt_baselines.py):
  // 96 layers, d 12288, 96 heads, ffn 4d, GPT-2's vocabulary padded to 50,272, sequence 2048,
  // learned positions, dropout 0.1, tied embeddings (ReLU instead of GELU: the same FLOPs).
  m["opt-175b"] = shape(96, 12288, 96, 50272, 2048, 0.1);
  // BLOOM-176B (Le Scao et al. 2022; BigScience tr11-176B-ml README): 70 layers, d 14336, 112
  // heads, vocabulary 250,880 (padded), sequence 2048, dropout 0.1, tied (ALiBi instead of
  // learned positions: 29M parameters of difference).
  m["bloom-176b"] = shape(70, 14336, 112, 250880, 2048, 0.1);
  // Llama 3 405B's shapes (Dubey et al. 2024, Table 3: 126 layers, d 16384, 128 heads, FFN
  // 53,248 SwiGLU, 8 key-value heads, vocabulary 128,000, 8K context in pre-training) in the
  // course GPT: full multi-head attention (4 d^2 per layer instead of 2.125 d^2) and a GELU MLP
  // with ff = 64,512 keep a layer at Llama's 3.19 B parameters (and so its FLOPs); untied, no
  // biases, no dropout. 405.9 B parameters with the course's learned positions.
  m["llama3-405b-like"] = shape(126, 16384, 128, 128000, 8192, 0.0, false, false, 64512);
  // The same at the 128K context of Llama 3's long-context pre-training (Dubey et al. 2024,
  // section 3.4.2; Table 4's third row). The course GPT's learned positions (T h = 2.1 B
  // parameters at this length; Llama uses RoPE, none) add memory, not FLOPs.
  m["llama3-405b-like-128k"] = shape(126, 16384, 128, 128000, 131072, 0.0, false, false, 64512);
  // Llama 2 70B's shapes (Touvron et al. 2023: 80 layers, d 8192, 64 heads with 8 key-value
  // heads, FFN 28,672 SwiGLU, vocabulary 32,000, 4K context) the same way: ff = 35,840 keeps a
  // layer at 855.6 M parameters; 69.0 B in all.
  m["llama2-70b-like"] = shape(80, 8192, 64, 32000, 4096, 0.0, false, false, 35840);
  return m;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& [name, cfg] : models()) names.push_back(name);
  return names;
}

GPTConfig model_by_name(const std::string& name) {
  const auto all = models();
  const auto it = all.find(name);
  DTL_CHECK(it != all.end(),
            fmt::format("unknown model '{}' (known: {})", name, fmt::join(model_names(), ", ")));
  return it->second;
}

// ================================================================ plans as text

namespace {

const char* ckpt_name(Checkpointing c) { return lab13::to_string(c); }

}  // namespace

std::string Plan::describe() const {
  std::string text = fmt::format("tp={} pp={} dp={} cp={} zero={} ckpt={} mb={} v={}", tp, pp, dp,
                                 cp, zero_stage, ckpt_name(checkpointing), micro_batch,
                                 virtual_stages);
  // The edge stages' layers only when set: an even split reads as it always has.
  if (first_stage_layers != 0) text += fmt::format(" first_layers={}", first_stage_layers);
  if (last_stage_layers != 0) text += fmt::format(" last_layers={}", last_stage_layers);
  return text;
}

Plan parse_plan(const std::string& text, const Plan& base) {
  Plan p = base;
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    DTL_CHECK(eq != std::string::npos,
              fmt::format("--fix '{}': '{}' is not key=value (tp, pp, dp, cp, zero, ckpt, mb, v, "
                          "first_layers, last_layers)", text, item));
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    const std::string where = "--fix '" + text + "'";
    auto whole = [&](const std::string& what) {
      const double x = parse_double(value, what, where);
      DTL_CHECK(x == std::floor(x) && std::abs(x) < 1e15,
                fmt::format("{}: {}={} is not a whole number", where, what, value));
      return static_cast<int64_t>(x);
    };
    if (key == "tp") {
      p.tp = static_cast<int>(whole("tp"));
    } else if (key == "pp") {
      p.pp = static_cast<int>(whole("pp"));
    } else if (key == "dp") {
      p.dp = static_cast<int>(whole("dp"));
    } else if (key == "cp") {
      p.cp = static_cast<int>(whole("cp"));
    } else if (key == "zero") {
      p.zero_stage = static_cast<int>(whole("zero"));
    } else if (key == "mb") {
      p.micro_batch = whole("mb");
    } else if (key == "v") {
      p.virtual_stages = static_cast<int>(whole("v"));
    } else if (key == "first_layers") {
      p.first_stage_layers = static_cast<int>(whole("first_layers"));
    } else if (key == "last_layers") {
      p.last_stage_layers = static_cast<int>(whole("last_layers"));
    } else if (key == "ckpt") {
      if (value == "none") {
        p.checkpointing = Checkpointing::kNone;
      } else if (value == "selective") {
        p.checkpointing = Checkpointing::kSelective;
      } else if (value == "full") {
        p.checkpointing = Checkpointing::kFull;
      } else {
        DTL_CHECK(false, fmt::format("{}: ckpt={} is not none, selective or full", where, value));
      }
    } else {
      DTL_CHECK(false, fmt::format("{}: unknown key '{}' (tp, pp, dp, cp, zero, ckpt, mb, v, "
                                   "first_layers, last_layers)", where, key));
    }
  }
  return p;
}

// ================================================================ published runs

namespace {

Plan published_plan(int tp, int pp, int dp, int zero, Checkpointing ckpt, int64_t mb, int v) {
  Plan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.zero_stage = zero;
  p.checkpointing = ckpt;
  p.micro_batch = mb;
  p.virtual_stages = v;
  return p;
}

}  // namespace

std::vector<PublishedRun> published_runs() {
  std::vector<PublishedRun> runs;
  // Narayanan et al. 2021, Table 1 (TFLOP/s per GPU, tp, pp, GPUs, batch), run on Selene (DGX
  // A100 80GB). Micro-batch sizes and interleaving are those of Megatron-LM's
  // examples/sc21/run_table_1.sh, which reproduces the table: full recomputation everywhere
  // ("--recompute-method uniform"), no distributed optimizer (ZeRO stage 0), no sequence
  // parallelism, no fused attention (all 2021). The published FLOPs are the paper's equation
  // (3): recomputation counted.
  struct Row {
    const char* name;
    int tp, pp, gpus;
    int64_t batch, mb;
    int v;
    double tflops;
  };
  const std::array<Row, 10> megatron = {{{"megatron-1.7b", 1, 1, 32, 512, 16, 1, 137},
                                         {"megatron-3.6b", 2, 1, 64, 512, 16, 1, 138},
                                         {"megatron-7.5b", 4, 1, 128, 512, 16, 1, 142},
                                         {"megatron-18.4b", 8, 1, 256, 1024, 8, 1, 135},
                                         {"megatron-39.1b", 8, 2, 512, 1536, 4, 1, 138},
                                         {"megatron-76.1b", 8, 4, 1024, 1792, 2, 3, 140},
                                         {"megatron-145.6b", 8, 8, 1536, 2304, 2, 2, 148},
                                         {"megatron-310.1b", 8, 16, 1920, 2160, 1, 2, 155},
                                         {"megatron-529.6b", 8, 35, 2520, 2520, 1, 3, 163},
                                         {"megatron-1t", 8, 64, 3072, 3072, 1, 1, 163}}};
  for (const Row& r : megatron) {
    PublishedRun run;
    run.name = run.model = r.name;
    run.cluster = fmt::format("a100-80g:{}", r.gpus);
    run.global_batch = r.batch;
    run.plan = published_plan(r.tp, r.pp, r.gpus / (r.tp * r.pp), 0, Checkpointing::kFull, r.mb, r.v);
    run.tflops_per_gpu = r.tflops;
    run.counts_recompute = true;
    run.source = "Narayanan et al. 2021, Table 1; Megatron-LM examples/sc21/run_table_1.sh";
    runs.push_back(run);
  }
  {
    // OPT-175B (Zhang et al. 2022, section 2.4: 992 80GB A100s, FSDP with Megatron tensor
    // parallelism, "up to 147 TFLOP/s per GPU"; Table 1: 2M tokens per batch). metaseq's launcher
    // (opt_baselines.py, opt_job_constants.py): model parallel 8, FSDP without resharding after
    // forward (its own key for it: "zero2"), activation checkpointing distributed over the tp
    // ranks, no gradient accumulation, per-replica batch 2M / 124 / 2048 = 8 sequences: 992 in
    // all. We read its TFLOP/s as Megatron's (recomputation counted).
    PublishedRun run;
    run.name = run.model = "opt-175b";
    run.cluster = "a100-80g:992";
    run.global_batch = 992;
    run.plan = published_plan(8, 1, 124, 2, Checkpointing::kFull, 8, 1);
    run.sequence_parallel = true;  // --distribute-checkpointed-activations: the kept inputs / t
    run.tflops_per_gpu = 147;
    run.counts_recompute = true;
    run.source = "Zhang et al. 2022, 2.4 and Table 1; metaseq opt_baselines.py";
    runs.push_back(run);
  }
  {
    // BLOOM-176B on Jean Zay (BigScience tr11-176B-ml README: 48 nodes of 8 A100 80GB, four 100
    // Gb/s Omni-Path links per node, i.e. 6.25 GB/s per GPU; TP 4, PP 12, DP 8, micro-batch 2,
    // global batch 2048, ZeRO stage 1, activation checkpointing). Throughput: the training
    // chronicles' log at full batch, 105 s per iteration, "TFLOPs: 149.02" (Megatron's formula,
    // recomputation counted).
    PublishedRun run;
    run.name = run.model = "bloom-176b";
    run.cluster = "a100-80g:384,net=6.25";
    run.global_batch = 2048;
    run.plan = published_plan(4, 12, 8, 1, Checkpointing::kFull, 2, 1);
    run.tflops_per_gpu = 149;
    run.counts_recompute = true;
    run.source = "BigScience tr11-176B-ml README and chronicles (2022-03-18)";
    runs.push_back(run);
  }
  // Narayanan et al. 2021, Table 2: the 174.6 B and 529.6 B models at a fixed global batch on
  // 2 and 4 times the GPUs, two ways. PTD-P: tensor 8 x pipeline 12 (174.6 B) or 35 (529.6 B),
  // micro-batch 1 (the table gives no schedule: the default 1F1B here). ZeRO-3 without model
  // parallelism (DeepSpeed): every GPU a data-parallel rank, micro-batches of 4, 2, 1 (one per
  // pipeline: no accumulation); the 529.6 B model did not fit on 560 GPUs and ran on 640 with a
  // batch of 2560 instead (the table's asterisk). 2021 software, full recomputation (Megatron's
  // equation (3) counts it, as in Table 1).
  struct Table2Row {
    const char* scheme;
    const char* model;
    int tp, pp, gpus;
    int64_t batch, mb;
    int zero;
    double tflops;
  };
  const std::array<Table2Row, 12> table2 = {{
      {"ptdp", "megatron-174.6b", 8, 12, 384, 1536, 1, 0, 153},
      {"ptdp", "megatron-174.6b", 8, 12, 768, 1536, 1, 0, 149},
      {"ptdp", "megatron-174.6b", 8, 12, 1536, 1536, 1, 0, 141},
      {"ptdp", "megatron-529.6b", 8, 35, 560, 2240, 1, 0, 171},
      {"ptdp", "megatron-529.6b", 8, 35, 1120, 2240, 1, 0, 167},
      {"ptdp", "megatron-529.6b", 8, 35, 2240, 2240, 1, 0, 159},
      {"zero3", "megatron-174.6b", 1, 1, 384, 1536, 4, 3, 144},
      {"zero3", "megatron-174.6b", 1, 1, 768, 1536, 2, 3, 88},
      {"zero3", "megatron-174.6b", 1, 1, 1536, 1536, 1, 3, 44},
      {"zero3", "megatron-529.6b", 1, 1, 640, 2560, 4, 3, 138},
      {"zero3", "megatron-529.6b", 1, 1, 1120, 2240, 2, 3, 98},
      {"zero3", "megatron-529.6b", 1, 1, 2240, 2240, 1, 3, 48}}};
  for (const Table2Row& r : table2) {
    PublishedRun run;
    const std::string size = std::string(r.model).substr(9);  // "174.6b"
    run.name = fmt::format("{}-{}-{}", r.scheme, size, r.gpus);
    run.model = r.model;
    run.cluster = fmt::format("a100-80g:{}", r.gpus);
    run.global_batch = r.batch;
    run.plan = published_plan(r.tp, r.pp, r.gpus / (r.tp * r.pp), r.zero, Checkpointing::kFull, r.mb, 1);
    run.tflops_per_gpu = r.tflops;
    run.counts_recompute = true;
    run.source = "Narayanan et al. 2021, Table 2";
    if (r.zero == 3)
      run.outside_model =
          "ZeRO-3 without model parallelism: the model prices one bandwidth-bound all-gather of "
          "the parameters per forward and backward; DeepSpeed's 2021 ZeRO-3 gathered them "
          "parameter by parameter over every GPU, and lost per-GPU throughput with the GPU "
          "count far faster than bandwidth alone explains (Narayanan et al. 2021, section 5.2)";
    runs.push_back(run);
  }
  // Llama 3 405B (Dubey et al. 2024, Table 4: 8,192 H100s with TP 8, PP 16, DP 64, 32 sequences
  // of 8,192 per DP group, 430 TFLOP/s per GPU, BF16 MFU 43%; 16,384 H100s with DP 128, 16
  // sequences per group, 400 TFLOP/s, 41%). Section 3.3.2: FSDP sharding optimizer state and
  // gradients without resharding parameters after forward (ZeRO stage 2 here), 8K sequences
  // without activation checkpointing (only possible if attention never stores its scores: a
  // fused kernel), an interleaved schedule (126 layers plus the embedding and the output as
  // their own chunks: 128 = 16 ranks x 8 chunks of one layer), tensor parallelism after
  // Korthikanti et al. (sequence parallel). "Memory imbalance": one layer fewer on the first and
  // on the last stage (7 + 14 x 8 + 7 = 126), the first chunk of the first stage holding only the
  // embedding and the last chunk of the last stage only the output and the loss. Micro-batches
  // of one sequence (not published). The published TFLOP/s are model FLOPs (MFU).
  for (int dp : {64, 128}) {
    PublishedRun run;
    run.name = fmt::format("llama3-405b-{}k", dp / 8);
    run.model = "llama3-405b-like";
    run.cluster = fmt::format("h100-80g:{}", 8 * 16 * dp);
    run.global_batch = 2048;  // 16M tokens of 8,192
    run.plan = published_plan(8, 16, dp, 2, Checkpointing::kNone, 1, 8);
    run.plan.first_stage_layers = run.plan.last_stage_layers = 7;
    run.flash_attention = run.sequence_parallel = true;
    run.tflops_per_gpu = dp == 64 ? 430 : 400;
    run.counts_recompute = false;
    run.source = "Dubey et al. 2024, Table 4 and section 3.3.2";
    runs.push_back(run);
  }
  {
    // Table 4's third row: long-context pre-training, 131,072-token sequences over context
    // parallelism 16 (16,384 H100s: TP 8, CP 16, PP 16, DP 8; 16 M tokens per batch, so 128
    // sequences, 16 per data-parallel group), 380 TFLOP/s per GPU, BF16 MFU 38%.
    PublishedRun run;
    run.name = "llama3-405b-16k-cp16";
    run.model = "llama3-405b-like-128k";
    run.cluster = "h100-80g:16384";
    run.global_batch = 128;
    run.plan = published_plan(8, 16, 8, 2, Checkpointing::kNone, 1, 8);
    run.plan.cp = 16;
    run.plan.first_stage_layers = run.plan.last_stage_layers = 7;  // as at 8K
    run.flash_attention = run.sequence_parallel = true;
    run.tflops_per_gpu = 380;
    run.counts_recompute = false;
    run.source = "Dubey et al. 2024, Table 4 and section 3.3.2";
    runs.push_back(run);
  }
  return runs;
}

std::vector<std::string> calibration_rows() { return {"megatron-1.7b", "megatron-145.6b", "opt-175b"}; }

double published_mfu(const PublishedRun& run) {
  const Cluster cl = cluster(run.cluster);
  return published_tokens_per_s(run) * model_flops_per_token(model_by_name(run.model)) /
         (cl.gpus * cl.peak_flops);
}

double constant_mfu(const std::vector<std::string>& rows) {
  const std::vector<PublishedRun> runs = published_runs();
  double sum = 0;
  for (const std::string& name : rows) {
    const auto it = std::find_if(runs.begin(), runs.end(),
                                 [&](const PublishedRun& r) { return r.name == name; });
    DTL_CHECK(it != runs.end(), fmt::format("constant_mfu: no published run '{}'", name));
    sum += published_mfu(*it);
  }
  DTL_CHECK(!rows.empty(), "constant_mfu: no run named");
  return sum / static_cast<double>(rows.size());
}

double baseline_tokens_per_s(const PublishedRun& run, double mfu) {
  const Cluster cl = cluster(run.cluster);
  return mfu * cl.gpus * cl.peak_flops / model_flops_per_token(model_by_name(run.model));
}

std::vector<PublishedRanking> published_rankings() {
  const std::vector<PublishedRun> runs = published_runs();
  auto row = [&](const std::string& name) {
    const auto it = std::find_if(runs.begin(), runs.end(),
                                 [&](const PublishedRun& r) { return r.name == name; });
    DTL_CHECK(it != runs.end(), fmt::format("published_rankings: no published run '{}'", name));
    return *it;
  };
  std::vector<PublishedRanking> out;
  const std::string table2 = "Narayanan et al. 2021, Table 2";
  // The same model over more data-parallel ranks at a fixed global batch: fewer micro-batches
  // per pipeline (PTD-P: a larger bubble), the same ZeRO-3 traffic per GPU for less compute.
  for (const char* scheme : {"ptdp-174.6b", "zero3-174.6b"})
    out.push_back({fmt::format("{}: 384 > 768 > 1536 GPUs per GPU", scheme),
                   {row(fmt::format("{}-384", scheme)), row(fmt::format("{}-768", scheme)),
                    row(fmt::format("{}-1536", scheme))}, true, table2});
  out.push_back({"ptdp-529.6b: 560 > 1120 > 2240 GPUs per GPU",
                 {row("ptdp-529.6b-560"), row("ptdp-529.6b-1120"), row("ptdp-529.6b-2240")}, true,
                 table2});
  out.push_back({"zero3-529.6b: 640 > 1120 > 2240 GPUs per GPU",
                 {row("zero3-529.6b-640"), row("zero3-529.6b-1120"), row("zero3-529.6b-2240")},
                 true, table2});
  // Tensor and pipeline parallelism against ZeRO-3 without model parallelism, on as many GPUs.
  for (int gpus : {384, 768, 1536})
    out.push_back({fmt::format("174.6B on {} GPUs: PTD-P > ZeRO-3", gpus),
                   {row(fmt::format("ptdp-174.6b-{}", gpus)), row(fmt::format("zero3-174.6b-{}", gpus))},
                   true, table2});
  for (int gpus : {1120, 2240})
    out.push_back({fmt::format("529.6B on {} GPUs: PTD-P > ZeRO-3", gpus),
                   {row(fmt::format("ptdp-529.6b-{}", gpus)), row(fmt::format("zero3-529.6b-{}", gpus))},
                   true, table2});
  {
    // Figure 13: the 162.2 B model on 64 A100s (8 nodes), global batch 128, micro-batch 1, full
    // recomputation, every (pipeline, tensor) split of 64. The paper: the best is tensor
    // parallelism over one node (t = 8) and the pipeline across nodes (p = 8); tensor
    // parallelism across nodes is the worst choice. Only the order is used (the values are
    // read off a figure).
    PublishedRanking r{"162.2B on 64 GPUs: (pp 8, tp 8) beats every other (pp, tp)", {}, false,
                       "Narayanan et al. 2021, Figure 13 and section 5.4.1; Megatron-LM "
                       "examples/sc21/run_figure_13.sh"};
    for (int pp : {8, 2, 4, 16, 32}) {
      PublishedRun run;
      run.name = fmt::format("megatron-162.2b-pp{}-tp{}", pp, 64 / pp);
      run.model = "megatron-162.2b";
      run.cluster = "a100-80g:64";
      run.global_batch = 128;
      run.plan = published_plan(64 / pp, pp, 1, 0, Checkpointing::kFull, 1, 1);
      run.source = r.source;
      r.best_first.push_back(run);
    }
    out.push_back(r);
  }
  return out;
}

CostModel cost_for(const PublishedRun& run, const CostModel& base) {
  CostModel c = base;
  c.flash_attention = run.flash_attention;
  c.sequence_parallel = run.sequence_parallel;
  return c;
}

double published_tokens_per_s(const PublishedRun& run) {
  const GPTConfig cfg = model_by_name(run.model);
  const double flops = run.counts_recompute ? hardware_flops_per_token(cfg, run.plan.checkpointing)
                                            : model_flops_per_token(cfg);
  return run.tflops_per_gpu * 1e12 * cluster(run.cluster).gpus / flops;
}

CostModel calibrate(const std::vector<std::string>& rows, const CostModel& base) {
  DTL_CHECK(rows.size() == 3,
            fmt::format("calibrate: three runs for three constants, not {}", rows.size()));
  const std::vector<PublishedRun> runs = published_runs();
  // The step time is affine in x = (1/eps, kappa, omega): t = a0 + a1 x1 + a2 x2 + a3 x3. Four
  // evaluations of step_time give a run's coefficients; each run's published step time gives
  // one equation.
  double A[3][4];
  for (size_t i = 0; i < 3; ++i) {
    const auto it = std::find_if(runs.begin(), runs.end(),
                                 [&](const PublishedRun& r) { return r.name == rows[i]; });
    DTL_CHECK(it != runs.end(), fmt::format("calibrate: no published run '{}'", rows[i]));
    const GPTConfig cfg = model_by_name(it->model);
    const Cluster cl = cluster(it->cluster);
    auto t = [&](double inv_eps, double kappa, double omega) {
      CostModel c = cost_for(*it, base);
      c.compute_efficiency = 1.0 / inv_eps;
      c.memory_passes = kappa;
      c.dp_overlap = omega;
      return step_time(cfg, cl, it->plan, it->global_batch, c).total;
    };
    const double t0 = t(1, 0, 0);
    const double a1 = t(2, 0, 0) - t0, a2 = t(1, 1, 0) - t0, a3 = t(1, 0, 1) - t0;
    const double published_step =
        static_cast<double>(it->global_batch * cfg.seq_len) / published_tokens_per_s(*it);
    A[i][0] = a1;
    A[i][1] = a2;
    A[i][2] = a3;
    A[i][3] = published_step - (t0 - a1);
  }
  // Gauss-Jordan elimination with partial pivoting on the 3 x 4 augmented matrix.
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::abs(A[r][col]) > std::abs(A[pivot][col])) pivot = r;
    DTL_CHECK(std::abs(A[pivot][col]) > 1e-300,
              "calibrate: the three runs do not determine the three constants (no solution)");
    for (int k = 0; k < 4; ++k) std::swap(A[col][k], A[pivot][k]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = A[r][col] / A[col][col];
      for (int k = col; k < 4; ++k) A[r][k] -= f * A[col][k];
    }
  }
  CostModel c = base;
  c.compute_efficiency = A[0][0] / A[0][3];
  c.memory_passes = A[1][3] / A[1][1];
  c.dp_overlap = A[2][3] / A[2][2];
  DTL_CHECK(std::isfinite(c.compute_efficiency) && c.compute_efficiency > 0 &&
                std::isfinite(c.memory_passes) && std::isfinite(c.dp_overlap),
            fmt::format("calibrate: no solution (eps {}, kappa {}, omega {})", c.compute_efficiency,
                        c.memory_passes, c.dp_overlap));
  return c;
}

// ================================================================ the trainer's glue

HookedOptimizer::HookedOptimizer(torch::optim::Optimizer& inner, std::function<void()> before_step)
    : torch::optim::Optimizer(inner.param_groups(),
                              std::make_unique<torch::optim::AdamWOptions>()),
      inner_(&inner),
      before_step_(std::move(before_step)) {}

torch::Tensor HookedOptimizer::step(LossClosure closure) {
  if (before_step_) before_step_();
  return inner_->step(std::move(closure));
}

void HookedOptimizer::save(torch::serialize::OutputArchive& archive) const { inner_->save(archive); }
void HookedOptimizer::load(torch::serialize::InputArchive& archive) { inner_->load(archive); }

namespace {

// The optimizer's state of one parameter. LibTorch 1.13 keys its state map by the string of the
// TensorImpl's address, 2.x by the address itself.
template <typename Map>
auto state_key(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;  // what 1.13's c10::guts::to_string did (2.x has no guts::to_string)
    address << p.unsafeGetTensorImpl();
    return address.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

torch::optim::AdamWParamState& adamw_state(torch::optim::Optimizer& opt, const torch::Tensor& p) {
  auto& states = opt.state();
  const auto key = state_key(states, p);
  auto it = states.find(key);
  if (it == states.end()) {  // before the first step: zero moments, as AdamW would create them
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(0);
    s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    it = states.insert({key, std::move(s)}).first;
  }
  auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get());
  DTL_CHECK(adamw != nullptr, "training state: the optimizer is not torch::optim::AdamW");
  return *adamw;
}

// A problem found on any rank raises the same dtl::Error on every rank (collective).
void raise_if_any_rank(Comm& comm, const std::string& mine) {
  for (const std::string& e : lab17::all_gather_strings(comm, mine)) DTL_CHECK(e.empty(), e);
}

// What every rank lists about the serial tensors it holds: name -> (shape, dtype).
using Catalogue = std::map<std::string, std::pair<std::vector<int64_t>, std::string>>;

// The union of every rank's serial tensors (collective over comm): every rank lists every name,
// so that lab 17 sees the same names in the same order on every rank. A name with two shapes or
// dtypes on two ranks is an error on every rank.
Catalogue all_serial_tensors(const std::vector<torch::Tensor>& params,
                             const std::vector<SerialBox>& boxes, Comm& comm) {
  nlohmann::json mine = nlohmann::json::object();
  for (size_t i = 0; i < boxes.size(); ++i)
    mine[boxes[i].name] = {{"shape", boxes[i].shape},
                           {"dtype", lab17::safetensors_dtype(params[i].scalar_type())}};
  Catalogue all;
  std::string error;
  for (const std::string& text : lab17::all_gather_strings(comm, mine.dump())) {
    const nlohmann::json theirs = nlohmann::json::parse(text);
    for (auto e = theirs.begin(); e != theirs.end(); ++e) {
      const std::string& name = e.key();
      const std::pair<std::vector<int64_t>, std::string> entry = {
          e->at("shape").get<std::vector<int64_t>>(), e->at("dtype").get<std::string>()};
      const auto [it, fresh] = all.emplace(name, entry);
      if (!fresh && it->second != entry && error.empty())
        error = fmt::format("training state: the ranks disagree on the serial tensor '{}' "
                            "(shape {} or {})", name, fmt::join(it->second.first, "x"),
                            fmt::join(entry.first, "x"));
    }
  }
  DTL_CHECK(error.empty(), error);
  return all;
}

// The tensors of the training state as a lab 17 Snapshot: each serial tensor's box from this
// rank's first parameter of that name (an empty box when it holds none, or, when saving, when
// it does not write it), for the parameter and its two moments. `twins` gets the (first,
// other) parameter indices of one name on this rank (tied copies): a load copies the first's
// state into the other.
lab17::Snapshot snapshot_of(int64_t step, const Plan* plan,
                            const std::vector<torch::Tensor>& params,
                            const std::vector<SerialBox>& boxes, torch::optim::Optimizer& adamw,
                            Comm& comm, bool saving,
                            std::vector<std::pair<size_t, size_t>>& twins) {
  DTL_CHECK(boxes.size() == params.size(),
            fmt::format("training state: {} boxes for {} parameters", boxes.size(), params.size()));
  std::map<std::string, size_t> first;  // serial name -> this rank's first parameter of it
  std::string error;
  for (size_t i = 0; i < params.size() && error.empty(); ++i) {
    const SerialBox& b = boxes[i];
    const std::vector<int64_t> box = b.box.empty() ? params[i].sizes().vec() : b.box;
    int64_t numel = 1;
    for (int64_t k : box) numel *= k;
    if (b.offset.size() != b.shape.size() || box.size() != b.shape.size() ||
        numel != params[i].numel())
      error = fmt::format("training state: the box of '{}' (offset [{}], box [{}]) does not "
                          "describe a parameter of {} elements in a tensor of shape [{}]",
                          b.name, fmt::join(b.offset, ", "), fmt::join(box, ", "),
                          params[i].numel(), fmt::join(b.shape, ", "));
    const auto [it, fresh] = first.emplace(b.name, i);
    if (!fresh && error.empty()) {
      const SerialBox& a = boxes[it->second];
      const std::vector<int64_t> a_box = a.box.empty() ? params[it->second].sizes().vec() : a.box;
      if (a.offset != b.offset || a.shape != b.shape || a_box != box)
        error = fmt::format("training state: this rank holds two boxes of '{}' (a tied copy "
                            "must be the same box)", b.name);
      twins.emplace_back(it->second, i);
    }
  }
  raise_if_any_rank(comm, error);
  const Catalogue all = all_serial_tensors(params, boxes, comm);

  lab17::Snapshot s;
  s.step = step;
  if (plan) {
    s.layout = plan->describe();
    s.counters = {{"tp", plan->tp}, {"pp", plan->pp}, {"dp", plan->dp}, {"cp", plan->cp}};
  }
  s.counters["step"] = step;
  s.counters["world"] = comm.size();
  int64_t adam_step = 0;
  for (const auto& p : params) adam_step = std::max(adam_step, adamw_state(adamw, p).step());
  s.counters["adam_step"] = adam_step;
  const std::array<std::string, 3> kinds = {"param/", "exp_avg/", "exp_avg_sq/"};
  for (size_t k = 0; k < kinds.size(); ++k)
    for (const auto& [name, entry] : all) {
      const auto& [shape, dtype] = entry;
      lab17::ShardedTensor t{kinds[k] + name, shape, 0, torch::Tensor(),
                             std::vector<int64_t>(shape.size(), 0)};
      const auto it = first.find(name);
      if (it != first.end() && (!saving || boxes[it->second].writes)) {
        const SerialBox& b = boxes[it->second];
        const torch::Tensor& p = params[it->second];
        auto& st = adamw_state(adamw, p);
        const torch::Tensor of = k == 0 ? p.detach() : k == 1 ? st.exp_avg() : st.exp_avg_sq();
        t.local = b.box.empty() ? of : of.view(b.box);
        t.box_offset = b.offset;
      } else {  // nothing of it here (or another rank writes it): an empty box
        t.local = torch::empty(std::vector<int64_t>(shape.size(), 0),
                               torch::TensorOptions()
                                   .dtype(lab17::dtype_from_safetensors(dtype))
                                   .device(comm.device()));
      }
      s.sharded.push_back(std::move(t));
    }
  return s;
}

}  // namespace

std::string save_training_state(const std::string& dir, int64_t step, const Plan& plan,
                                const std::vector<torch::Tensor>& params,
                                const std::vector<SerialBox>& boxes,
                                torch::optim::Optimizer& adamw, Comm& comm) {
  std::vector<std::pair<size_t, size_t>> twins;
  const lab17::Snapshot s = snapshot_of(step, &plan, params, boxes, adamw, comm, true, twins);
  return lab17::save(dir, s, comm);
}

int64_t load_training_state(const std::string& dir, const std::vector<torch::Tensor>& params,
                            const std::vector<SerialBox>& boxes, torch::optim::Optimizer& adamw,
                            Comm& comm) {
  if (lab17::latest(dir).empty()) return -1;
  std::vector<std::pair<size_t, size_t>> twins;
  lab17::Snapshot s = snapshot_of(0, nullptr, params, boxes, adamw, comm, false, twins);
  // Parameters are leaves that require grad: load writes into detached views of them. Any
  // plan, any world size: lab 17 fills each box from the saved boxes it overlaps.
  lab17::LoadOptions options;
  options.allow_reshard = true;
  lab17::LoadResult r;
  try {
    r = lab17::load(dir, s, comm, options);
  } catch (const dtl::Error& e) {
    DTL_CHECK(false, fmt::format("training state: the checkpoint in {} does not fit this "
                                 "model: {}", dir, e.what()));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [a, b] : twins) {  // a tied copy gets what its first holder loaded
    params[b].copy_(params[a]);
    adamw_state(adamw, params[b]).exp_avg().copy_(adamw_state(adamw, params[a]).exp_avg());
    adamw_state(adamw, params[b]).exp_avg_sq().copy_(adamw_state(adamw, params[a]).exp_avg_sq());
  }
  for (const auto& p : params) adamw_state(adamw, p).step(s.counters.at("adam_step"));
  return r.step;
}

}  // namespace dtl::lab20
