// Comm::all_reduce vs raw MPI_Allreduce, 1 KiB to 64 MiB, nccl-tests counters (algbw, busbw).
//
//   ./lab bench comm -n 2      (or: mpirun -n 4 --oversubscribe build/bin/comm_bench)
//
// Both variants run on the same tensor sizes in one process, interleaved per size, so the
// comparison is fair on a noisy machine; every timed call's result is checked (the harness's
// run_all_reduce, shared with labs 03 and 07). The added cost of Comm is argument checks, an op
// record and (for async) a hand-off to the worker thread; for blocking calls on an idle Comm
// the op runs on the caller's thread.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include "dtl/comm_mpi.hpp"
#include "dtl/harness/bench.hpp"
#include "dtl/runtime.hpp"

namespace {

dtl::Comm& comm() {
  static std::shared_ptr<dtl::Comm> c = dtl::world().dup();  // created on first use, by all ranks
  return *c;
}

void BM_Comm_AllReduce(benchmark::State& state) {
  dtl::bench::run_all_reduce(state, comm(), [](const torch::Tensor& t) { comm().all_reduce(t); });
}

// The baseline Comm is measured against; only the MPI backend has an MPI communicator (on
// CUDA the tensors live on the GPU and the world is NCCL's).
void BM_MPI_Allreduce(benchmark::State& state) {
  if (comm().backend() != "mpi") {
    state.SkipWithError("raw MPI_Allreduce needs the mpi backend (CPU tensors)");
    return;
  }
  MPI_Comm raw = static_cast<dtl::MpiComm&>(comm()).raw();
  dtl::bench::run_all_reduce(state, comm(), [raw](const torch::Tensor& t) {
    dtl::mpi_check(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()),
                                 MPI_FLOAT, MPI_SUM, raw),
                   "MPI_Allreduce");
  });
}

// Registered size by size, Comm then raw MPI, so both see the same machine state.
const bool registered = [] {
  for (int64_t bytes = 1 << 10; bytes <= (64 << 20); bytes *= 4) {
    benchmark::RegisterBenchmark("Comm::all_reduce", BM_Comm_AllReduce)
        ->Arg(bytes)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("MPI_Allreduce", BM_MPI_Allreduce)
        ->Arg(bytes)->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
