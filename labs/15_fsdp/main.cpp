// Lab 15 demo: DDP, ZeRO-3 and FSDP's four strategies side by side on the same model and data,
// and what fits on an 80 GB GPU at the scale of real models.
//
//   ./lab run 15                         4 ranks, shared memory as the network
//   ./lab run 15 -- --net eth-2node      4 ranks as 2 nodes joined by 25 Gb/s Ethernet
//   ./lab run 15 -- --net ib-2node       the same over InfiniBand
//   ./lab run 15 -- --no-prefetch        every gather on demand: what prefetch was hiding
//   ./lab run 15 -- --json fsdp.json     also the table and the at-scale bytes as data
//   ./lab run 15 -- --help               every flag
//
// 1. For DDP (lab 04: all-reduce in buckets), ZeRO-3 (lab 14) and FSDP FULL_SHARD,
//    SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD: the parameter bytes param_bytes() predicts
//    (shards + the most gathered at once), the most the tracker saw live during a step
//    (activations and gradients in flight included), the bytes a rank sends per step, the part
//    of them that crosses a node boundary, the median step time and the final loss.
// 2. A 7B and a 70B model in mixed precision on 8 to 512 GPUs (8 per node): model-state GB per
//    GPU per strategy, and whether it fits on an 80 GB GPU.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp.hpp"          // defines: lab04::DistributedDataParallel (the reference)
#include "demo_config.hpp"  // defines: demo::demo_config, demo::demo_adamw, demo::strategies
#include "dtl/cli.hpp"      // defines: add_model_options
#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: memory::install, peak_bytes, format_bytes
#include "dtl/net.hpp"      // defines: net::enabled, net::current
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/perf.hpp"     // defines: measure, sum_over_ranks, max_over_ranks
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "fsdp.hpp"
#include "zero.hpp"  // defines: lab14::ZeroOptimizer (the reference)

namespace {

using dtl::lab15::FSDPConfig;
using dtl::lab15::FullyShardedDataParallel;
using dtl::lab15::GPT;
using dtl::lab15::GPTConfig;
using dtl::lab15::ShardingStrategy;

struct Row {
  std::string name;
  int64_t predicted = -1;  // param_bytes().total(), when the formula covers it
  int64_t peak = 0;        // the highest live bytes during a step, above those before the model
  double wire = 0;         // bytes this rank sent per step
  double inter = 0;        // ... of them on communicators that span nodes
  double step_ms = 0;      // median after one warm-up step, slowest rank
  double loss = 0;         // the last step's loss averaged over ranks
};

bool spans(const dtl::Comm& c, int rpn) {
  const auto& r = c.world_ranks();
  return std::any_of(r.begin(), r.end(), [&](int x) { return x / rpn != r[0] / rpn; });
}

// One training run of `steps` steps; `kind` is "DDP", "ZeRO-3" or an FSDP strategy.
Row run(const GPTConfig& cfg, const std::string& kind, const FSDPConfig& fc, bool prefetch,
        int steps, const dtl::data::GlobalBatchSampler& sampler, dtl::Comm& world, int rpn) {
  const int64_t per = sampler.global_batch() / world.size();
  auto rows = [&](int s) {
    return sampler.rows(s, world.rank() * per, (world.rank() + 1) * per).to(world.device());
  };
  Row r;
  r.name = kind;
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes(world.device()));
  {
    GPT model(cfg);
    model->to(world.device());
    std::shared_ptr<dtl::Comm> comm = world.dup();  // this run's traffic only
    std::vector<dtl::Comm*> comms = {comm.get()};
    std::unique_ptr<dtl::lab04::DistributedDataParallel> ddp;
    std::unique_ptr<torch::optim::AdamW> adam;
    std::unique_ptr<dtl::lab14::ZeroOptimizer> zero;
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    if (kind == "DDP") {
      ddp = std::make_unique<dtl::lab04::DistributedDataParallel>(model.ptr(), *comm);
      adam = dtl::make_adamw(*model, dtl::lab15::demo::demo_adamw());
    } else if (kind == "ZeRO-3") {
      dtl::OptimConfig oc = dtl::lab15::demo::demo_adamw();
      oc.weight_decay = 0;  // lab 14's flat shards cannot tell a matrix from a bias
      zero = std::make_unique<dtl::lab14::ZeroOptimizer>(model, *comm, 3, oc);
    } else {
      FSDPConfig c = fc;
      c.forward_prefetch = prefetch;
      c.backward_prefetch = prefetch ? dtl::lab15::BackwardPrefetch::BACKWARD_PRE
                                     : dtl::lab15::BackwardPrefetch::NONE;
      fsdp = std::make_unique<FullyShardedDataParallel>(model, *comm, c, dtl::lab15::demo::demo_adamw());
      comms = {&fsdp->shard_comm()};
      if (fsdp->replicate_comm()) comms.push_back(fsdp->replicate_comm());
      const int shard = fc.strategy == ShardingStrategy::HYBRID_SHARD ? rpn : world.size();
      r.predicted = dtl::lab15::param_bytes(fsdp->unit_numels(), fsdp->strategies(), shard,
                                            world.size(), prefetch).total();
    }
    for (auto* c : comms) c->reset_stats();
    torch::Tensor loss;
    int s = 0;
    auto step = [&] {
      dtl::memory::reset_peak(world.device());
      if (adam) {
        adam->zero_grad();
        loss = model->loss(rows(s));
        loss.backward();
        adam->step();
      } else if (zero) {
        zero->zero_grad();
        loss = zero->loss(rows(s));
        loss.backward();
        zero->step();
      } else {
        fsdp->zero_grad();
        loss = fsdp->loss(rows(s));
        loss.backward();
        fsdp->step();
      }
      r.peak = std::max(r.peak, static_cast<int64_t>(dtl::memory::peak_bytes(world.device())) - before);
      ++s;
    };
    r.step_ms = dtl::measure(step, /*warmup=*/1, steps - 1).median * 1e3;
    for (auto* c : comms) {
      const double w = c->stats().total_wire_bytes() / steps;
      r.wire += w;
      if (spans(*c, rpn)) r.inter += w;
    }
    r.loss = dtl::sum_over_ranks(loss.item<double>()) / world.size();
  }
  return r;
}

