// NcclComm: Comm over NCCL for CUDA tensors. Compiled only when CUDA + NCCL are found
// (comm_nccl_stub.cpp otherwise). Uses the CUDA runtime directly, so it builds against a
// CPU-only LibTorch too (CI builds it without a GPU and tests its no-device error path).
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"

namespace dtl {

bool nccl_compiled() { return true; }

static void cuda_check(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  throw Error(fmt::format("{}{} failed: {} ({})", rank_prefix(), call, cudaGetErrorString(rc),
                          cudaGetErrorName(rc)));
}

static void nccl_check(ncclResult_t rc, const std::string& where, const char* call) {
  if (rc == ncclSuccess) return;
  throw Error(fmt::format("{}{} failed: {}", where, call, ncclGetErrorString(rc)));
}

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

void nccl_check_tensor(const torch::Tensor& t, int device_index, const char* op) {
  DTL_CHECK(t.is_cuda(), fmt::format("{}: tensor is on {} but the nccl backend moves CUDA tensors "
                                     "(use --backend mpi for CPU tensors, or .to(torch::kCUDA))",
                                     op, t.device().str()));
  DTL_CHECK(t.device().index() == device_index,
            fmt::format("{}: tensor is on {} but this rank's NCCL comm uses cuda:{}", op,
                        t.device().str(), device_index));
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
      throw Error(fmt::format("{}nccl backend: dtype {} is not supported", rank_prefix(),
                              c10::toString(t.scalar_type())));
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

// Completion of an op on the comm stream: an event, plus the tensors it must keep alive.
struct NcclState : Work::State {
  cudaEvent_t done = nullptr;
  std::vector<torch::Tensor> keep_alive;
  std::function<void()> finish;
  ncclComm_t comm = nullptr;
  bool waited = false;
  ~NcclState() override {
    if (done) cudaEventDestroy(done);
  }
  void check_async() {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess)
      throw Error(fmt::format("{}NCCL async error: {}", rank_prefix(), ncclGetErrorString(async)));
  }
  // NCCL semantics: the caller's stream (here the legacy default stream, LibTorch's default)
  // waits for the op; the CPU does not block.
  void wait() override {
    check_async();
    if (waited) return;
    cuda_check(cudaStreamWaitEvent(cudaStreamLegacy, done, 0), "cudaStreamWaitEvent");
    if (finish) finish();  // copy-back enqueued after the wait on the default stream
    waited = true;
  }
  bool is_completed() override {
    check_async();
    return cudaEventQuery(done) == cudaSuccess;
  }
};

class NcclComm : public Comm {
 public:
  NcclComm(Comm& bootstrap, int device, const std::string& name)
      : Comm(bootstrap.rank(), bootstrap.size(), name, bootstrap.world_ranks()),
        device_(device),
        bootstrap_(bootstrap.dup()) {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    // Rank 0 makes the unique id; the bootstrap (MPI) comm carries it to everyone.
    ncclUniqueId id;
    auto id_bytes = torch::zeros({static_cast<int64_t>(sizeof(id))}, torch::kUInt8);
    if (rank() == 0) {
      nccl_check(ncclGetUniqueId(&id), rank_prefix(), "ncclGetUniqueId");
      std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
    }
    bootstrap_->broadcast(id_bytes, 0);
    std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
    nccl_check(ncclCommInitRank(&comm_, size(), id, rank()), rank_prefix(), "ncclCommInitRank");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclComm() override {
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string backend() const override { return "nccl"; }
  torch::Device device() const override {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

 protected:
  Work launch(Op op) override {
    OpRecord& rec = *op.record;
    if (op.type == OpType::Split) {
      std::shared_ptr<Comm> sub = bootstrap_->split(op.color, op.key);
      if (sub) *op.split_result = std::make_shared<NcclComm>(
                   *sub, device_, fmt::format("{}/split({})", name(), op.color));
      mark_started(rec);
      mark_finished(rec, true);
      return Work();
    }
    auto state = std::make_shared<NcclState>();
    state->comm = comm_;
    state->finish = std::move(op.finish);
    for (auto* t : {&op.send, &op.recv})
      if (t->defined()) {
        nccl_check_tensor(*t, device_, to_string(op.type));
        state->keep_alive.push_back(*t);
      }
    const std::string at = where(rec);
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    // Order after everything already queued on the default stream (e.g. the backward that
    // produced a gradient), then run on our own stream.
    cudaEvent_t ready;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(ready, cudaStreamLegacy), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    mark_started(rec);
    const size_t n = op.recv.defined() ? static_cast<size_t>(op.recv.numel()) : 0;
    switch (op.type) {
      case OpType::AllReduce:
        nccl_check(ncclAllReduce(op.send.data_ptr(), op.recv.data_ptr(), n, nccl_dtype(op.recv),
                                 nccl_op(op.reduce), comm_, stream_), at, "ncclAllReduce");
        break;
      case OpType::ReduceScatter:
        nccl_check(ncclReduceScatter(op.send.data_ptr(), op.recv.data_ptr(), n, nccl_dtype(op.recv),
                                     nccl_op(op.reduce), comm_, stream_), at, "ncclReduceScatter");
        break;
      case OpType::AllGather:
        nccl_check(ncclAllGather(op.send.data_ptr(), op.recv.data_ptr(), op.send.numel(),
                                 nccl_dtype(op.send), comm_, stream_), at, "ncclAllGather");
        break;
      case OpType::Broadcast:
        nccl_check(ncclBroadcast(op.send.data_ptr(), op.recv.data_ptr(), n, nccl_dtype(op.recv),
                                 op.peer, comm_, stream_), at, "ncclBroadcast");
        break;
      case OpType::Reduce:
        nccl_check(ncclReduce(op.send.data_ptr(), op.recv.data_ptr(), n, nccl_dtype(op.recv),
                              nccl_op(op.reduce), op.peer, comm_, stream_), at, "ncclReduce");
        break;
      case OpType::AllToAll: {
        // NCCL has no all-to-all: n grouped send/recv pairs.
        const size_t chunk = n / size();
        const size_t bytes = chunk * op.send.element_size();
        auto* sbuf = static_cast<char*>(op.send.data_ptr());
        auto* rbuf = static_cast<char*>(op.recv.data_ptr());
        nccl_check(ncclGroupStart(), at, "ncclGroupStart");
        for (int p = 0; p < size(); ++p) {
          nccl_check(ncclSend(sbuf + p * bytes, chunk, nccl_dtype(op.send), p, comm_, stream_), at,
                     "ncclSend");
          nccl_check(ncclRecv(rbuf + p * bytes, chunk, nccl_dtype(op.recv), p, comm_, stream_), at,
                     "ncclRecv");
        }
        nccl_check(ncclGroupEnd(), at, "ncclGroupEnd");
        break;
      }
      case OpType::Barrier: {
        auto one = torch::ones({1}, torch::TensorOptions().dtype(torch::kInt32).device(device()));
        state->keep_alive.push_back(one);
        nccl_check(ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclInt32, ncclSum, comm_,
                                 stream_), at, "ncclAllReduce (barrier)");
        break;
      }
      case OpType::Send:
        nccl_check(ncclSend(op.send.data_ptr(), op.send.numel(), nccl_dtype(op.send), op.peer,
                            comm_, stream_), at, "ncclSend");
        break;
      case OpType::Recv:
        nccl_check(ncclRecv(op.recv.data_ptr(), n, nccl_dtype(op.recv), op.peer, comm_, stream_),
                   at, "ncclRecv");
        break;
      case OpType::SendRecv:
        nccl_check(ncclGroupStart(), at, "ncclGroupStart");
        nccl_check(ncclSend(op.send.data_ptr(), op.send.numel(), nccl_dtype(op.send), op.peer,
                            comm_, stream_), at, "ncclSend");
        nccl_check(ncclRecv(op.recv.data_ptr(), n, nccl_dtype(op.recv), op.peer2, comm_, stream_),
                   at, "ncclRecv");
        nccl_check(ncclGroupEnd(), at, "ncclGroupEnd");
        break;
      case OpType::Split: break;
    }
    cuda_check(cudaEventCreateWithFlags(&state->done, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(state->done, stream_), "cudaEventRecord");
    // The record completes when the GPU finishes; the trace reads it at wait time.
    mark_finished(rec, true);
    return Work(state);
  }

 private:
  int device_;
  std::shared_ptr<Comm> bootstrap_;  // MPI comm with the same members: ids and splits
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::shared_ptr<Comm> make_nccl_comm(Comm& bootstrap, int device_index, const std::string& name) {
  DTL_CHECK(bootstrap.backend() == "mpi", "make_nccl_comm: the bootstrap comm must be an MPI comm");
  int devices = cuda_device_count();
  DTL_CHECK(device_index >= 0 && device_index < devices,
            fmt::format("cuda:{} does not exist ({} CUDA devices)", device_index, devices));
  return std::make_shared<NcclComm>(bootstrap, device_index, name);
}

}  // namespace dtl
