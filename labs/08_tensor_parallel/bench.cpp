// lab 08 benchmark: forward + backward of the tensor-parallel MLP (d -> 4d -> d) at tp = the
// number of ranks, for two widths. Each rank multiplies 1/tp of the weights; the price is one
// all-reduce of the activations [tokens, d] each way. Every timed step's output is checked
// against the serial MLP's (computed once), so nothing is timed that did not do the work.
//
//   ./lab bench 08 -n 4                 your layers
//   ./lab bench 08 -n 4 --net nvlink    with an emulated NVLink between the ranks
//   ./lab bench 08 -n 4 --solutions     the reference
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>

#include "dtl/error.hpp"
#include "dtl/model.hpp"
#include "dtl/perf.hpp"
#include "dtl/runtime.hpp"
#include "tensor_parallel.hpp"

namespace {

void BM_TensorParallelMLP(benchmark::State& state) {
  dtl::model::GPTConfig cfg;
  cfg.d_model = state.range(0);  // ff = 4 d: divisible by tp 1-4 for the widths below
  cfg.n_head = 4;
  const int64_t tokens = 256;
  const torch::Device device = dtl::Runtime::get().device();
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();
  dtl::model::MLP serial(cfg);
  dtl::model::init_parameters(*serial, cfg, "blocks.0.mlp.");
  serial->to(device);
  // The same input on every rank (seeded), and the serial output it must give.
  torch::Generator gen = at::detail::createCPUGenerator(7);
  const torch::Tensor x = torch::randn({tokens, cfg.d_model}, gen).to(device);
  const torch::Tensor expected = serial(x).detach();
  try {
    dtl::lab08::TensorParallelMLP mlp(serial->fc->weight, serial->fc->bias,
                                      serial->proj->weight, serial->proj->bias, *comm);
    const torch::Tensor xg = x.clone().requires_grad_(true);
    mlp(xg).sum().backward();  // warm-up: first-touch allocations, BLAS start-up
    bool wrong = false;
    for (auto _ : state) {
      dtl::bench::Iteration it(state);
      const torch::Tensor y = mlp(xg);
      y.sum().backward();
      wrong = wrong || !torch::allclose(y, expected, 1e-4, 1e-5);
    }
    if (dtl::max_over_ranks(wrong ? 1.0 : 0.0) > 0) state.SkipWithError("wrong result: the output differs from the serial MLP");
  } catch (const dtl::NotImplemented& e) {
    state.SkipWithError(e.what());  // every rank throws alike: nobody waits
  }
  state.counters["tp"] = comm->size();
  state.counters["params_per_rank"] =
      static_cast<double>(2 * 4 * cfg.d_model * cfg.d_model) / comm->size();
}

BENCHMARK(BM_TensorParallelMLP)
    ->Arg(256)
    ->Arg(512)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
