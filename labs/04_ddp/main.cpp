// lab 04 demo: naive data parallelism (one blocking all-reduce per parameter, lab 02) against
// your DistributedDataParallel (buckets, all-reduced while backward is still running), on the
// same model, data and network. Prints the bucket layout, then per variant the median step,
// compute, communication and EXPOSED communication (what overlap did not hide).
//
//   ./lab run 04 -n 4 --net pcie                       the lecture's comparison
//   ./lab run 04 -n 4 --net pcie --trace ddp.json      open ddp.json in ui.perfetto.dev
//   ./lab run 04 -n 4 --net pcie -- --bucket-cap-kib 25600 --first-bucket-kib 1024
//                                                      PyTorch's defaults on this small model
//   ./lab run 04 -n 4 --net pcie -- --help             every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <vector>

#include "ddp.hpp"
#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/memory.hpp"   // defines: format_bytes
#include "dtl/net.hpp"      // defines: net::current
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/perf.hpp"     // defines: median
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "dtl/split.hpp"    // defines: split_range
#include "dtl/trace.hpp"    // defines: trace::enable
#include "timed_step.hpp"   // defines: timed_step, StepTimes

namespace {

struct Medians {
  double step = 0, compute = 0, comm = 0, exposed = 0;
};

// `steps` steps of one variant; step 0 is warm-up (allocator, Adam state, first emulator sync).
// Each number is the critical path's (timed_step.hpp) of that step, then the median over steps.
Medians run(dtl::model::GPT& model, torch::optim::Optimizer& opt,
            const dtl::data::GlobalBatchSampler& sampler, dtl::Comm& comm, bool naive, int steps) {
  std::vector<double> step, compute, comm_s, exposed;
  for (int s = 0; s < steps; ++s) {
    const torch::Tensor global = sampler.global_batch_at(s).to(dtl::Runtime::get().device());
    const dtl::Range rows = dtl::split_range(global.size(0), comm.size(), comm.rank());
    const dtl::lab04::StepTimes t =
        dtl::lab04::timed_step(model, opt, global.narrow(0, rows.begin, rows.size()), comm, naive);
    const dtl::lab04::StepTimes job = dtl::lab04::critical_path(t);
    if (s == 0) continue;
    step.push_back(job.step);
    compute.push_back(job.compute);
    comm_s.push_back(job.comm);
    exposed.push_back(job.exposed);
  }
  return {dtl::median(step), dtl::median(compute), dtl::median(comm_s), dtl::median(exposed)};
}

void print_row(const char* name, const Medians& m) {
  dtl::print0("{:<22} {:>9.1f} {:>10.1f} {:>9.1f} {:>9.1f} {:>9.0f}%", name, m.step * 1e3,
              m.compute * 1e3, m.comm * 1e3, m.exposed * 1e3,
              m.comm > 0 ? 100 * m.exposed / m.comm : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 04: naive data parallelism vs DistributedDataParallel (buckets + overlap)"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  dtl::model::GPTConfig cfg = dtl::lab04::demo_config();
  int steps = 4;
  int64_t batch = dtl::lab04::kDemoBatch;
  double first_kib = dtl::lab04::kDemoFirstBucketBytes / 1024.0;
  double cap_kib = dtl::lab04::kDemoBucketCapBytes / 1024.0;
  bool find_unused = false, bucket_view = false, skip_naive = false;
  app.add_option("--steps", steps, "steps per variant (the first is warm-up)")->capture_default_str();
  app.add_option("--batch", batch, "GLOBAL batch (sequences per step)")->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "model width")->capture_default_str();
  app.add_option("--layers", cfg.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--heads", cfg.n_head, "attention heads")->capture_default_str();
  app.add_option("--first-bucket-kib", first_kib, "DDP first bucket cap, KiB (PyTorch: 1024)")
      ->capture_default_str();
  app.add_option("--bucket-cap-kib", cap_kib, "DDP bucket cap, KiB (PyTorch: 25600)")
      ->capture_default_str();
  app.add_flag("--find-unused", find_unused, "DDP find_unused_parameters");
  app.add_flag("--bucket-view", bucket_view, "DDP gradient_as_bucket_view");
  app.add_flag("--no-naive", skip_naive, "skip the naive baseline (it is slow under --net)");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    const int n = rt.world_size();
    DTL_CHECK(batch % n == 0, fmt::format("--batch {} must be a multiple of the {} ranks (DDP "
                                          "averages with equal weights)", batch, n));
    dtl::trace::enable(true);  // the step accounting reads the trace (written only with --trace)
    std::shared_ptr<dtl::Comm> grad_comm = rt.world().dup();
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);

    dtl::print0("{} ranks, network: {}", n,
                dtl::net::enabled() ? dtl::net::current().describe()
                                    : "none (shared memory: try --net pcie)");
    dtl::model::GPT naive_model(cfg), ddp_model(cfg);
    naive_model->to(rt.device());
    ddp_model->to(rt.device());
    dtl::lab04::DDPOptions o;
    o.first_bucket_bytes = static_cast<int64_t>(first_kib * 1024);
    o.bucket_cap_bytes = static_cast<int64_t>(cap_kib * 1024);
    o.find_unused_parameters = find_unused;
    o.gradient_as_bucket_view = bucket_view;
    dtl::lab04::DistributedDataParallel ddp(ddp_model.ptr(), *grad_comm, o);

    int64_t grad_bytes = 0;
    for (const auto& p : ddp.parameters()) grad_bytes += p.numel() * p.element_size();
    dtl::print0("model {}: {} parameter tensors, {} of gradients, global batch {} x {} tokens",
                cfg.to_string(), ddp.parameters().size(),
                dtl::memory::format_bytes(static_cast<double>(grad_bytes)), batch, cfg.seq_len);
    dtl::print0("\nbuckets (first {} KiB, cap {} KiB), in the order they are all-reduced:",
                first_kib, cap_kib);
    for (size_t b = 0; b < ddp.buckets().size(); ++b) {
      int64_t bytes = 0;
      for (int64_t i : ddp.buckets()[b])
        bytes += ddp.parameters()[i].numel() * ddp.parameters()[i].element_size();
      const auto& first = ddp.parameter_names()[ddp.buckets()[b].front()];
      const auto& last = ddp.parameter_names()[ddp.buckets()[b].back()];
      dtl::print0("  bucket {:>2}: {:>9}  {:>2} tensors  {} .. {}", b,
                  dtl::memory::format_bytes(static_cast<double>(bytes)), ddp.buckets()[b].size(),
                  first, last);
    }

    dtl::print0("\nmedian over steps 2..{}, milliseconds (step: slowest rank; the rest: the rank "
                "with the most compute)", steps);
    dtl::print0("{:<22} {:>9} {:>10} {:>9} {:>9} {:>10}", "", "step", "compute", "comm",
                "exposed", "exposed/comm");
    Medians naive{};
    if (!skip_naive) {
      auto opt = dtl::make_adamw(*naive_model);
      naive = run(naive_model, *opt, sampler, *grad_comm, /*naive=*/true, steps);
      print_row("naive (per parameter)", naive);
    }
    const int64_t before = grad_comm->stats()[dtl::OpType::AllReduce].count;
    auto opt = dtl::make_adamw(*ddp_model);
    const Medians d = run(ddp_model, *opt, sampler, *grad_comm, /*naive=*/false, steps);
    print_row("DDP (buckets+overlap)", d);
    const int64_t per_step = (grad_comm->stats()[dtl::OpType::AllReduce].count - before) / steps;
    dtl::print0("\nDDP: {} all-reduces per step ({} buckets){}", per_step, ddp.buckets().size(),
                skip_naive ? "" : fmt::format("; naive: {} per step", ddp.parameters().size()));
    if (!skip_naive && d.step > 0)
      dtl::print0("DDP step is {:.2f}x faster than naive; it hides {:.0f}% of its communication "
                  "under compute",
                  naive.step / d.step, d.comm > 0 ? 100 * (1 - d.exposed / d.comm) : 0.0);
    if (!opts.trace.empty())
      dtl::print0("trace: {} (open in https://ui.perfetto.dev: one row per rank and Comm)",
                  opts.trace);
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab04: %s\n", e.what());
    return 1;
  }
  return 0;
}
