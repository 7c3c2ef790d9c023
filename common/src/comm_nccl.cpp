// The NCCL backend's device layer (the engine, dtl/comm_engine.hpp, does everything else:
// validation, padding, issue order, keep-alive, completion, timeouts, abort, messages). This
// file only creates and destroys NCCL communicators, launches NCCL calls on a CUDA stream and
// records and queries CUDA events. Compiled only when CUDA + NCCL >= 2.10 are found
// (comm_nccl_stub.cpp otherwise). Uses the CUDA runtime directly, so it builds against a
// CPU-only LibTorch too (CI builds it without a GPU and tests its no-device error path). With a
// CUDA LibTorch (DTL_TORCH_HAS_CUDA, set by cmake/DtlGpu.cmake) it follows LibTorch's current
// stream.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#if DTL_FAKE_CUDA && DTL_TORCH_HAS_CUDA
// The CPU test build (common/tests/fake_cuda) declares its own cudaStream_t and friends; the
// LibTorch-CUDA branch would pull in the real ones. cmake/DtlGpu.cmake gives DTL_TORCH_HAS_CUDA to
// dtl_common alone.
#error "comm_nccl.cpp: the fake CUDA build (DTL_FAKE_CUDA) cannot take the LibTorch-CUDA branch"
#endif
#if DTL_TORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "dtl/comm_engine.hpp"
#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"
#include "dtl/log.hpp"

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

// Makes `device` the calling thread's current CUDA device if it is not already, and leaves it
// so. It never switches back: a thread that never chose a device reports device 0, and making
// device 0 current again would create a CUDA context on GPU 0 (CUDA >= 12 creates it in
// cudaSetDevice), in every rank. With one GPU per rank, every comm of a rank is on the rank's
// GPU, so a thread that issues ops is left on the GPU it uses anyway. Cleanup paths
// (destructors, the poller) pass check = false: they must not throw.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool check = true) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
    cudaError_t rc = cudaSetDevice(device);
    if (check) cuda_check(rc, "cudaSetDevice");
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
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
  std::string where_;
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


// The NCCL library loaded at run time (2.18.1 is 21801); 0 if it cannot say.
int nccl_runtime_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

#define DTL_NCCL_HAS_CONFIG (NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0))
#if DTL_NCCL_HAS_CONFIG
// Every communicator is asked to block: this layer relies on NCCL calls having finished (or
// failed) when they return; a non-blocking communicator returns ncclInProgress instead.
ncclConfig_t blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  return config;
}
#endif

// Two NCCL environment variables change what this layer relies on, and NCCL reads each once, at
// the first communicator a process makes: so they are settled here, before every communicator
// (only the first call matters to a real NCCL).
//  - NCCL_COMM_BLOCKING: when set, NCCL (2.14 through at least 2.30) takes it over the config's
//    `blocking`, so NCCL_COMM_BLOCKING=0 would make every communicator non-blocking whatever
//    blocking_config() says. Set to 1, with a note.
//  - NCCL_RUNTIME_CONNECT (NCCL >= 2.22, default 1): a communicator connects each collective
//    algorithm at its first use, inside the launch, and the host blocks there until every peer
//    makes the same first use. Two comms whose first ops two ranks issue in different orders
//    (one thread per comm, as pipeline and overlap code does) then wait on each other for good,
//    before any timeout can act. Unset, it is set to 0: collectives connect when the communicator
//    is made, which every rank does in the same order (making a comm is collective). Set by the
//    user, it is kept, with a note. Point-to-point connects at first use either way.
void settle_nccl_environment() {
  const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
  if (blocking && *blocking && std::string(blocking) != "1") {
    static std::once_flag noted;
    std::call_once(noted, [&] {
      if (log_rank() == 0)
        std::fprintf(stderr, "dtl: NCCL_COMM_BLOCKING=%s overridden to 1: the nccl backend needs "
                             "blocking communicators, and NCCL lets the variable override the "
                             "communicator's own setting\n", blocking);
    });
    setenv("NCCL_COMM_BLOCKING", "1", 1);
  }
  const char* connect = std::getenv("NCCL_RUNTIME_CONNECT");
  if (!connect || !*connect) {
    setenv("NCCL_RUNTIME_CONNECT", "0", 1);
  } else if (std::string(connect) != "0") {
    static std::once_flag noted;
    std::call_once(noted, [&] {
      if (log_rank() == 0)
        std::fprintf(stderr, "dtl: NCCL_RUNTIME_CONNECT=%s kept: each collective connects at its "
                             "first use and blocks the host until every peer makes the same first "
                             "use; comms driven from several threads must issue their first ops "
                             "in the same order on every rank (notes/gpu.md)\n", connect);
    });
  }
}

