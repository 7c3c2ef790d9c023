// Lab 07 demo: what the topology does to an all-reduce, measured and predicted.
//
//   ./lab run 07 -n 4 --net eth-2node                 two emulated nodes over 25 GbE (~50 s)
//   ./lab run 07 -n 4 --net ib-2node                  the same over HDR InfiniBand
//   ./lab run 07 -n 4 --net eth-2node -- --max-bytes 64M
//   ./lab run 07 -n 4 --net "intra=20GB/s,10us;inter=25GB/s,10us;ranks_per_node=2;time_scale=1000"
//   ./lab run 07 -n 4 --net eth-2node -- --json topo.json   also the table as data (./lab figures)
//
// 1. Fits alpha and beta of each link class from measured point-to-point transfers (your
//    fit_alpha_beta over measure_link): ranks 0 -> 1 inside a node, 0 -> k across nodes.
// 2. An nccl-tests style table, 1 KiB to 16 MiB by default: the flat ring (the built-in
//    Comm::all_reduce) and your hierarchical all-reduce, with time, algbw and busbw (your
//    bus_bandwidth), #wrong (elements that differ from the flat ring's result on random data),
//    the speedup, what your chooser picks from the fitted links, and which one was faster.
// 3. The crossover size of the two models, from the fitted links.
//
// time = median over iterations of the slowest rank, as measured (emulated time, under --net).
// algbw and busbw are in the HARDWARE's time: under a preset's time_scale=1000 every emulated
// duration is 1000x the real link's, so the table multiplies bandwidths back by 1000 and a
// busbw reads like a datasheet (25 GbE: 3.1 GB/s). The fitted links are printed both ways.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/log.hpp"
#include "dtl/net.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "topology.hpp"

namespace {

using dtl::lab07::AllReduceAlgorithm;
using dtl::lab07::LinkModel;
using dtl::lab07::Topology;

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  return fmt::format(u == 0 ? "{:.0f} {}" : "{:.3g} {}", b, unit[u]);
}

// Elements of `got` that differ from `expected` (float sums: beyond a relative 1e-5).
int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected) {
  auto g = got.to(torch::kFloat64), e = expected.to(torch::kFloat64);
  return (g - e).abs().gt(1e-5 * (e.abs() + 1.0)).sum().item<int64_t>();
}

// Times `run` on `data` once (the probe, also the correctness run), then on `zeros` as many
// more times as fit in `budget` seconds (at most 19): the probe's time is the slowest rank's,
// the same on every rank, so every rank agrees on the count.
dtl::Measurement time_cell(const std::function<void(const torch::Tensor&)>& run,
                           const torch::Tensor& data, const torch::Tensor& zeros, double budget) {
  dtl::Measurement probe = dtl::measure([&] { run(data); }, 0, 1);
  const int more = static_cast<int>(std::min(19.0, std::floor(budget / probe.median)));
  if (more <= 0) return probe;
  dtl::Measurement rest = dtl::measure([&] { run(zeros); }, 0, more);
  rest.seconds.insert(rest.seconds.end(), probe.seconds.begin(), probe.seconds.end());
  rest.median = dtl::median(rest.seconds);
  return rest;
}

// The bandwidths of a row, with your bus_bandwidth (dtl::bus_factor until it is written).
dtl::lab07::Bandwidth bandwidth(double bytes, double seconds, int n, bool& have_task1) {
  if (have_task1) {
    try {
      return dtl::lab07::bus_bandwidth(dtl::OpType::AllReduce, bytes, seconds, n);
    } catch (const dtl::NotImplemented&) {
      have_task1 = false;
    }
  }
  const double algbw = bytes / seconds;
  return {algbw, algbw * dtl::bus_factor(dtl::OpType::AllReduce, n)};
}

// The link from src to dst, fitted with your fit_alpha_beta; nullopt before Task 2.
std::optional<LinkModel> fit_link(dtl::Comm& comm, int src, int dst, const char* name,
                                  const std::optional<LinkModel>& configured, double scale) {
  const std::vector<int64_t> sizes = {4 << 10, 64 << 10, 256 << 10, 1 << 20};
  const auto samples = dtl::lab07::measure_link(comm, src, dst, sizes);
  try {
    const LinkModel fit = dtl::lab07::fit_alpha_beta(samples);
    std::string line = fmt::format("#   {:<10} ranks {} -> {}: alpha {:9.3f} ms, beta {:9.3f} MB/s",
                                   name, src, dst, fit.alpha * 1e3, fit.beta / 1e6);
    if (configured)
      line += fmt::format("   (emulator: {:.3f} ms, {:.3f} MB/s; hardware at x{:g}: {:.3g} us, "
                          "{:.3g} GB/s)",
                          configured->alpha * 1e3, configured->beta / 1e6, scale,
                          fit.alpha / scale * 1e6, fit.beta * scale / 1e9);
    dtl::print0("{}", line);
    return fit;
  } catch (const dtl::NotImplemented&) {
    dtl::print0("#   {}: implement fit_alpha_beta (Task 2) to see the fitted link", name);
  } catch (const dtl::Error& e) {
    dtl::print0("#   {}: fit failed: {}", name, e.what());
  }
  return std::nullopt;
}