// Model state per GPU in mixed precision (bf16 parameters and gradients, 12 bytes of fp32
// optimizer state per parameter), the model as `layers` equal units plus a root of `root`
// elements, on `gpus` GPUs with 8 per node.
void at_scale(const char* label, double psi, int layers, double root) {
  using dtl::lab15::param_bytes;
  const double block = (psi - root) / layers;
  std::vector<int64_t> units = {static_cast<int64_t>(root)};
  for (int i = 0; i < layers; ++i) units.push_back(static_cast<int64_t>(block));
  dtl::print0("{} ({:.1f}B parameters, {} blocks), mixed precision, GB of model state per GPU:",
              label, psi / 1e9, layers);
  dtl::print0("  {:>6} {:>11} {:>14} {:>11} {:>14}", "GPUs", "NO_SHARD", "SHARD_GRAD_OP",
              "FULL_SHARD", "HYBRID (x8)");
  for (int n : {8, 64, 512}) {
    std::string line = fmt::format("  {:>6}", n);
    const ShardingStrategy order[] = {ShardingStrategy::NO_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                                      ShardingStrategy::FULL_SHARD, ShardingStrategy::HYBRID_SHARD};
    const int width[] = {11, 14, 11, 14};
    for (int k = 0; k < 4; ++k) {
      const ShardingStrategy st = order[k];
      const int shard = st == ShardingStrategy::NO_SHARD ? 1 : st == ShardingStrategy::HYBRID_SHARD ? 8 : n;
      std::vector<ShardingStrategy> all(units.size(), st);
      const auto params = param_bytes(units, all, shard, n, /*prefetch=*/true, 2, /*bytes=*/2);
      // Gradients (2 B) and optimizer state (12 B) live on the shards in every sharded strategy.
      const double shard_elements = static_cast<double>(params.sharded) / 2;
      const double gb = (params.total() + 14 * shard_elements) / 1e9;
      line += fmt::format(" {:>{}}", fmt::format("{:.1f}{}", gb, gb <= 80 ? " " : "*"), width[k]);
    }
    dtl::print0("{}", line);
  }
  dtl::print0("  (* does not fit the 80 GB of an H100 even before activations)");
}

