// dtl/runtime.hpp — defines: RuntimeOptions, Runtime (process start-up and shutdown), world().
//
// Every dtl program starts with one Runtime:
//
//   int main(int argc, char** argv) {
//     dtl::Runtime rt(argc, argv);          // MPI up, ranks known, device chosen, RNG seeded
//     dtl::Comm& world = rt.world();        // all ranks, backend mpi (CPU) or nccl (CUDA)
//     ...
//   }                                       // ~Runtime: comms drained, MPI finalized
//
// Flags (also as environment variables, flags win): --device cpu|cuda (DTL_DEVICE),
// --backend mpi|nccl (DTL_BACKEND; default nccl for cuda, mpi for cpu), --seed N (DTL_SEED),
// --threads N (DTL_THREADS; intra-op threads, default cores / ranks on this node),
// --net SPEC (DTL_NET; network emulator, see net.hpp), --trace FILE (DTL_TRACE; Chrome trace
// of the run, see trace.hpp), --gantt (DTL_GANTT=1; terminal timeline at exit).
#pragma once

#include <CLI/App.hpp>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "dtl/blas.hpp"  // defines: BlasInfo
#include "dtl/comm.hpp"

namespace dtl {

struct RuntimeOptions {
  std::string device = "cpu";  // cpu | cuda
  std::string backend;         // mpi | nccl | "" (auto: nccl for cuda, mpi for cpu)
  uint64_t seed = 1234;
  int threads = 0;             // 0: hardware cores / ranks on this node (at least 1)
  std::string net;             // network emulator spec or preset ("" or "none": off)
  std::string trace;           // write a Chrome trace of the run here ("" = off)
  bool gantt = false;          // print a terminal Gantt chart of the run at exit (rank 0)

  // Defaults overridden by DTL_DEVICE, DTL_BACKEND, DTL_SEED, DTL_THREADS, DTL_NET, DTL_TRACE.
  static RuntimeOptions from_env();
  // Registers --device --backend --seed --threads --net --trace on a program's own CLI11 app,
  // so one parser (and one --help) covers the runtime and the program.
  void add_to(CLI::App& app);
};

class Runtime {
 public:
  // Parses the runtime flags out of argv (other arguments are left for the program).
  Runtime(int argc, char** argv);
  explicit Runtime(RuntimeOptions options, int argc = 0, char** argv = nullptr);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  static Runtime& get();  // the live Runtime; dtl::Error if there is none
  static bool exists();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }  // rank among the processes on this node
  int local_size() const { return local_size_; }
  int intra_op_threads() const { return threads_; }
  torch::Device device() const { return device_; }
  const std::string& backend() const { return backend_; }
  const RuntimeOptions& options() const { return options_; }
  // The BLAS library behind CPU matmuls (OpenBLAS, or the slow reference one: a warning).
  const BlasInfo& blas() const { return blas_; }
  // Base seed. Torch's global RNG is seeded with seed() + rank(); model init uses seed() alone
  // (model::init_normal), so every rank builds the same weights.
  uint64_t seed() const { return options_.seed; }

  Comm& world() { return *world_; }
  std::shared_ptr<Comm> world_ptr() { return world_; }
  // Plain CPU Comm over all ranks even when world() is NCCL (side channels, bootstrap).
  Comm& cpu_world() { return *cpu_world_; }
  // A private MPI communicator over all ranks for the test/bench harness (end-of-test syncs,
  // timing barriers): never shares a communicator with the Comms under test.
  MPI_Comm control_comm() const { return control_; }

 private:
  void init(int argc, char** argv);
  void finish_trace() noexcept;
  RuntimeOptions options_;
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1, threads_ = 1;
  torch::Device device_{torch::kCPU};
  std::string backend_;
  BlasInfo blas_;
  std::shared_ptr<Comm> world_;
  std::shared_ptr<Comm> cpu_world_;
  MPI_Comm control_ = MPI_COMM_NULL;
};

// Shorthand for Runtime::get().world().
inline Comm& world() { return Runtime::get().world(); }

}  // namespace dtl
