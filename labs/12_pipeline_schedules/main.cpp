// lab 12 demo: each schedule simulated, then executed for real (the course GPT, real sends and
// receives) with emulated compute (every forward sleeps --forward-ms, every backward
// --backward-ms, split over chunks), so that 4 ranks on 2 cores still have uniform work: the
// measured bubble against the simulated one and the formula, and a terminal Gantt of each.
//
//   ./lab run 12 -n 4                               GPipe, 1F1B, interleaved v=2; m = 8
//   ./lab run 12 -n 4 -- --m 16                     more micro-batches: smaller bubbles
//   ./lab run 12 -n 4 -- --schedule interleaved --v 4
//   ./lab run 12 -n 4 -- --p2p-ms 5                 the simulation with a latency per message
//   ./lab run 12 -n 4 -- --json run.json            also every timeline as data (./lab figures)
//   ./lab run 12 -n 4 -- --help                     every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "dtl/trace.hpp"    // defines: trace::record, gather_to_rank0, gantt
#include "pipeline_schedules.hpp"

namespace {

struct Variant {
  std::string name;
  int v;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 12: pipeline schedules, simulated and executed"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  std::string which = "all";
  int64_t m = 8;
  int v = 2, width = 96;
  double forward_ms = 20, backward_ms = 40, p2p_ms = 0;
  app.add_option("--schedule", which, "gpipe | 1f1b | interleaved | all")->capture_default_str();
  app.add_option("--m", m, "micro-batches per step")->capture_default_str();
  app.add_option("--v", v, "model chunks per rank (interleaved)")->capture_default_str();
  app.add_option("--forward-ms", forward_ms, "emulated forward of one stage")
      ->capture_default_str();
  app.add_option("--backward-ms", backward_ms, "emulated backward of one stage")
      ->capture_default_str();
  app.add_option("--p2p-ms", p2p_ms,
                 "latency of one message in the simulation (compare with the runtime's --net)")
      ->capture_default_str();
  app.add_option("--width", width, "Gantt width in columns")->capture_default_str();
  std::string json_path;
  app.add_option("--json", json_path,
                 "also write each schedule's simulated and measured timeline to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    dtl::Comm& world = rt.world();
    const int p = world.size();
    std::vector<Variant> variants;
    for (const Variant& x : {Variant{"gpipe", 1}, Variant{"1f1b", 1}, Variant{"interleaved", v}})
      if (which == "all" || which == x.name) variants.push_back(x);
    DTL_CHECK(!variants.empty(),
              fmt::format("--schedule {}: gpipe, 1f1b, interleaved or all", which));

    // A model with enough blocks for p x v virtual stages of one block each (plus the ends).
    dtl::model::GPTConfig cfg = dtl::model::GPTConfig::tiny();
    cfg.n_layer = std::max<int64_t>(2, static_cast<int64_t>(p) * v);
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, 2 * m, cfg.seq_len);
    dtl::lab12::PipelineLinks links(world);
    const dtl::lab12::ExecuteOptions emulated{forward_ms / 1e3, backward_ms / 1e3};
    dtl::print0(
        "# p = {} ranks, m = {} micro-batches, emulated forward {} ms / backward {} ms "
        "per stage; the course GPT with {} blocks",
        p, m, forward_ms, backward_ms, cfg.n_layer);
    dtl::print0("# {:<12} {:>3} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10}", "schedule", "v",
                "formula", "simulated", "measured", "sim ms", "step ms", "peak in", "loss");
    std::string charts;
    nlohmann::json doc = {{"p", p},
                          {"m", m},
                          {"forward_ms", forward_ms},
                          {"backward_ms", backward_ms},
                          {"p2p_ms", p2p_ms},
                          {"schedules", nlohmann::json::array()}};
    for (const Variant& x : variants) {
      const dtl::lab12::Schedule s = x.name == "gpipe"  ? dtl::lab12::gpipe(p, m)
                                     : x.name == "1f1b" ? dtl::lab12::one_f_one_b(p, m)
                                                        : dtl::lab12::interleaved(p, m, x.v);
      const dtl::lab12::SimResult sim =
          dtl::lab12::simulate(s, x.v, {forward_ms, backward_ms, p2p_ms});
      const std::vector<dtl::Range> parts = dtl::lab11::even_parts(cfg, p * x.v);
      dtl::lab12::ModelChunks chunks(cfg, world, x.v, parts);
      auto opt = dtl::make_adamw(chunks.module());
      // One untimed step (allocations, first-touch), then the measured one.
      dtl::lab12::execute(s, chunks, links, *opt, sampler.global_batch_at(0).to(rt.device()));
      world.barrier();
      const dtl::lab12::StepResult res = dtl::lab12::execute(
          s, chunks, links, *opt, sampler.global_batch_at(1).to(rt.device()), emulated);
      const double measured = dtl::lab12::measured_bubble(res, world);
      int64_t peak = res.peak_in_flight;
      {
        torch::Tensor t = torch::tensor({peak}, torch::kInt64).to(rt.device());
        world.all_reduce(t, dtl::ReduceOp::Max);
        peak = t.item<int64_t>();
      }
      dtl::print0(
          "  {:<12} {:>3} {:>10.4f} {:>10.4f} {:>10.4f} {:>10.1f} {:>10.1f} {:>9} {:>10.4f}",
          x.name, x.v, dtl::lab12::bubble_formula(p, m, x.v), sim.bubble, measured, sim.makespan,
          res.seconds * 1e3, peak, res.loss);
      // The measured step as a chart: this rank's actions as trace events, gathered on rank 0.
      // What --trace recorded (each action's scope, every send and receive) is set aside and
      // restored, so the trace file keeps every schedule.
      const std::vector<dtl::trace::Event> recorded = dtl::trace::events();
      dtl::trace::clear();
      for (const auto& t : res.timeline)
        dtl::trace::record({dtl::lab12::describe(t.action, x.v), "compute", "compute", t.start,
                            t.end, world.rank(), ""});
      const auto events = dtl::trace::gather_to_rank0();
      dtl::trace::clear();
      for (const auto& e : recorded) dtl::trace::record(e);
      if (world.rank() == 0)
        charts += fmt::format("\n# {} (v = {}): F = forward, B = backward; one row per rank\n{}",
                              x.name, x.v, dtl::trace::gantt(events, width));
      // The same as data: the simulation (ms of the cost model) and the measured step (s).
      nlohmann::json simulated = nlohmann::json::array(),
                     measured_actions = nlohmann::json::array();
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < s[r].size(); ++i) {
          const dtl::lab12::Action& a = s[r][i];
          const double cost =
              (a.kind == dtl::lab12::Action::Forward ? forward_ms : backward_ms) / x.v;
          simulated.push_back({{"rank", r},
                               {"name", dtl::lab12::describe(a, x.v)},
                               {"start", sim.start[r][i]},
                               {"end", sim.start[r][i] + cost}});
        }
      for (const auto& e : events)
        measured_actions.push_back(
            {{"rank", e.rank}, {"name", e.name}, {"start", e.start * 1e3}, {"end", e.end * 1e3}});
      doc["schedules"].push_back({{"name", x.name},
                                  {"v", x.v},
                                  {"formula", dtl::lab12::bubble_formula(p, m, x.v)},
                                  {"simulated",
                                   {{"bubble", sim.bubble},
                                    {"makespan", sim.makespan},
                                    {"peak_in_flight", sim.peak_in_flight},
                                    {"actions", simulated}}},
                                  {"measured",
                                   {{"bubble", measured},
                                    {"step_ms", res.seconds * 1e3},
                                    {"peak_in_flight", peak},
                                    {"actions", measured_actions}}}});
    }
    if (!json_path.empty() && world.rank() == 0) std::ofstream(json_path) << doc.dump(1) << "\n";
    dtl::print0(
        "# bubble = idle share of p x step time; peak in = most (micro-batch, chunk) "
        "activations held by one rank.");
    if (world.rank() == 0) std::fputs(charts.c_str(), stdout);
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab 12: %s\n", e.what());
    return 1;
  }
  return 0;
}
