// Lab 16 demo: what overlapping communication with compute buys, measured from traces under
// the network emulator (default: the PCIe preset), in three places:
//
//   1. the collective matmul (yours): plain (gather, then compute) against the ring (each
//      chunk's transfer under the previous chunk's matmul), with both timelines as Gantt charts;
//   2. DDP's buckets (lab 04's reference): a sweep of the bucket cap, measured, against your
//      bucket model's prediction from a profile of the backward;
//   3. FSDP's prefetch (lab 15's reference): FULL_SHARD with and without it.
// Every compute / comm / exposed figure comes from your overlap_from_chrome on the trace.
//
//   ./lab run 16                          2 ranks, --net pcie
//   ./lab run 16 -- --net ib-2node -n 4   another network (-n before --)
//   ./lab run 16 -- --trace run.json      also write the whole run's trace (open in Perfetto)
//   ./lab run 16 -- --only matmul         one section: matmul, ddp or fsdp
//   ./lab run 16 -- --json overlap.json   also the timelines and the sweep as data (./lab figures)
//   ./lab run 16 -- --help                every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp.hpp"          // defines: lab04::DistributedDataParallel, DDPOptions (the reference)
#include "dtl/cli.hpp"      // defines: add_model_options
#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/hooks.hpp"    // defines: GradReadyHook
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: memory::format_bytes
#include "dtl/net.hpp"      // defines: net::enabled, net::current, net::collective_cost
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/perf.hpp"     // defines: max_over_ranks, median
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "dtl/trace.hpp"    // defines: trace::enable, events, gather_to_rank0, chrome_json, gantt
#include "fsdp.hpp"         // defines: lab15::FullyShardedDataParallel (the reference)
#include "overlap.hpp"
#include "timed_step.hpp"   // defines: lab04::timed_step, critical_path, demo_config, kDemoBatch

namespace {

using dtl::lab16::RankOverlap;
using nlohmann::json;

// A window of events as a Chrome trace (the format --trace writes), for the --json file.
json chrome(const std::vector<dtl::trace::Event>& events) {
  return json::parse(dtl::trace::chrome_json(events));
}

// The window [from, to] of every rank's events on rank 0, read with overlap_from_chrome.
// Collective. Returns the per-rank figures on rank 0 (empty elsewhere) and the events.
std::vector<RankOverlap> read_window(double from, double to, std::vector<dtl::trace::Event>* all) {
  const double lo = -dtl::max_over_ranks(-from), hi = dtl::max_over_ranks(to);
  std::vector<dtl::trace::Event> evs = dtl::trace::gather_to_rank0();
  std::vector<dtl::trace::Event> window;
  for (const auto& e : evs)
    if (e.end > lo && e.start < hi) window.push_back(e);
  if (all) *all = window;
  if (dtl::Runtime::get().rank() != 0) return {};
  return dtl::lab16::overlap_from_chrome(dtl::trace::chrome_json(window), lo, hi);
}

// The rank with the most compute: the critical path (a faster rank waits for it, and that wait
// shows as its exposed comm although it is load imbalance).
RankOverlap critical(const std::vector<RankOverlap>& ranks) {
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const auto& a, const auto& b) { return a.compute < b.compute; });
}

// ---------------------------------------------------------------- 1. the collective matmul

