// lab 05 demo: one training run with gradient accumulation over lab 04's DDP, at the world size
// of the launch and the --micro / --accum of the flags. Prints, per optimizer step, the lr of
// the schedule, the loss over the global batch, what the gradient Comm sent, and the running
// gradient noise scale B_simple (from 2 ranks on). Run it at three settings of the same global
// batch (16) and compare: the loss curves agree to float rounding, the communication does not.
//
//   ./lab run 05 -n 1 -- --micro 16 --accum 1
//   ./lab run 05 -n 2 -- --micro 4 --accum 2
//   ./lab run 05 -n 4 -- --micro 2 --accum 2
//   ./lab run 05 -n 4 -- --micro 2 --accum 2 --sync-every-micro   forget no_sync
//   ./lab run 05 -n 4 -- --micro 2 --accum 2 --no-noise-scale     no B_simple, no extra all-reduce
//   ./lab run 05 -n 2 -- --help                                      every flag
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>

#include "ddp.hpp"                // defines: lab04::DistributedDataParallel
#include "demo_config.hpp"        // defines: demo_config, kDemoBucketBytes
#include "dtl/data.hpp"           // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"          // defines: dtl::Error
#include "dtl/log.hpp"            // defines: print0
#include "dtl/memory.hpp"         // defines: format_bytes
#include "dtl/optim.hpp"          // defines: make_adamw
#include "dtl/perf.hpp"           // defines: max_over_ranks
#include "dtl/runtime.hpp"        // defines: Runtime, RuntimeOptions
#include "dtl/split.hpp"          // defines: split_range
#include "dtl/timer.hpp"          // defines: DeviceTimer
#include "grad_accumulation.hpp"  // defines: global_batch, AccumulationTrainer, ...