// A new NCCL communicator over the members of `bootstrap` (MPI), on the current device. Rank 0
// makes the unique id and the bootstrap carries it to everyone, with one byte more saying
// whether rank 0 has one: if ncclGetUniqueId fails there, the others fail too instead of
// waiting in a broadcast rank 0 never joins.
ncclComm_t init_comm(Comm& bootstrap, const std::string& name) {
  ncclUniqueId id;
  auto id_bytes = torch::zeros({static_cast<int64_t>(sizeof(id)) + 1}, torch::kUInt8);
  std::exception_ptr id_error;
  if (bootstrap.rank() == 0) {
    try {
      nccl_check(ncclGetUniqueId(&id), rank_prefix(), "ncclGetUniqueId");
      std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
      id_bytes.data_ptr<uint8_t>()[sizeof(id)] = 1;
    } catch (...) {
      id_error = std::current_exception();
    }
  }
  bootstrap.broadcast(id_bytes, 0);
  if (id_error) std::rethrow_exception(id_error);
  if (id_bytes.data_ptr<uint8_t>()[sizeof(id)] != 1)
    throw Error(fmt::format("{}comm '{}': rank 0 could not create NCCL's unique id "
                            "(ncclGetUniqueId failed there: see rank 0's error)",
                            rank_prefix(), name));
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
  ncclComm_t comm = nullptr;
#if DTL_NCCL_HAS_CONFIG
  if (nccl_runtime_version() >= NCCL_VERSION(2, 14, 0)) {
    ncclConfig_t config = blocking_config();
    nccl_check(ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config),
               rank_prefix(), "ncclCommInitRankConfig");
    return comm;
  }
#endif
  nccl_check(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), rank_prefix(),
             "ncclCommInitRank");
  return comm;
}

// One op's start and end events. Independent of the communicator: it may outlive it.
class NcclOp : public engine::DeviceOp {
 public:
  explicit NcclOp(int device) : device_(device) {}
  ~NcclOp() override {
    if (start) cudaEventDestroy(start);
    if (end) cudaEventDestroy(end);
  }
  Status query(std::string& error) noexcept override {
    cudaError_t q = cudaEventQuery(end);
    if (q == cudaSuccess) return Status::Done;
    if (q != cudaErrorNotReady) {
      cudaGetLastError();  // a CUDA error is not "not done yet"
      error = cuda_error(q, "cudaEventQuery");
      return Status::Failed;
    }
    q = cudaEventQuery(start);
    if (q == cudaSuccess) return Status::Running;
    if (q != cudaErrorNotReady) cudaGetLastError();
    return Status::Queued;
  }
  void order_caller_after() override {
    DeviceGuard guard(device_);
    cuda_check(cudaStreamWaitEvent(caller_stream(device_), end, 0), "cudaStreamWaitEvent");
  }
  cudaEvent_t start = nullptr, end = nullptr;

 private:
  int device_;
};

