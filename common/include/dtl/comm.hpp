// dtl/comm.hpp — defines: ReduceOp, Work, CommStats, OpRecord, Comm (the one communication
// interface every lab sees).
//
// A Comm is a group of ranks that exchange torch::Tensors. Two backends implement it:
// MpiComm (CPU tensors, OpenMPI; see comm_mpi.hpp) and NcclComm (CUDA tensors; comm_nccl.hpp).
//
// Ordering contract (the property that makes async safe): every op of one Comm runs in the
// order it was issued on that Comm's own worker (a thread for MPI, a CUDA stream for NCCL).
// A blocking call is "issue, then wait", so mixing blocking and async calls can never reorder
// collectives between ranks. To overlap two independent streams of traffic, use two Comms
// (split or dup).
//
// Tensor rules: any dtype of comm_dtypes() {float32, float64, float16, bfloat16, int32, int64,
// int8, uint8}; inputs may be non-contiguous (copied); outputs may be non-contiguous (a
// contiguous buffer is used and copied back when the op completes); empty tensors are fine
// (every rank still calls).
// Sizes of reduce_scatter and all_gather follow the course's one splitting rule (split.hpp):
// the flat full tensor of N elements is cut into size() contiguous chunks, the first N mod
// size() of them one element longer; rank r's chunk is chunk r. So reduce_scatter's output
// holds split_range(input.numel(), size(), rank()).size() elements and all_gather's input
// split_range(output.numel(), size(), rank()).size(); when size() divides N every chunk is
// N / size() (the only case NCCL and MPI's _block variants support natively).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dtl {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* to_string(ReduceOp op);

enum class OpType {
  AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, Barrier,
  Send, Recv, SendRecv, Split
};
const char* to_string(OpType op);

// The dtypes every backend moves, and a check for one.
const std::vector<torch::ScalarType>& comm_dtypes();
bool is_comm_dtype(torch::ScalarType t);
// ReduceOp::Avg is a Sum on the wire and one division at the end: t /= n, where integer
// dtypes truncate toward zero (as NCCL's ncclAvg does). No-op for other ops or n == 1.
void finish_avg(ReduceOp op, const torch::Tensor& t, int n);

// Handle on an issued op. wait() blocks until the op completed on this rank and rethrows its
// error, if any (NCCL: the caller's stream waits instead of the CPU). A default-constructed
// Work is already complete.
class Work {
 public:
  struct State;  // backend-specific completion state
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait();
  bool is_completed() const;

 private:
  std::shared_ptr<State> state_;
};

struct Work::State {
  virtual ~State() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};

// What one rank communicated, per op type. `bytes` is the op's message size as nccl-tests
// counts it (all_reduce/broadcast/reduce: the tensor; reduce_scatter: the whole input;
// all_gather: the whole output; all_to_all: the input; send/recv: the tensor sent/received).
// `wire_bytes` is what this rank sends on the wire under the bandwidth-optimal algorithm
// (ring all_reduce 2(n-1)/n S, reduce_scatter and all_gather (n-1)/n S, all_to_all
// (n-1)/n S, broadcast and reduce S, send S): the number communication-cost formulas use.
struct OpStats {
  int64_t count = 0;
  int64_t bytes = 0;
  double wire_bytes = 0;
};
struct CommStats {
  std::map<OpType, OpStats> ops;
  const OpStats& operator[](OpType op) const;
  int64_t total_count() const;
  int64_t total_bytes() const;
  double total_wire_bytes() const;
  std::string to_string() const;
};