int main(int argc, char** argv) {
  CLI::App app{"lab 05: gradient accumulation over DDP: same global batch, same training"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  dtl::model::GPTConfig cfg = dtl::lab05::demo_config();
  int64_t micro = 8, accum = 1, steps = 8;
  dtl::lab05::LrSchedule schedule;
  schedule.base_lr = 1e-3;
  schedule.base_batch = 16;
  schedule.warmup_steps = 3;
  std::string scaling = "sqrt";  // AdamW: the square-root rule (note 05, section 4)
  double cap_kib = dtl::lab05::kDemoBucketBytes / 1024.0;
  bool sync_every_micro = false;
  bool no_noise_scale = false;
  app.add_option("--micro", micro, "sequences per micro-batch per rank")->capture_default_str();
  app.add_option("--accum", accum, "micro-batches per optimizer step")->capture_default_str();
  app.add_option("--steps", steps, "optimizer steps")->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "model width")->capture_default_str();
  app.add_option("--layers", cfg.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--base-lr", schedule.base_lr, "peak lr tuned at --base-batch")
      ->capture_default_str();
  app.add_option("--base-batch", schedule.base_batch, "global batch the base lr was tuned at")
      ->capture_default_str();
  app.add_option("--scaling", scaling, "lr scaling rule: none, linear or sqrt")
      ->check(CLI::IsMember({"none", "linear", "sqrt"}))
      ->capture_default_str();
  app.add_option("--warmup", schedule.warmup_steps, "warm-up optimizer steps")
      ->capture_default_str();
  app.add_option("--bucket-cap-kib", cap_kib, "DDP bucket cap (first bucket too), KiB")
      ->capture_default_str();
  app.add_flag("--sync-every-micro", sync_every_micro,
               "no no_sync: every micro-batch's backward all-reduces (and no B_simple)");
  app.add_flag("--no-noise-scale", no_noise_scale,
               "do not measure B_simple (saves one scalar all-reduce per step)");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    const int64_t world = rt.world_size();
    const int64_t batch = dtl::lab05::global_batch(world, micro, accum);
    schedule.scaling = scaling == "none"     ? dtl::lab05::LrScaling::None
                       : scaling == "linear" ? dtl::lab05::LrScaling::Linear
                                             : dtl::lab05::LrScaling::Sqrt;
    schedule.total_steps = steps;
    std::shared_ptr<dtl::Comm> grad_comm = rt.world().dup();  // DDP's traffic only

    dtl::model::GPT model(cfg);
    model->to(rt.device());
    dtl::lab04::DDPOptions ddp_options;
    ddp_options.first_bucket_bytes = ddp_options.bucket_cap_bytes =
        static_cast<int64_t>(cap_kib * 1024);
    dtl::lab04::DistributedDataParallel ddp(model.ptr(), *grad_comm, ddp_options);
    auto optimizer = dtl::make_adamw(*model);
    dtl::lab05::AccumulationOptions options;
    options.accum_steps = accum;
    options.schedule = schedule;
    options.no_sync = !sync_every_micro;
    // The local gradient exists only between no_sync backwards; one rank has no small batch.
    options.measure_noise_scale = !no_noise_scale && !sync_every_micro && world > 1;
    dtl::lab05::AccumulationTrainer trainer(model, ddp, *optimizer, options);
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);

    int64_t grad_bytes = 0;
    for (const auto& p : ddp.parameters()) grad_bytes += p.numel() * p.element_size();
    dtl::print0("world {} x micro {} x accum {} = global batch {} sequences of {} tokens{}", world,
                micro, accum, batch, cfg.seq_len,
                sync_every_micro ? " (no no_sync: every backward all-reduces)" : "");
    dtl::print0("model: {} ({} of gradients in {} DDP buckets)", cfg.to_string(),
                dtl::memory::format_bytes(static_cast<double>(grad_bytes)), ddp.buckets().size());
    dtl::print0(
        "lr: {} at batch {}, {} scaling -> peak {:.3e} at batch {}; warm-up {} steps, "
        "cosine to step {}; loss floor (entropy rate) {:.4f}",
        schedule.base_lr, schedule.base_batch, scaling,
        dtl::lab05::scheduled_lr(schedule, batch, std::max<int64_t>(schedule.warmup_steps - 1, 0)),
        batch, schedule.warmup_steps, steps - 1, corpus.entropy_rate());
    if (options.measure_noise_scale) {
      double inverse_rows = 0;  // the local batch: the harmonic mean of the ranks' rows
      for (int64_t r = 0; r < world; ++r)
        inverse_rows += 1.0 / static_cast<double>(dtl::split_range(batch, world, r).size());
      dtl::print0(
          "B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, A.1) from the local "
          "(batch {:.4g}) and all-reduced (batch {}) gradients' norms, averages with decay {}; "
          "+1 all-reduce of 8 B per step",
          static_cast<double>(world) / inverse_rows, batch, options.noise_scale_decay);
    }
    dtl::print0("\n{:>4} {:>10} {:>10} {:>12} {:>12} {:>14} {:>9} {:>9}", "step", "lr", "loss",
                "all-reduces", "bytes", "wire B/rank", "step ms", "B_simple");
    for (int64_t s = 0; s < steps; ++s) {
      const torch::Tensor global = sampler.global_batch_at(s).to(rt.device());
      const dtl::CommStats before = grad_comm->stats();
      const dtl::DeviceTimer timer;
      const dtl::lab05::StepStats st = trainer.step(global);
      const double seconds = dtl::max_over_ranks(timer.seconds());
      const dtl::CommStats after = grad_comm->stats();
      // The global mean loss from each rank's row-weighted mean, on the world Comm (not counted
      // with the gradients).
      torch::Tensor total = torch::tensor({st.loss * static_cast<double>(st.local_rows)},
                                          torch::TensorOptions().dtype(torch::kFloat64))
                                .to(rt.device());
      rt.world().all_reduce(total);
      const auto& a = after[dtl::OpType::AllReduce];
      const auto& b = before[dtl::OpType::AllReduce];
      // "-" while there is no estimate: one rank, not measured, or no positive average yet.
      const std::string b_simple = st.b_simple ? fmt::format("{:.1f}", *st.b_simple) : "-";
      dtl::print0("{:>4} {:>10.3e} {:>10.6f} {:>12} {:>12} {:>14} {:>9.1f} {:>9}", s, st.lr,
                  total.item<double>() / static_cast<double>(batch), a.count - b.count,
                  dtl::memory::format_bytes(static_cast<double>(a.bytes - b.bytes)),
                  dtl::memory::format_bytes(a.wire_bytes - b.wire_bytes), seconds * 1e3,
                  b_simple);
    }
    const dtl::CommStats totals = grad_comm->stats();  // by value: a reference into it would dangle
    const auto& ar = totals[dtl::OpType::AllReduce];
    dtl::print0("\ntotal: {} all-reduces ({} per step), {} all-reduced, {} on the wire per rank",
                ar.count, ar.count / steps,
                dtl::memory::format_bytes(static_cast<double>(ar.bytes)),
                dtl::memory::format_bytes(ar.wire_bytes));
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab05: %s\n", e.what());
    return 1;
  }
  return 0;
}
