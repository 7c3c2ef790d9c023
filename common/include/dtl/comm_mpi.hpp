// dtl/comm_mpi.hpp — defines: MpiComm (the CPU backend of Comm, over OpenMPI), mpi_check.
//
// Each MpiComm owns a duplicated MPI communicator and one worker thread that runs its ops in
// issue order. A blocking call issued while the worker is idle runs on the caller's thread
// instead (same order, no thread hand-off: this is what keeps small-message latency close to
// raw MPI). Built-in collectives are MPI's own; bfloat16 and float16 reductions use
// user-defined MPI ops, since MPI has no 16-bit float types.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <thread>

#include "dtl/comm.hpp"

namespace dtl {

// Throws dtl::Error "[rank r/n] <call> failed: <MPI error string>" unless rc == MPI_SUCCESS.
void mpi_check(int rc, const char* call);

class MpiComm : public Comm {
 public:
  // A Comm over a duplicate of `base` (MPI_COMM_WORLD for the world comm). Collective.
  static std::shared_ptr<MpiComm> create(MPI_Comm base, const std::string& name);
  ~MpiComm() override;

  std::string backend() const override { return "mpi"; }
  torch::Device device() const override { return torch::kCPU; }
  // The underlying communicator, for benchmarks that compare against raw MPI. Do not issue
  // ops on it while this Comm has ops in flight.
  MPI_Comm raw() const { return comm_; }

 private:
  Work launch(Op op) override;
  struct Task;
  MpiComm(MPI_Comm comm, int rank, int size, std::string name, std::vector<int> world_ranks);
  void execute(Op& op);  // runs one op (on the worker or inline)
  void worker_loop();

  MPI_Comm comm_;
  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool busy_ = false;  // the worker or an inline caller is executing an op
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace dtl