// at_scale's arithmetic for one GPU count, per strategy and kind of bytes, for the --json file.
nlohmann::json at_scale_json(const char* label, double psi, int layers, double root, int n) {
  using dtl::lab15::param_bytes;
  const double block = (psi - root) / layers;
  std::vector<int64_t> units = {static_cast<int64_t>(root)};
  for (int i = 0; i < layers; ++i) units.push_back(static_cast<int64_t>(block));
  nlohmann::json out = {{"model", label},
                        {"parameters", psi},
                        {"gpus", n},
                        {"gpus_per_node", 8},
                        {"strategies", nlohmann::json::array()}};
  for (ShardingStrategy st : {ShardingStrategy::NO_SHARD, ShardingStrategy::SHARD_GRAD_OP,
                              ShardingStrategy::FULL_SHARD, ShardingStrategy::HYBRID_SHARD}) {
    const int shard = st == ShardingStrategy::NO_SHARD       ? 1
                      : st == ShardingStrategy::HYBRID_SHARD ? 8
                                                             : n;
    std::vector<ShardingStrategy> all(units.size(), st);
    const auto params = param_bytes(units, all, shard, n, /*prefetch=*/true, 2, /*bytes=*/2);
    const double shard_elements = static_cast<double>(params.sharded) / 2;
    out["strategies"].push_back({{"name", dtl::lab15::to_string(st)},
                                 {"params_sharded", params.sharded},
                                 {"params_gathered", params.unsharded},
                                 {"grads", 2 * shard_elements},
                                 {"optimizer", 12 * shard_elements}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 15: how FSDP differs from DDP and when it helps"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  GPTConfig cfg = dtl::lab15::demo::demo_config();
  int steps = 4;
  int64_t rows = 4;
  bool no_prefetch = false;
  dtl::add_model_options(app, cfg);
  app.add_option("--rows", rows, "sequences per rank per step")->capture_default_str();
  app.add_option("--steps", steps, "steps per run (the first is warm-up)")->capture_default_str();
  app.add_flag("--no-prefetch", no_prefetch, "FSDP gathers every unit on demand");
  std::string json_path;
  app.add_option("--json", json_path, "also write the table and the at-scale bytes to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    cfg.validate();
    DTL_CHECK(steps >= 2, fmt::format("--steps {} must be >= 2 (the first is warm-up)", steps));
    dtl::memory::install();
    const int n = rt.world_size();
    // Nodes: the emulator's when it runs, else two halves (HYBRID_SHARD shards inside a node).
    int rpn = n % 2 == 0 ? std::max(1, n / 2) : 1;
    if (dtl::net::enabled()) {
      const auto& spec = dtl::net::current();
      rpn = spec.ranks_per_node > 0 ? spec.ranks_per_node : std::max(1, n / std::max(1, spec.nodes));
    }
    DTL_CHECK(n % rpn == 0, fmt::format("{} ranks do not split into nodes of {}", n, rpn));
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, rows * n, cfg.seq_len);
    dtl::print0("{} ranks as {} node(s) of {}, network: {}", n, n / rpn, rpn,
                dtl::net::enabled() ? dtl::net::current().describe() : "none (try --net eth-2node)");
    dtl::print0("model {}, {} rows x {} tokens per rank, prefetch {}\n", cfg.to_string(), rows,
                cfg.seq_len, no_prefetch ? "off" : "on (forward and BACKWARD_PRE)");
    dtl::print0("{:<14} {:>12} {:>12} {:>12} {:>13} {:>9} {:>9}", "", "params pred.", "step peak",
                "sent/step", "across nodes", "step ms", "loss");
    std::vector<std::string> kinds = {"DDP", "ZeRO-3"};
    const auto configs = dtl::lab15::demo::strategies(rpn);
    for (const auto& fc : configs) kinds.push_back(dtl::lab15::to_string(fc.strategy));
    double full_ms = 0, hybrid_ms = 0;
    nlohmann::json doc = {{"model", cfg.to_string()},
                          {"ranks", n},
                          {"ranks_per_node", rpn},
                          {"rows", nlohmann::json::array()}};
    for (size_t k = 0; k < kinds.size(); ++k) {
      const FSDPConfig fc = k < 2 ? FSDPConfig{} : configs[k - 2];
      const Row r = run(cfg, kinds[k], fc, !no_prefetch, steps, sampler, rt.world(), rpn);
      if (kinds[k] == "FULL_SHARD") full_ms = r.step_ms;
      if (kinds[k] == "HYBRID_SHARD") hybrid_ms = r.step_ms;
      doc["rows"].push_back({{"name", r.name},
                             {"predicted", r.predicted},
                             {"peak", r.peak},
                             {"wire", r.wire},
                             {"inter", r.inter},
                             {"step_ms", r.step_ms}});
      dtl::print0("{:<14} {:>12} {:>12} {:>12} {:>13} {:>9.1f} {:>9.4f}", r.name,
                  r.predicted >= 0 ? dtl::memory::format_bytes(static_cast<double>(r.predicted)) : "-",
                  dtl::memory::format_bytes(static_cast<double>(r.peak)),
                  dtl::memory::format_bytes(r.wire), dtl::memory::format_bytes(r.inter), r.step_ms,
                  r.loss);
    }
    if (full_ms > 0 && hybrid_ms > 0)
      dtl::print0("\nHYBRID_SHARD step / FULL_SHARD step: {:.2f}", hybrid_ms / full_ms);
    dtl::print0("\nparams pred.: param_bytes() (fp32: the shards + the most gathered at once); step "
                "peak: the most live during a step (activations and gradients in flight "
                "included); sent: the ring's wire bytes per rank; across nodes: those on "
                "communicators that span nodes. ZeRO-3 runs without weight decay (lab 14's flat "
                "shards cannot apply it per parameter), hence its slightly different loss.\n");
    doc["at_scale"] = at_scale_json("a 7B model with Llama 2 7B's shapes", 6.76e9, 32, 0.28e9, 64);
    if (!json_path.empty() && rt.rank() == 0) std::ofstream(json_path) << doc.dump(1) << "\n";
    at_scale("a 7B model with Llama 2 7B's shapes", 6.76e9, 32, 0.28e9);
    at_scale("a 70B model as equal blocks", 70e9, 80, 1.05e9);
  } catch (const dtl::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
