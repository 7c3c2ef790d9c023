// dtl/comm_nccl.hpp — defines: nccl_compiled, nccl_version_string, make_nccl_comm,
// cuda_device_count, nccl_check_distinct_gpus, nccl_check_p2p_tag (the GPU
// backend of Comm: the engine in comm_engine.cpp over the device layer in comm_nccl.cpp, which is
// compiled when CUDA + NCCL >= 2.10 are found; comm_nccl_stub.cpp otherwise).
//
// The nccl backend is the device-independent engine (dtl/comm_engine.hpp: validation, padding,
// issue order, keep-alive, completion, timeouts, abort, messages; tested in CI on CPU with a
// fake device) over a thin NCCL device layer (comm_nccl.cpp): one ncclComm_t per Comm, its
// unique id made by rank 0 and broadcast over MPI (split and dup use ncclCommSplit when the NCCL
// loaded at run time is >= 2.18), its own CUDA stream. Issuing an op, one launch at a time in
// sequence order even when several threads issue:
//   1. everything that can throw is checked first (device, dtype, tag);
//   2. the Comm's own CUDA stream waits for the caller's *current* stream (so the kernels that
//      produced the inputs run first);
//   3. the NCCL call(s) run on the Comm's stream (grouped calls are always closed), followed by
//      the copy-back into a non-contiguous or padded output, then an end event is recorded;
//   4. every tensor the op touches (inputs, outputs, temporaries) stays referenced until the end
//      event completed, even if the Work is dropped unwaited.
// Work::wait() makes the caller's current stream wait for the end event (the CPU does not
// block), except barrier(), which blocks the host until the barrier completed on the GPU.
// Work::is_completed() says whether the poller saw the end event complete, and throws if the op
// failed.
//
// Completion is honest: a per-Comm poller thread marks an op completed (op records, trace,
// the test watchdog's pending_ops()) only when its end event completed. It also watches
// ncclCommGetAsyncError and a per-op timeout (env DTL_NCCL_TIMEOUT, seconds, default 600,
// read when a Comm is created; it counts from issue, so a launch blocked in NCCL counts too):
// on either it marks the op and every later one failed, aborts the communicator
// (ncclCommAbort; if a launch is inside NCCL, when it returns), and wait()/is_completed() throw
// a dtl::Error naming the rank, op, sequence number and comm. DTL_NCCL_BLOCKING_WAIT=1 makes
// every wait() block the host until the op completed or failed (debugging). A Work may outlive
// the Comm; destroying a Comm first drains its in-flight ops (bounded by the timeout) and
// aborts instead of destroying the NCCL communicator if an op failed or is stuck.
//
// Two ranks may not share a GPU (NCCL rejects duplicate devices; checked by GPU UUID);
// multi-rank tests on one GPU or none use the mpi backend. NCCL matches point-to-point messages
// by order only, so send, recv and sendrecv reject a nonzero tag.
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"

namespace dtl {

// Whether this build has the NCCL backend compiled in.
bool nccl_compiled();
// "2.28.9 (built with 2.28.9)": the NCCL library loaded at run time (ncclGetVersion) and the
// header the build used; "none (built without NCCL)" in a build without the backend.
std::string nccl_version_string();
// Creates an NCCL Comm over the ranks of `bootstrap` (an MPI Comm with the same members) on
// CUDA device `device_index`. Throws dtl::Error naming the cause when this build has no NCCL,
// when no CUDA device is usable (e.g. "cudaGetDeviceCount: CUDA driver version is
// insufficient..."), or when NCCL initialisation fails.
std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name);
// The same, after checking that no two ranks use the same GPU (nccl_check_distinct_gpus; a
// collective over `bootstrap`). `local_ranks`: ranks on this node, for the message.
std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name,
                                     int local_ranks);
// Number of CUDA devices, or a dtl::Error explaining why there are none usable.
int cuda_device_count();
// Makes `index` this thread's current CUDA device (the Runtime calls it for the main thread, so
// LibTorch's and NCCL's contexts land on this rank's GPU, not all on GPU 0).
void cuda_set_current_device(int index);

// The checks below are what the nccl backend applies; inline so the no-GPU CI box (and a build
// without NCCL) tests the very messages a GPU run gives.

// One GPU per rank: a dtl::Error naming two ranks that share one. `uuids[r]` is rank r's GPU
// ("GPU-8f3a2c1e-..." as nvidia-smi -L prints it). Identities, not counts: under per-rank GPU
// binding (Slurm --gpus-per-task=1, CUDA_VISIBLE_DEVICES set per rank) each rank sees one GPU
// and the launch is correct. `local_ranks` (ranks on this node) only informs the message.
inline void nccl_check_distinct_gpus(const std::vector<std::string>& uuids, int local_ranks) {
  std::map<std::string, int> first;
  for (int r = 0; r < static_cast<int>(uuids.size()); ++r) {
    auto it = first.emplace(uuids[r], r).first;
    if (it->second == r) continue;
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw Error(fmt::format(
        "{}ranks {} and {} both use GPU {}{} ({} ranks on this node); the nccl backend needs one "
        "GPU per rank (NCCL rejects a GPU used twice in a communicator): launch at most as many "
        "ranks per node as it has GPUs, give each rank its own, or use --device cpu --backend mpi",
        rank_prefix(), it->second, r, uuids[r],
        visible ? fmt::format(" (CUDA_VISIBLE_DEVICES={} here)", visible) : "", local_ranks));
  }
}
// send/recv/sendrecv tags: only 0. NCCL matches messages between two ranks by issue order.
inline void nccl_check_p2p_tag(int tag, const char* op) {
  DTL_CHECK(tag == 0,
            fmt::format("{}: tag {} is not supported by the nccl backend (NCCL has no tags: it "
                        "matches sends and receives between two ranks in issue order); use tag "
                        "0 and issue matching calls in the same order, or dup() a Comm per "
                        "stream of messages", op, tag));
}

}  // namespace dtl
