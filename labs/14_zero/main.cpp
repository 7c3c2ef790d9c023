// Lab 14 demo: what each ZeRO stage removes from a rank, predicted (your model_state_bytes) and
// measured (the tracking allocator), what each step communicates, and the paper's arithmetic
// at the scale of real models.
//
//   ./lab run 14                        4 ranks: data parallelism, then stages 1, 2, 3
//   ./lab run 14 -n 2 -- --layers 8     more layers: more units, the same ratios
//   ./lab run 14 -- --rows 1            smaller activations: stage 2 now lowers the step peak
//   ./lab run 14 -- --net ib-2node      stage 3's extra all-gathers cost time on a slow network
//   ./lab run 14 -- --json zero.json    also the table and the paper's arithmetic as data
//   ./lab run 14 -- --help              every flag
//
// 1. For stage 0 (plain data parallelism: all-reduce every gradient, AdamW on the full model)
//    and ZeRO stages 1-3: the bytes a rank holds after a step (predicted, measured), the most it
//    held during a step (activations and gradients in flight included), the bytes it sends per
//    step (CommStats' wire bytes, and as a multiple of data parallelism's), the
//    median step time and the final loss (the same for every stage: same trajectory).
// 2. The formulas for a 7.5B model (the paper's Table 1) and a 70B one, mixed precision, on
//    4 to 1024 ranks: which stage fits on an 80 GB GPU.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "demo_config.hpp"  // defines: demo::demo_config, demo::demo_adamw
#include "dtl/cli.hpp"      // defines: add_model_options
#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: memory::install, current_bytes, format_bytes
#include "dtl/net.hpp"      // defines: net::enabled, net::current
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/perf.hpp"     // defines: measure, sum_over_ranks
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "zero.hpp"

namespace {

using dtl::lab14::GPT;
using dtl::lab14::GPTConfig;

struct Row {
  int64_t held = 0;       // bytes after the last step, above those before the model existed
  int64_t peak = 0;       // the highest live bytes during a step, above the same
  double wire = 0;        // bytes this rank sent per step
  double step_ms = 0;     // median after one warm-up step, slowest rank
  float loss = 0;         // the last step's loss on this rank's rows, averaged over ranks
};

// `comm` carries the training's traffic only: its stats are the table's. Step times and the
// loss travel over the control channel (dtl/perf.hpp), which Comm stats do not count.
Row run(const GPTConfig& cfg, int stage, int steps, const dtl::data::GlobalBatchSampler& sampler,
        dtl::Comm& comm) {
  const int64_t per = sampler.global_batch() / comm.size();
  auto rows = [&](int s) {
    return sampler.rows(s, comm.rank() * per, (comm.rank() + 1) * per).to(comm.device());
  };
  const dtl::OptimConfig oc = dtl::lab14::demo::demo_adamw();
  Row r;
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes(comm.device()));
  {
    GPT model(cfg);
    model->to(comm.device());
    std::unique_ptr<dtl::lab14::ZeroOptimizer> zero;
    std::unique_ptr<torch::optim::AdamW> adam;
    if (stage == 0) {
      for (auto& p : model->parameters()) comm.broadcast(p.detach(), 0);
      adam = dtl::make_adamw(*model, oc);
    } else {
      zero = std::make_unique<dtl::lab14::ZeroOptimizer>(model, comm, stage, oc);
    }
    comm.reset_stats();
    torch::Tensor loss;
    int s = 0;
    auto step = [&] {
      dtl::memory::reset_peak(comm.device());
      if (stage == 0) {
        adam->zero_grad();
        loss = model->loss(rows(s));
        loss.backward();
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) comm.all_reduce(p.grad());
        for (auto& p : model->parameters()) p.grad().div_(comm.size());
        adam->step();
      } else {
        zero->zero_grad();
        loss = zero->loss(rows(s));
        loss.backward();
        zero->step();
      }
      r.peak = std::max(r.peak, static_cast<int64_t>(dtl::memory::peak_bytes(comm.device())) - before);
      ++s;
    };
    r.step_ms = dtl::measure(step, /*warmup=*/1, steps - 1).median * 1e3;
    r.wire = comm.stats().total_wire_bytes() / steps;
    r.held = static_cast<int64_t>(dtl::memory::current_bytes(comm.device())) - before;
    r.loss = static_cast<float>(dtl::sum_over_ranks(loss.item<double>()) / comm.size());
  }
  return r;
}

