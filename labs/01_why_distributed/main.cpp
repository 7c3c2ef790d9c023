// lab 01 demo: train the course GPT on one process, measure tokens/s and MFU against this
// machine's measured matmul peak, then push the same formulas to GPT-3 and a 7B model.
//
//   ./lab run 01 -n 1                         # 200 steps of the default model
//   ./lab run 01 -n 1 -- --steps 500 --d-model 128 --layers 4 --seq 64
//   ./lab run 01 -n 1 -- --precision          # only the precision experiment (no training)
//
// Lab 01 is single-process. With -n K > 1 every rank trains its own identical replica (no
// communication: that is lab 02) and shares the cores with the others; rank 0 reports.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <numeric>
#include <vector>

#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0, Progress
#include "dtl/memory.hpp"   // defines: format_bytes
#include "dtl/perf.hpp"     // defines: measure_matmul_flops
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "dtl/timer.hpp"    // defines: DeviceTimer
#include "why_distributed.hpp"

namespace {

using dtl::lab01::GPTConfig;

std::string si(double v, const char* unit) {  // 1.23e12 -> "1.23 T<unit>"
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E", "Z", "Y"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 8) v /= 1000, ++i;
  return fmt::format("{:.3g} {}{}", v, prefixes[i], unit);
}

std::string duration(double seconds) {
  if (seconds < 1) return fmt::format("{:.2g} ms", seconds * 1e3);
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 2 * 3600) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{:.1f} h", seconds / 3600);
  if (seconds < 2 * 365 * 86400) return fmt::format("{:.1f} days", seconds / 86400);
  return fmt::format("{:.1f} years", seconds / (365.25 * 86400));
}

// The precision experiment: why mixed-precision training keeps a float32 master copy of the
// weights. Real torch tensors, each op rounding to its dtype as it would on a GPU.
// 1. 0.01 summed 1000 times (exact: 10) in each format, and in a float32 accumulator.
// 2. A LayerNorm gain (initialised to 1.0) updated 1000 times by lr x g with lr = 1e-4 and
//    g in [0.5, 1.5): in bf16 or fp16 in place, or in a float32 master cast to bf16 for use.
void precision_experiment() {
  const int kSteps = 1000;
  auto sum_of_hundredths = [&](torch::Dtype accumulator, torch::Dtype addend) {
    torch::Tensor sum = torch::zeros({}, accumulator);
    const torch::Tensor x = torch::full({}, 0.01, addend);
    for (int i = 0; i < kSteps; ++i) sum += x.to(accumulator);
    return sum.item<double>();
  };
  dtl::print0("Sum of 1000 x 0.01 (exact: 10):");
  const struct {
    const char* what;
    torch::Dtype accumulator, addend;
  } sums[] = {{"float32", torch::kFloat32, torch::kFloat32},
              {"float16", torch::kFloat16, torch::kFloat16},
              {"bfloat16", torch::kBFloat16, torch::kBFloat16},
              {"float16 addends, float32 sum", torch::kFloat32, torch::kFloat16},
              {"bfloat16 addends, float32 sum", torch::kFloat32, torch::kBFloat16}};
  for (const auto& s : sums)
    dtl::print0("  {:<32} {:>10.6f}", s.what, sum_of_hundredths(s.accumulator, s.addend));

  const double kLr = 1e-4;
  torch::manual_seed(0);
  const torch::Tensor g = 0.5 + torch::rand({kSteps, 4096}, torch::kFloat64);  // the updates
  const torch::Tensor exact = 1.0 + kLr * g.sum(0);  // float64: the reference
  torch::Tensor bf16 = torch::ones({4096}, torch::kBFloat16);
  torch::Tensor fp16 = torch::ones({4096}, torch::kFloat16);
  torch::Tensor master = torch::ones({4096}, torch::kFloat32);
  for (int i = 0; i < kSteps; ++i) {
    const torch::Tensor update = kLr * g[i];
    bf16 += update.to(torch::kBFloat16);  // each sum rounded to the weight's format
    fp16 += update.to(torch::kFloat16);
    master += update.to(torch::kFloat32);
  }
  const double moved = (exact - 1.0).mean().item<double>();
  auto row = [&](const char* what, const torch::Tensor& w) {
    const torch::Tensor w64 = w.to(torch::kFloat64);
    const double w_moved = (w64 - 1.0).mean().item<double>();
    dtl::print0("  {:<32} moved {:.6f} ({:5.1f}% of it), max error {:.2e}", what, w_moved,
                100 * w_moved / moved, (w64 - exact).abs().max().item<double>());
  };
  dtl::print0(
      "\n4096 weights at 1.0 (LayerNorm gains), {} updates of lr x g, lr {:g}, g in [0.5, 1.5) "
      "(exact: moved {:.6f}):",
      kSteps, kLr, moved);
  row("bfloat16 weights", bf16);
  row("float16 weights", fp16);
  row("float32 master", master);
  row("its bfloat16 copy (for compute)", master.to(torch::kBFloat16));
  dtl::print0(
      "bf16's 8-bit mantissa spaces the numbers near 1.0 by 2^-7 = 0.0078: an update under half "
      "that rounds away, every step. fp16 (2^-10) loses it too. The float32 master keeps it; its "
      "bf16 copy is within half a bf16 step (0.0039) of the truth.");
}

