// Lab 20 demo: plan a training run, check the planner against published runs, train a plan.
//
//   ./lab run 20 -- --model gpt3-175b --cluster a100-80g:1024 --batch 1536
//                                            the plan table: the chosen plan, the runners-up, why
//                                            the others lost, the chosen plan's breakdown
//   ./lab run 20 -- --layers 80 --d-model 8192 --heads 64 --vocab 32000 --seq 4096 --ff 35840
//                   --untied --no-bias --cluster h100-80g:512 --batch 1024
//                                            a model by its shape: llama2-70b-like's estimate
//                                            (--dropout P for Megatron's models, which use 0.1)
//   ./lab run 20 -- --model gpt3-175b --cluster a100-80g:1024 --batch 1536
//                   --fix tp=8,pp=8,dp=16,ckpt=full            one given plan instead of choosing
//   ./lab run 20 -- ... --json plans.json    every plan that fits, best first, machine-readably
//   ./lab run 20 -- --published              predicted against published throughput, every run,
//                                            beside a constant-MFU baseline; the papers' rankings
//   ./lab run 20 -- --calibrate              the three constants from the three calibration runs
//   ./lab run 20 -n 4 -- --train tp=2,pp=2 [--steps 150] [--checkpoint DIR] [--trace run.json]
//                                            train the tiny GPT with that plan on 4 ranks
//   ./lab run 20 -- --help                   every flag
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt >= 11 declares it here only)

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtl/cli.hpp"      // defines: add_model_options
#include "dtl/data.hpp"     // defines: SyntheticCorpus (the loss floor)
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "training_stack.hpp"

