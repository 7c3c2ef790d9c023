// lab 08 demo: the tensor-parallel MLP against the serial one, what each rank stores, what
// crosses the wire per step (counted vs the formula), and what the same formula says for
// GPT-3 175B.
//
//   ./lab run 08 -n 4                          tp = 4, widths 128, 256, 512
//   ./lab run 08 -n 4 --net nvlink             the same over an emulated NVLink
//   ./lab run 08 -n 4 --net ib-2node           tp across two nodes: watch the step time
//   ./lab run 08 -n 2 -- --tokens 1024         more tokens per step: more bytes per all-reduce
//   ./lab run 08 -n 4 -- --json tp.json        also the serial and sharded shapes as data
//   ./lab run 08 -n 4 -- --help                every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: format_bytes
#include "dtl/model.hpp"    // defines: GPTConfig, MLP, init_parameters
#include "dtl/perf.hpp"     // defines: measure, max_over_ranks
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "tensor_parallel.hpp"

namespace {

// (name, shape) of every parameter of `m`, for the --json file.
nlohmann::json shapes(const torch::nn::Module& m) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : m.named_parameters()) out.push_back({p.key(), p.value().sizes().vec()});
  return out;
}

// Per transformer layer and micro-batch, Megatron's tensor parallelism all-reduces the
// activations [b, s, h] twice in forward (attention out, MLP out) and twice in backward (the
// inputs' gradients): 4 all-reduces of b s h elements, each moving 2 (t-1)/t of its bytes per
// rank on a ring (Narayanan et al. 2021, section 3.2).
void print_real_model_table() {
  struct Row {
    const char* name;
    double h, s, layers;
  };
  const double b = 1, bytes_per = 2, t = 8;  // micro-batch 1, bf16, tp 8 (one DGX node)
  dtl::print0("\n# what the formula says for real models (micro-batch 1, bf16, tp {:.0f}):", t);
  dtl::print0("# {:<16} {:>7} {:>6} {:>16} {:>18} {:>12} {:>12}", "model", "h", "s",
              "per layer (data)", "per layer (wire)", "NVLink 300", "IB 25 GB/s");
  for (const Row& m : {Row{"GPT-3 175B", 12288, 2048, 96}, Row{"Llama-2-7B-like", 4096, 4096, 32}}) {
    const double data = 4 * b * m.s * m.h * bytes_per;     // 4 all-reduces of b s h
    const double wire = data * 2 * (t - 1) / t;            // ring: 2 (t-1)/t per rank
    dtl::print0("  {:<16} {:>7.0f} {:>6.0f} {:>16} {:>18} {:>9.2f} ms {:>9.2f} ms", m.name, m.h,
                m.s, dtl::memory::format_bytes(data), dtl::memory::format_bytes(wire),
                wire / 300e9 * 1e3, wire / 25e9 * 1e3);
  }
  dtl::print0("# per layer per micro-batch; x layers x micro-batches per step. Inside a node the"
              " transfers hide behind");
  dtl::print0("# milliseconds of matmuls per layer; across nodes they do not: tp stays inside"
              " the node.");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 08: tensor-parallel layers, the MLP, and their communication"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  std::vector<int64_t> widths = {128, 256, 512};
  int64_t tokens = 256;
  int iters = 5;
  app.add_option("--widths", widths, "model widths d (the MLP is d -> 4d -> d)")
      ->capture_default_str();
  app.add_option("--tokens", tokens, "tokens per step (batch x sequence)")->capture_default_str();
  app.add_option("--iters", iters, "timed steps per width")->capture_default_str();
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write the first width's serial and rank-0 shapes to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    auto tp = rt.world().dup();  // the demo's tp group: every rank
    const int t = tp->size();
    dtl::print0("# tensor-parallel MLP on tp = {} rank(s), {} tokens per step, network: {}", t,
                tokens, opts.net.empty() ? "none (shared memory)" : opts.net);
    dtl::print0("# {:>6} {:>14} {:>14} {:>10} {:>14} {:>14} {:>12} {:>12}", "d", "weights/rank",
                "serial", "allreduce", "bytes", "formula", "step ms", "max |diff|");
    for (int64_t d : widths) {
      dtl::model::GPTConfig cfg;
      cfg.d_model = d;
      cfg.n_head = 4;
      cfg.validate();
      dtl::model::MLP serial(cfg);
      dtl::model::init_parameters(*serial, cfg, "blocks.0.mlp.");
      serial->to(rt.device());
      dtl::lab08::TensorParallelMLP mlp(serial->fc->weight, serial->fc->bias,
                                        serial->proj->weight, serial->proj->bias, *tp);
      torch::Generator gen = at::detail::createCPUGenerator(8);  // the same x on every rank
      const torch::Tensor x =
          torch::randn({tokens, d}, gen).to(rt.device()).requires_grad_(true);

      const dtl::CommStats before = tp->stats();
      const torch::Tensor y = mlp(x);
      y.sum().backward();
      const dtl::CommStats after = tp->stats();
      const double diff = (y - serial(x)).abs().max().item<double>();

      const auto m = dtl::measure([&] { mlp(x).sum().backward(); }, 1, iters);
      int64_t weights = 0;
      for (const auto& p : mlp->parameters()) weights += p.numel() * p.element_size();
      int64_t serial_weights = 0;
      for (const auto& p : serial->parameters()) serial_weights += p.numel() * p.element_size();
      const int64_t reduces = after[dtl::OpType::AllReduce].count - before[dtl::OpType::AllReduce].count;
      const int64_t bytes = after[dtl::OpType::AllReduce].bytes - before[dtl::OpType::AllReduce].bytes;
      const double formula = t > 1 ? 2.0 * static_cast<double>(tokens * d) * 4 : 0.0;
      dtl::print0("  {:>6} {:>14} {:>14} {:>10} {:>14} {:>14} {:>12.2f} {:>12.2e}", d,
                  dtl::memory::format_bytes(static_cast<double>(weights)),
                  dtl::memory::format_bytes(static_cast<double>(serial_weights)), reduces,
                  dtl::memory::format_bytes(static_cast<double>(bytes)),
                  dtl::memory::format_bytes(formula), m.median * 1e3, dtl::max_over_ranks(diff));
      if (!json_path.empty() && tp->rank() == 0 && d == widths.front())
        std::ofstream(json_path) << nlohmann::json{{"tp", t},
                                                   {"d_model", d},
                                                   {"tokens", tokens},
                                                   {"all_reduces", reduces},
                                                   {"serial", shapes(*serial)},
                                                   {"shard", shapes(*mlp)}}
                                        .dump(1)
                                 << "\n";
    }
    dtl::print0("# allreduce/bytes: counted by Comm::stats() for one forward + backward; formula: "
                "2 all-reduces of tokens x d float32 (0 at tp 1).");
    dtl::print0("# Each rank keeps 1/tp of the weight matrices (the proj bias is whole on every "
                "rank); max |diff| is against the serial MLP.");
    print_real_model_table();
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab 08: %s\n", e.what());
    return 1;
  }
  return 0;
}