// The lecture's table: what the same four formulas say about real models.
void print_scaling_table(const GPTConfig& ours, double ours_tokens) {
  // A100 bf16 dense peak (datasheet) and an MFU that good large runs reach.
  const double kPeak = 312e12, kMfu = 0.40, kGpuMemory = 80e9;
  struct Row {
    const char* name;
    GPTConfig cfg;
    double tokens;
  };
  const Row rows[] = {{"GPT-3 175B", GPTConfig::gpt3_175b(), 300e9},
                      {"7B (Llama 2 shapes)", GPTConfig::llama2_7b_like(), 2e12},
                      {"this run's model", ours, ours_tokens}};
  dtl::print0("\nThe same formulas at scale (A100: {} bf16 peak, {:.0f}% MFU, 80 GB):",
              si(kPeak, "FLOP/s"), kMfu * 100);
  dtl::print0("  {:<18} {:>10} {:>13} {:>7} {:>12} {:>9} {:>12} {:>12}", "model", "params",
              "AdamW state*", "GPUs**", "FLOPs/token", "tokens", "on 1 GPU", "on 1024 GPUs");
  for (const Row& r : rows) {
    const auto state = dtl::lab01::training_state_bytes(r.cfg, dtl::lab01::Precision::kMixedBF16,
                                                        dtl::lab01::OptimizerKind::kAdamW);
    const double flops = dtl::lab01::flops_per_token(r.cfg);
    const double one_gpu_s = flops * r.tokens / (kPeak * kMfu);
    const double min_gpus = std::ceil(static_cast<double>(state.total()) / kGpuMemory);
    dtl::print0("  {:<18} {:>10} {:>13} {:>7} {:>12} {:>9} {:>12} {:>12}", r.name,
                si(static_cast<double>(dtl::lab01::param_count(r.cfg)), ""),
                dtl::memory::format_bytes(static_cast<double>(state.total())), min_gpus,
                si(flops, "FLOP"), si(r.tokens, ""), duration(one_gpu_s),
                duration(one_gpu_s / 1024));
  }
  dtl::print0("  * bf16 weights+grads, fp32 master+m+v = 16 B/param, before activations (lab 06)");
  dtl::print0("  ** GPUs whose memory the training state alone fills; the 1024-GPU column");
  dtl::print0("     assumes perfect scaling: labs 02-20 are about what that costs.");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 01: train the course GPT on one process; tokens/s and MFU"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  GPTConfig cfg;
  cfg.vocab_size = 64;
  cfg.seq_len = 32;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.d_model = 64;
  int steps = 200, every = 20, branching = 4;
  int64_t batch = 16;
  std::vector<int64_t> matmul_sizes = {256, 512, 768};
  dtl::OptimConfig optim;
  optim.lr = 1e-2;
  app.add_option("--steps", steps, "training steps")->capture_default_str();
  app.add_option("--batch", batch, "sequences per step")->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "tokens per sequence (model context)")
      ->capture_default_str();
  app.add_option("--vocab", cfg.vocab_size, "vocabulary of the synthetic corpus")
      ->capture_default_str();
  app.add_option("--branching", branching, "successors per token in the corpus (entropy <= ln b)")
      ->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "model width")->capture_default_str();
  app.add_option("--layers", cfg.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--heads", cfg.n_head, "attention heads")->capture_default_str();
  bool untied = false;
  app.add_flag("--untied", untied, "separate lm head instead of the tied token embedding");
  bool precision = false;
  app.add_flag("--precision", precision,
               "only the precision experiment: sums and weight updates in fp32, fp16 and bf16");
  app.add_option("--lr", optim.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--matmul-sizes", matmul_sizes,
                 "square fp32 matmul sizes that measure the peak (the best one counts)")
      ->capture_default_str();
  app.add_option("--every", every, "progress line every N steps (non-terminal output)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  cfg.tied_head = !untied;

  try {
    dtl::Runtime rt(opts, argc, argv);
    if (precision) {
      precision_experiment();
      return 0;
    }
    if (rt.world_size() > 1)
      dtl::print0(
          "note: lab 01 is single-process; each of the {} ranks trains its own replica "
          "on {} intra-op thread(s). Use -n 1 to give one process every core.",
          rt.world_size(), rt.intra_op_threads());

    // ---- what the formulas predict for this model
    dtl::lab01::GPT model(cfg);  // the seeded init on the CPU, then onto the device
    model->to(rt.device());
    const int64_t n_params = dtl::lab01::param_count(cfg);
    const double flops = dtl::lab01::flops_per_token(cfg);
    const auto state = dtl::lab01::training_state_bytes(cfg, dtl::lab01::Precision::kFP32,
                                                        dtl::lab01::OptimizerKind::kAdamW);
    dtl::print0("model: {}", cfg.to_string());
    dtl::print0("  parameters N      {} (model::num_parameters says {})", n_params,
                dtl::model::num_parameters(*model));
    dtl::print0("  FLOPs per token   6N + 12LdT = {:.0f} + {:.0f} = {}", 6.0 * n_params,
                flops - 6.0 * n_params, si(flops, "FLOP"));
    dtl::print0("  training state    {} (fp32 AdamW: weights {}, grads {}, m+v {})",
                dtl::memory::format_bytes(state.total()), dtl::memory::format_bytes(state.params),
                dtl::memory::format_bytes(state.grads), dtl::memory::format_bytes(state.optimizer));

    // ---- the machine: what a dense fp32 matmul reaches with this process's threads
    const double peak = dtl::measure_matmul_flops(matmul_sizes);
    dtl::print0(
        "machine: best fp32 matmul (n = {}) on {} intra-op thread(s): {} (the MFU "
        "denominator)",
        fmt::join(matmul_sizes, ", "), rt.intra_op_threads(), si(peak, "FLOP/s"));

    // ---- the data: a Markov language whose best possible loss is known
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed(), branching);
    dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);
    const double floor = corpus.entropy_rate();
    dtl::print0(
        "data: Markov corpus, vocab {}, branching {}: entropy floor {:.4f} nats/token "
        "(initial loss ~ ln {} = {:.2f})",
        cfg.vocab_size, branching, floor, cfg.vocab_size,
        std::log(static_cast<double>(cfg.vocab_size)));

    // ---- train
    auto optimizer = dtl::make_adamw(*model, optim);
    dtl::Progress progress("train", steps, every);
    std::deque<float> recent;  // the last 10 losses: each on fresh data, so an honest estimate
    double train_seconds = 0;
    const double tokens_per_step = static_cast<double>(batch * cfg.seq_len);
    for (int step = 0; step < steps; ++step) {
      const torch::Tensor tokens = sampler.global_batch_at(step).to(rt.device());  // not timed
      dtl::set_lr(*optimizer, dtl::cosine_lr(optim, step, steps));
      dtl::DeviceTimer t;
      const float loss = dtl::lab01::train_step(model, *optimizer, tokens);
      train_seconds += t.seconds();
      recent.push_back(loss);
      if (recent.size() > 10) recent.pop_front();
      const double tps = tokens_per_step * (step + 1) / train_seconds;
      progress.update(step + 1,
                      fmt::format("loss {:.4f} (floor {:.4f}) | {}/s | MFU {:.1f}%", loss, floor,
                                  si(tps, "tok"), 100 * dtl::lab01::mfu(tps, cfg, peak)));
    }
    const double last = std::accumulate(recent.begin(), recent.end(), 0.0) / recent.size();
    const double tps = tokens_per_step * steps / train_seconds;
    dtl::print0("result: loss {:.4f} (mean of the last {} steps) vs floor {:.4f}: {:+.1f}%", last,
                recent.size(), floor, 100 * (last / floor - 1));
    dtl::print0("        {} steps in {:.2f} s: {}/s, {} achieved, MFU {:.1f}% of the measured peak",
                steps, train_seconds, si(tps, "tok"), si(tps * flops, "FLOP/s"),
                100 * dtl::lab01::mfu(tps, cfg, peak));
    print_scaling_table(cfg, tokens_per_step * steps);
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab01: %s\n", e.what());
    return 1;
  }
  return 0;
}
