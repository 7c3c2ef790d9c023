// lab 09 demo: a tensor-parallel GPT trained on a dp x tp mesh next to the serial GPT on the
// same global batch, with what each rank stores and what crosses the wire per step on each
// dimension (counted vs Megatron's formula).
//
//   ./lab run 09 -n 4                           tp = 2, dp = 2 (the default mesh on 4 ranks)
//   ./lab run 09 -n 4 -- --tp 4                 tp = 4, dp = 1
//   ./lab run 09 -n 4 --net nvlink -- --tp 4    tp over an emulated NVLink...
//   ./lab run 09 -n 4 --net ib-2node -- --tp 4  ...and across two nodes: watch the step time
//   ./lab run 09 -n 4 -- --json tp.json         also the serial and sharded shapes as data
//   ./lab run 09 -n 4 -- --help                 every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: format_bytes
#include "dtl/mesh.hpp"     // defines: DeviceMesh
#include "dtl/model.hpp"    // defines: GPTConfig, GPT
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/perf.hpp"     // defines: max_over_ranks
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "dtl/timer.hpp"    // defines: DeviceTimer
#include "tp_transformer.hpp"

namespace {

int64_t bytes_of(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel() * p.element_size();
  return n;
}

// (name, shape) of every parameter of `m`, for the --json file.
nlohmann::json shapes(const torch::nn::Module& m) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : m.named_parameters()) out.push_back({p.key(), p.value().sizes().vec()});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 09: a tensor-parallel GPT on a dp x tp mesh, against the serial GPT"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  int tp_size = 0;
  int64_t layers = 4, d = 128, heads = 8, vocab = 512, seq = 64, batch = 8;
  int steps = 6;
  app.add_option("--tp", tp_size,
                 "tensor-parallel size (default: 2 if it divides the world, else 1)");
  app.add_option("--layers", layers, "transformer blocks")->capture_default_str();
  app.add_option("--d-model", d, "model width")->capture_default_str();
  app.add_option("--heads", heads, "attention heads")->capture_default_str();
  app.add_option("--vocab", vocab, "vocabulary size")->capture_default_str();
  app.add_option("--seq", seq, "sequence length")->capture_default_str();
  app.add_option("--batch", batch, "global batch (sequences per step, split over dp)")
      ->capture_default_str();
  app.add_option("--steps", steps, "training steps")->capture_default_str();
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write the serial and rank-0 parameter shapes to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    const int world = rt.world().size();
    if (tp_size == 0) tp_size = world % 2 == 0 ? 2 : 1;
    dtl::DeviceMesh mesh = dtl::DeviceMesh::megatron(rt.world(), tp_size);
    dtl::Comm& tp = mesh.comm("tp");
    dtl::Comm& dp = mesh.comm("dp");
    DTL_CHECK(batch % dp.size() == 0,
              fmt::format("--batch {} is not divisible by dp={}", batch, dp.size()));

    dtl::model::GPTConfig cfg;
    cfg.n_layer = layers;
    cfg.d_model = d;
    cfg.n_head = heads;
    cfg.vocab_size = vocab;
    cfg.seq_len = seq;
    dtl::lab09::check_tp_config(cfg, tp.size());

    // Every rank builds the serial GPT from the seed (the oracle, and the weights to slice);
    // the tensor-parallel model keeps this rank's shards.
    dtl::model::GPT serial(cfg);
    serial->to(rt.device());
    dtl::lab09::TensorParallelGPT gpt(*serial, tp);
    auto opt = dtl::make_adamw(*gpt);
    auto serial_opt = dtl::make_adamw(*serial);
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);
    const int64_t local = batch / dp.size(), first = mesh.coord("dp") * local;

    dtl::print0("# {}: {}", mesh.layout().describe(), cfg.to_string());
    if (!json_path.empty() && rt.rank() == 0)
      std::ofstream(json_path) << nlohmann::json{{"tp", tp.size()},
                                                 {"dp", dp.size()},
                                                 {"layers", layers},
                                                 {"d_model", d},
                                                 {"heads", heads},
                                                 {"vocab", vocab},
                                                 {"serial", shapes(*serial)},
                                                 {"shard", shapes(*gpt)}}
                                      .dump(1)
                               << "\n";
    dtl::print0("# weights per rank {} vs serial {}; network: {}",
                dtl::memory::format_bytes(static_cast<double>(bytes_of(*gpt))),
                dtl::memory::format_bytes(static_cast<double>(bytes_of(*serial))),
                opts.net.empty() ? "none (shared memory)" : opts.net);
    dtl::print0("# {:>4} {:>10} {:>10} {:>10} {:>14} {:>14} {:>10}", "step", "loss", "serial",
                "|diff|", "tp bytes", "dp bytes", "step ms");
    for (int s = 0; s < steps; ++s) {
      const auto tp_before = tp.stats();
      const auto dp_before = dp.stats();
      dtl::DeviceTimer timer;
      opt->zero_grad();
      torch::Tensor loss = gpt->loss(sampler.rows(s, first, first + local).to(rt.device()));
      loss.backward();
      // Data parallelism over the other mesh dimension: each dp rank saw 1/dp of the batch, so
      // the gradient of the global mean is the mean of the ranks' gradients (lab 02), averaged
      // in one flat buffer (one all-reduce, as a DDP bucket would: lab 04).
      if (dp.size() > 1) {
        std::vector<torch::Tensor> grads;
        for (auto& p : gpt->parameters()) grads.push_back(p.grad().view(-1));
        torch::Tensor flat = torch::cat(grads);
        dp.all_reduce(flat, dtl::ReduceOp::Avg);
        int64_t offset = 0;
        for (auto& g : grads) {
          g.copy_(flat.narrow(0, offset, g.numel()));
          offset += g.numel();
        }
      }
      opt->step();
      const double ms = dtl::max_over_ranks(timer.millis());
      const int64_t tp_bytes = tp.stats().total_bytes() - tp_before.total_bytes();
      const int64_t dp_bytes = dp.stats().total_bytes() - dp_before.total_bytes();
      double global_loss = loss.item<double>();
      if (dp.size() > 1) {
        torch::Tensor l = loss.detach().clone();
        dp.all_reduce(l, dtl::ReduceOp::Avg);
        global_loss = l.item<double>();
      }
      // The serial oracle: the whole global batch on one model, on every rank.
      serial_opt->zero_grad();
      torch::Tensor serial_loss = serial->loss(sampler.global_batch_at(s).to(rt.device()));
      serial_loss.backward();
      serial_opt->step();
      dtl::print0("  {:>4} {:>10.5f} {:>10.5f} {:>10.2e} {:>14} {:>14} {:>10.1f}", s, global_loss,
                  serial_loss.item<double>(), std::abs(global_loss - serial_loss.item<double>()),
                  dtl::memory::format_bytes(static_cast<double>(tp_bytes)),
                  dtl::memory::format_bytes(static_cast<double>(dp_bytes)), ms);
    }
    const double act = static_cast<double>(local * cfg.seq_len * cfg.d_model * 4);
    dtl::print0(
        "# tp bytes per step: 2 x (2L + 1) all-reduces of the activations [B/dp, T, d] "
        "float32 = {} (formula) + the loss's per-token numbers; 0 at tp 1.",
        dtl::memory::format_bytes(tp.size() > 1 ? 2 * (2 * layers + 1) * act : 0.0));
    dtl::print0(
        "# dp bytes per step: one all-reduce of this rank's gradient shard = {}; the tp "
        "ranks of a dp group each reduce only their 1/tp.",
        dtl::memory::format_bytes(dp.size() > 1 ? static_cast<double>(bytes_of(*gpt)) : 0.0));
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab 09: %s\n", e.what());
    return 1;
  }
  return 0;
}
