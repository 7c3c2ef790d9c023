// lab 04 benchmark: one training step with your DistributedDataParallel (BM_DDPStep) and with
// naive per-parameter all-reduces (BM_NaiveDPStep, lab 02's method, written out here), on the
// demo's workload (timed_step.hpp: 4 blocks of width 192, global batch 128 x 64 tokens).
//
//   ./lab bench 04 -n 4                                 both, on the emulated PCIe network
//   ./lab bench 04 -n 4 --solutions                     the reference
//   ./lab bench 04 -n 4 -- --benchmark_filter=DDP       only yours
//
// Network: the emulated one given with --net, else the pcie preset, which every benchmark sets
// itself on every rank (the grader runs benchmarks with the emulator off in the environment).
// Counters (the slowest rank's step; compute / comm / exposed of the rank with the most
// compute, see critical_path): compute_ms, comm_ms, exposed_ms and exposed_fraction = exposed /
// comm. The grader compares BM_DDPStep's time (yours vs the reference's) on 4 ranks; after every
// timed step the replicas must be identical on every rank, or the benchmark fails.
#include "dtl/harness/bench.hpp"   // defines: bench::Iteration
#include "dtl/harness/checks.hpp"  // defines: testing::same_on_all_ranks, testing::flat_params

#include <benchmark/benchmark.h>

#include "ddp.hpp"
#include "dtl/data.hpp"     // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/error.hpp"    // defines: dtl::NotImplemented
#include "dtl/net.hpp"      // defines: net::set, net::Spec
#include "dtl/optim.hpp"    // defines: make_adamw
#include "dtl/perf.hpp"     // defines: control_barrier
#include "dtl/runtime.hpp"  // defines: Runtime, world()
#include "dtl/split.hpp"    // defines: split_range
#include "dtl/trace.hpp"    // defines: trace::enable
#include "timed_step.hpp"   // defines: timed_step, critical_path, demo_config

namespace {

using namespace dtl::lab04;  // NOLINT: the lab's names

// The emulated network for one benchmark: pcie unless one is already set. Every rank switches
// at the same point, between barriers, with no op in flight: a rank that emulates and one that
// does not would run different protocols for the same collective.
class EmulatedNetwork {
 public:
  EmulatedNetwork() : saved_(dtl::net::current()), mine_(!dtl::net::enabled()) {
    if (!mine_) return;
    dtl::control_barrier();
    dtl::net::set(dtl::net::Spec::parse("pcie"));
    dtl::control_barrier();
  }
  ~EmulatedNetwork() {
    if (!mine_) return;
    dtl::control_barrier();
    dtl::net::set(saved_);
    dtl::control_barrier();
  }

 private:
  dtl::net::Spec saved_;
  bool mine_;
};

void run_steps(benchmark::State& state, bool naive) {
  const dtl::model::GPTConfig cfg = demo_config();
  const torch::Device device = dtl::Runtime::get().device();
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();  // gradient traffic only
  dtl::model::GPT model(cfg);
  model->to(device);
  std::unique_ptr<DistributedDataParallel> ddp;
  if (!naive) {
    DDPOptions o;
    o.first_bucket_bytes = kDemoFirstBucketBytes;
    o.bucket_cap_bytes = kDemoBucketCapBytes;
    try {
      ddp = std::make_unique<DistributedDataParallel>(model.ptr(), *comm, o);  // before the
    } catch (const dtl::NotImplemented& e) {  // emulator: construction is not what we time
      state.SkipWithError(e.what());  // every rank throws here alike: nobody waits
      return;
    }
  }
  auto optimizer = dtl::make_adamw(*model);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 1);
  dtl::data::GlobalBatchSampler sampler(corpus, kDemoBatch, cfg.seq_len);
  const dtl::Range rows = dtl::split_range(kDemoBatch, comm->size(), comm->rank());
  auto local = [&](int64_t step) {
    return sampler.global_batch_at(step).narrow(0, rows.begin, rows.size()).to(device);
  };

  const bool was_tracing = dtl::trace::enabled();
  dtl::trace::enable(true);  // the step accounting reads the trace
  EmulatedNetwork network;
  timed_step(model, *optimizer, local(0), *comm, naive);  // warm-up: allocator, Adam state
  double compute = 0, comm_s = 0, exposed = 0;
  int64_t step = 1;
  bool diverged = false;
  for (auto _ : state) {
    const torch::Tensor tokens = local(step++);  // data preparation: not timed
    StepTimes t;
    {
      dtl::bench::Iteration it(state);
      t = timed_step(model, *optimizer, tokens, *comm, naive);
    }
    const StepTimes job = critical_path(t);  // collective: every rank, every iteration
    compute += job.compute;
    comm_s += job.comm;
    exposed += job.exposed;
    // Untimed: every rank trained on different data, so the replicas stay identical only if
    // the gradients really were averaged. A step that skipped its all-reduces is not timed as
    // a fast one: it fails the benchmark (same result on every rank: a collective check).
    if (!dtl::testing::same_on_all_ranks(dtl::testing::flat_params(*model))) diverged = true;
  }
  dtl::trace::enable(was_tracing);
  if (diverged) {
    state.SkipWithError("wrong result: the replicas diverged (gradients not averaged)");
    return;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["compute_ms"] = compute / iters * 1e3;
  state.counters["comm_ms"] = comm_s / iters * 1e3;
  state.counters["exposed_ms"] = exposed / iters * 1e3;
  state.counters["exposed_fraction"] = comm_s > 0 ? exposed / comm_s : 0;
  state.counters["all_reduces"] =
      static_cast<double>(comm->stats()[dtl::OpType::AllReduce].count) / (iters + 1);
}

void BM_DDPStep(benchmark::State& state) { run_steps(state, /*naive=*/false); }
void BM_NaiveDPStep(benchmark::State& state) { run_steps(state, /*naive=*/true); }

// Fixed iteration counts: every rank runs the same number of collectives, and a run stays
// short (a naive step is several seconds under the emulator).
BENCHMARK(BM_DDPStep)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NaiveDPStep)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
