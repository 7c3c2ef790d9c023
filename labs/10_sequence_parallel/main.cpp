// lab 10 demo, in two parts.
//  1. Sequence parallelism: lab 09's tensor-parallel GPT and this lab's sequence-parallel one on
//     the same batch: the same loss, the same wire bytes, and the activations each rank keeps.
//  2. Ring attention: causal attention over growing sequences, whole on one rank vs split over
//     the ranks: time, peak memory per rank, and the bytes sent against the formula.
//
//   ./lab run 10 -n 4                           tp = cp = 4
//   ./lab run 10 -n 2 -- --seq 512              a longer context for part 1
//   ./lab run 10 -n 4 --net nvlink              ring attention's K/V traffic over NVLink
//   ./lab run 10 -n 4 -- --json sp.json         also the chunks and part 2's table as data
//   ./lab run 10 -n 4 -- --help                 every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: install, current_bytes, peak_bytes, format_bytes
#include "dtl/model.hpp"    // defines: GPTConfig, GPT, causal_attention
#include "dtl/perf.hpp"     // defines: max_over_ranks
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "dtl/timer.hpp"    // defines: DeviceTimer
#include "sequence_parallel.hpp"

namespace {

std::string mib(double bytes) { return dtl::memory::format_bytes(bytes); }

// Bytes alive after `forward` above those before (its graph and output), and its loss.
template <typename Fn>
std::pair<double, double> kept_by(Fn&& forward) {
  const auto before = static_cast<double>(dtl::memory::current_bytes());
  torch::Tensor loss = forward();
  const double kept = static_cast<double>(dtl::memory::current_bytes()) - before;
  loss.backward();
  return {kept, loss.item<double>()};
}

void sequence_parallel_part(dtl::Comm& tp, const dtl::model::GPTConfig& cfg, int64_t batch) {
  dtl::model::GPT serial(cfg);
  serial->to(dtl::Runtime::get().device());
  torch::Generator gen = at::detail::createCPUGenerator(3);  // the same batch on every rank
  const torch::Tensor tokens =
      torch::randint(cfg.vocab_size, {batch, cfg.seq_len + 1}, gen, torch::kInt64)
          .to(dtl::Runtime::get().device());
  dtl::lab09::TensorParallelGPT tpgpt(*serial, tp);
  dtl::lab10::SequenceParallelGPT spgpt(*serial, tp);
  const double serial_loss = serial->loss(tokens).item<double>();

  auto before = tp.stats();
  const auto [kept_tp, loss_tp] = kept_by([&] { return tpgpt->loss(tokens); });
  const double wire_tp = tp.stats().total_wire_bytes() - before.total_wire_bytes();
  before = tp.stats();
  const auto [kept_sp, loss_sp] = kept_by([&] { return spgpt->loss(tokens); });
  dtl::lab10::sync_sequence_parallel_grads(*spgpt, tp);
  const double wire_sp = tp.stats().total_wire_bytes() - before.total_wire_bytes();

  dtl::print0("# part 1: {} on tp = {}, batch {} x {} tokens", cfg.to_string(), tp.size(), batch,
              cfg.seq_len);
  dtl::print0("# {:<26} {:>12} {:>18} {:>18}", "model", "loss - serial", "activations kept",
              "wire bytes/step");
  dtl::print0("  {:<26} {:>12.2e} {:>18} {:>18}", "tensor parallel (lab 09)", loss_tp - serial_loss,
              mib(dtl::max_over_ranks(kept_tp)), mib(wire_tp));
  dtl::print0("  {:<26} {:>12.2e} {:>18} {:>18}", "+ sequence parallel", loss_sp - serial_loss,
              mib(dtl::max_over_ranks(kept_sp)), mib(wire_sp));
  const double stream = static_cast<double>(batch * cfg.seq_len * cfg.d_model * 4);
  dtl::print0(
      "# the LayerNorm inputs alone: 2 x {} per block x {} blocks at tp 1; sequence "
      "parallelism keeps 1/{} of them.",
      mib(stream), cfg.n_layer, tp.size());
  dtl::print0(
      "# wire bytes: the same, plus one small all-reduce of the LayerNorm/bias/position "
      "gradients (sync_sequence_parallel_grads).\n");
}

void ring_attention_part(dtl::Comm& cp, const std::vector<int64_t>& lengths,
                         nlohmann::json& table) {
  const torch::Device device = dtl::Runtime::get().device();
  const int64_t heads = 4, dh = 32;
  dtl::print0(
      "# part 2: causal attention, 1 x {} heads x {} dims, forward + backward; ring on "
      "cp = {}",
      heads, dh, cp.size());
  dtl::print0("# {:>6} {:>12} {:>14} {:>12} {:>14} {:>14} {:>14} {:>10}", "T", "full ms",
              "full peak", "ring ms", "ring peak", "sent/rank", "formula", "max|diff|");
  for (int64_t t : lengths) {
    if (t % cp.size() != 0) continue;
    torch::Generator gen = at::detail::createCPUGenerator(5);
    std::vector<torch::Tensor> full;
    for (int i = 0; i < 3; ++i)
      full.push_back(torch::randn({1, heads, t, dh}, gen).to(device).requires_grad_(true));
    // Whole, on every rank (what each rank would do without context parallelism).
    auto before = static_cast<double>(dtl::memory::current_bytes());
    dtl::memory::reset_peak();
    dtl::DeviceTimer timer;
    const torch::Tensor ref = dtl::model::causal_attention(full[0], full[1], full[2], 0.0, false);
    ref.sum().backward();
    const double full_ms = dtl::max_over_ranks(timer.millis());
    const double full_peak = static_cast<double>(dtl::memory::peak_bytes()) - before;
    // Split: my chunk of q, k, v.
    std::vector<torch::Tensor> mine;
    for (auto& x : full)
      mine.push_back(dtl::lab10::sequence_chunk(x.detach(), 2, cp).clone().requires_grad_(true));
    const auto stats = cp.stats();
    before = static_cast<double>(dtl::memory::current_bytes());
    dtl::memory::reset_peak();
    timer.reset();
    const torch::Tensor out = dtl::lab10::ring_attention(mine[0], mine[1], mine[2], cp);
    out.sum().backward();
    const double ring_ms = dtl::max_over_ranks(timer.millis());
    const double ring_peak =
        dtl::max_over_ranks(static_cast<double>(dtl::memory::peak_bytes()) - before);
    const auto sent = static_cast<double>(cp.stats()[dtl::OpType::SendRecv].bytes -
                                          stats[dtl::OpType::SendRecv].bytes);
    const dtl::lab10::RingBytes formula =
        dtl::lab10::ring_attention_bytes(mine[0].numel(), 4, cp.size());
    const double diff =
        (out - dtl::lab10::sequence_chunk(ref.detach(), 2, cp)).abs().max().item<double>();
    table.push_back({{"T", t},
                     {"full_ms", full_ms},
                     {"full_peak", full_peak},
                     {"ring_ms", ring_ms},
                     {"ring_peak", ring_peak},
                     {"sent", sent}});
    dtl::print0("  {:>6} {:>12.1f} {:>14} {:>12.1f} {:>14} {:>14} {:>14} {:>10.1e}", t, full_ms,
                mib(full_peak), ring_ms, mib(ring_peak), mib(sent),
                mib(static_cast<double>(formula.forward + formula.backward)),
                dtl::max_over_ranks(diff));
  }
  dtl::print0(
      "# full attention keeps [T, T] scores and probabilities per head: memory ~ T^2; a "
      "ring rank holds [T/cp, T/cp] blocks,");
  dtl::print0(
      "# its K/V chunk and the one in flight: ~ (T/cp)^2 + T/cp. Causal chunks are "
      "unequal work: rank cp-1 computes cp blocks, rank 0 one.");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 10: sequence parallelism and ring attention"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  int64_t layers = 4, d = 128, heads = 8, vocab = 512, seq = 256, batch = 4;
  std::vector<int64_t> lengths = {512, 1024, 2048, 4096};
  app.add_option("--layers", layers, "part 1: transformer blocks")->capture_default_str();
  app.add_option("--d-model", d, "part 1: model width")->capture_default_str();
  app.add_option("--heads", heads, "part 1: attention heads")->capture_default_str();
  app.add_option("--vocab", vocab, "part 1: vocabulary size")->capture_default_str();
  app.add_option("--seq", seq, "part 1: sequence length")->capture_default_str();
  app.add_option("--batch", batch, "part 1: sequences per step")->capture_default_str();
  app.add_option("--lengths", lengths, "part 2: sequence lengths")->capture_default_str();
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write each rank's sequence chunk and part 2's table to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    dtl::memory::install();
    auto comm = rt.world().dup();  // tp for part 1, cp for part 2: every rank
    dtl::model::GPTConfig cfg;
    cfg.n_layer = layers;
    cfg.d_model = d;
    cfg.n_head = heads;
    cfg.vocab_size = vocab;
    cfg.seq_len = seq;
    DTL_CHECK(seq % comm->size() == 0,
              fmt::format("--seq {} is not divisible by the {} ranks (sequence length)", seq,
                          comm->size()));
    sequence_parallel_part(*comm, cfg, batch);
    nlohmann::json ring = nlohmann::json::array();
    ring_attention_part(*comm, lengths, ring);
    if (!json_path.empty()) {
      // Which positions each rank holds: sequence_chunk of [0, 1, ..., T-1], gathered.
      const torch::Tensor mine = dtl::lab10::sequence_chunk(
          torch::arange(seq, torch::kInt64).unsqueeze(0).to(rt.device()), 1, *comm);
      const torch::Tensor ends = torch::stack({mine.min(), mine.max()}).view({1, 2});
      const torch::Tensor gathered = torch::empty({comm->size(), 2}, ends.options());
      comm->all_gather(gathered, ends);
      const torch::Tensor chunks = gathered.cpu();
      nlohmann::json doc = {{"ranks", comm->size()},
                            {"seq", seq},
                            {"d_model", d},
                            {"layers", layers},
                            {"batch", batch},
                            {"ring_attention", ring},
                            {"chunks", nlohmann::json::array()}};
      for (int r = 0; r < comm->size(); ++r)
        doc["chunks"].push_back({chunks[r][0].item<int64_t>(), chunks[r][1].item<int64_t>() + 1});
      if (comm->rank() == 0) std::ofstream(json_path) << doc.dump(1) << "\n";
    }
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab 10: %s\n", e.what());
    return 1;
  }
  return 0;
}
