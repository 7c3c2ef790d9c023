// lab 02 demo: synchronous data-parallel training, step by step, with the step time split into
// compute (forward + backward on this rank's rows), the gradient all-reduces, and the time
// ranks spend waiting for the slowest one.
//
//   ./lab run 02 -n 4
//   ./lab run 02 -n 4 --net pcie                 # pay an emulated network's cost per transfer
//   ./lab run 02 -n 4 -- --d-model 256 --steps 10
//
// Reading the split. In synchronous SGD no rank can step before every rank's gradients are
// in, so the time a rank spends inside the all-reduces is (waiting for the slowest rank's
// backward) + (moving bytes). The slowest rank hardly waits, so its all-reduce time is the
// transfer; every other rank's extra is waiting. A faster network shrinks the transfer only;
// stragglers (here: 4 ranks sharing 2 cores) cost the same on any network.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <vector>

#include "data_parallel.hpp"
#include "dtl/data.hpp"         // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"        // defines: dtl::Error
#include "dtl/log.hpp"          // defines: print0
#include "dtl/memory.hpp"       // defines: format_bytes
#include "dtl/runtime.hpp"      // defines: Runtime, RuntimeOptions
#include "dtl/timer.hpp"        // defines: DeviceTimer
#include "dtl/optim.hpp"        // defines: OptimConfig, make_adamw
#include "dtl/perf.hpp"         // defines: median

