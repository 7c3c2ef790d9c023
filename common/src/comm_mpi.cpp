// MpiComm: Comm over OpenMPI for CPU tensors.
#include "dtl/comm_mpi.hpp"

#include <fmt/format.h>

#include "dtl/error.hpp"

namespace dtl {

void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(fmt::format("{}{} failed: {}", rank_prefix(), call, std::string(msg, len)));
}

// ---------------------------------------------------------------- dtypes and reductions

namespace {

// MPI has no bfloat16/float16: they travel as an opaque 2-byte type and reduce with
// user-defined ops that widen to float, combine, and round back (as NCCL does on the wire).
template <typename T, typename F>
void reduce_16bit(void* in, void* inout, int* len, F combine) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = T(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
}
template <typename T>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_16bit<T>(in, inout, len, [](float x, float y) { return x + y; });
}
template <typename T>
void max16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_16bit<T>(in, inout, len, [](float x, float y) { return x > y ? x : y; });
}
template <typename T>
void min16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_16bit<T>(in, inout, len, [](float x, float y) { return x < y ? x : y; });
}

struct Custom16 {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL, f16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum, bf16_max, bf16_min, f16_sum, f16_max, f16_min;
  Custom16() {
    mpi_check(MPI_Type_contiguous(2, MPI_BYTE, &bf16), "MPI_Type_contiguous");
    mpi_check(MPI_Type_commit(&bf16), "MPI_Type_commit");
    mpi_check(MPI_Type_contiguous(2, MPI_BYTE, &f16), "MPI_Type_contiguous");
    mpi_check(MPI_Type_commit(&f16), "MPI_Type_commit");
    MPI_Op_create(&sum16<c10::BFloat16>, 1, &bf16_sum);
    MPI_Op_create(&max16<c10::BFloat16>, 1, &bf16_max);
    MPI_Op_create(&min16<c10::BFloat16>, 1, &bf16_min);
    MPI_Op_create(&sum16<c10::Half>, 1, &f16_sum);
    MPI_Op_create(&max16<c10::Half>, 1, &f16_max);
    MPI_Op_create(&min16<c10::Half>, 1, &f16_min);
  }
};
// Created on first use (after MPI_Init); freed by MPI_Finalize.
const Custom16& custom16() {
  static Custom16 c;
  return c;
}

MPI_Datatype mpi_dtype(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return MPI_FLOAT;
    case torch::kFloat64: return MPI_DOUBLE;
    case torch::kInt32: return MPI_INT32_T;
    case torch::kInt64: return MPI_INT64_T;
    case torch::kInt8: return MPI_INT8_T;
    case torch::kUInt8: return MPI_UINT8_T;
    case torch::kBFloat16: return custom16().bf16;
    case torch::kFloat16: return custom16().f16;
    default:
      throw Error(fmt::format("{}mpi backend: dtype {} is not supported (float32, float64, "
                              "float16, bfloat16, int32, int64, int8, uint8 are)",
                              rank_prefix(), c10::toString(t.scalar_type())));
  }
}

MPI_Op mpi_op(ReduceOp op, const torch::Tensor& t) {
  const bool bf16 = t.scalar_type() == torch::kBFloat16, f16 = t.scalar_type() == torch::kFloat16;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // sum on the wire, divide after
      return bf16 ? custom16().bf16_sum : f16 ? custom16().f16_sum : MPI_SUM;
    case ReduceOp::Max: return bf16 ? custom16().bf16_max : f16 ? custom16().f16_max : MPI_MAX;
    case ReduceOp::Min: return bf16 ? custom16().bf16_min : f16 ? custom16().f16_min : MPI_MIN;
  }
  return MPI_SUM;
}

// Avg = Sum / n. Integer tensors truncate toward zero, as NCCL's ncclAvg does.
void finish_avg(ReduceOp op, torch::Tensor& t, int n) {
  if (op != ReduceOp::Avg || n == 1) return;
  if (t.is_floating_point())
    t.div_(n);
  else
    t.div_(n, "trunc");
}

int count_of(const torch::Tensor& t) { return static_cast<int>(t.numel()); }

// Completion state of an MPI op: set by whoever executed it, awaited by Work::wait().
struct MpiState : Work::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  void complete(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    error = std::move(e);
    done = true;
    cv.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
};

}  // namespace

struct MpiComm::Task {
  Op op;
  std::shared_ptr<MpiState> state;
};

// ---------------------------------------------------------------- construction

