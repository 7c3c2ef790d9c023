// Lab 20 benchmark: the planner's search (every candidate plan estimated for GPT-3 175B on 1024
// A100s) and a short training run of each 4-rank composition.
//
//   ./lab bench 20                  1 rank: the planner
//   ./lab bench 20 -n 4             the compositions too (dp, tp x dp, pp x dp, tp x pp)
//   ./lab bench 20 --solutions
//
// Results are checked in every iteration: the planner's choice must fit and be within 5% of the
// fastest plan; a training step's loss must equal single-process training's (computed up front).
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "dtl/data.hpp"
#include "dtl/error.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"
#include "dtl/train.hpp"
#include "training_stack.hpp"

namespace {

using namespace dtl::lab20;

void BM_Plan(benchmark::State& state) {
  try {
    const GPTConfig m = model_by_name("gpt3-175b");
    const Cluster cl = cluster("a100-80g:1024");
    for (auto _ : state) {
      PlanReport report;
      {
        dtl::bench::Iteration it(state);
        report = plan(m, cl, 1536, CostModel{});
      }
      const Estimate& chosen = report.chosen().estimate;
      if (!chosen.fits || chosen.tokens_per_s < 0.95 * report.fastest_tokens_per_s) {
        state.SkipWithError("wrong result: the chosen plan does not fit or is not within 5%");
        return;
      }
      state.counters["plans"] = static_cast<double>(report.plans.size());
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
}
BENCHMARK(BM_Plan)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

// One training run of kSteps steps of a composition (0: dp, 1: tp x dp, 2: pp x dp, 3: tp x pp;
// the world must be 4 for 1-3), every step's loss against single-process training.
constexpr int kSteps = 3;

TrainOptions bench_options() {
  TrainOptions o;
  o.model = GPTConfig::small();
  o.global_batch = 8;
  o.steps = kSteps;
  o.optim.eps = 1e-6;
  o.peak_flops = 1e10;
  return o;
}

const std::vector<double>& serial_losses() {
  static const std::vector<double> losses = [] {
    const TrainOptions o = bench_options();
    dtl::model::GPT model(o.model);
    model->to(dtl::Runtime::get().device());
    auto opt = dtl::make_adamw(*model, o.optim);
    dtl::data::SyntheticCorpus corpus(o.model.vocab_size, o.data_seed);
    dtl::data::GlobalBatchSampler sampler(corpus, o.global_batch, o.model.seq_len);
    std::vector<double> out;
    for (int64_t k = 0; k < o.steps; ++k) {
      dtl::set_lr(*opt, dtl::warmup_cosine_lr(o.optim, k, o.steps));
      out.push_back(dtl::train_step(model, *opt, sampler.global_batch_at(k).to(dtl::Runtime::get().device())));
    }
    return out;
  }();
  return losses;
}

void BM_Train(benchmark::State& state) {
  dtl::Comm& world = dtl::world();
  const int n = world.size();
  const std::vector<std::string> plans = {fmt::format("dp={}", n), "tp=2,dp=2", "pp=2,dp=2",
                                          "tp=2,pp=2"};
  const std::string p = plans[static_cast<size_t>(state.range(0))];
  state.SetLabel(p);
  if (state.range(0) > 0 && n != 4) {
    state.SkipWithError("needs 4 ranks (./lab bench 20 -n 4)");
    return;
  }
  try {
    const std::vector<double>& want = serial_losses();
    auto comm = world.dup();
    for (auto _ : state) {
      TrainResult r;
      {
        dtl::bench::Iteration it(state);
        r = train(parse_plan(p), bench_options(), *comm);
      }
      for (size_t k = 0; k < want.size(); ++k)
        if (r.losses.size() != want.size() || std::abs(r.losses[k] - want[k]) > 1e-4 * want[k]) {
          state.SkipWithError(fmt::format("wrong result: {} step {} loss differs from "
                                          "single-process training's", p, k).c_str());
          return;
        }
      state.counters["tokens_per_s"] = r.tokens_per_s;
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_Train)->DenseRange(0, 3)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
