// Lab 16 benchmark: the collective matmul, plain (all-gather, then compute) and overlapped (the
// ring), under an emulated PCIe network the benchmark sets itself (so the comparison means the
// same whatever DTL_NET says), with the compute, comm and exposed comm of each call as counters.
//
//   ./lab bench 16 -n 4
//   ./lab bench 16 -n 4 --solutions
//
// Every timed call is checked against the serial matmul computed up front; anything else fails
// the benchmark ("wrong result").
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <memory>

#include "dtl/error.hpp"
#include "dtl/net.hpp"
#include "dtl/runtime.hpp"
#include "dtl/trace.hpp"
#include "overlap.hpp"

namespace {

// 256 rows of width 512 per rank (512 KiB a chunk), a weight of 8192 outputs: on two cores a
// chunk's matmul and its transfer over the emulated link take about as long.
constexpr int64_t kRows = 256, kIn = 512, kOut = 8192;
constexpr int kCalls = 5;

struct Fixture {
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();
  torch::Tensor x, weight, expected;
  Fixture() {
    torch::manual_seed(16);
    const torch::Tensor x_full = torch::randn({comm->size() * kRows, kIn});
    const torch::Tensor w = torch::randn({kOut, kIn});
    expected = x_full.matmul(w.t()).to(comm->device());
    x = x_full.narrow(0, comm->rank() * kRows, kRows).clone().to(comm->device());
    weight = w.to(comm->device());
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Arg: 0 plain, 1 overlapped.
void BM_AllGatherMatmul(benchmark::State& state) {
  Fixture& f = fixture();
  const bool overlap = state.range(0) == 1;
  state.SetLabel(overlap ? "ring (overlapped)" : "plain");
  const dtl::net::Spec before = dtl::net::current();
  dtl::net::set(dtl::net::Spec::parse("pcie"));
  dtl::trace::enable(true);
  try {
    double compute = 0, comm = 0, exposed = 0;
    for (auto _ : state) {
      dtl::trace::clear();
      torch::Tensor y;
      {
        dtl::bench::Iteration it(state);
        y = dtl::lab16::allgather_matmul(f.x, f.weight, *f.comm, overlap);
      }
      const auto s = dtl::trace::summary();
      compute += s.compute;
      comm += s.comm;
      exposed += s.exposed_comm;
      if (!torch::allclose(y, f.expected, 1e-3, 1e-3)) {
        state.SkipWithError("wrong result: y differs from the serial all_gather(x) @ W^T");
        break;
      }
    }
    state.counters["compute_ms"] = 1e3 * compute / kCalls;
    state.counters["comm_ms"] = 1e3 * comm / kCalls;
    state.counters["exposed_ms"] = 1e3 * exposed / kCalls;
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
  dtl::trace::enable(false);
  dtl::net::set(before);
}

BENCHMARK(BM_AllGatherMatmul)->Arg(0)->Arg(1)->Iterations(kCalls)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
