// Lab 06 demo: where the memory of a training step goes, predicted (your estimate) and measured
// (the tracking allocator, one AdamW step in float32 on CPU), then the same formulas at scale.
//
//   ./lab run 06                                        the default: 4 layers, d 64, B 8, T 64
//   ./lab run 06 -- --layers 2 --d-model 128 --heads 4 --vocab 512 --batch 4 --seq 128
//   ./lab run 06 -- --json memory.json                 also two steps' memory timeline as data
//
// 1. The breakdown table for the configuration given by the flags, measured over two steps:
//    params and the state after the step are exact, activations + logits and the two peaks
//    (the first step's, and the steady state's of every later step) are estimates.
// 2. A GPT-3 2.7B-like, Llama 2 7B (GPTConfig::llama2_7b_like) and a 70B-like config in bf16 mixed
//    precision with AdamW: state at 16 bytes per parameter, activations per sequence of 4096 at
//    micro-batch 1 (ours next to Korthikanti et al.'s sbh(34 + 5as/h) per layer), both peaks,
//    and whether the steady state fits an 80 GB GPU.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "dtl/error.hpp"
#include "dtl/log.hpp"
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "memory.hpp"

namespace {

using dtl::lab06::GPTConfig;
using dtl::lab06::OptimizerKind;
using dtl::lab06::Precision;

double gb(double bytes) { return bytes / 1e9; }

// Korthikanti et al. 2022, per layer, no parallelism, 16-bit activations and 1-byte dropout
// masks: s b h (34 + 5 a s / h) bytes.
double korthikanti_per_layer(const GPTConfig& c, double s, double b) {
  const double h = double(c.d_model), a = double(c.n_head);
  return s * b * h * (34.0 + 5.0 * a * s / h);
}

void at_scale(const char* label, const GPTConfig& c) {
  const int64_t T = 4096;
  const auto e = dtl::lab06::estimate(c, 1, T, Precision::kMixedBF16, OptimizerKind::kAdamW);
  const int64_t N = dtl::lab06::parameter_count(c);
  const double per_layer =
      double(dtl::lab06::activation_bytes_per_layer(c, 1, T, Precision::kMixedBF16));
  const double kor = korthikanti_per_layer(c, double(T), 1.0);
  const double gpu = 80e9;
  // The steady state decides: a budget between the two peaks runs one step, then fails.
  dtl::print0(
      "{:<12} N = {:.2f}B  state 16 B/param = {:.1f} GB ({:.2f} x 80 GB GPUs just for it)\n"
      "             activations per sequence of {} (micro-batch 1, bf16): ours {:.1f} GB "
      "({:.2f} GB/layer), Korthikanti {:.1f} GB ({:.2f} GB/layer); loss softmax {:.2f} GB\n"
      "             peak: first step {:.1f} GB, every later step {:.1f} GB; fits on one 80 GB "
      "GPU: {}\n",
      label, N / 1e9, gb(double(e.state())), double(e.state()) / gpu, T, gb(double(e.activations)),
      gb(per_layer), gb(kor * double(c.n_layer)), gb(kor), gb(double(e.logits)), gb(double(e.peak)),
      gb(double(e.steady_peak)),
      e.steady_peak <= gpu ? "yes"
      : e.peak <= gpu      ? "no: the first step fits, the second does not"
                           : "no: shard the state (ZeRO/FSDP, lab 14-15) or split the model");
}

// Memory over two steps of a fresh model and AdamW (train_step's calls, with a mark between
// them): the first step creates the gradients and the optimizer state, the second reuses them.
void write_timeline(const std::string& path, const GPTConfig& cfg,
                    const dtl::lab06::Breakdown& predicted, const torch::Tensor& tokens) {
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  dtl::lab06::GPT model(cfg);
  auto optimizer = dtl::make_adamw(*model);
  dtl::memory::record_timeline(true);
  for (int step = 1; step <= 2; ++step) {
    optimizer->zero_grad();
    dtl::memory::timeline_mark("forward");
    torch::Tensor loss = model->loss(tokens);
    dtl::memory::timeline_mark("backward");
    loss.backward();
    dtl::memory::timeline_mark("optimizer");
    optimizer->step();
  }
  dtl::memory::timeline_mark("end");
  dtl::memory::record_timeline(false);
  nlohmann::json samples = nlohmann::json::array(), marks = nlohmann::json::array();
  for (const auto& s : dtl::memory::timeline()) {
    samples.push_back({s.seconds, static_cast<int64_t>(s.bytes) - before});
    if (!s.label.empty()) marks.push_back({s.label, s.seconds});
  }
  const nlohmann::json doc = {{"model", cfg.to_string()},
                              {"batch", tokens.size(0)},
                              {"seq", tokens.size(1) - 1},
                              {"predicted",
                               {{"params", predicted.params},
                                {"grads", predicted.grads},
                                {"optimizer", predicted.optimizer},
                                {"activations", predicted.activations},
                                {"logits", predicted.logits},
                                {"peak", predicted.peak},
                                {"steady_peak", predicted.steady_peak}}},
                              {"samples", samples},
                              {"marks", marks}};  // (seconds, bytes above those before the model)
  std::ofstream(path) << doc.dump() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 06: where LLM training memory goes, predicted and measured"};
  dtl::RuntimeOptions options = dtl::RuntimeOptions::from_env();
  options.add_to(app);
  GPTConfig cfg;
  cfg.n_layer = 4;
  cfg.d_model = 64;
  cfg.n_head = 4;
  cfg.vocab_size = 256;
  cfg.seq_len = 64;
  int64_t batch = 8, seq = 0;
  app.add_option("--layers", cfg.n_layer, "transformer blocks");
  app.add_option("--d-model", cfg.d_model, "model width");
  app.add_option("--heads", cfg.n_head, "attention heads");
  app.add_option("--vocab", cfg.vocab_size, "vocabulary size");
  app.add_option("--batch", batch, "sequences per step");
  app.add_option("--seq", seq, "tokens per sequence (default: the context, 64)");
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write the live bytes over two training steps of a fresh model to this file");
  CLI11_PARSE(app, argc, argv);
  if (seq > 0) cfg.seq_len = seq;
  seq = cfg.seq_len;

  try {
    dtl::Runtime rt(options, argc, argv);
    dtl::print0("{}  batch {} x seq {}\n", cfg.to_string(), batch, seq);
    const auto predicted =
        dtl::lab06::estimate(cfg, batch, seq, Precision::kFP32, OptimizerKind::kAdamW);
    if (dtl::Runtime::get().device().is_cpu()) {
      dtl::memory::install();
      torch::Tensor tokens = torch::randint(cfg.vocab_size, {batch, seq + 1}, torch::kInt64);
      const auto baseline = static_cast<int64_t>(dtl::memory::current_bytes());
      dtl::lab06::GPT model(cfg);
      auto optimizer = dtl::make_adamw(*model);
      const auto m = dtl::lab06::measure_two_steps(model, *optimizer, tokens);
      dtl::print0("{}\n", dtl::lab06::breakdown_table(predicted, &m.first, baseline, &m.second));
      if (!json_path.empty()) write_timeline(json_path, cfg, predicted, tokens);
    } else {
      dtl::print0("{}\n(the tracker counts CPU memory only: nothing measured on this device)\n",
                  dtl::lab06::breakdown_table(predicted));
    }

    GPTConfig l70 = GPTConfig::llama2_7b_like();  // Llama 2 70B's width and depth
    l70.n_layer = 80;
    l70.d_model = 8192;
    l70.n_head = 64;
    l70.d_ff = 0;  // 4 d: GPT-style, no grouped-query attention: 65.0B parameters
    GPTConfig g27 = GPTConfig::gpt3_175b();  // GPT-3 2.7B's width and depth (Brown et al.)
    g27.n_layer = 32;
    g27.d_model = 2560;
    g27.n_head = 32;
    g27.seq_len = 4096;  // its context was 2048: 4096 to compare with the others
    dtl::print0("\nThe same formulas at scale (bf16 mixed precision + AdamW, 80 GB GPUs):\n");
    at_scale("GPT3-2.7B", g27);
    at_scale("Llama2-7B", GPTConfig::llama2_7b_like());
    at_scale("70B-like", l70);
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
