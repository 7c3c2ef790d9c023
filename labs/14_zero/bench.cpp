// Lab 14 benchmark: one training step (zero_grad, forward, backward, step) at each ZeRO stage,
// with the bytes a rank holds and sends as counters. Stage 3 gathers every unit twice and
// allocates and frees its buffers each time: how much slower than stage 2 is it here, where
// the network is shared memory? (Try ./lab bench 14 -n 2 -- with DTL_NET=ib-2node.)
//
//   ./lab bench 14
//   ./lab bench 14 --solutions
//
// Every timed step is checked: after it, the parameters must equal (to float tolerance) those
// of single-process AdamW on the global batch after as many steps, computed up front; anything
// else fails the benchmark ("wrong result").
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "dtl/data.hpp"
#include "dtl/error.hpp"
#include "dtl/memory.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "dtl/train.hpp"
#include "demo_config.hpp"  // defines: demo::demo_config, demo::demo_adamw
#include "zero.hpp"

namespace {

using dtl::lab14::GPT;
using dtl::lab14::GPTConfig;

constexpr int kSteps = 8;
constexpr int64_t kRowsPerRank = 4;

struct Fixture {
  GPTConfig cfg = dtl::lab14::demo::demo_config();
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();
  dtl::data::SyntheticCorpus corpus{cfg.vocab_size, 14};
  dtl::data::GlobalBatchSampler sampler{corpus, kRowsPerRank * comm->size(), cfg.seq_len};
  std::vector<torch::Tensor> want;  // flat parameters after each step of the serial run

  Fixture() {
    dtl::memory::install();
    GPT model(cfg);
    auto opt = dtl::make_adamw(*model, dtl::lab14::demo::demo_adamw());
    for (int s = 0; s < kSteps; ++s) {
      dtl::train_step(model, *opt, sampler.global_batch_at(s));
      std::vector<torch::Tensor> flat;
      for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
      want.push_back(torch::cat(flat).to(comm->device()));
    }
  }
  torch::Tensor rows(int s) const {
    const int64_t r = comm->rank();
    return sampler.rows(s, r * kRowsPerRank, (r + 1) * kRowsPerRank).to(comm->device());
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_Stage(benchmark::State& state) {
  Fixture& f = fixture();
  const int stage = static_cast<int>(state.range(0));
  try {
    const auto before = static_cast<double>(dtl::memory::current_bytes(f.comm->device()));
    GPT model(f.cfg);
    model->to(f.comm->device());
    dtl::lab14::ZeroOptimizer zero(model, *f.comm, stage, dtl::lab14::demo::demo_adamw());
    f.comm->reset_stats();
    double held = 0;
    int s = 0;
    for (auto _ : state) {
      {
        dtl::bench::Iteration it(state);
        zero.zero_grad();
        zero.loss(f.rows(s)).backward();
        zero.step();
      }
      held = static_cast<double>(dtl::memory::current_bytes(f.comm->device())) - before;
      const double sent = f.comm->stats().total_wire_bytes();
      const torch::Tensor got = zero.full_parameters();
      f.comm->reset_stats();  // full_parameters' gathers (stage 3) are not the step's
      if (!torch::allclose(got, f.want[s], 1e-3, 1e-4)) {
        state.SkipWithError(fmt::format("wrong result: stage {} parameters after step {} differ "
                                        "from single-process AdamW's", stage, s + 1).c_str());
        return;
      }
      state.counters["sent_MiB"] = sent / (1 << 20);
      ++s;
    }
    state.counters["held_MiB"] = held / (1 << 20);
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
}

BENCHMARK(BM_Stage)->Arg(1)->Arg(2)->Arg(3)->Iterations(kSteps)->UseManualTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