// One ncclComm_t, its own stream, and the scratch int a barrier all-reduces.
class NcclDevice : public engine::DeviceLayer {
 public:
  // Adopts `comm` (aborted if this constructor throws) and warms it up: a one-element all-reduce
  // that every member runs now, while the comm is being made, so each comm's first op (and with
  // it whatever NCCL connects at first use) happens in the same order on every rank, whatever
  // order threads issue their own ops in later. A member that never joins (it failed to make the
  // comm) ends it in an error after `timeout_s`, not a hang.
  NcclDevice(ncclComm_t comm, int device, int rank, double timeout_s)
      : comm_(comm), device_(device), timeout_s_(timeout_s) {
    try {
      DeviceGuard guard(device);
      int nccl_rank = -1;
      nccl_check(ncclCommUserRank(comm, &nccl_rank), rank_prefix(), "ncclCommUserRank");
      DTL_CHECK(nccl_rank == rank, fmt::format("NCCL ranked this process {} but MPI ranked it {}",
                                               nccl_rank, rank));
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
      // Stream-ordered (de)allocation: cudaFree would wait for every stream of the device, so
      // destroying a comm would wait for the kernels of every other comm and of the caller.
      cuda_check(cudaMallocAsync(&barrier_buf_, sizeof(int32_t), stream_), "cudaMallocAsync");
      cuda_check(cudaMemsetAsync(barrier_buf_, 0, sizeof(int32_t), stream_), "cudaMemsetAsync");
      warm_up();
    } catch (...) {
      abort();
      release_cuda();
      throw;
    }
  }
  ~NcclDevice() override {
    abort();  // the engine closed or aborted it already, unless it never ran
    release_cuda();
  }

