// Lab 13 demo: what checkpointing saves and what it costs, predicted (your formulas) and
// measured (the tracking allocator, the clock), then the same trade at the scale of GPT-3.
//
//   ./lab run 13                                       4 blocks, d 128, T 128, batch 8
//   ./lab run 13 -- --seq 256 --batch 4                the T^2 term grows: selective wins more
//   ./lab run 13 -- --budget-mib 20                    which plan fits 20 MiB of activations?
//   ./lab run 13 -- --json memory.json                 also each policy's memory timeline as data
//   ./lab run 13 -- --help                             every flag
//
// 1. For each policy: activations kept at the end of forward and the step's peak, predicted and
//    measured; the step time (forward + backward) and its overhead over no checkpointing in
//    units of one forward: (t_policy - t_none) / t_forward; a check that the gradients are
//    bitwise those of model->loss.
// 2. The chooser for --budget-mib.
// 3. Korthikanti et al.'s per-layer formula at scale (16-bit activations, 1-byte masks).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpointing.hpp"
#include "demo_config.hpp"  // defines: demo::demo_config, demo::flat_grads
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: memory::install, current_bytes, peak_bytes, format_bytes
#include "dtl/perf.hpp"     // defines: measure
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions

namespace {

using dtl::lab13::GPT;
using dtl::lab13::GPTConfig;
using dtl::lab13::Policy;
using dtl::lab13::demo::flat_grads;

std::string mib(double bytes) { return fmt::format("{:.2f}", bytes / (1 << 20)); }

// Korthikanti et al. 2022, bytes of activations per layer with 16-bit activations and 1-byte
// dropout masks, no tensor parallelism: s b h (34 + 5 a s / h) without recomputation, 34 s b h
// with selective recomputation, 2 s b h (the layer's input) with full recomputation.
double korthikanti_per_layer(double s, double b, double h, double a, Policy p) {
  switch (p) {
    case Policy::kNone:
      return s * b * h * (34.0 + 5.0 * a * s / h);
    case Policy::kSelective:
      return 34.0 * s * b * h;
    case Policy::kFull:
      return 2.0 * s * b * h;
  }
  return 0.0;
}

void at_scale(const char* label, double layers, double s, double h, double a) {
  dtl::print0("{} (L {}, h {}, a {}, s {}, micro-batch 1):", label, layers, h, a, s);
  for (Policy p : {Policy::kNone, Policy::kSelective, Policy::kFull}) {
    const double layer = korthikanti_per_layer(s, 1, h, a, p);
    dtl::print0("  {:<10} {:8.2f} GB per layer {:9.1f} GB for all layers", to_string(p),
                layer / 1e9, layer * layers / 1e9);
  }
  // Forward FLOPs per layer and token: 24 h^2 (the projections, MLP 4h) + 4 s h (the core).
  const double core = 4.0 * s * h, layer = 24.0 * h * h + core;
  dtl::print0(
      "  recompute: selective {:.1f}% of a forward ({:.1f}% of a step); full one forward "
      "(33% of a step)",
      100.0 * core / layer, 100.0 * core / (3.0 * layer));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 13: activation checkpointing, predicted and measured"};
  dtl::RuntimeOptions options = dtl::RuntimeOptions::from_env();
  options.add_to(app);
  GPTConfig cfg = dtl::lab13::demo::demo_config();
  int64_t batch = 8, seq = 0;
  int iters = 5;
  double budget_mib = 0;
  app.add_option("--layers", cfg.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "model width")->capture_default_str();
  app.add_option("--heads", cfg.n_head, "attention heads")->capture_default_str();
  app.add_option("--vocab", cfg.vocab_size, "vocabulary size")->capture_default_str();
  app.add_option("--dropout", cfg.dropout, "dropout probability")->capture_default_str();
  app.add_option("--batch", batch, "sequences per step")->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence (default: the context, 128)");
  app.add_option("--iters", iters, "timed steps per policy")->capture_default_str();
  app.add_option("--budget-mib", budget_mib, "activation budget for the chooser (MiB)");
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write each policy's live bytes over its step to this file");
  CLI11_PARSE(app, argc, argv);
  if (seq > 0) cfg.seq_len = seq;
  seq = cfg.seq_len;

  try {
    dtl::Runtime rt(options, argc, argv);
    dtl::memory::install();
    const bool cpu = rt.device().is_cpu();
    torch::Tensor tokens =
        torch::randint(cfg.vocab_size, {batch, seq + 1}, torch::kInt64).to(rt.device());
    GPT model(cfg);
    model->to(rt.device());
    model->train();
    for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
    auto zero_grads = [&] {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.mutable_grad().zero_();
    };
    dtl::print0("model {}, batch {} x seq {}, {} on {}", cfg.to_string(), batch, seq, "float32",
                rt.device().str());

    // The ground truth of every policy: plain model->loss with the same dropout seed.
    torch::manual_seed(99);
    model->loss(tokens).backward();
    const torch::Tensor want = flat_grads(model).clone();
    const double t_forward = dtl::measure([&] { model->loss(tokens); }, 1, iters).median;

    dtl::print0("\n{:<10} {:>11} {:>11} {:>11} {:>11} {:>9} {:>16} {:>9}", "policy", "kept pred",
                "kept meas", "peak pred", "peak meas", "step ms", "extra / forward", "grads");
    double t_none = 0;
    nlohmann::json doc = {{"model", cfg.to_string()},
                          {"batch", batch},
                          {"seq", seq},
                          {"policies", nlohmann::json::array()}};
    for (Policy p : {Policy::kNone, Policy::kSelective, Policy::kFull}) {
      const auto am = dtl::lab13::activation_memory(cfg, batch, seq, p);
      zero_grads();
      torch::manual_seed(99);
      const auto before = double(dtl::memory::current_bytes());
      dtl::memory::reset_peak();
      if (!json_path.empty()) dtl::memory::record_timeline(true);
      torch::Tensor loss = dtl::lab13::gpt_loss(model, tokens, p);
      const double kept = double(dtl::memory::current_bytes()) - before;
      dtl::memory::timeline_mark("backward");
      loss.backward();
      dtl::memory::timeline_mark("end");
      const double peak = double(dtl::memory::peak_bytes()) - before;
      if (!json_path.empty()) {
        dtl::memory::record_timeline(false);
        nlohmann::json samples = nlohmann::json::array(), marks = nlohmann::json::array();
        for (const auto& s : dtl::memory::timeline()) {  // (seconds, bytes above `before`)
          samples.push_back({s.seconds, double(s.bytes) - before});
          if (!s.label.empty()) marks.push_back({s.label, s.seconds});
        }
        doc["policies"].push_back({{"name", to_string(p)},
                                   {"predicted_kept", am.saved},
                                   {"predicted_peak", am.peak},
                                   {"kept", kept},
                                   {"peak", peak},
                                   {"samples", samples},
                                   {"marks", marks}});
      }
      const bool same = torch::equal(flat_grads(model), want);
      const double t = dtl::measure(
                           [&] {
                             zero_grads();
                             dtl::lab13::gpt_loss(model, tokens, p).backward();
                           },
                           1, iters)
                           .median;
      if (p == Policy::kNone) t_none = t;
      dtl::print0("{:<10} {:>11} {:>11} {:>11} {:>11} {:>9.1f} {:>16.2f} {:>9}", to_string(p),
                  mib(double(am.saved)), cpu ? mib(kept) : "-", mib(double(am.peak)),
                  cpu ? mib(peak) : "-", t * 1e3, (t - t_none) / t_forward,
                  same ? "bitwise" : "DIFFER");
    }
    dtl::print0("(MiB; forward alone {:.1f} ms; medians of {} steps)", t_forward * 1e3, iters);
    if (!json_path.empty()) std::ofstream(json_path) << doc.dump() << "\n";

    if (budget_mib > 0) {
      const auto budget = static_cast<int64_t>(budget_mib * (1 << 20));
      try {
        const auto plan = dtl::lab13::choose_checkpointing(cfg, batch, seq, budget);
        dtl::print0("\nbudget {} MiB: {} (peak {} MiB, recompute {:.2f} GFLOP per step)",
                    budget_mib, to_string(plan.policy), mib(double(plan.peak_bytes)),
                    plan.recompute_flops / 1e9);
      } catch (const dtl::Error& e) {
        dtl::print0("\nbudget {} MiB: {}", budget_mib, e.what());
      }
    }

    dtl::print0("\nAt scale, Korthikanti et al.'s count (bf16 activations, 1-byte masks):");
    at_scale("GPT-3 175B", 96, 2048, 12288, 96);
    at_scale("Llama 2 70B-like (MHA, 4h MLP)", 80, 4096, 8192, 64);
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab 13: %s\n", e.what());
    return 1;
  }
  return 0;
}