void section_matmul(int64_t R, int64_t K, int64_t N, int iters, json& out) {
  dtl::Comm& world = dtl::world();
  std::shared_ptr<dtl::Comm> comm = world.dup();
  torch::manual_seed(16);
  const torch::Tensor x_full = torch::randn({world.size() * R, K});
  const torch::Tensor weight = torch::randn({N, K}).to(comm->device());
  const torch::Tensor x = x_full.narrow(0, comm->rank() * R, R).clone().to(comm->device());
  dtl::print0("1. all_gather(x) @ W^T: x [{} x {}] per rank, W [{} x {}], {} KiB per chunk\n", R, K,
              N, K, R * K * 4 / 1024);
  std::map<bool, RankOverlap> result;
  std::map<bool, std::vector<dtl::trace::Event>> timeline;
  for (bool overlap : {false, true}) {
    dtl::lab16::allgather_matmul(x, weight, *comm, overlap);  // warm-up
    std::vector<RankOverlap> best;
    for (int i = 0; i < iters; ++i) {
      dtl::trace::clear();
      comm->barrier();
      const double from = dtl::trace::now();
      dtl::lab16::allgather_matmul(x, weight, *comm, overlap);
      const double to = dtl::trace::now();
      std::vector<dtl::trace::Event> evs;
      auto ranks = read_window(from, to, &evs);
      if (!ranks.empty() && (best.empty() || critical(ranks).wall < critical(best).wall)) {
        best = ranks;
        timeline[overlap] = evs;
      }
    }
    if (world.rank() == 0) {
      dtl::print0("{} (fastest of {}):\n{}", overlap ? "ring, overlapped" : "plain: gather, then compute",
                  iters, dtl::lab16::overlap_report(best));
      result[overlap] = critical(best);
    }
  }
  if (world.rank() != 0) return;
  for (bool overlap : {false, true}) {
    const RankOverlap& r = result[overlap];
    const double bound = overlap ? std::max(r.compute, r.comm) : r.compute + r.comm;
    dtl::print0("  {:<8} step {:7.1f} ms = {:.2f} x {} ({:.1f} ms); exposed comm {:6.1f} ms, step - "
                "compute {:6.1f} ms", overlap ? "ring" : "plain", r.wall * 1e3, r.wall / bound,
                overlap ? "max(compute, comm)" : "(compute + comm)", bound * 1e3,
                r.exposed_comm * 1e3, (r.wall - r.compute) * 1e3);
  }
  dtl::print0("  ring / plain step: {:.2f}\n", result[true].wall / result[false].wall);
  for (bool overlap : {false, true})
    dtl::print0("{}:\n{}", overlap ? "ring" : "plain", dtl::trace::gantt(timeline[overlap], 96));
  out["matmul"] = {{"rows", R},
                   {"k", K},
                   {"n", N},
                   {"plain", chrome(timeline[false])},
                   {"ring", chrome(timeline[true])}};
}

// ---------------------------------------------------------------- 2. DDP's buckets

// One backward of the model without DDP on this rank's rows: when each gradient is ready.
dtl::lab16::BackwardProfile profile_backward(const dtl::model::GPTConfig& cfg, const torch::Tensor& rows,
                                             const std::vector<int>& members) {
  dtl::model::GPT model(cfg);
  model->to(dtl::Runtime::get().device());
  const auto params = model->parameters();
  dtl::lab16::BackwardProfile p;
  p.ready_at.assign(params.size(), 0);
  double start = 0;
  std::vector<std::unique_ptr<dtl::GradReadyHook>> hooks;
  for (size_t i = 0; i < params.size(); ++i) {
    p.grad_bytes.push_back(params[i].numel() * params[i].element_size());
    hooks.push_back(std::make_unique<dtl::GradReadyHook>(params[i], [&p, &start, i] {
      p.ready_at[i] = dtl::trace::now() - start;
    }));
  }
  std::vector<double> runs;
  for (int k = 0; k < 3; ++k) {  // the last of three (the first ones warm the allocator)
    model->zero_grad();
    torch::Tensor loss = model->loss(rows);
    start = dtl::trace::now();
    loss.backward();
    p.backward = dtl::trace::now() - start;
  }
  for (auto& t : p.ready_at) t = std::min(t, p.backward);
  // alpha + beta * bytes: the emulator's own cost of an all-reduce among these ranks.
  const double c0 = dtl::net::collective_cost("all_reduce", 0, members);
  const double c1 = dtl::net::collective_cost("all_reduce", 1 << 20, members);
  p.alpha = c0;
  p.beta = (c1 - c0) / (1 << 20);
  return p;
}