  torch::Device device() const override {
#if DTL_FAKE_CUDA  // the CPU test build (common/tests/fake_cuda): "device memory" is host memory
    return torch::kCPU;
#else
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_));
#endif
  }

  std::unique_ptr<engine::DeviceOp> enqueue(const engine::DeviceCall& call,
                                            const std::function<void()>& finish) override {
    DeviceGuard guard(device_);
    auto op = std::make_unique<NcclOp>(device_);
    cuda_check(cudaEventCreateWithFlags(&op->start, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&op->end, cudaEventDisableTiming), "cudaEventCreate");
    const ncclDataType_t send_type = call.send.defined() ? nccl_dtype(call.send) : ncclInt32;
    const ncclDataType_t recv_type = call.recv.defined() ? nccl_dtype(call.recv) : ncclInt32;

    // After the caller's current stream (the kernels that produced the inputs). No
    // recordStream onto stream_: the engine keeps the tensors until the end event, and an
    // event recorded on this stream would outlive it when a tensor outlives its comm.
    cuda_check(cudaEventRecord(ready_, caller_stream(device_)), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    cuda_check(cudaEventRecord(op->start, stream_), "cudaEventRecord");

    const size_t n = call.recv.defined() ? static_cast<size_t>(call.recv.numel()) : 0;
    void* sbuf = call.send.defined() ? call.send.data_ptr() : nullptr;
    void* rbuf = call.recv.defined() ? call.recv.data_ptr() : nullptr;
    const char* where = "";
    switch (call.type) {
      case OpType::AllReduce:
        nccl_check(ncclAllReduce(sbuf, rbuf, n, recv_type, nccl_op(call.reduce), comm_, stream_),
                   where, "ncclAllReduce");
        break;
      case OpType::ReduceScatter:
        nccl_check(ncclReduceScatter(sbuf, rbuf, n, recv_type, nccl_op(call.reduce), comm_,
                                     stream_), where, "ncclReduceScatter");
        break;
      case OpType::AllGather:
        nccl_check(ncclAllGather(sbuf, rbuf, call.send.numel(), send_type, comm_, stream_), where,
                   "ncclAllGather");
        break;
      case OpType::Broadcast:
        nccl_check(ncclBroadcast(sbuf, rbuf, n, recv_type, call.peer, comm_, stream_), where,
                   "ncclBroadcast");
        break;
      case OpType::Reduce:
        nccl_check(ncclReduce(sbuf, rbuf, n, recv_type, nccl_op(call.reduce), call.peer, comm_,
                              stream_), where, "ncclReduce");
        break;
      case OpType::AllToAll: {
        // NCCL has no all-to-all: size grouped send/recv pairs.
        const size_t chunk = n / call.size;
        const size_t bytes = chunk * call.send.element_size();
        NcclGroup group(where);
        for (int p = 0; p < call.size; ++p) {
          nccl_check(ncclSend(static_cast<char*>(sbuf) + p * bytes, chunk, send_type, p, comm_,
                              stream_), where, "ncclSend");
          nccl_check(ncclRecv(static_cast<char*>(rbuf) + p * bytes, chunk, recv_type, p, comm_,
                              stream_), where, "ncclRecv");
        }
        group.end();
        break;
      }
      case OpType::Barrier:
        // A one-element all-reduce on the scratch int; the engine makes wait() block the host.
        nccl_check(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_,
                                 stream_), where, "ncclAllReduce (barrier)");
        break;
      case OpType::Send:
        nccl_check(ncclSend(sbuf, call.send.numel(), send_type, call.peer, comm_, stream_), where,
                   "ncclSend");
        break;
      case OpType::Recv:
        nccl_check(ncclRecv(rbuf, n, recv_type, call.peer, comm_, stream_), where, "ncclRecv");
        break;
      case OpType::SendRecv: {
        NcclGroup group(where);
        nccl_check(ncclSend(sbuf, call.send.numel(), send_type, call.peer, comm_, stream_), where,
                   "ncclSend");
        nccl_check(ncclRecv(rbuf, n, recv_type, call.peer2, comm_, stream_), where, "ncclRecv");
        group.end();
        break;
      }
      case OpType::Split: break;  // split()
    }

    // The copy-back (padded or non-contiguous output), on this stream after the op.
    if (finish) {
#if DTL_TORCH_HAS_CUDA
      const auto nccl_stream =
          c10::cuda::getStreamFromExternal(stream_, static_cast<c10::DeviceIndex>(device_));
      c10::cuda::CUDAStreamGuard on_nccl_stream(nccl_stream);
      finish();
#else
      // A CPU LibTorch has no CUDA tensors: only the CPU test build (fake CUDA, host memory)
      // gets here. Its tensor ops run on the host at once, so the copy runs as a host function
      // on this stream, after the op (the engine keeps `finish` alive until the op is over).
      cuda_check(cudaLaunchHostFunc(stream_, [](void* f) { (*static_cast<const std::function<void()>*>(f))(); },
                                    const_cast<std::function<void()>*>(&finish)),
                 "cudaLaunchHostFunc");
#endif
    }
    cuda_check(cudaEventRecord(op->end, stream_), "cudaEventRecord");
    return op;
  }

  std::string async_error() noexcept override {
    if (!comm_) return "";
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
    if (rc != ncclSuccess)
      return fmt::format("ncclCommGetAsyncError failed: {}", ncclGetErrorString(rc));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    if (async == ncclInProgress) return "";
#endif
    if (async == ncclSuccess) return "";
    return fmt::format("NCCL async error: {}{}", ncclGetErrorString(async), nccl_last_error(comm_));
  }

  void abort() noexcept override {
    if (!comm_) return;
    DeviceGuard guard(device_, false);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  bool idle() noexcept override {
    if (!stream_) return true;
    cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaErrorNotReady) return false;
    if (q != cudaSuccess) cudaGetLastError();  // a broken stream runs nothing more
    return true;
  }

  void close() noexcept override {
    if (!comm_) return;
    DeviceGuard guard(device_, false);
    ncclCommDestroy(comm_);  // flushes; collective within a node
    comm_ = nullptr;
  }

  // ncclCommSplit where the NCCL loaded at run time has it (>= 2.18; the header alone does not
  // say: an older libnccl.so may be loaded), else a fresh communicator over the new MPI comm.
  std::unique_ptr<engine::DeviceLayer> split(const std::shared_ptr<Comm>& sub, int color,
                                             int key) override {
    DeviceGuard guard(device_);
    settle_nccl_environment();
#if DTL_NCCL_HAS_SPLIT
    if (nccl_runtime_version() >= NCCL_VERSION(2, 18, 0)) {
      ncclComm_t child = nullptr;
      ncclConfig_t config = blocking_config();
      nccl_check(ncclCommSplit(comm_, sub ? color : NCCL_SPLIT_NOCOLOR, key, &child, &config),
                 rank_prefix(), "ncclCommSplit");
      if (!sub) return nullptr;
      return std::make_unique<NcclDevice>(child, device_, sub->rank(), timeout_s_);
    }
#else
    (void)color;
    (void)key;
#endif
    if (!sub) return nullptr;
    return std::make_unique<NcclDevice>(init_comm(*sub, "split"), device_, sub->rank(),
                                        timeout_s_);
  }

  void bind_thread() noexcept override { cudaSetDevice(device_); }

 private:
  void warm_up() {
    nccl_check(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_),
               rank_prefix(), "ncclAllReduce (warm-up of a new communicator)");
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, "cudaStreamQuery (warm-up of a new communicator)");
      const std::string async = async_error();
      if (!async.empty()) throw Error(rank_prefix() + "warm-up of a new communicator: " + async);
      if (std::chrono::steady_clock::now() > deadline)
        throw Error(fmt::format("{}the warm-up all-reduce of a new NCCL communicator did not "
                                "complete within {} s (DTL_NCCL_TIMEOUT): a member never joined "
                                "(did making the comm fail there? see the other ranks' errors)",
                                rank_prefix(), timeout_s_));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void release_cuda() noexcept {
    DeviceGuard guard(device_, false);
    if (barrier_buf_) cudaFreeAsync(barrier_buf_, stream_);  // after the stream's work
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    barrier_buf_ = nullptr;
    ready_ = nullptr;
    stream_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;        // null once closed or aborted
  int device_;
  double timeout_s_;                 // for the warm-up; children inherit it
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;      // the caller's stream position at issue (reused)
  void* barrier_buf_ = nullptr;      // one int32 on the device, all-reduced by barrier()
};