// One issued op, as the watchdog, the flight recorder and the tracer see it.
struct OpRecord {
  enum class State { Issued, Started, Completed, Failed };
  uint64_t seq = 0;  // 1-based, per Comm, in issue order
  OpType op = OpType::Barrier;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  int peer = -1;  // root for broadcast/reduce, peer for send/recv, dst for sendrecv
  State state = State::Issued;
  double issued = 0, started = 0, finished = 0;  // now_seconds()
  std::string describe() const;  // "all_reduce #5 float32[1024] (4096 B) started 2.1 s ago"
};
const char* to_string(OpRecord::State s);

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  virtual ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // "world", "world/split(1)", ...
  const std::vector<int>& world_ranks() const { return world_ranks_; }  // member i's world rank
  virtual std::string backend() const = 0;  // "mpi" or "nccl"
  virtual torch::Device device() const = 0;  // where this Comm's tensors must live

  // ---- blocking ops (issue + wait) ----
  void all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  void reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                      ReduceOp op = ReduceOp::Sum);
  void all_gather(const torch::Tensor& output, const torch::Tensor& input);
  void broadcast(const torch::Tensor& tensor, int root);
  void reduce(const torch::Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum);
  void all_to_all(const torch::Tensor& output, const torch::Tensor& input);
  void barrier();
  void send(const torch::Tensor& tensor, int dst, int tag = 0);
  void recv(const torch::Tensor& tensor, int src, int tag = 0);
  void sendrecv(const torch::Tensor& send_tensor, int dst, const torch::Tensor& recv_tensor,
                int src, int tag = 0);

  // ---- async twins: issue now, complete in issue order on this Comm's worker ----
  // The tensors must stay untouched until wait(); the Work keeps them alive.
  Work all_reduce_async(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  Work reduce_scatter_async(const torch::Tensor& output, const torch::Tensor& input,
                            ReduceOp op = ReduceOp::Sum);
  Work all_gather_async(const torch::Tensor& output, const torch::Tensor& input);
  Work broadcast_async(const torch::Tensor& tensor, int root);
  Work reduce_async(const torch::Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum);
  Work all_to_all_async(const torch::Tensor& output, const torch::Tensor& input);
  Work barrier_async();
  Work send_async(const torch::Tensor& tensor, int dst, int tag = 0);
  Work recv_async(const torch::Tensor& tensor, int src, int tag = 0);
  Work sendrecv_async(const torch::Tensor& send_tensor, int dst, const torch::Tensor& recv_tensor,
                      int src, int tag = 0);

  // Collective over this Comm, like MPI_Comm_split: ranks with the same color form a new Comm,
  // ordered by (key, old rank). color < 0 opts out and returns nullptr. `name` names the new
  // Comm in errors, traces and the watchdog (default "<this name>/split(<color>)").
  std::shared_ptr<Comm> split(int color, int key, const std::string& name = "");
  // A new Comm with the same members and ranks (its own worker, so its traffic overlaps).
  std::shared_ptr<Comm> dup() { return split(0, rank_, name_ + "/dup"); }

  CommStats stats() const;
  void reset_stats();
  // The last few ops of this Comm (oldest first) and the ones not yet completed.
  std::vector<OpRecord> recent_ops() const;
  std::vector<OpRecord> pending_ops() const;
  uint64_t ops_issued() const;

  // What one Comm is doing, as data (the watchdog ships these between ranks as JSON).
  struct Snapshot {
    std::string name, backend;
    int rank = 0, size = 1;
    uint64_t ops_issued = 0;
    std::vector<OpRecord> pending;  // not yet completed, oldest first
    std::vector<OpRecord> recent;   // the last few ops, oldest first
  };
  Snapshot snapshot() const;
  // Every live Comm of this process.
  static std::vector<Snapshot> snapshot_all();
  // The same, described op by op for a human: what the watchdog prints.
  static std::string describe_all();

  // Observers of every op of every Comm of this process (a flight recorder, lab 18). An
  // observer is called with a copy of the op's record three times: when it is issued (state
  // Issued, on the issuing thread, before the op can start), when it starts and when it ends
  // (Started, then Completed or Failed, on whichever thread runs it). Calls for different ops
  // come from several threads at once: an observer locks what it shares, returns quickly, and
  // neither issues ops nor adds or removes observers. Costs nothing while none is registered.
  using OpObserver = std::function<void(const Comm& comm, const OpRecord& record)>;
  static int add_op_observer(OpObserver observer);  // returns the id remove_op_observer takes
  // When it returns, the observer is not running and will not be called again.
  static void remove_op_observer(int id);

 protected:
  // A fully validated op handed to a backend. Buffers are contiguous and on device().
  struct Op {
    OpType type = OpType::Barrier;
    ReduceOp reduce = ReduceOp::Sum;
    torch::Tensor send;     // input buffer (all_reduce/broadcast/reduce: same as recv)
    torch::Tensor recv;     // output buffer
    int peer = -1;          // root, dst (send, sendrecv) or src (recv)
    int peer2 = -1;         // src of sendrecv
    int tag = 0;
    int color = 0, key = 0;                   // split
    std::string split_name;                   // split: the new Comm's name
    std::shared_ptr<Comm>* split_result = nullptr;
    std::function<void()> finish;             // copy-back into a non-contiguous user tensor
    bool blocking = false;                    // the caller waits right away (fast path)
    std::shared_ptr<OpRecord> record;         // shared with the Comm's tables
  };

  Comm(int rank, int size, std::string name, std::vector<int> world_ranks);
  // Backends call these from their worker as an op starts and ends (tracing, diagnosis).
  void mark_started(OpRecord& r);
  void mark_finished(OpRecord& r, bool ok);
  // Error message prefix for op failures: "[rank 1/4] all_reduce #3 on comm 'world': ".
  std::string where(const OpRecord& r) const;

 private:
  // Run or enqueue `op` so that it executes after every op issued before it on this Comm.
  // Private (backends override it, nothing calls it but issue()): every op goes through
  // issue(), which validates it, numbers it and records its stats, so a pointer to member taken
  // in a derived class cannot run a collective that stats() and the grader's audit do not see.
  virtual Work launch(Op op) = 0;
  Work issue(Op op, const std::vector<int64_t>& shape, int64_t bytes, double wire_bytes);
  void notify_observers(const OpRecord& r) const;
  void check_tensor(const torch::Tensor& t, const char* what, OpType op) const;
  void check_peer(int peer, const char* what, OpType op, bool allow_self) const;
  torch::Tensor input_buffer(const torch::Tensor& t) const;
  torch::Tensor output_buffer(const torch::Tensor& t, Op& op) const;

  int rank_, size_;
  std::string name_;
  std::vector<int> world_ranks_;
  mutable std::mutex mu_;
  uint64_t next_seq_ = 1;
  CommStats stats_;
  std::vector<std::shared_ptr<OpRecord>> recent_;   // ring of the last kRecent ops
  size_t recent_head_ = 0;
  std::map<uint64_t, std::shared_ptr<OpRecord>> pending_;
  static constexpr size_t kRecent = 16;
};

// Busbw factor of nccl-tests for an op on n ranks (all_reduce 2(n-1)/n, reduce_scatter,
// all_gather, all_to_all (n-1)/n, broadcast/reduce/send 1).
double bus_factor(OpType op, int n);

}  // namespace dtl