int main(int argc, char** argv) {
  CLI::App app{"lab 02: data-parallel training; compute vs communication per step"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  dtl::model::GPTConfig cfg;
  cfg.vocab_size = 128;
  cfg.seq_len = 32;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.d_model = 128;
  int steps = 20;
  int64_t batch = 16;
  dtl::OptimConfig optim;
  app.add_option("--steps", steps, "training steps")->capture_default_str();
  app.add_option("--batch", batch, "GLOBAL batch (sequences per step, over all ranks)")
      ->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--vocab", cfg.vocab_size, "vocabulary of the synthetic corpus")
      ->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "model width (gradient bytes grow as d^2)")
      ->capture_default_str();
  app.add_option("--layers", cfg.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--heads", cfg.n_head, "attention heads")->capture_default_str();
  app.add_option("--lr", optim.lr, "AdamW learning rate")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    const int n = rt.world_size();
    // Gradients travel on their own Comm, metrics on another: the stats of grad_comm count
    // exactly the training traffic, and metric gathers never queue behind gradients.
    std::shared_ptr<dtl::Comm> grad_comm = rt.world().dup();
    // Metrics are CPU numbers: on a GPU run they travel on a CPU (MPI) Comm, not through NCCL.
    std::shared_ptr<dtl::Comm> metrics = rt.cpu_world().dup();

    dtl::model::GPT model(cfg);  // the seeded init on the CPU, then onto the device
    model->to(rt.device());
    auto optimizer = dtl::make_adamw(*model, optim);
    dtl::data::SyntheticCorpus corpus(cfg.vocab_size, rt.seed());
    dtl::data::GlobalBatchSampler sampler(corpus, batch, cfg.seq_len);
    int64_t grad_bytes = 0, n_tensors = 0;
    for (const auto& p : model->parameters()) {
      grad_bytes += p.numel() * static_cast<int64_t>(sizeof(float));
      ++n_tensors;
    }
    dtl::print0("data parallel on {} rank(s), {} intra-op thread(s) each, network: {}", n,
                rt.intra_op_threads(), opts.net.empty() ? "none (shared memory)" : opts.net);
    dtl::print0("model {}: {} parameters in {} tensors = {} of gradients per step", cfg.to_string(),
                dtl::model::num_parameters(*model), n_tensors,
                dtl::memory::format_bytes(static_cast<double>(grad_bytes)));
    dtl::print0("global batch {} x {} tokens; rank 0 trains on {} rows; entropy floor {:.3f}",
                batch, cfg.seq_len, dtl::lab02::shard_range(batch, 0, n).size(),
                corpus.entropy_rate());
    dtl::print0("{:>5} {:>8} | {:>18} | {:>11} {:>11} | {:>6}", "step", "loss", "compute max (min)",
                "all-reduce", "waiting", "comm%");

    std::vector<double> step_ms, compute_ms, transfer_ms, wait_ms;
    for (int step = 0; step < steps; ++step) {
      const torch::Tensor global = sampler.global_batch_at(step).to(rt.device());
      const dtl::lab02::StepStats st =
          dtl::lab02::dp_train_step(model, *optimizer, global, *grad_comm);

      // Every rank's numbers to rank 0: [compute, comm, optimizer, loss x rows].
      auto mine = torch::tensor({st.compute_seconds, st.comm_seconds, st.optimizer_seconds,
                                 st.loss * static_cast<double>(st.local_rows)},
                                torch::kFloat64);
      auto all = torch::empty({n * 4}, torch::kFloat64);
      metrics->all_gather(all, mine);
      auto a = all.view({n, 4});
      const double loss = a.select(1, 3).sum().item<double>() / static_cast<double>(batch);
      const int64_t slowest = a.select(1, 0).argmax().item<int64_t>();
      const double compute_max = a[slowest][0].item<double>();
      const double compute_min = a.select(1, 0).min().item<double>();
      // The slowest rank arrives last at the all-reduces: its time there is the transfer.
      const double transfer = a[slowest][1].item<double>();
      const double wait = (a.select(1, 1).sum().item<double>() - n * transfer) / n;
      // Wall time of the step: every rank leaves the last all-reduce at about the same time.
      const double step_time = a.narrow(1, 0, 3).sum(1).max().item<double>();
      if (step > 0) {  // step 0 pays one-off costs (allocator, thread pools, Adam state)
        step_ms.push_back(step_time * 1e3);
        compute_ms.push_back(compute_max * 1e3);
        transfer_ms.push_back(transfer * 1e3);
        wait_ms.push_back(std::max(0.0, wait) * 1e3);
      }
      dtl::print0("{:>5} {:>8.4f} | {:>8.1f} ({:>5.1f}) ms | {:>8.2f} ms {:>8.2f} ms | {:>5.1f}%",
                  step + 1, loss, compute_max * 1e3, compute_min * 1e3, transfer * 1e3,
                  std::max(0.0, wait) * 1e3, 100 * transfer / step_time);
    }

    // ---- summary: what one step cost, and what the bytes say
    const dtl::CommStats stats = grad_comm->stats();
    const double wire_per_step = stats[dtl::OpType::AllReduce].wire_bytes / steps;
    const double t_step = dtl::median(step_ms), t_transfer = dtl::median(transfer_ms);
    dtl::print0(
        "\nmedian over steps 2..{}: step {:.1f} ms = compute {:.1f} + all-reduce {:.2f} "
        "(+ optimizer); ranks waited {:.2f} ms on average for the slowest",
        steps, t_step, dtl::median(compute_ms), t_transfer, dtl::median(wait_ms));
    dtl::print0("throughput {:.0f} tokens/s over {} rank(s); communication is {:.1f}% of a step",
                static_cast<double>(batch * cfg.seq_len) / (t_step / 1e3), n,
                100 * t_transfer / t_step);
    // Full replication: every rank holds the whole model, its grads and Adam's moments, so the
    // per-rank peak does not shrink as ranks are added (only the activations do, with the rows).
    const double peak = dtl::max_over_ranks(static_cast<double>(dtl::memory::peak_bytes()));
    dtl::print0("peak memory per rank {} (weights + grads + AdamW state = {} of it): run with -n 1, "
                "2, 4 and compare", dtl::memory::format_bytes(peak),
                dtl::memory::format_bytes(4.0 * static_cast<double>(grad_bytes)));
    dtl::print0(
        "traffic per step: {} all-reduces of {} in total; on the wire per rank "
        "{} = 2(n-1)/n x gradient bytes",
        stats[dtl::OpType::AllReduce].count / steps,
        dtl::memory::format_bytes(static_cast<double>(grad_bytes)),
        dtl::memory::format_bytes(wire_per_step));
    if (n > 1 && t_transfer > 0) {
      // The same bytes in ONE all-reduce: what bucketing (lab 04) buys back.
      torch::Tensor flat = torch::zeros({grad_bytes / static_cast<int64_t>(sizeof(float))},
                                        torch::TensorOptions().device(rt.device()));
      std::vector<double> fused_s;
      for (int i = 0; i < 6; ++i) {
        metrics->barrier();  // start together: time the transfer, not a straggler
        dtl::DeviceTimer t;
        grad_comm->all_reduce(flat);
        if (i > 0) fused_s.push_back(t.seconds());  // i = 0 warms up
      }
      const double fused = dtl::median(fused_s);
      dtl::print0(
          "per-parameter all-reduces: {:.2f} ms ({:.2f} GB/s bus bandwidth); one fused "
          "all-reduce of the same bytes: {:.2f} ms ({:.2f} GB/s)",
          t_transfer, wire_per_step / (t_transfer / 1e3) / 1e9, fused * 1e3,
          wire_per_step / fused / 1e9);
    }
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "lab02: %s\n", e.what());
    return 1;
  }
  return 0;
}