// "GPU-8f3a2c1e-..." as nvidia-smi -L prints it: the identity of cuda:`index` in this process.
std::string gpu_uuid(int index) {
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::string hex;
  for (int i = 0; i < 16; ++i) hex += fmt::format("{:02x}", b[i]);
  return fmt::format("GPU-{}-{}-{}-{}-{}", hex.substr(0, 8), hex.substr(8, 4), hex.substr(12, 4),
                     hex.substr(16, 4), hex.substr(20, 12));
}

}  // namespace

std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name) {
  DTL_CHECK(bootstrap.backend() == "mpi", "make_nccl_comm: the bootstrap comm must be an MPI comm");
  int devices = cuda_device_count();
  DTL_CHECK(device_index >= 0 && device_index < devices,
            fmt::format("cuda:{} does not exist ({} CUDA devices)", device_index, devices));
  engine::Options defaults;
  defaults.backend = "nccl";
  defaults.read_env = true;  // every Comm, split() and dup() included, reads them when made
  const engine::Options options = engine::options_from_env(defaults);
  settle_nccl_environment();  // before NCCL's first look at its environment
  std::shared_ptr<Comm> boot = bootstrap.dup();  // the engine's for splits; ours for the id
  std::unique_ptr<engine::DeviceLayer> device;
  {
    DeviceGuard guard(device_index);
    device = std::make_unique<NcclDevice>(init_comm(*boot, name), device_index, boot->rank(),
                                          options.timeout_s);
  }
  static std::once_flag logged;
  std::call_once(logged, [&] {
    if (log_rank() == 0)
      std::fprintf(stderr, "dtl: NCCL %s, op timeout %.0f s (DTL_NCCL_TIMEOUT)\n",
                   nccl_version_string().c_str(), options.timeout_s);
  });
  return engine::make_comm(boot, std::move(device), name, options);
}

std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name,
                                     int local_ranks) {
  // Every rank's GPU identity, over MPI. A rank that cannot read its own still takes part
  // (with an empty one), so all fail together instead of waiting for it.
  constexpr int64_t kLen = 48;
  std::string mine;
  std::exception_ptr error;
  try {
    cuda_device_count();  // no GPU at all: say so, not what reading a UUID failed with
    mine = gpu_uuid(device_index);
  } catch (...) {
    error = std::current_exception();
  }
  auto in = torch::zeros({kLen}, torch::kUInt8);
  std::memcpy(in.data_ptr(), mine.data(), std::min<size_t>(mine.size(), kLen - 1));
  auto all = torch::zeros({bootstrap.size() * kLen}, torch::kUInt8);
  bootstrap.all_gather(all, in);
  if (error) std::rethrow_exception(error);
  std::vector<std::string> uuids;
  for (int r = 0; r < bootstrap.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * kLen);
    uuids.emplace_back(p, strnlen(p, kLen));
    DTL_CHECK(!uuids.back().empty(),
              fmt::format("rank {} could not read its GPU's identity (see its error)", r));
  }
  nccl_check_distinct_gpus(uuids, local_ranks);
  return make_nccl_comm(bootstrap, device_index, name);
}

}  // namespace dtl