std::shared_ptr<MpiComm> MpiComm::create(MPI_Comm base, const std::string& name) {
  MPI_Comm comm;
  mpi_check(MPI_Comm_dup(base, &comm), "MPI_Comm_dup");
  // Errors come back as return codes (turned into dtl::Error) instead of aborting the job.
  mpi_check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Which world rank is each member: translate our group's ranks into MPI_COMM_WORLD's.
  MPI_Group group, world_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> mine(size), world(size);
  for (int i = 0; i < size; ++i) mine[i] = i;
  MPI_Group_translate_ranks(group, size, mine.data(), world_group, world.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  custom16();  // make the 16-bit types while every rank is here (MPI_Type_* are local)
  return std::shared_ptr<MpiComm>(new MpiComm(comm, rank, size, name, std::move(world)));
}

MpiComm::MpiComm(MPI_Comm comm, int rank, int size, std::string name, std::vector<int> world_ranks)
    : Comm(rank, size, std::move(name), std::move(world_ranks)), comm_(comm) {
  worker_ = std::thread([this] { worker_loop(); });
}

MpiComm::~MpiComm() {
  {
    std::lock_guard<std::mutex> lock(qmu_);
    stop_ = true;
  }
  qcv_.notify_all();
  if (worker_.joinable()) worker_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

// ---------------------------------------------------------------- ordering

Work MpiComm::launch(Op op) {
  auto state = std::make_shared<MpiState>();
  std::unique_lock<std::mutex> lock(qmu_);
  if (op.blocking && !busy_ && queue_.empty()) {
    // Fast path: nothing is queued or running, so executing here keeps issue order.
    busy_ = true;
    lock.unlock();
    std::exception_ptr err;
    try {
      execute(op);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    lock.unlock();
    qcv_.notify_all();  // the worker may have been handed ops meanwhile
    state->complete(err);
    return Work(state);
  }
  queue_.push_back(std::make_shared<Task>(Task{std::move(op), state}));
  lock.unlock();
  qcv_.notify_all();
  return Work(state);
}

void MpiComm::worker_loop() {
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(qmu_);
      qcv_.wait(lock, [&] { return (stop_ && queue_.empty()) || (!busy_ && !queue_.empty()); });
      if (queue_.empty()) return;  // stop requested and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr err;
    try {
      execute(task->op);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(qmu_);
      busy_ = false;
    }
    qcv_.notify_all();
    task->state->complete(err);
  }
}

// ---------------------------------------------------------------- the ops

void MpiComm::execute(Op& op) {
  OpRecord& rec = *op.record;
  mark_started(rec);
  try {
    auto check = [&](int rc, const char* call) {
      if (rc == MPI_SUCCESS) return;
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      throw Error(where(rec) + call + " failed: " + std::string(msg, len));
    };
    // A received message must have exactly the size this rank expects.
    auto check_count = [&](MPI_Status& st, const torch::Tensor& t, int src) {
      int got = 0;
      MPI_Get_count(&st, mpi_dtype(t), &got);
      if (got != count_of(t))
        throw Error(where(rec) + fmt::format("rank {} sent {} elements but this rank expects {}",
                                             src, got, count_of(t)));
    };
    const int n = size();
    switch (op.type) {
      case OpType::AllReduce:
        check(MPI_Allreduce(MPI_IN_PLACE, op.recv.data_ptr(), count_of(op.recv),
                            mpi_dtype(op.recv), mpi_op(op.reduce, op.recv), comm_),
              "MPI_Allreduce");
        finish_avg(op.reduce, op.recv, n);
        break;
      case OpType::ReduceScatter:
        check(MPI_Reduce_scatter_block(op.send.data_ptr(), op.recv.data_ptr(), count_of(op.recv),
                                       mpi_dtype(op.recv), mpi_op(op.reduce, op.recv), comm_),
              "MPI_Reduce_scatter_block");
        finish_avg(op.reduce, op.recv, n);
        break;
      case OpType::AllGather:
        check(MPI_Allgather(op.send.data_ptr(), count_of(op.send), mpi_dtype(op.send),
                            op.recv.data_ptr(), count_of(op.send), mpi_dtype(op.recv), comm_),
              "MPI_Allgather");
        break;
      case OpType::Broadcast:
        check(MPI_Bcast(op.recv.data_ptr(), count_of(op.recv), mpi_dtype(op.recv), op.peer, comm_),
              "MPI_Bcast");
        break;
      case OpType::Reduce: {
        const bool root = rank() == op.peer;
        check(MPI_Reduce(root ? MPI_IN_PLACE : op.send.data_ptr(), root ? op.recv.data_ptr() : nullptr,
                         count_of(op.recv), mpi_dtype(op.recv), mpi_op(op.reduce, op.recv),
                         op.peer, comm_),
              "MPI_Reduce");
        if (root) finish_avg(op.reduce, op.recv, n);
        break;
      }
      case OpType::AllToAll:
        check(MPI_Alltoall(op.send.data_ptr(), count_of(op.send) / n, mpi_dtype(op.send),
                           op.recv.data_ptr(), count_of(op.recv) / n, mpi_dtype(op.recv), comm_),
              "MPI_Alltoall");
        break;
      case OpType::Barrier:
        check(MPI_Barrier(comm_), "MPI_Barrier");
        break;
      case OpType::Send:
        check(MPI_Send(op.send.data_ptr(), count_of(op.send), mpi_dtype(op.send), op.peer, op.tag,
                       comm_),
              "MPI_Send");
        break;
      case OpType::Recv: {
        MPI_Status st;
        check(MPI_Recv(op.recv.data_ptr(), count_of(op.recv), mpi_dtype(op.recv), op.peer, op.tag,
                       comm_, &st),
              "MPI_Recv (a larger message than expected truncates)");
        check_count(st, op.recv, op.peer);
        break;
      }
      case OpType::SendRecv: {
        MPI_Status st;
        check(MPI_Sendrecv(op.send.data_ptr(), count_of(op.send), mpi_dtype(op.send), op.peer,
                           op.tag, op.recv.data_ptr(), count_of(op.recv), mpi_dtype(op.recv),
                           op.peer2, op.tag, comm_, &st),
              "MPI_Sendrecv (a larger message than expected truncates)");
        check_count(st, op.recv, op.peer2);
        break;
      }
      case OpType::Split: {
        MPI_Comm sub;
        check(MPI_Comm_split(comm_, op.color < 0 ? MPI_UNDEFINED : op.color, op.key, &sub),
              "MPI_Comm_split");
        if (sub != MPI_COMM_NULL) {
          *op.split_result = MpiComm::create(sub, fmt::format("{}/split({})", name(), op.color));
          MPI_Comm_free(&sub);  // create() duplicated it
        }
        break;
      }
    }
    if (op.finish) op.finish();
  } catch (...) {
    mark_finished(rec, false);
    throw;
  }
  mark_finished(rec, true);
}

}  // namespace dtl