void section_ddp(int steps, json& out) {
  dtl::Comm& world = dtl::world();
  const dtl::model::GPTConfig cfg = dtl::lab04::demo_config();
  const int64_t per = dtl::lab04::kDemoBatch / world.size();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 16);
  dtl::data::GlobalBatchSampler sampler(corpus, per * world.size(), cfg.seq_len);
  auto rows = [&](int s) {
    return sampler.rows(s, world.rank() * per, (world.rank() + 1) * per).to(world.device());
  };
  std::vector<int> members(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) members[static_cast<size_t>(r)] = r;
  dtl::lab16::BackwardProfile p = profile_backward(cfg, rows(0), members);
  p.backward = dtl::max_over_ranks(p.backward);
  int64_t total_bytes = 0;
  for (int64_t b : p.grad_bytes) total_bytes += b;
  dtl::print0("2. DDP's bucket cap (lab 04's reference), model {} ({:.1f} MiB of gradients), {} "
              "rows per rank", cfg.to_string(), total_bytes / 1048576.0, per);
  dtl::print0("   profile: backward {:.1f} ms; all-reduce alpha {:.2f} ms, beta {:.2f} ms/MiB\n",
              p.backward * 1e3, p.alpha * 1e3, p.beta * 1e3 * 1048576);
  std::vector<int64_t> caps;
  // From 128 KiB up to the first cap that holds every gradient in one bucket.
  for (int64_t cap = int64_t{128} << 10; cap < 2 * total_bytes; cap *= 2) caps.push_back(cap);
  dtl::print0("{:>10} {:>8} {:>14} {:>14} {:>12}", "cap", "buckets", "predicted ms", "measured ms",
              "exposed ms");
  std::vector<double> measured;
  json sweep = json::array();
  for (int64_t cap : caps) {
    dtl::model::GPT model(cfg);
    model->to(world.device());
    std::shared_ptr<dtl::Comm> comm = world.dup();
    dtl::lab04::DDPOptions o;
    o.first_bucket_bytes = o.bucket_cap_bytes = cap;
    dtl::lab04::DistributedDataParallel ddp(model.ptr(), *comm, o);
    auto opt = dtl::make_adamw(*model);
    std::vector<double> totals, exposed;
    for (int s = 0; s <= steps; ++s) {
      dtl::trace::clear();
      const auto t = dtl::lab04::critical_path(dtl::lab04::timed_step(model, *opt, rows(s), *comm, false));
      if (s == 0) continue;  // warm-up
      // The model predicts backward and its communication: the step without forward and
      // optimizer, i.e. backward's compute plus what stayed exposed.
      totals.push_back(p.backward + t.exposed);
      exposed.push_back(t.exposed);
    }
    const auto predicted = dtl::lab16::bucket_timing(p, cap, cap);
    measured.push_back(dtl::median(totals));
    sweep.push_back({{"cap", cap},
                     {"buckets", predicted.buckets},
                     {"predicted", predicted.total},
                     {"measured", measured.back()},
                     {"exposed", dtl::median(exposed)}});
    dtl::print0("{:>10} {:>8} {:>14.1f} {:>14.1f} {:>12.1f}", dtl::memory::format_bytes(static_cast<double>(cap)), predicted.buckets,
                predicted.total * 1e3, measured.back() * 1e3, dtl::median(exposed) * 1e3);
  }
  const int64_t predicted_best = dtl::lab16::best_bucket_cap(p, caps);
  out["ddp"] = {{"model", cfg.to_string()},
                {"grad_bytes", total_bytes},
                {"backward", p.backward},
                {"predicted_best", predicted_best},
                {"sweep", sweep}};
  const size_t measured_best =
      static_cast<size_t>(std::min_element(measured.begin(), measured.end()) - measured.begin());
  const size_t predicted_index =
      static_cast<size_t>(std::find(caps.begin(), caps.end(), predicted_best) - caps.begin());
  dtl::print0("\n   best cap: predicted {}, measured {} ({} sweep step(s) apart)\n",
              dtl::memory::format_bytes(static_cast<double>(predicted_best)), dtl::memory::format_bytes(static_cast<double>(caps[measured_best])),
              predicted_index > measured_best ? predicted_index - measured_best : measured_best - predicted_index);
}

// ---------------------------------------------------------------- 3. FSDP's prefetch

