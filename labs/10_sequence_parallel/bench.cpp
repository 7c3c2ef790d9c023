// lab 10 benchmark: causal attention (forward + backward) over a growing sequence, computed
// whole on every rank vs split over the ranks with ring attention (cp = the number of ranks).
// Counters: peak_MiB, the memory tracker's peak above the inputs on a rank (the [T, T] scores
// whole, or [T/cp, T/cp] blocks). Every ring step's output is checked against full attention
// (computed once, before timing), so nothing is timed that did not do the work.
//
//   ./lab bench 10 -n 4                   your ring attention at cp = 4, and full attention
//   ./lab bench 10 -n 2 --solutions       the reference at cp = 2
//   ./lab bench 10 -n 4 --net nvlink      with an emulated NVLink between the ranks
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include "dtl/error.hpp"
#include "dtl/memory.hpp"
#include "dtl/model.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "sequence_parallel.hpp"

namespace {

constexpr int64_t kHeads = 4, kHeadDim = 32;

// q, k, v [1, H, T, Dh], the same on every rank.
std::vector<torch::Tensor> full_qkv(int64_t t) {
  torch::Generator gen = at::detail::createCPUGenerator(11);
  std::vector<torch::Tensor> out;
  for (int i = 0; i < 3; ++i)
    out.push_back(torch::randn({1, kHeads, t, kHeadDim}, gen).to(dtl::Runtime::get().device()));
  return out;
}

void BM_FullAttention(benchmark::State& state) {
  dtl::memory::install();
  std::vector<torch::Tensor> qkv = full_qkv(state.range(0));
  for (auto& x : qkv) x.requires_grad_(true);
  double peak = 0;
  for (auto _ : state) {
    dtl::bench::Iteration it(state);
    const auto before = static_cast<double>(dtl::memory::current_bytes());
    dtl::memory::reset_peak();
    dtl::model::causal_attention(qkv[0], qkv[1], qkv[2], 0.0, false).sum().backward();
    peak = static_cast<double>(dtl::memory::peak_bytes()) - before;
  }
  state.counters["peak_MiB"] = peak / (1 << 20);
}

void BM_RingAttention(benchmark::State& state) {
  dtl::memory::install();
  std::shared_ptr<dtl::Comm> cp = dtl::world().dup();
  const int64_t t = state.range(0);
  std::vector<torch::Tensor> qkv = full_qkv(t);
  double peak = 0;
  try {  // sequence_chunk throws alike on every rank when cp does not divide T
    const torch::Tensor expected = dtl::lab10::sequence_chunk(
        dtl::model::causal_attention(qkv[0], qkv[1], qkv[2], 0.0, false), 2, *cp);
    std::vector<torch::Tensor> mine;
    for (auto& x : qkv)
      mine.push_back(dtl::lab10::sequence_chunk(x, 2, *cp).clone().requires_grad_(true));
    bool wrong = false;
    for (auto _ : state) {
      dtl::bench::Iteration it(state);
      const auto before = static_cast<double>(dtl::memory::current_bytes());
      dtl::memory::reset_peak();
      const torch::Tensor out = dtl::lab10::ring_attention(mine[0], mine[1], mine[2], *cp);
      out.sum().backward();
      peak = static_cast<double>(dtl::memory::peak_bytes()) - before;
      wrong = wrong || !torch::allclose(out, expected, 1e-4, 1e-5);
    }
    if (dtl::max_over_ranks(wrong ? 1.0 : 0.0) > 0)
      state.SkipWithError("wrong result: ring attention differs from full causal attention");
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // every rank throws alike: nobody waits
  }
  state.counters["cp"] = cp->size();
  state.counters["peak_MiB"] = dtl::max_over_ranks(peak) / (1 << 20);
}

// T = 1024, 2048, 4096; three timed forward + backward passes each.
void sequence_lengths(benchmark::internal::Benchmark* b) {
  b->Arg(1024)->Arg(2048)->Arg(4096)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_FullAttention)->Apply(sequence_lengths);
BENCHMARK(BM_RingAttention)->Apply(sequence_lengths);

}  // namespace
