// lab 11 demo: where to cut a GPT into pipeline stages, and one fill-drain step after another,
// checked against serial training.
//
//   ./lab run 11 -n 4                                   4 stages, the balanced partition
//   ./lab run 11 -n 4 -- --micro-batches 1              no micro-batching: the bubble is 3/4
//   ./lab run 11 -n 4 -- --layers 10 --vocab 4096       a heavy head: watch the partition move
//   ./lab run 11 -n 4 --trace pp.json                   the sends and receives in ui.perfetto.dev
//   ./lab run 11 -n 4 -- --json split.json              also the unit costs and cuts as data
//   ./lab run 11 -n 4 -- --help                         every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/perf.hpp"     // defines: median, max_over_ranks
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "dtl/timer.hpp"    // defines: DeviceTimer
#include "dtl/train.hpp"    // defines: train_step
#include "pipeline.hpp"

namespace {

std::string describe(const std::vector<dtl::Range>& parts, const std::vector<double>& costs) {
  std::string out;
  for (const auto& r : parts) {
    double c = 0;
    for (int64_t u = r.begin; u < r.end; ++u) c += costs[static_cast<size_t>(u)];
    out += fmt::format("[{}-{}] {:.2f}M  ", r.begin, r.end - 1, c / 1e6);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 11: pipeline stages, partitioning and the fill-drain schedule"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  dtl::model::GPTConfig cfg;
  cfg.n_layer = 6;
  cfg.d_model = 128;
  cfg.n_head = 4;
  cfg.seq_len = 64;
  cfg.vocab_size = 512;
  int steps = 4;
  int64_t batch = 16, micro = 8;
  bool even = false;
  app.add_option("--steps", steps, "training steps (the first is warm-up)")->capture_default_str();
  app.add_option("--batch", batch, "GLOBAL batch (sequences per step)")->capture_default_str();
  app.add_option("--micro-batches", micro, "micro-batches per step (m)")->capture_default_str();
  app.add_option("--layers", cfg.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "model width")->capture_default_str();
  app.add_option("--vocab", cfg.vocab_size, "vocabulary (the head's cost)")->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "tokens per sequence")->capture_default_str();
  app.add_flag("--even", even, "cut by unit count (split_range) instead of by cost");
  std::string json_path;
  app.add_option("--json", json_path, "also write the unit costs and both cuts to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    const int p = rt.world_size();
    const auto costs = dtl::lab11::unit_costs(cfg);
    const std::vector<dtl::Range> even_parts = dtl::lab11::even_parts(cfg, p);
    const auto balanced = dtl::lab11::partition(costs, p);
    dtl::print0("model {}", cfg.to_string());
    dtl::print0("unit costs (forward MFLOPs per token): embed {:.2f}, block {:.2f}, head {:.2f}",
                costs.front() / 1e6, costs[1] / 1e6, costs.back() / 1e6);
    dtl::print0("even cut:     {} imbalance {:.2f}", describe(even_parts, costs),
                dtl::lab11::imbalance(costs, even_parts));
    dtl::print0("balanced cut: {} imbalance {:.2f}", describe(balanced, costs),
                dtl::lab11::imbalance(costs, balanced));
    dtl::print0(
        "fill-drain bubble (p-1)/(m+p-1) with p={}: m=1 {:.0f}%, m={} {:.0f}%, m=32 {:.0f}%", p,
        100.0 * (p - 1) / p, micro, 100.0 * (p - 1) / static_cast<double>(micro + p - 1),
        100.0 * (p - 1) / (32.0 + p - 1));
    if (!json_path.empty() && rt.rank() == 0) {
      auto cut = [](const std::vector<dtl::Range>& parts) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& r : parts) out.push_back({r.begin, r.end});
        return out;
      };
      const nlohmann::json doc = {
          {"model", cfg.to_string()},
          {"p", p},
          {"costs", costs},
          {"even",
           {{"parts", cut(even_parts)}, {"imbalance", dtl::lab11::imbalance(costs, even_parts)}}},
          {"balanced",
           {{"parts", cut(balanced)}, {"imbalance", dtl::lab11::imbalance(costs, balanced)}}}};
      std::ofstream(json_path) << doc.dump(1) << "\n";
    }

    const auto& parts = even ? even_parts : balanced;
    dtl::lab11::PipelineStage stage(cfg, rt.world(), parts);
    auto opt = dtl::make_adamw(stage.module());
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);
    // The oracle, computed on every rank (no communication): the same steps, serially.
    dtl::model::GPT serial(cfg);
    auto serial_opt = dtl::make_adamw(*serial);

    dtl::print0("{:>5} {:>10} {:>10} {:>10} {:>12} {:>12}", "step", "loss", "serial", "step ms",
                "fwd ms max", "bwd ms max");
    std::vector<double> step_ms;
    for (int s = 0; s < steps; ++s) {
      const torch::Tensor global = sampler.global_batch_at(s);
      const dtl::DeviceTimer timer;
      const dtl::lab11::StepStats st = dtl::lab11::fill_drain_step(stage, *opt, global, micro);
      const double ms = dtl::max_over_ranks(timer.millis());
      const double serial_loss = dtl::train_step(serial, *serial_opt, global);
      if (s > 0) step_ms.push_back(ms);
      dtl::print0("{:>5} {:>10.5f} {:>10.5f} {:>10.1f} {:>12.1f} {:>12.1f}", s, st.loss,
                  serial_loss, ms, dtl::max_over_ranks(st.forward_seconds * 1e3),
                  dtl::max_over_ranks(st.backward_seconds * 1e3));
    }
    dtl::print0(
        "median step {:.1f} ms over {} stages, {} micro-batches of {} sequences; peak "
        "micro-batches in flight per stage: {}",
        dtl::median(step_ms), p, micro, batch / micro, micro);
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab 11: %s\n", e.what());
    return 1;
  }
  return 0;
}