// The sizes where the chooser's pick changes, scanning 1 B .. 100 GB in 2% steps.
std::string crossovers(const Topology& topo) {
  std::string out;
  AllReduceAlgorithm prev = dtl::lab07::choose_algorithm(topo, 1);
  for (double S = 1; S <= 1e11; S *= 1.02) {
    const AllReduceAlgorithm now = dtl::lab07::choose_algorithm(topo, S);
    if (now != prev)
      out += fmt::format("{}{} wins from ~{}", out.empty() ? "" : "; ", to_string(now),
                         human_bytes(S));
    prev = now;
  }
  if (out.empty())
    return fmt::format("none: {} wins at every size from 1 B to 100 GB",
                       to_string(dtl::lab07::choose_algorithm(topo, 1)));
  return fmt::format("{} below, then {}", to_string(dtl::lab07::choose_algorithm(topo, 1)), out);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 07: flat ring vs hierarchical all-reduce on an (emulated) two-node cluster"};
  dtl::RuntimeOptions options = dtl::RuntimeOptions::from_env();
  options.add_to(app);
  int64_t min_bytes = 1 << 10, max_bytes = 16 << 20;
  int ranks_per_node = 0;
  double budget = 1.0;
  app.add_option("--min-bytes", min_bytes, "smallest message, e.g. 1K (default 1K)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-bytes", max_bytes, "largest message, e.g. 64M (default 16M); x4 steps")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--ranks-per-node", ranks_per_node,
                 "ranks per node of the hierarchy (default: the emulator's; without --net 2)");
  app.add_option("--budget", budget, "seconds of timing per cell after the first run (default 1)");
  std::string json_path;
  app.add_option("--json", json_path, "also write the table (sizes, times, busbw) to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(options, argc, argv);
    auto comm = rt.world().dup();  // the demo's own Comm
    const int n = comm->size();
    const auto& spec = dtl::net::current();
    const double scale = spec.enabled ? spec.time_scale : 1.0;
    const Topology emulated = dtl::lab07::emulated_topology(n);
    int k = ranks_per_node;
    if (k <= 0) k = spec.enabled ? emulated.ranks_per_node : (n % 2 == 0 ? 2 : n);
    if (n % k != 0) {
      dtl::print0("lab 07 demo: {} ranks do not make equal nodes of {} ranks; run with -n {} or "
                  "pass -- --ranks-per-node K with K dividing {}",
                  n, k, 2 * k, n);
      return 1;
    }
    const int m = n / k;

    dtl::print0("# lab 07 topology: {} ranks = {} node(s) x {} ranks per node, {} backend, float32 "
                "sum, in place",
                n, m, k, comm->backend());
    dtl::print0("# network: {}", spec.describe());
    if (spec.enabled && emulated.ranks_per_node != k)
      dtl::print0("# note: the emulator puts {} ranks on a node, the hierarchy assumes {}",
                  emulated.ranks_per_node, k);

    // ---- 1. the links, measured and fitted
    Topology fitted{{}, {}, k, m};
    bool have_fit = n > 1;
    if (n > 1) {
      dtl::print0("#\n# links (point-to-point sends of 4 KiB-1 MiB, fastest of 5, least squares):");
      if (k > 1) {
        auto f = fit_link(*comm, 0, 1, "intra-node",
                          spec.enabled ? std::optional(emulated.intra) : std::nullopt, scale);
        have_fit = have_fit && f.has_value();
        if (f) fitted.intra = *f;
      }
      if (m > 1) {
        auto f = fit_link(*comm, 0, k, "inter-node",
                          spec.enabled ? std::optional(emulated.inter) : std::nullopt, scale);
        have_fit = have_fit && f.has_value();
        if (f) fitted.inter = *f;
      }
    }

    // ---- 2. the table
    bool have_hier = true, have_task1 = true, have_chooser = have_fit;
    try {
      dtl::lab07::hierarchical_all_reduce(*comm, k, torch::zeros({1}, torch::TensorOptions().device(rt.device())));  // builds the hierarchy
    } catch (const dtl::NotImplemented&) {
      have_hier = false;
    }
    dtl::print0("#\n# time: median of the slowest rank ({}); algbw, busbw: GB/s in the "
                "hardware's time{}; busbw = algbw x 2(n-1)/n",
                spec.enabled ? "emulated time" : "wall clock",
                scale != 1 ? fmt::format(" (x{:g})", scale) : std::string());
    dtl::print0("# {:>10} {:>10}  {:^30}  {:^38}  {:>7}  {:>12}  {:>12}", "", "",
                "flat ring (Comm::all_reduce)", "hierarchical (yours)", "", "chooser", "measured");
    dtl::print0("# {:>10} {:>10}  {:>12} {:>8} {:>8}  {:>12} {:>8} {:>8} {:>7}  {:>7}  {:>12}  {:>12}",
                "size", "count", "time", "algbw", "busbw", "time", "algbw", "busbw", "#wrong",
                "speedup", "pick", "winner");
    dtl::print0("# {:>10} {:>10}  {:>12} {:>8} {:>8}  {:>12} {:>8} {:>8} {:>7}  {:>7}", "(B)",
                "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "(GB/s)", "", "");
    DTL_CHECK(min_bytes >= 4 && min_bytes <= max_bytes,
              fmt::format("--min-bytes {} must be >= 4 and <= --max-bytes {}", min_bytes, max_bytes));
    int64_t wrong_total = 0;
    int agreed = 0, rows = 0, ties = 0;
    nlohmann::json doc = {{"ranks", n},          {"nodes", m},
                          {"ranks_per_node", k}, {"network", spec.describe()},
                          {"time_scale", scale}, {"rows", nlohmann::json::array()}};
    std::string at_16m;
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const int64_t count = bytes / 4;
      // Differs per rank (seed + rank); drawn on the CPU, moved to the Runtime's device.
      const torch::Tensor input = torch::randn({count}).to(rt.device());
      const torch::Tensor zeros = torch::zeros({count}, input.options());
      torch::Tensor flat_out = input.clone();
      const auto flat = time_cell([&](const torch::Tensor& t) { comm->all_reduce(t); }, flat_out,
                                  zeros, budget);
      const auto fb = bandwidth(bytes, flat.median / scale, n, have_task1);
      std::string row = fmt::format("  {:>10} {:>10}  {:>12.1f} {:>8.3f} {:>8.3f}", bytes, count,
                                    flat.median * 1e6, fb.algbw / 1e9, fb.busbw / 1e9);
      // Seconds as measured (emulated time under --net), busbw in the hardware's time.
      nlohmann::json entry = {
          {"bytes", bytes}, {"flat_seconds", flat.median}, {"flat_busbw", fb.busbw}};
      if (have_hier) {
        torch::Tensor hier_out = input.clone();
        const auto hier = time_cell(
            [&](const torch::Tensor& t) { dtl::lab07::hierarchical_all_reduce(*comm, k, t); },
            hier_out, zeros, budget);
        const auto hb = bandwidth(bytes, hier.median / scale, n, have_task1);
        const auto wrong = static_cast<int64_t>(
            dtl::sum_over_ranks(static_cast<double>(count_wrong(hier_out, flat_out))));
        wrong_total += wrong;
        // Within 2% is a tie: the machine's noise, not a winner.
        const bool hier_won = hier.median < flat.median;
        const bool tie = std::abs(hier.median / flat.median - 1) < 0.02;
        std::string pick = "-";
        if (have_chooser) {
          try {
            const auto choice = dtl::lab07::choose_algorithm(fitted, static_cast<double>(bytes));
            pick = to_string(choice);
            if (!tie) agreed += (choice == AllReduceAlgorithm::Hierarchical) == hier_won;
          } catch (const dtl::NotImplemented&) {
            have_chooser = false;
          }
        }
        ties += tie;
        ++rows;
        row += fmt::format("  {:>12.1f} {:>8.3f} {:>8.3f} {:>7}  {:>6.2f}x  {:>12}  {:>12}",
                           hier.median * 1e6, hb.algbw / 1e9, hb.busbw / 1e9, wrong,
                           flat.median / hier.median, pick,
                           tie ? "tie" : hier_won ? "hierarchical" : "flat ring");
        entry["hierarchical_seconds"] = hier.median;
        entry["hierarchical_busbw"] = hb.busbw;
        if (bytes == (16 << 20))
          at_16m = fmt::format("{:.2f}x ({:.1f} ms flat, {:.1f} ms hierarchical)",
                               flat.median / hier.median, flat.median * 1e3, hier.median * 1e3);
      } else {
        row += fmt::format("  {:^38}", "not implemented (Task 3)");
      }
      dtl::print0("{}", row);
      doc["rows"].push_back(entry);
    }
    if (!json_path.empty() && comm->rank() == 0) std::ofstream(json_path) << doc.dump(1) << "\n";

    // ---- 3. footer: correctness, the models' crossover, agreement with the measurement
    if (have_hier) dtl::print0("# Wrong elements: {} {}", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
    if (!have_task1) dtl::print0("# (algbw/busbw from dtl::bus_factor: implement bus_bandwidth, Task 1)");
    if (!at_16m.empty()) dtl::print0("# hierarchical speedup at 16 MiB: {}", at_16m);
    try {
      if (have_fit) dtl::print0("# crossover, models on the fitted links: {}", crossovers(fitted));
      if (spec.enabled && emulated.world() == n && emulated.ranks_per_node == k)
        dtl::print0("# crossover, models on the emulator's links:  {}", crossovers(emulated));
      if (have_chooser && rows > 0)
        dtl::print0("# chooser (fitted links) agreed with the measured winner on {} of {} sizes "
                    "({} ties within 2% left out)",
                    agreed, rows - ties, ties);
    } catch (const dtl::NotImplemented&) {
      dtl::print0("# (implement the cost models and choose_algorithm, Task 4, to see the crossover)");
    }
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