namespace {

using namespace dtl::lab20;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string row(const Estimate& e, const std::string& verdict) {
  const Plan& p = e.plan;
  return fmt::format("{:>3} {:>3} {:>4} {:>3} {:>4} {:>9} {:>3} {:>2} {:>8.1f} {:>8.2f} {:>10.0f} "
                     "{:>7.1f} {:>5.1f}%  {}",
                     p.tp, p.pp, p.dp, p.cp, p.zero_stage, dtl::lab13::to_string(p.checkpointing),
                     p.micro_batch, p.virtual_stages, e.memory_gb_per_gpu, e.step_s,
                     e.tokens_per_s, e.tflops_per_gpu, 100 * e.mfu, verdict);
}
const char* kHeader =
    " tp  pp   dp  cp zero      ckpt  mb  v  GiB/GPU   step s   tokens/s  TFLOP/s    MFU  verdict";

void breakdown(const Estimate& e, const Cluster& cl, const CostModel& cost) {
  const Memory& m = e.memory;
  const StepTime& t = e.time;
  dtl::print0("\nthe plan {}:", e.plan.describe());
  dtl::print0("  memory per GPU: model state {:.1f} GiB + activations {:.1f} GiB + logits {:.1f} "
              "GiB = {:.1f} GiB of {:.1f} usable",
              m.states / kGiB, m.activations / kGiB, m.logits / kGiB, m.total() / kGiB,
              cost.usable_memory * cl.memory_bytes / kGiB);
  dtl::print0("  step {:.2f} s: compute {:.2f}, tensor-parallel {:.2f}, context-parallel {:.2f}, "
              "pipeline sends {:.2f}, bubble {:.2f}, data-parallel {:.2f} exposed of {:.2f}",
              t.total, t.compute, t.tp_comm, t.cp_comm, t.p2p, t.bubble, t.dp_exposed, t.dp_comm);
}

nlohmann::json to_json(const Estimate& e, const std::string& verdict) {
  const Plan& p = e.plan;
  return {{"tp", p.tp},
          {"pp", p.pp},
          {"dp", p.dp},
          {"cp", p.cp},
          {"zero_stage", p.zero_stage},
          {"checkpointing", dtl::lab13::to_string(p.checkpointing)},
          {"micro_batch", p.micro_batch},
          {"virtual_stages", p.virtual_stages},
          {"memory_gb_per_gpu", e.memory_gb_per_gpu},
          {"step_s", e.step_s},
          {"tokens_per_s", e.tokens_per_s},
          {"tflops_per_gpu", e.tflops_per_gpu},
          {"mfu", e.mfu},
          {"fits", e.fits},
          {"verdict", verdict}};
}

// Predicted against published throughput for every run, beside the constant-MFU baseline
// fitted on the same calibration rows; the errors on the held-out rows; the published
// rankings.
void published(const CostModel& base) {
  const auto calibrated = calibration_rows();
  const double mfu = constant_mfu(calibrated);
  dtl::print0("{:<22} {:>21} {:>6} {:>9} {:>11} {:>11} {:>7} {:>9} {:>8}", "run", "cluster",
              "batch", "published", "tokens/s", "predicted", "error", "baseline", "GiB/GPU");
  // The held-out rows, split: those whose layout the model prices (the summary the text quotes)
  // and those outside it (ZeRO-3 of 2021: printed, and summarised apart).
  std::vector<double> planner, baseline, planner_out, baseline_out;
  for (const auto& run : published_runs()) {
    const Estimate e = estimate(model_by_name(run.model), cluster(run.cluster), run.plan,
                                run.global_batch, cost_for(run, base));
    const double pub = published_tokens_per_s(run);
    const double base_err = baseline_tokens_per_s(run, mfu) / pub - 1;
    const bool cal = std::count(calibrated.begin(), calibrated.end(), run.name) > 0;
    const bool outside = !run.outside_model.empty();
    if (!cal) {
      (outside ? planner_out : planner).push_back(std::abs(e.tokens_per_s / pub - 1));
      (outside ? baseline_out : baseline).push_back(std::abs(base_err));
    }
    dtl::print0("{:<22} {:>21} {:>6} {:>5.0f} TF/s {:>11.0f} {:>11.0f} {:>+6.1f}% {:>+8.1f}% {:>8.1f}{}{}",
                run.name, run.cluster, run.global_batch, run.tflops_per_gpu, pub, e.tokens_per_s,
                100 * (e.tokens_per_s / pub - 1), 100 * base_err, e.memory_gb_per_gpu,
                cal ? "  calibrated" : (outside ? "  (outside the model)" : ""),
                e.fits ? "" : "  (over the usable memory)");
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  auto most = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  dtl::print0("\nheld out, within the model ({} rows, none of them calibrated): the planner's mean "
              "|error| {:.1f}% (max {:.1f}%); a constant {:.1f}% MFU (the calibration rows' mean) "
              "{:.1f}% (max {:.1f}%)", planner.size(), 100 * mean(planner), 100 * most(planner),
              100 * mfu, 100 * mean(baseline), 100 * most(baseline));
  if (!planner_out.empty())
    dtl::print0("outside the model ({} rows: PublishedRun::outside_model says why): the planner "
                "{:.1f}% (max {:.1f}%), the constant {:.1f}% (max {:.1f}%)", planner_out.size(),
                100 * mean(planner_out), 100 * most(planner_out), 100 * mean(baseline_out),
                100 * most(baseline_out));
  dtl::print0("\npublished rankings (tokens/s per GPU predicted, best first as published):");
  for (const auto& r : published_rankings()) {
    std::string line;
    std::vector<double> per_gpu;
    for (const auto& run : r.best_first) {
      const Cluster cl = cluster(run.cluster);
      const Estimate e = estimate(model_by_name(run.model), cl, run.plan, run.global_batch,
                                  cost_for(run, base));
      per_gpu.push_back(e.tokens_per_s / cl.gpus);
      line += fmt::format(" {:.0f}", e.tokens_per_s / cl.gpus);
    }
    bool kept = true;
    for (size_t i = 1; i < per_gpu.size(); ++i)
      kept = kept && (r.full_order ? per_gpu[i - 1] > per_gpu[i] : per_gpu[0] > per_gpu[i]);
    dtl::print0("  {:<58} {:<6}{}", r.name, kept ? "kept" : "LOST", line);
  }
  dtl::print0("\nconfigurations: {}", "published_runs() and published_rankings() in catalogue.cpp, with their sources");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 20: plan a training run, validate the planner, train a plan"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  std::string model_name, cluster_spec = "a100-80g:1024", fix, json_path, train_plan, ckpt_dir;
  int64_t batch = 1536, steps = 150;
  int top = 12;
  bool list_published = false, run_calibration = false, no_flash = false, no_sp = false;
  GPTConfig shape = GPTConfig::tiny();
  app.add_option("--model", model_name, "a model by name: " + fmt::format("{}", fmt::join(model_names(), ", ")));
  dtl::add_model_options(app, shape);
  app.add_option("--ff", shape.d_ff, "MLP hidden size (0: 4 x d-model)");
  // What else the catalogue's models set, so a model given by its dimensions prices exactly as
  // the named one (Megatron's models train with dropout 0.1; Llama's are untied, without biases).
  app.add_option("--dropout", shape.dropout, "dropout probability (its masks are activation memory)");
  bool untied = false, no_bias = false;
  app.add_flag("--untied", untied, "an output head of its own (not tied to the embedding)");
  app.add_flag("--no-bias", no_bias, "no biases in the linear layers");
  app.add_option("--cluster", cluster_spec, "NAME:GPUS[,net=GBPS][,per-node=K] (a100-40g, a100-80g, h100-80g)")
      ->capture_default_str();
  app.add_option("--batch", batch, "global batch, sequences per step")->capture_default_str();
  app.add_option("--fix", fix, "evaluate this plan instead of choosing: tp=8,pp=4,dp=32[,cp,zero,ckpt,mb,v,first_layers,last_layers]");
  app.add_option("--json", json_path, "write the plans that fit, best first, to this file");
  app.add_option("--top", top, "rows of the plan table")->capture_default_str();
  app.add_flag("--no-flash-attention", no_flash, "attention stores its T x T scores (2021-era kernels)");
  app.add_flag("--no-sequence-parallel", no_sp, "tensor parallelism replicates LayerNorm regions");
  app.add_flag("--published", list_published, "predicted against published throughput, every run");
  app.add_flag("--calibrate", run_calibration, "fit the three constants to the calibration runs");
  app.add_option("--train", train_plan, "train the model (default tiny) with this plan on the ranks");
  app.add_option("--steps", steps, "training steps (--train)")->capture_default_str();
  app.add_option("--checkpoint", ckpt_dir, "--train: checkpoint and resume in this directory");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    CostModel cost;
    cost.flash_attention = !no_flash;
    cost.sequence_parallel = !no_sp;

    // A model by name, then any shape flag given on top of it.
    GPTConfig cfg = model_name.empty() ? GPTConfig::tiny() : model_by_name(model_name);
    if (app.count("--layers")) cfg.n_layer = shape.n_layer;
    if (app.count("--d-model")) cfg.d_model = shape.d_model;
    if (app.count("--heads")) cfg.n_head = shape.n_head;
    if (app.count("--vocab")) cfg.vocab_size = shape.vocab_size;
    if (app.count("--seq")) cfg.seq_len = shape.seq_len;
    if (app.count("--ff")) cfg.d_ff = shape.d_ff;
    if (app.count("--dropout")) cfg.dropout = shape.dropout;
    if (untied) cfg.tied_head = false;
    if (no_bias) cfg.bias = false;
    cfg.validate();

    if (list_published) {
      published(cost);
      return 0;
    }
    if (run_calibration) {
      const CostModel c = calibrate(calibration_rows(), cost);
      dtl::print0("calibrated on {}: compute_efficiency {:.5f}, memory_passes {:.4f}, "
                  "dp_overlap {:.5f}", fmt::join(calibration_rows(), ", "), c.compute_efficiency,
                  c.memory_passes, c.dp_overlap);
      return 0;
    }
    if (!train_plan.empty()) {
      Plan p = parse_plan(train_plan);
      if (!app.count("--train") || train_plan.find("dp=") == std::string::npos)
        p.dp = std::max(1, rt.world_size() / std::max(1, p.tp * p.pp * p.cp));
      TrainOptions o;
      o.model = cfg;
      o.optim.lr = 2e-2;  // the tiny GPT reaches the corpus's floor in ~150 steps
      o.global_batch = app.count("--batch") ? batch : 16;
      o.steps = steps;
      o.progress_every = std::max<int64_t>(1, steps / 10);
      o.checkpoint_dir = ckpt_dir;
      dtl::print0("training {} with {} on {} rank(s), global batch {}", cfg.to_string(),
                  p.describe(), rt.world_size(), o.global_batch);
      const TrainResult r = train(p, o, rt.world());
      const double floor =
          dtl::data::SyntheticCorpus(cfg.vocab_size, o.data_seed).entropy_rate();
      if (!r.losses.empty())
        dtl::print0("steps {}-{}: loss {:.4f} -> {:.4f} (the corpus's floor {:.4f}), {:.0f} "
                    "tokens/s, MFU {:.2f}% of this machine's measured matmul rate{}",
                    r.first_step, r.first_step + static_cast<int64_t>(r.losses.size()) - 1,
                    r.losses.front(), r.losses.back(), floor, r.tokens_per_s, 100 * r.mfu,
                    r.checkpoint.empty() ? "" : ", checkpoint " + r.checkpoint);
      return 0;
    }

    const Cluster cl = cluster(cluster_spec);
    dtl::print0("model   {} ({:.1f} B parameters)", cfg.to_string(),
                static_cast<double>(params_per_gpu(cfg, Plan{})) / 1e9);
    dtl::print0("cluster {}", cl.describe());
    dtl::print0("batch   {} sequences of {} tokens; attention {}, sequence parallelism {}; "
                "constants eps {:.3f} kappa {:.2f} omega {:.3f}\n",
                batch, cfg.seq_len, cost.flash_attention ? "fused" : "stores its scores",
                cost.sequence_parallel ? "on" : "off", cost.compute_efficiency,
                cost.memory_passes, cost.dp_overlap);
    if (!fix.empty()) {
      Plan p = parse_plan(fix);
      if (fix.find("dp=") == std::string::npos) p.dp = std::max(1, cl.gpus / (p.tp * p.pp * p.cp));
      const Estimate e = estimate(cfg, cl, p, batch, cost);
      dtl::print0("{}", kHeader);
      dtl::print0("{}", row(e, e.fits ? "given" : fmt::format("given; does not fit: {:.1f} GiB > {:.1f} GiB",
                                                              e.memory_gb_per_gpu,
                                                              cost.usable_memory * cl.memory_bytes / kGiB)));
      breakdown(e, cl, cost);
      if (!json_path.empty() && rt.rank() == 0)
        std::ofstream(json_path) << nlohmann::json::array({to_json(e, "given")}).dump(1) << "\n";
      return 0;
    }

    const PlanReport report = plan(cfg, cl, batch, cost);
    int64_t fitting = 0;
    for (const auto& r : report.plans) fitting += r.estimate.fits;
    dtl::print0("{} plans considered, {} fit; the fastest that fits: {:.0f} tokens/s\n",
                report.plans.size(), fitting, report.fastest_tokens_per_s);
    dtl::print0("{}", kHeader);
    for (int i = 0; i < std::min<int>(top, static_cast<int>(fitting)); ++i)
      dtl::print0("{}", row(report.plans[i].estimate, report.plans[i].verdict));
    // Why the simpler structures lost: the best plan of each smaller (tp, cp, pp), fit or not.
    const Plan& chosen = report.chosen().estimate.plan;
    dtl::print0("\nsimpler structures, at their best:");
    std::vector<std::tuple<int, int, int>> shown;
    for (const auto& r : report.plans) {
      const Plan& p = r.estimate.plan;
      if (p.tp * p.cp * p.pp >= chosen.tp * chosen.cp * chosen.pp) continue;
      const auto key = std::make_tuple(p.tp, p.cp, p.pp);
      if (std::find(shown.begin(), shown.end(), key) != shown.end()) continue;
      shown.push_back(key);
      if (shown.size() <= 8) dtl::print0("{}", row(r.estimate, r.verdict));
    }
    if (shown.empty()) dtl::print0("  (none: the chosen plan is as small as a structure gets)");
    breakdown(report.chosen().estimate, cl, cost);
    if (!json_path.empty() && rt.rank() == 0) {
      nlohmann::json plans = nlohmann::json::array();
      for (const auto& r : report.plans)
        if (r.estimate.fits) plans.push_back(to_json(r.estimate, r.verdict));
      std::ofstream(json_path) << plans.dump(1) << "\n";
      dtl::print0("\nwrote {} plans to {}", plans.size(), json_path);
    }
  } catch (const dtl::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
