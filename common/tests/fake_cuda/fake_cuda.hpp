// Test controls of the fake CUDA runtime and fake NCCL (cuda_runtime.h, nccl.h beside this).
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cuda_runtime.h"

namespace fake_cuda {

// Devices this process sees (default 2).
void set_device_count(int n);
// Devices on which this process has a CUDA context (cudaSetDevice, or any call in a thread that
// never set a device: device 0), and clears the record.
std::set<int> contexts();
void reset_contexts();
// cudaFree and cudaDeviceSynchronize calls so far: each one waits for every stream of the device.
int device_syncs();
// Enqueues `kernel` on `stream` (cudaStreamLegacy: this thread's current stream), as a kernel
// launch would: it runs after the stream's earlier work, the host does not wait.
void launch(cudaStream_t stream, std::function<void()> kernel);
// Makes `stream` the calling thread's current stream for a scope (c10::cuda::CUDAStreamGuard).
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
};
// A new stream on the current device (c10::cuda::getStreamFromPool); destroyed at exit.
cudaStream_t new_stream();
// The host waits until the calling thread's current stream ran everything enqueued so far.
void sync_current_stream();
// NCCL's runtime connection (>= 2.22): the first use of a collective (op and size) between ranks
// blocks the host inside the launch until the peers make the same first use; so does the first
// send/recv between two ranks. Communicators made with NCCL_RUNTIME_CONNECT=0 in the environment
// connect their collectives in init instead (point-to-point stays lazy, as in NCCL). Unmatched after
// `give_up_s`, the launch fails (ncclSystemError) and a violation is recorded, where real NCCL would
// block for good. `force` = 1 or 0 overrides the variable for communicators made from now on; -1
// (the default) follows it.
void set_runtime_connect(int force, double give_up_s = 8);
// Breaches of what CUDA or NCCL require, seen so far (and cleared).
std::vector<std::string> take_violations();

}  // namespace fake_cuda
