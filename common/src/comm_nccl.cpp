// NcclComm: Comm over NCCL for CUDA tensors (design and guarantees: dtl/comm_nccl.hpp).
// Compiled only when CUDA + NCCL >= 2.10 are found (comm_nccl_stub.cpp otherwise). Uses the
// CUDA runtime directly, so it builds against a CPU-only LibTorch too (CI builds it without a
// GPU and tests its no-device error path). With a CUDA LibTorch (DTL_TORCH_HAS_CUDA, set by
// cmake/DtlGpu.cmake) it also follows LibTorch's current stream and tells the caching
// allocator which stream uses each tensor.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#if DTL_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"
#include "dtl/split.hpp"
#include "dtl/log.hpp"
#include "dtl/timer.hpp"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "the nccl backend needs NCCL >= 2.10 (ncclAvg, bfloat16); cmake/FindNCCL.cmake checks this"
#endif
#define DTL_NCCL_HAS_SPLIT (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))

namespace dtl {

bool nccl_compiled() { return true; }

static std::string cuda_error(cudaError_t rc, const char* call) {
  return fmt::format("{} failed: {} ({})", call, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

static void cuda_check(cudaError_t rc, const char* call, const std::string& where = "") {
  if (rc == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls report their own
  throw Error((where.empty() ? rank_prefix() : where) + cuda_error(rc, call));
}

// NCCL's own explanation of the last error ("" before NCCL 2.13).
static std::string nccl_last_error(ncclComm_t comm) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* msg = ncclGetLastError(comm);
  if (msg && *msg) return fmt::format(" ({})", msg);
#else
  (void)comm;
#endif
  return "";
}

static void nccl_check(ncclResult_t rc, const std::string& where, const char* call) {
  if (rc == ncclSuccess) return;
  throw Error(fmt::format("{}{} failed: {}{}", where, call, ncclGetErrorString(rc),
                          nccl_last_error(nullptr)));
}

std::string nccl_version_string() {
  int v = 0;
  std::string runtime = ncclGetVersion(&v) == ncclSuccess
                            ? fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
                            : std::string("unknown");
  return fmt::format("{} (built with {}.{}.{})", runtime, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

void cuda_set_current_device(int index) { cuda_check(cudaSetDevice(index), "cudaSetDevice"); }

int cuda_device_count() {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later CUDA calls report their own
    throw Error(fmt::format("{}no usable CUDA device: cudaGetDeviceCount: {} ({}); run on CPU "
                            "with --device cpu --backend mpi", rank_prefix(),
                            cudaGetErrorString(rc), cudaGetErrorName(rc)));
  }
  if (n == 0)
    throw Error(rank_prefix() + "no CUDA device found; run on CPU with --device cpu --backend mpi");
  return n;
}

namespace {

ncclDataType_t nccl_dtype(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kFloat64: return ncclFloat64;
    case torch::kFloat16: return ncclFloat16;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kInt32: return ncclInt32;
    case torch::kInt64: return ncclInt64;
    case torch::kInt8: return ncclInt8;
    case torch::kUInt8: return ncclUint8;
    default:
      throw Error(fmt::format("{}nccl backend: dtype {} is not supported (float32, float64, "
                              "float16, bfloat16, int32, int64, int8, uint8 are)",
                              rank_prefix(), c10::toString(t.scalar_type())));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  double s = std::atof(v);
  return s > 0 ? s : fallback;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// Sets the current CUDA device for a scope and restores the previous one. Cleanup paths
// (destructors, the poller) pass check = false: they must not throw.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool check = true) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ == device_) return;
    cudaError_t rc = cudaSetDevice(device_);
    if (check) cuda_check(rc, "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// ncclGroupStart/End as a scope: an exception between them still closes the group.
class NcclGroup {
 public:
  explicit NcclGroup(const std::string& where) : where_(where) {
    nccl_check(ncclGroupStart(), where_, "ncclGroupStart");
  }
  void end() {
    open_ = false;
    nccl_check(ncclGroupEnd(), where_, "ncclGroupEnd");
  }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  const std::string& where_;
  bool open_ = true;
};

// The stream LibTorch's kernels go to on `device` right now: ops are ordered after it on issue
// and it waits for them on wait(). A CPU LibTorch has no stream API (and no CUDA tensors); its
// stand-in is the legacy default stream, which is also LibTorch's default stream.
cudaStream_t caller_stream(int device) {
#if DTL_TORCH_HAS_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}

// One enqueued op, from issue until its end event completed (or the comm was aborted).
struct Entry {
  enum class State { Pending, Done, Failed };
  std::shared_ptr<OpRecord> record;
  std::string where;                  // "[rank 1/4] all_reduce #3 on comm 'world': "
  cudaEvent_t start = nullptr, end = nullptr;
  std::vector<torch::Tensor> keep;    // inputs, outputs, temporaries: alive until `end`
  std::function<void()> finish;       // copy-back (holds its tensors too)
  double deadline = 0;                // now_seconds() past which the op has timed out
  bool started = false;               // the poller saw `start` complete
  State state = State::Pending;       // guarded by Core::mu
  std::string error;                  // when Failed
  ~Entry() {
    if (start) cudaEventDestroy(start);
    if (end) cudaEventDestroy(end);
  }
};

// What an NcclComm shares with its Works and its poller thread: a Work may outlive the Comm.
struct Core {
  int device = 0;
  double timeout = 600;
  bool blocking_wait = false;
  std::mutex mu;
  std::condition_variable changed;   // an entry completed or failed; the poller has work
  std::deque<std::shared_ptr<Entry>> inflight;  // issue order; Failed ones until the GPU let go
  ncclComm_t comm = nullptr;         // null once destroyed or aborted
  bool aborted = false;
  std::string error;                 // why the comm was aborted
  int host_waiters = 0;              // threads blocked in wait(): poll faster
  bool stop = false;                 // poller: exit

  // Under mu. Throws the entry's failure, or the comm's.
  void throw_if_failed(const Entry& e) const {
    if (e.state == Entry::State::Failed) throw Error(e.error);
  }
  // Under mu. The communicator's asynchronous error, if any (a peer died, a network error).
  std::string async_error() const {
    if (!comm || aborted) return "";
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
    if (rc != ncclSuccess) return fmt::format("ncclCommGetAsyncError failed: {}", ncclGetErrorString(rc));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    if (async == ncclInProgress) return "";
#endif
    if (async == ncclSuccess) return "";
    return fmt::format("NCCL async error: {}{}", ncclGetErrorString(async), nccl_last_error(comm));
  }
  // Blocks the calling thread until `e` completed or failed (the poller decides which).
  void block_until_resolved(const Entry& e) {
    std::unique_lock<std::mutex> lock(mu);
    ++host_waiters;
    changed.notify_all();
    changed.wait(lock, [&] { return e.state != Entry::State::Pending; });
    --host_waiters;
  }
};

struct NcclWork : Work::State {
  std::shared_ptr<Core> core;
  std::shared_ptr<Entry> entry;
  bool block_host = false;  // barrier, or DTL_NCCL_BLOCKING_WAIT=1
  bool waited = false;

  void wait() override {
    if (block_host) core->block_until_resolved(*entry);
    {
      std::lock_guard<std::mutex> lock(core->mu);
      core->throw_if_failed(*entry);
    }
    if (waited) return;
    // The caller's current stream (of this comm's device) waits for the op; the CPU does not.
    DeviceGuard device(core->device);
    cuda_check(cudaStreamWaitEvent(caller_stream(core->device), entry->end, 0),
               "cudaStreamWaitEvent", entry->where);
    waited = true;
  }

  bool is_completed() override {
    {
      std::lock_guard<std::mutex> lock(core->mu);
      core->throw_if_failed(*entry);
      if (entry->state == Entry::State::Done) return true;
      std::string async = core->async_error();
      if (!async.empty()) throw Error(entry->where + async);
    }
    cudaError_t q = cudaEventQuery(entry->end);
    if (q == cudaSuccess) return true;
    if (q == cudaErrorNotReady) return false;
    cuda_check(q, "cudaEventQuery", entry->where);  // a CUDA error is not "not done yet"
    return false;
  }
};

class NcclComm : public Comm {
 public:
  // Takes ownership of `bootstrap` (an MPI comm with the same members: unique ids, splits).
  // With `comm` null a new NCCL communicator is made over the bootstrap; otherwise `comm` (from
  // ncclCommSplit) is adopted.
  NcclComm(std::shared_ptr<Comm> bootstrap, int device, const std::string& name,
           ncclComm_t comm = nullptr)
      : Comm(bootstrap->rank(), bootstrap->size(), name, bootstrap->world_ranks()),
        bootstrap_(std::move(bootstrap)),
        core_(std::make_shared<Core>()) {
    core_->device = device;
    core_->timeout = env_seconds("DTL_NCCL_TIMEOUT", 600);
    core_->blocking_wait = env_flag("DTL_NCCL_BLOCKING_WAIT");
    DeviceGuard guard(device);
    if (!comm) {
      // Rank 0 makes the unique id; the bootstrap (MPI) comm carries it to everyone.
      // One byte more says whether rank 0 has an id: if ncclGetUniqueId fails there, the other
      // ranks must fail too, not wait in a broadcast rank 0 never joins.
      ncclUniqueId id;
      auto id_bytes = torch::zeros({static_cast<int64_t>(sizeof(id)) + 1}, torch::kUInt8);
      std::exception_ptr id_error;
      if (rank() == 0) {
        try {
          nccl_check(ncclGetUniqueId(&id), rank_prefix(), "ncclGetUniqueId");
          std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
          id_bytes.data_ptr<uint8_t>()[sizeof(id)] = 1;
        } catch (...) {
          id_error = std::current_exception();
        }
      }
      bootstrap_->broadcast(id_bytes, 0);
      if (id_error) std::rethrow_exception(id_error);
      if (id_bytes.data_ptr<uint8_t>()[sizeof(id)] != 1)
        throw Error(fmt::format("{}comm '{}': rank 0 could not create NCCL's unique id "
                                "(ncclGetUniqueId failed there: see rank 0's error)",
                                rank_prefix(), name));
      std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
      nccl_check(ncclCommInitRank(&comm, size(), id, rank()), rank_prefix(), "ncclCommInitRank");
    }
    core_->comm = comm;
    try {
      int nccl_rank = -1;
      nccl_check(ncclCommUserRank(comm, &nccl_rank), rank_prefix(), "ncclCommUserRank");
      DTL_CHECK(nccl_rank == rank(), fmt::format("comm '{}': NCCL ranked this process {} but "
                                                 "MPI ranked it {}", name, nccl_rank, rank()));
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaMalloc(&barrier_buf_, sizeof(int32_t)), "cudaMalloc");
      cuda_check(cudaMemset(barrier_buf_, 0, sizeof(int32_t)), "cudaMemset");
    } catch (...) {
      release_cuda();
      ncclCommAbort(comm);
      throw;
    }
    poller_ = std::thread([this] { poll_loop(); });
    static std::once_flag logged;
    std::call_once(logged, [&] {
      if (log_rank() == 0)
        std::fprintf(stderr, "dtl: NCCL %s, op timeout %.0f s (DTL_NCCL_TIMEOUT)\n",
                     nccl_version_string().c_str(), core_->timeout);
    });
  }

  ~NcclComm() override {
    // Drain: the poller completes in-flight ops, or fails them at their deadline.
    {
      std::unique_lock<std::mutex> lock(core_->mu);
      ++core_->host_waiters;
      core_->changed.notify_all();
      core_->changed.wait(lock, [&] { return core_->aborted || !has_pending(); });
      --core_->host_waiters;
      core_->stop = true;
    }
    core_->changed.notify_all();
    if (poller_.joinable()) poller_.join();
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      comm = core_->comm;
      core_->comm = nullptr;
    }
    // An aborted communicator is already freed; ncclCommDestroy (which flushes, and is
    // collective within a node) only runs when every op of this comm completed.
    if (comm) {
      DeviceGuard guard(core_->device, false);
      ncclCommDestroy(comm);
    }
    release_cuda();
  }

  std::string backend() const override { return "nccl"; }
  torch::Device device() const override {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(core_->device));
  }

 private:
  Work launch(Op op) override {
    OpRecord& rec = *op.record;
    // Enqueue in sequence order: Comm::issue numbers ops under its own lock, so two threads
    // may reach launch() out of order; each waits for its turn (and holds the issue lock).
    std::unique_lock<std::timed_mutex> lock(issue_mu_);
    turn_.wait(lock, [&] { return next_launch_ == rec.seq; });
    struct NextTurn {
      NcclComm& c;
      ~NextTurn() {
        ++c.next_launch_;
        c.turn_.notify_all();
      }
    } next_turn{*this};
    try {
      return op.type == OpType::Split ? launch_split(op) : launch_op(op);
    } catch (...) {
      mark_finished(rec, false);  // a record never stays pending for an op that never ran
      throw;
    }
  }

 private:
  // Under core mu.
  bool has_pending() const {
    for (auto& e : core_->inflight)
      if (e->state == Entry::State::Pending) return true;
    return false;
  }

  void release_cuda() noexcept {
    DeviceGuard guard(core_->device, false);
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    barrier_buf_ = nullptr;
    ready_ = nullptr;
    stream_ = nullptr;
  }

  // The split itself is host-side: membership over MPI, the communicator by ncclCommSplit
  // (NCCL >= 2.18) or a fresh unique id over the new MPI comm.
  Work launch_split(Op& op) {
    OpRecord& rec = *op.record;
    const std::string at = where(rec);
    ncclComm_t parent = live_comm(at);
    mark_started(rec);
    std::shared_ptr<Comm> sub = bootstrap_->split(op.color, op.key);
    const std::string& name = op.split_name;
#if DTL_NCCL_HAS_SPLIT
    ncclComm_t child = nullptr;
    {
      DeviceGuard guard(core_->device);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      nccl_check(ncclCommSplit(parent, sub ? op.color : NCCL_SPLIT_NOCOLOR, op.key, &child,
                               &config), at, "ncclCommSplit");
    }
    if (sub) *op.split_result = std::make_shared<NcclComm>(sub, core_->device, name, child);
#else
    (void)parent;
    if (sub) *op.split_result = std::make_shared<NcclComm>(sub, core_->device, name);
#endif
    mark_finished(rec, true);
    return Work();
  }

  // The communicator to enqueue on, or the reason there is none any more.
  ncclComm_t live_comm(const std::string& at) {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->aborted)
      throw Error(at + "this comm was aborted after an earlier failure: " + core_->error);
    return core_->comm;
  }

  // NCCL's reduce-scatter and all-gather need equal chunks; Comm's follow split_range (the first
  // N mod n chunks one element longer). For uneven sizes, run NCCL on chunks padded to the
  // largest one and move the real elements in and out with copies ordered around the op.
  void pad_uneven(Op& op) {
    if (op.type != OpType::ReduceScatter && op.type != OpType::AllGather) return;
    const torch::Tensor full = op.type == OpType::ReduceScatter ? op.send : op.recv;
    const int64_t total = full.numel(), parts = size();
    if (total % parts == 0) return;
    const int64_t largest = split_range(total, parts, 0).size();
    // By value: `finish` keeps a copy of this lambda and runs it after this function returned.
    auto range = [total, parts](int64_t p) { return split_range(total, parts, p); };
    std::function<void()> then = std::move(op.finish);
    if (op.type == OpType::ReduceScatter) {
      // In: chunk p at [p * largest, ...), zero tail. Out: this rank's largest-sized slot.
      torch::Tensor padded_in = torch::zeros({parts * largest}, full.options());
      for (int64_t p = 0; p < parts; ++p)
        padded_in.narrow(0, p * largest, range(p).size()).copy_(full.narrow(0, range(p).begin, range(p).size()));
      torch::Tensor padded_out = torch::empty({largest}, full.options()), out = op.recv;
      const int64_t mine = out.numel();
      op.send = padded_in;
      op.recv = padded_out;
      op.finish = [padded_out, out, mine, then]() mutable {
        out.copy_(padded_out.narrow(0, 0, mine));
        if (then) then();
      };
    } else {
      torch::Tensor padded_in = torch::zeros({largest}, full.options());
      padded_in.narrow(0, 0, op.send.numel()).copy_(op.send);
      torch::Tensor padded_out = torch::empty({parts * largest}, full.options()), out = op.recv;
      op.send = padded_in;
      op.recv = padded_out;
      op.finish = [padded_out, out, range, parts, largest, then]() mutable {
        for (int64_t p = 0; p < parts; ++p)
          out.narrow(0, range(p).begin, range(p).size()).copy_(padded_out.narrow(0, p * largest, range(p).size()));
        if (then) then();
      };
    }
  }

  Work launch_op(Op& op) {
    OpRecord& rec = *op.record;
    const char* what = to_string(op.type);
    auto e = std::make_shared<Entry>();
    e->record = op.record;
    e->where = where(rec);
    // ---- everything that can throw before any CUDA or NCCL call ----
    if (op.type == OpType::Send || op.type == OpType::Recv || op.type == OpType::SendRecv)
      nccl_check_p2p_tag(op.tag, what);
    ncclDataType_t send_type = ncclInt32, recv_type = ncclInt32;
    // Whichever buffers the op has: none for barrier, only `send` for send, only `recv` for recv.
    for (const torch::Tensor* t : {&op.send, &op.recv})
      if (t->defined()) nccl_check_tensor(*t, core_->device, what);
    pad_uneven(op);  // before `ready_` is recorded: the padding copies run first
    // Held until the op's end event has passed: no buffer is freed (and so none is handed to
    // another stream by the caching allocator) while NCCL may still touch it.
    for (auto* t : {&op.send, &op.recv})
      if (t->defined() && !(t == &op.recv && op.recv.is_same(op.send))) e->keep.push_back(*t);
    if (op.send.defined()) send_type = nccl_dtype(op.send);
    if (op.recv.defined()) recv_type = nccl_dtype(op.recv);
    const std::string& at = e->where;
    ncclComm_t comm = live_comm(at);
    DeviceGuard guard(core_->device);
    cuda_check(cudaEventCreateWithFlags(&e->start, cudaEventDisableTiming), "cudaEventCreate", at);
    cuda_check(cudaEventCreateWithFlags(&e->end, cudaEventDisableTiming), "cudaEventCreate", at);

    // ---- order after the caller's current stream (the kernels that produced the inputs) ----
    cuda_check(cudaEventRecord(ready_, caller_stream(core_->device)), "cudaEventRecord", at);
    cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent", at);
    // No recordStream onto stream_: the keep-alive above already prevents reuse until the op
    // ends, and an event recorded on this comm's own stream would outlive the stream (destroyed
    // with the comm) when a tensor outlives its comm, making the allocator's later free fail.
    cuda_check(cudaEventRecord(e->start, stream_), "cudaEventRecord", at);

    // ---- the NCCL call(s) on the comm stream ----
    const size_t n = op.recv.defined() ? static_cast<size_t>(op.recv.numel()) : 0;
    void* sbuf = op.send.defined() ? op.send.data_ptr() : nullptr;
    void* rbuf = op.recv.defined() ? op.recv.data_ptr() : nullptr;
    switch (op.type) {
      case OpType::AllReduce:
        nccl_check(ncclAllReduce(sbuf, rbuf, n, recv_type, nccl_op(op.reduce), comm, stream_), at,
                   "ncclAllReduce");
        break;
      case OpType::ReduceScatter:
        nccl_check(ncclReduceScatter(sbuf, rbuf, n, recv_type, nccl_op(op.reduce), comm, stream_),
                   at, "ncclReduceScatter");
        break;
      case OpType::AllGather:
        nccl_check(ncclAllGather(sbuf, rbuf, op.send.numel(), send_type, comm, stream_), at,
                   "ncclAllGather");
        break;
      case OpType::Broadcast:
        nccl_check(ncclBroadcast(sbuf, rbuf, n, recv_type, op.peer, comm, stream_), at,
                   "ncclBroadcast");
        break;
      case OpType::Reduce:
        nccl_check(ncclReduce(sbuf, rbuf, n, recv_type, nccl_op(op.reduce), op.peer, comm, stream_),
                   at, "ncclReduce");
        break;
      case OpType::AllToAll: {
        // NCCL has no all-to-all: size() grouped send/recv pairs.
        const size_t chunk = n / size();
        const size_t bytes = chunk * op.send.element_size();
        NcclGroup group(at);
        for (int p = 0; p < size(); ++p) {
          nccl_check(ncclSend(static_cast<char*>(sbuf) + p * bytes, chunk, send_type, p, comm,
                              stream_), at, "ncclSend");
          nccl_check(ncclRecv(static_cast<char*>(rbuf) + p * bytes, chunk, recv_type, p, comm,
                              stream_), at, "ncclRecv");
        }
        group.end();
        break;
      }
      case OpType::Barrier:
        // A one-element all-reduce on a scratch int; wait() then blocks the host.
        nccl_check(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm, stream_),
                   at, "ncclAllReduce (barrier)");
        break;
      case OpType::Send:
        nccl_check(ncclSend(sbuf, op.send.numel(), send_type, op.peer, comm, stream_), at,
                   "ncclSend");
        break;
      case OpType::Recv:
        nccl_check(ncclRecv(rbuf, n, recv_type, op.peer, comm, stream_), at, "ncclRecv");
        break;
      case OpType::SendRecv: {
        NcclGroup group(at);
        nccl_check(ncclSend(sbuf, op.send.numel(), send_type, op.peer, comm, stream_), at,
                   "ncclSend");
        nccl_check(ncclRecv(rbuf, n, recv_type, op.peer2, comm, stream_), at, "ncclRecv");
        group.end();
        break;
      }
      case OpType::Split: break;  // launch_split
    }

    // ---- copy-back into a non-contiguous output, ordered after the op and before `end` ----
    e->finish = std::move(op.finish);
    if (e->finish) {
#if DTL_TORCH_HAS_CUDA
      const auto nccl_stream =
          c10::cuda::getStreamFromExternal(stream_, static_cast<c10::DeviceIndex>(core_->device));
      c10::cuda::CUDAStreamGuard on_nccl_stream(nccl_stream);
      e->finish();
#else
      // No stream API: run the copy on LibTorch's (legacy default) stream after the op, and
      // end the op after the copy.
      cuda_check(cudaEventRecord(ready_, stream_), "cudaEventRecord", at);
      cuda_check(cudaStreamWaitEvent(cudaStreamLegacy, ready_, 0), "cudaStreamWaitEvent", at);
      e->finish();
      cuda_check(cudaEventRecord(ready_, cudaStreamLegacy), "cudaEventRecord", at);
      cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent", at);
#endif
    }
    cuda_check(cudaEventRecord(e->end, stream_), "cudaEventRecord", at);

    e->deadline = now_seconds() + core_->timeout;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->inflight.push_back(e);
    }
    core_->changed.notify_all();
    auto work = std::make_shared<NcclWork>();
    work->core = core_;
    work->entry = e;
    work->block_host = op.type == OpType::Barrier || core_->blocking_wait;
    return Work(work);
  }

  // ---- the poller: completion, async errors, timeouts ----

  void poll_loop() {
    cudaSetDevice(core_->device);  // this thread's event queries and aborts concern our device
    std::unique_lock<std::mutex> lock(core_->mu);
    while (!core_->stop) {
      if (core_->inflight.empty()) {
        core_->changed.wait(lock, [&] { return core_->stop || !core_->inflight.empty(); });
        continue;
      }
      lock.unlock();
      try {
        poll_once();
      } catch (const std::exception& ex) {  // never let the poller thread die
        warn_str(where_comm() + "NCCL poller: " + ex.what());
      }
      lock.lock();
      // Fast while a thread blocks on an op (barrier), relaxed otherwise.
      auto period = core_->host_waiters > 0 ? std::chrono::microseconds(50)
                                            : std::chrono::microseconds(1000);
      core_->changed.wait_for(lock, period);
    }
  }

  void poll_once() {
    std::vector<std::shared_ptr<Entry>> started, done;
    std::shared_ptr<Entry> culprit;
    std::string failure;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      // Ops complete in issue order on one stream: stop at the first one still running.
      while (!core_->inflight.empty()) {
        auto e = core_->inflight.front();
        cudaError_t q = cudaEventQuery(e->end);
        if (q != cudaSuccess && q != cudaErrorNotReady) cudaGetLastError();
        if (e->state == Entry::State::Failed) {
          // Aborted: hold its tensors until the GPU let go of them (or reported an error).
          if (q == cudaErrorNotReady) break;
          core_->inflight.pop_front();
          continue;
        }
        if (!e->started && (q == cudaSuccess || cudaEventQuery(e->start) == cudaSuccess)) {
          e->started = true;
          started.push_back(e);
        }
        if (q == cudaSuccess) {
          done.push_back(e);
          core_->inflight.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady) {
          failure = e->where + cuda_error(q, "cudaEventQuery") + "; the communicator was aborted";
          culprit = e;
        } else if (now_seconds() > e->deadline) {
          failure = e->where + fmt::format(
              "did not complete within {:.0f} s (DTL_NCCL_TIMEOUT); the communicator was "
              "aborted. A rank issued a different op or none (compare the op numbers # of the "
              "ranks), or a peer died or hangs.", core_->timeout);
          culprit = e;
        }
        break;
      }
      if (failure.empty()) {
        std::string async = core_->async_error();
        if (!async.empty()) {
          culprit = core_->inflight.empty() ? nullptr : core_->inflight.front();
          failure = (culprit ? culprit->where : where_comm()) + async +
                    "; the communicator was aborted";
        }
      }
    }
    for (auto& e : started) mark_started(*e->record);
    for (auto& e : done) {
      // The record is completed before a waiter can return (barrier counts only then).
      mark_finished(*e->record, true);
      std::lock_guard<std::mutex> lock(core_->mu);
      e->state = Entry::State::Done;
      e->keep.clear();
      e->finish = nullptr;
    }
    if (!done.empty()) core_->changed.notify_all();
    if (!failure.empty()) abort_comm(failure, culprit);
  }

  std::string where_comm() const {
    return fmt::format("{}comm '{}': ", rank_prefix(), name());
  }

  // Abort the communicator (kernels stuck in it return) and fail every op not completed.
  void abort_comm(const std::string& why, const std::shared_ptr<Entry>& culprit) {
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      if (core_->aborted) return;
      core_->aborted = true;
      core_->error = why;
      comm = core_->comm;
      core_->comm = nullptr;
    }
    warn_str(why);
    {
      // Launches hold the issue lock while calling NCCL; take it so the communicator is not
      // freed under one, unless the launcher itself is stuck (a full stream blocks kernel
      // launches) and would never let go.
      std::unique_lock<std::timed_mutex> issue(issue_mu_, std::defer_lock);
      (void)issue.try_lock_for(std::chrono::seconds(2));
      DeviceGuard guard(core_->device, false);
      if (comm) ncclCommAbort(comm);
    }
    std::vector<std::shared_ptr<Entry>> failed;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      for (auto& e : core_->inflight)
        if (e->state == Entry::State::Pending) failed.push_back(e);
    }
    for (auto& e : failed) {
      mark_finished(*e->record, false);
      std::lock_guard<std::mutex> lock(core_->mu);
      e->state = Entry::State::Failed;
      e->error = e == culprit ? why : e->where + "aborted because an earlier op failed: " + why;
    }
    core_->changed.notify_all();
  }

  std::shared_ptr<Comm> bootstrap_;  // MPI comm with the same members: ids and splits
  std::shared_ptr<Core> core_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;      // the caller's stream position at issue (reused)
  void* barrier_buf_ = nullptr;      // one int32 on the device, all-reduced by barrier()
  std::timed_mutex issue_mu_;        // held while enqueueing (and by abort, briefly)
  std::condition_variable_any turn_;
  uint64_t next_launch_ = 1;         // sequence number allowed to enqueue next
  std::thread poller_;
};

}  // namespace

std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name) {
  DTL_CHECK(bootstrap.backend() == "mpi", "make_nccl_comm: the bootstrap comm must be an MPI comm");
  int devices = cuda_device_count();
  DTL_CHECK(device_index >= 0 && device_index < devices,
            fmt::format("cuda:{} does not exist ({} CUDA devices)", device_index, devices));
  return std::make_shared<NcclComm>(bootstrap.dup(), device_index, name);
}

std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name,
                                     int local_ranks) {
  nccl_check_local_ranks(local_ranks, cuda_device_count());
  return make_nccl_comm(bootstrap, device_index, name);
}

}  // namespace dtl