void section_fsdp(int steps, int64_t rows_per_rank, json& out) {
  dtl::Comm& world = dtl::world();
  const dtl::model::GPTConfig cfg = dtl::model::GPTConfig::small();
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 16);
  dtl::data::GlobalBatchSampler sampler(corpus, rows_per_rank * world.size(), cfg.seq_len);
  dtl::print0("3. FSDP FULL_SHARD (lab 15's reference), model {}, {} rows per rank\n", cfg.to_string(),
              rows_per_rank);
  std::map<bool, RankOverlap> result;
  out["fsdp"] = {{"model", cfg.to_string()}, {"rows", rows_per_rank}};
  for (bool prefetch : {false, true}) {
    dtl::lab15::FSDPConfig fc;
    fc.forward_prefetch = prefetch;
    fc.backward_prefetch = prefetch ? dtl::lab15::BackwardPrefetch::BACKWARD_PRE
                                    : dtl::lab15::BackwardPrefetch::NONE;
    dtl::model::GPT model(cfg);
    model->to(world.device());
    std::shared_ptr<dtl::Comm> comm = world.dup();
    dtl::lab15::FullyShardedDataParallel fsdp(model, *comm, fc);
    std::vector<RankOverlap> best;
    json best_window;
    for (int s = 0; s <= steps; ++s) {
      const torch::Tensor rows = sampler.rows(s, world.rank() * rows_per_rank,
                                              (world.rank() + 1) * rows_per_rank).to(world.device());
      dtl::trace::clear();
      comm->barrier();
      const double from = dtl::trace::now();
      // This rank's live bytes over the step: each unit's gather and release (rank 0's is kept).
      dtl::memory::record_timeline(true);
      fsdp.zero_grad();
      // The reference marks its own compute: each block's forward, and backward's spans between
      // the points where it blocks on a gather or a reduction.
      fsdp.loss(rows).backward();
      {
        DTL_SCOPE("optimizer");
        fsdp.step();
      }
      const double to = dtl::trace::now();
      dtl::memory::record_timeline(false);
      std::vector<dtl::trace::Event> evs;
      auto ranks = read_window(from, to, &evs);
      if (s > 0 && !ranks.empty() && (best.empty() || critical(ranks).wall < critical(best).wall)) {
        best = ranks;
        json memory = json::array();  // (seconds on the trace's clock, bytes)
        for (const auto& m : dtl::memory::timeline()) memory.push_back({from + m.seconds, m.bytes});
        best_window = {{"trace", chrome(evs)}, {"memory", memory}};
      }
    }
    out["fsdp"][prefetch ? "prefetch" : "no_prefetch"] = best_window;
    if (world.rank() == 0) {
      dtl::print0("prefetch {} (fastest of {} steps):\n{}", prefetch ? "on" : "off", steps,
                  dtl::lab16::overlap_report(best));
      result[prefetch] = critical(best);
    }
  }
  if (world.rank() == 0)
    dtl::print0("  prefetch on / off step: {:.2f} (exposed comm {:.1f} -> {:.1f} ms)\n",
                result[true].wall / result[false].wall, result[false].exposed_comm * 1e3,
                result[true].exposed_comm * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 16: how communication overlap hides step time"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  int64_t R = 256, K = 512, N = 4096, fsdp_rows = 64;
  int steps = 3;
  std::string only;
  app.add_option("--rows", R, "matmul: rows of x per rank")->capture_default_str();
  app.add_option("--k", K, "matmul: columns of x (the weight's inputs)")->capture_default_str();
  app.add_option("--n", N, "matmul: the weight's outputs")->capture_default_str();
  app.add_option("--fsdp-rows", fsdp_rows, "FSDP: sequences per rank per step")->capture_default_str();
  app.add_option("--steps", steps, "measured steps or calls per case (after one warm-up)")->capture_default_str();
  app.add_option("--only", only, "one section: matmul, ddp or fsdp")
      ->check(CLI::IsMember({"", "matmul", "ddp", "fsdp"}));
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write the timelines (Chrome traces) and the bucket sweep to this file");
  CLI11_PARSE(app, argc, argv);
  if (opts.net.empty()) opts.net = "pcie";  // overlap needs a network worth hiding

  try {
    dtl::Runtime rt(opts, argc, argv);
    DTL_CHECK(steps >= 1, fmt::format("--steps {} must be >= 1", steps));
    dtl::trace::enable(true);
    dtl::print0("{} ranks, network: {}\n", rt.world_size(),
                dtl::net::enabled() ? dtl::net::current().describe() : "none");
    json doc = {{"ranks", rt.world_size()},
                {"network", dtl::net::enabled() ? dtl::net::current().describe() : "none"}};
    if (only.empty() || only == "matmul") section_matmul(R, K, N, steps, doc);
    if (only.empty() || only == "ddp") section_ddp(steps, doc);
    if (only.empty() || only == "fsdp") section_fsdp(steps, fsdp_rows, doc);
    if (!json_path.empty() && rt.rank() == 0) std::ofstream(json_path) << doc.dump() << "\n";
  } catch (const dtl::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
