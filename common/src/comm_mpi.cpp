// MpiComm: Comm over OpenMPI for CPU tensors.
#include "dtl/comm_mpi.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include "dtl/error.hpp"
#include "dtl/net.hpp"
#include "dtl/split.hpp"
#include "dtl/timer.hpp"

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
    // Let go of the op's buffers before anyone can see it complete: a caller that waits and
    // then measures memory (or reuses the buffers) must not race this thread's cleanup.
    task->op = Op();
    {
      std::lock_guard<std::mutex> lock(qmu_);
      busy_ = false;
    }
    qcv_.notify_all();
    task->state->complete(err);
  }
}

// ---------------------------------------------------------------- the ops

// Waits for a nonblocking MPI request without burning a core: test, then sleep briefly.
// Used while the network emulator is on, where waits last milliseconds and oversubscribed
// ranks (4 on 2 cores) must leave the cores to compute; MPI's own waits spin.
static int polite_wait(MPI_Request& req, MPI_Status* status) {
  for (;;) {
    int done = 0;
    int rc = MPI_Test(&req, &done, status ? status : MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

static std::vector<int> to_int(const std::vector<int64_t>& v) {
  return std::vector<int>(v.begin(), v.end());
}
static std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}
static bool all_equal(const std::vector<int>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<int>()) == v.end();
}

// Network emulator (net.hpp). A transfer occupies a window [start, start + modelled cost];
// it completes at max(real transfer done, window end), so the real bytes move *inside* the
// window and a slow real transfer on a loaded machine does not add to the modelled time.
//   collectives: the ranks agree on the window's start (the latest arrival, one tiny
//     all-reduce of timestamps), then the real op runs, then each rank sleeps to the end;
//   point-to-point: the sender books its egress link (transfers queue), sends the window's
//     end as a small header message, then the data; the receiver may not see the data before
//     that end, so a receiver never gets bytes earlier than a real link would deliver them.
// Timestamps are steady_clock (CLOCK_MONOTONIC), shared by every process of one machine:
// the emulator models a cluster on one machine.
static bool is_p2p(OpType t) { return t == OpType::Send || t == OpType::Recv || t == OpType::SendRecv; }

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
    // Run an MPI call: the blocking form normally (MPI's tuned algorithms, lowest latency);
    // under the network emulator, the nonblocking form and a wait that sleeps.
    const bool emulated = net::enabled();
    MPI_Status status;
    auto call = [&](const char* name, auto&& blocking, auto&& nonblocking) {
      if (!emulated) return check(blocking(), name);
      MPI_Request req;
      check(nonblocking(&req), name);
      check(polite_wait(req, &status), name);
    };
    const int n = size();
    const int me = world_ranks()[rank()];
    // ---- emulator, before the real transfer: find this op's window end.
    double window_end = 0;
    if (emulated && op.type != OpType::Split && !is_p2p(op.type)) {
      double arrival = now_seconds(), start = arrival;
      MPI_Request req;
      check(MPI_Iallreduce(&arrival, &start, 1, MPI_DOUBLE, MPI_MAX, comm_, &req), "MPI_Iallreduce (emulator sync)");
      check(polite_wait(req, nullptr), "MPI_Iallreduce (emulator sync)");
      window_end = net::book(net::collective_cost(to_string(op.type), static_cast<double>(rec.bytes),
                                                  world_ranks()),
                             net::spans_nodes(world_ranks()), start);
    }
    // Point-to-point: the sender books its link and tells the receiver when the window ends.
    double header_out = 0, header_in = 0;
    MPI_Request header_req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (emulated && (op.type == OpType::Recv || op.type == OpType::SendRecv))
      check(MPI_Irecv(&header_in, 1, MPI_DOUBLE, op.type == OpType::Recv ? op.peer : op.peer2,
                      op.tag, comm_, &header_req[0]), "MPI_Irecv (emulator header)");
    if (emulated && (op.type == OpType::Send || op.type == OpType::SendRecv)) {
      const int dst = world_ranks()[op.peer];
      header_out = net::book(net::p2p_cost(static_cast<double>(op.send.nbytes()), me, dst),
                             net::is_inter_node(me, dst), now_seconds());
      window_end = header_out;
      check(MPI_Isend(&header_out, 1, MPI_DOUBLE, op.peer, op.tag, comm_, &header_req[1]),
            "MPI_Isend (emulator header)");
    }

    // ---- the real transfer
    void* sbuf = op.send.defined() ? op.send.data_ptr() : nullptr;
    void* rbuf = op.recv.defined() ? op.recv.data_ptr() : nullptr;
    switch (op.type) {
      case OpType::AllReduce: {
        auto dt = mpi_dtype(op.recv);
        auto mop = mpi_op(op.reduce, op.recv);
        int c = count_of(op.recv);
        call("MPI_Allreduce",
             [&] { return MPI_Allreduce(MPI_IN_PLACE, rbuf, c, dt, mop, comm_); },
             [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, rbuf, c, dt, mop, comm_, r); });
        finish_avg(op.reduce, op.recv, n);
        break;
      }
      case OpType::ReduceScatter: {
        auto dt = mpi_dtype(op.recv);
        auto mop = mpi_op(op.reduce, op.recv);
        // Chunk r of the input goes to rank r; chunks follow split_range (first ones longer).
        std::vector<int> counts = to_int(split_sizes(op.send.numel(), n));
        if (all_equal(counts)) {
          int c = counts[0];
          call("MPI_Reduce_scatter_block",
               [&] { return MPI_Reduce_scatter_block(sbuf, rbuf, c, dt, mop, comm_); },
               [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(sbuf, rbuf, c, dt, mop, comm_, r); });
        } else {
          call("MPI_Reduce_scatter",
               [&] { return MPI_Reduce_scatter(sbuf, rbuf, counts.data(), dt, mop, comm_); },
               [&](MPI_Request* r) { return MPI_Ireduce_scatter(sbuf, rbuf, counts.data(), dt, mop, comm_, r); });
        }
        finish_avg(op.reduce, op.recv, n);
        break;
      }
      case OpType::AllGather: {
        auto dt = mpi_dtype(op.send);
        std::vector<int> counts = to_int(split_sizes(op.recv.numel(), n));
        if (all_equal(counts)) {
          int c = counts[0];
          call("MPI_Allgather",
               [&] { return MPI_Allgather(sbuf, c, dt, rbuf, c, dt, comm_); },
               [&](MPI_Request* r) { return MPI_Iallgather(sbuf, c, dt, rbuf, c, dt, comm_, r); });
        } else {
          std::vector<int> displs = displacements(counts);
          int c = count_of(op.send);
          call("MPI_Allgatherv",
               [&] { return MPI_Allgatherv(sbuf, c, dt, rbuf, counts.data(), displs.data(), dt, comm_); },
               [&](MPI_Request* r) {
                 return MPI_Iallgatherv(sbuf, c, dt, rbuf, counts.data(), displs.data(), dt, comm_, r);
               });
        }
        break;
      }
      case OpType::Broadcast: {
        auto dt = mpi_dtype(op.recv);
        int c = count_of(op.recv);
        call("MPI_Bcast", [&] { return MPI_Bcast(rbuf, c, dt, op.peer, comm_); },
             [&](MPI_Request* r) { return MPI_Ibcast(rbuf, c, dt, op.peer, comm_, r); });
        break;
      }
      case OpType::Reduce: {
        const bool root = rank() == op.peer;
        auto dt = mpi_dtype(op.recv);
        auto mop = mpi_op(op.reduce, op.recv);
        int c = count_of(op.recv);
        void* s = root ? MPI_IN_PLACE : sbuf;
        void* r = root ? rbuf : nullptr;
        call("MPI_Reduce", [&] { return MPI_Reduce(s, r, c, dt, mop, op.peer, comm_); },
             [&](MPI_Request* q) { return MPI_Ireduce(s, r, c, dt, mop, op.peer, comm_, q); });
        if (root) finish_avg(op.reduce, op.recv, n);
        break;
      }
      case OpType::AllToAll: {
        auto dt = mpi_dtype(op.send);
        int c = count_of(op.send) / n;
        call("MPI_Alltoall", [&] { return MPI_Alltoall(sbuf, c, dt, rbuf, c, dt, comm_); },
             [&](MPI_Request* r) { return MPI_Ialltoall(sbuf, c, dt, rbuf, c, dt, comm_, r); });
        break;
      }
      case OpType::Barrier:
        call("MPI_Barrier", [&] { return MPI_Barrier(comm_); },
             [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
        break;
      case OpType::Send: {
        auto dt = mpi_dtype(op.send);
        int c = count_of(op.send);
        call("MPI_Send", [&] { return MPI_Send(sbuf, c, dt, op.peer, op.tag, comm_); },
             [&](MPI_Request* r) { return MPI_Isend(sbuf, c, dt, op.peer, op.tag, comm_, r); });
        break;
      }
      case OpType::Recv: {
        auto dt = mpi_dtype(op.recv);
        int c = count_of(op.recv);
        call("MPI_Recv (a larger message than expected truncates)",
             [&] { return MPI_Recv(rbuf, c, dt, op.peer, op.tag, comm_, &status); },
             [&](MPI_Request* r) { return MPI_Irecv(rbuf, c, dt, op.peer, op.tag, comm_, r); });
        check_count(status, op.recv, op.peer);
        break;
      }
      case OpType::SendRecv: {
        auto sdt = mpi_dtype(op.send), rdt = mpi_dtype(op.recv);
        int sc = count_of(op.send), rc = count_of(op.recv);
        if (!emulated) {
          check(MPI_Sendrecv(sbuf, sc, sdt, op.peer, op.tag, rbuf, rc, rdt, op.peer2, op.tag, comm_,
                             &status),
                "MPI_Sendrecv (a larger message than expected truncates)");
        } else {
          MPI_Request reqs[2];
          check(MPI_Irecv(rbuf, rc, rdt, op.peer2, op.tag, comm_, &reqs[0]), "MPI_Irecv");
          check(MPI_Isend(sbuf, sc, sdt, op.peer, op.tag, comm_, &reqs[1]), "MPI_Isend");
          check(polite_wait(reqs[1], nullptr), "MPI_Isend");
          check(polite_wait(reqs[0], &status), "MPI_Irecv (a larger message than expected truncates)");
        }
        check_count(status, op.recv, op.peer2);
        break;
      }
      case OpType::Split: {
        MPI_Comm sub;
        check(MPI_Comm_split(comm_, op.color < 0 ? MPI_UNDEFINED : op.color, op.key, &sub),
              "MPI_Comm_split");
        if (sub != MPI_COMM_NULL) {
          *op.split_result = MpiComm::create(sub, op.split_name);
          MPI_Comm_free(&sub);  // create() duplicated it
        }
        break;
      }
    }
    // ---- emulator, after the real transfer: headers done, then hold until the window ends.
    if (emulated) {
      for (auto& r : header_req)
        if (r != MPI_REQUEST_NULL) check(polite_wait(r, nullptr), "emulator header");
      net::sleep_until(std::max(window_end, header_in));
    }
    if (op.finish) op.finish();
  } catch (...) {
    mark_finished(rec, false);
    throw;
  }
  mark_finished(rec, true);
}

}  // namespace dtl
