// dtl/comm_nccl.hpp — defines: nccl_available, make_nccl_comm, nccl_check_tensor (the GPU backend
// of Comm; the class itself lives in comm_nccl.cpp, compiled when CUDA + NCCL are found).
//
// NcclComm: one ncclComm_t per Comm, its unique id made by rank 0 and broadcast over MPI; ops
// are enqueued on the Comm's own CUDA stream after an event from the caller's (default) stream,
// so compute and communication order correctly; Work::wait() makes the default stream wait for
// the op and keeps the tensors alive until it completed. Two ranks may not share a GPU (NCCL
// rejects duplicate devices); multi-rank tests on one GPU or none use the mpi backend.
#pragma once

#include <memory>
#include <string>

#include "dtl/comm.hpp"

namespace dtl {

// Whether this build has the NCCL backend compiled in.
bool nccl_compiled();
// Creates an NCCL Comm over the ranks of `bootstrap` (an MPI Comm with the same members) on
// CUDA device `device_index`. Throws dtl::Error naming the cause when this build has no NCCL,
// when no CUDA device is usable (e.g. "cudaGetDeviceCount: CUDA driver version is
// insufficient..."), or when NCCL initialisation fails.
std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name);
// Number of CUDA devices, or a dtl::Error explaining why there are none usable.
int cuda_device_count();
// The check NcclComm applies to every tensor: CUDA, on this comm's device. Exposed so the
// no-GPU CI box can test the message a CPU tensor gets.
void nccl_check_tensor(const torch::Tensor& t, int device_index, const char* op);

}  // namespace dtl