void at_scale(const char* label, double psi) {
  using dtl::lab14::model_state_bytes;
  const auto mixed = dtl::lab14::Precision::mixed_adam();
  dtl::print0("{} ({:.1f}B parameters), mixed-precision Adam, GB per rank:", label, psi / 1e9);
  dtl::print0("  {:>6} {:>9} {:>9} {:>9} {:>9}", "ranks", "DP", "stage 1", "stage 2", "stage 3");
  for (int n : {4, 8, 64, 1024}) {
    std::string line = fmt::format("  {:>6}", n);
    for (int stage = 0; stage <= 3; ++stage) {
      const double gb = model_state_bytes(stage, {static_cast<int64_t>(psi)}, n, mixed).total() / 1e9;
      line += fmt::format(" {:>8.2f}{}", gb, gb <= 80 ? ' ' : '*');
    }
    dtl::print0("{}", line);
  }
  dtl::print0("  (* does not fit the 80 GB of an H100 even before activations)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 14: what ZeRO stage 1, 2 and 3 each remove"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  GPTConfig cfg = dtl::lab14::demo::demo_config();
  int steps = 5;
  int64_t rows = 4;
  dtl::add_model_options(app, cfg);
  app.add_option("--rows", rows, "sequences per rank per step")->capture_default_str();
  app.add_option("--steps", steps, "steps per stage (the first is warm-up)")->capture_default_str();
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write every stage's predicted and measured bytes to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    cfg.validate();
    DTL_CHECK(steps >= 2, fmt::format("--steps {} must be >= 2 (the first is warm-up)", steps));
    dtl::memory::install();
    const int n = rt.world_size();
    std::shared_ptr<dtl::Comm> comm = rt.world().dup();
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, rows * n, cfg.seq_len);
    GPT probe(cfg);
    const std::vector<int64_t> numels = dtl::lab14::unit_numels(probe);
    int64_t psi = 0;
    for (int64_t k : numels) psi += k;
    dtl::print0("{} ranks, network: {}", n,
                dtl::net::enabled() ? dtl::net::current().describe() : "none (try --net ib-2node)");
    dtl::print0("model {}: {} parameters in {} units, {} rows x {} tokens per rank\n",
                cfg.to_string(), psi, numels.size(), rows, cfg.seq_len);
    dtl::print0("{:<8} {:>12} {:>12} {:>7} {:>12} {:>12} {:>8} {:>10} {:>9}", "stage",
                "predicted", "measured", "error", "step peak", "sent/step", "x DP", "step ms",
                "loss");
    double dp_wire = 0;
    auto bytes_json = [](const dtl::lab14::ModelStateBytes& b) {
      return nlohmann::json{{"params", b.params}, {"grads", b.grads}, {"optimizer", b.optimizer}};
    };
    nlohmann::json doc = {{"model", cfg.to_string()},
                          {"parameters", psi},
                          {"ranks", n},
                          {"stages", nlohmann::json::array()},
                          {"at_scale", nlohmann::json::array()}};
    for (int stage = 0; stage <= 3; ++stage) {
      const Row r = run(cfg, stage, steps, sampler, *comm);
      const int64_t want = dtl::lab14::model_state_bytes(stage, numels, n).total();
      doc["stages"].push_back(
          {{"stage", stage},
           {"predicted", bytes_json(dtl::lab14::model_state_bytes(stage, numels, n))},
           {"held", r.held},
           {"peak", r.peak},
           {"wire", r.wire}});
      if (stage == 0) dp_wire = r.wire;
      dtl::print0("{:<8} {:>12} {:>12} {:>6.1f}% {:>12} {:>12} {:>8} {:>10.1f} {:>9.4f}",
                  stage == 0 ? "DP" : fmt::format("ZeRO-{}", stage),
                  dtl::memory::format_bytes(static_cast<double>(want)),
                  dtl::memory::format_bytes(static_cast<double>(r.held)),
                  want ? 100.0 * (r.held - want) / want : 0.0,
                  dtl::memory::format_bytes(static_cast<double>(r.peak)),
                  dtl::memory::format_bytes(r.wire),
                  dp_wire > 0 ? fmt::format("{:.2f}", r.wire / dp_wire) : std::string("-"),
                  r.step_ms, r.loss);
    }
    dtl::print0("\npredicted: model_state_bytes (fp32 AdamW: 4 + 4 + 8 bytes per parameter, "
                "padding per unit); measured: the tracker after the last step; step peak: the "
                "most live during a step (activations and transient gradients included); sent: "
                "the ring's wire bytes per rank.\n");
    // The paper's Figure 1: 7.5B parameters on 64 ranks, mixed-precision Adam.
    for (int stage = 0; stage <= 3; ++stage)
      doc["at_scale"].push_back({{"stage", stage},
                                 {"parameters", 7.5e9},
                                 {"ranks", 64},
                                 {"bytes", bytes_json(dtl::lab14::model_state_bytes(
                                               stage, {int64_t{7'500'000'000}}, 64,
                                               dtl::lab14::Precision::mixed_adam()))}});
    if (!json_path.empty() && rt.rank() == 0) std::ofstream(json_path) << doc.dump(1) << "\n";
    at_scale("the ZeRO paper's model", 7.5e9);
    at_scale("a 70B model", 70e9);
  } catch (const dtl::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
