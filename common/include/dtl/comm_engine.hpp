// dtl/comm_engine.hpp — defines: engine::DeviceCall, engine::DeviceOp, engine::DeviceLayer,
// engine::Options, engine::make_comm (the device-independent half of the NCCL backend).
//
// The NCCL backend is two pieces:
//   - this engine (comm_engine.cpp), which knows nothing of CUDA or NCCL and is tested on every
//     commit on CPU with a fake device layer (common/tests/comm_engine_test.cpp): it validates
//     an op, pads uneven reduce-scatters and all-gathers to equal chunks, enqueues ops in
//     sequence order, keeps every tensor an op touches alive until the device says the op is
//     over, marks ops started/completed/failed, enforces the per-op timeout, aborts the
//     communicator on a timeout, a device error or an asynchronous error (never while another
//     thread is inside the device layer), and writes every error message;
//   - a device layer (comm_nccl.cpp), which only launches NCCL calls on a CUDA stream and
//     records and queries CUDA events. It is the only part that runs solely on a GPU machine.
//
// Threads: the issuing thread calls DeviceLayer::enqueue (one at a time, in sequence order);
// one poller thread per Comm calls DeviceOp::query, DeviceLayer::async_error, idle and abort.
// The engine never calls abort() while a thread is inside enqueue() or split(): NCCL calls on
// one communicator are not thread-safe, so an abort that is due while a launch is blocked in
// NCCL (a first point-to-point op waits for its peer) runs when that launch returns.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dtl/comm.hpp"

namespace dtl {
namespace engine {

// One op as the device layer sees it: validated, contiguous buffers on the layer's device.
// Reduce-scatter and all-gather chunks are equal (the engine padded uneven ones); all-to-all
// sends and receives recv.numel() / size elements to and from each rank.
struct DeviceCall {
  OpType type = OpType::Barrier;
  ReduceOp reduce = ReduceOp::Sum;
  torch::Tensor send;  // undefined for barrier and recv; the same tensor as recv when in place
  torch::Tensor recv;  // undefined for barrier and send
  int peer = -1;       // root (broadcast, reduce), destination (send, sendrecv), source (recv)
  int peer2 = -1;      // sendrecv: the source
  int size = 1;        // ranks in the communicator
};

// One op enqueued on the device. May outlive its DeviceLayer (a Work may outlive its Comm).
class DeviceOp {
 public:
  enum class Status { Queued, Running, Done, Failed };
  virtual ~DeviceOp() = default;
  // Where the op is, without blocking; on Failed, `error` says why. Any thread; never throws.
  virtual Status query(std::string& error) noexcept = 0;
  // Work::wait(): order the caller's later device work after this op (CUDA: the caller's
  // current stream waits for the op's end event). The host does not block.
  virtual void order_caller_after() = 0;
};

class DeviceLayer {
 public:
  virtual ~DeviceLayer() = default;
  virtual torch::Device device() const = 0;
  // Enqueues `call` after the caller's pending device work, then `finish` (may be empty: the
  // copy-back into a non-contiguous or padded output), ordered after the call and before the op
  // reports Done. The engine keeps `finish` and every tensor of `call` alive until the op
  // reports Done or Failed (or, after an abort, until idle()); the layer holds no references.
  // May block the host (NCCL's first point-to-point op between two ranks waits for the peer).
  // If it throws, the engine assumes part of the op may have been enqueued: it aborts the
  // communicator and keeps the buffers until idle().
  virtual std::unique_ptr<DeviceOp> enqueue(const DeviceCall& call,
                                            const std::function<void()>& finish) = 0;
  // The communicator's asynchronous error (a peer died, a network error), "" when healthy.
  // Poller thread only; not called after abort().
  virtual std::string async_error() noexcept = 0;
  // Makes every op stuck in the communicator return; nothing is enqueued after it. Called at
  // most once, never while a thread is inside enqueue() or split().
  virtual void abort() noexcept = 0;
  // Whether everything enqueued so far has finished on the device (after abort(): let go of
  // every buffer). Never throws.
  virtual bool idle() noexcept = 0;
  // Clean close when every op completed (ncclCommDestroy); not called after abort().
  virtual void close() noexcept = 0;
  // A device layer for the communicator `split` made: `sub` is the new bootstrap (MPI) comm of
  // this rank, or null when this rank opted out (color < 0; it must still take part when the
  // device's split is collective). Returns null when `sub` is null.
  virtual std::unique_ptr<DeviceLayer> split(const std::shared_ptr<Comm>& sub, int color,
                                             int key) = 0;
  // Called first on the poller thread (CUDA: make this layer's device current there).
  virtual void bind_thread() noexcept {}
};

struct Options {
  double timeout_s = 600;      // per op, from issue (launch included) to completion
  bool blocking_wait = false;  // every wait() blocks the host until the op completed or failed
  std::string backend = "nccl";
  // Each Comm reads DTL_NCCL_TIMEOUT and DTL_NCCL_BLOCKING_WAIT when it is created, split()
  // and dup() included (options_from_env over the parent's options): a test may set a short
  // timeout for one dup(). Off: children copy their parent's options as they are.
  bool read_env = false;
};

// `inherited` with what the environment sets: DTL_NCCL_TIMEOUT (seconds > 0; anything else
// keeps the inherited value, with a warning) and DTL_NCCL_BLOCKING_WAIT (set and not "0": on;
// "0": off; unset: inherited).
Options options_from_env(Options inherited);

// A Comm with the members and ranks of `bootstrap` (an MPI comm, used for splits) whose ops run
// on `device`. Children made by split()/dup() get `options`, read anew from the environment when
// options.read_env.
std::shared_ptr<Comm> make_comm(std::shared_ptr<Comm> bootstrap,
                                std::unique_ptr<DeviceLayer> device, const std::string& name,
                                const Options& options);

}  // namespace engine
}  // namespace dtl
