// Comm: argument checking, statistics and op records shared by every backend.
// The backends (comm_mpi.cpp, comm_nccl.cpp) only move bytes.
#include "dtl/comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <shared_mutex>

#include "dtl/error.hpp"
#include "dtl/split.hpp"
#include "dtl/timer.hpp"
#include "dtl/trace.hpp"

namespace dtl {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* to_string(OpType op) {
  switch (op) {
    case OpType::AllReduce: return "all_reduce";
    case OpType::ReduceScatter: return "reduce_scatter";
    case OpType::AllGather: return "all_gather";
    case OpType::Broadcast: return "broadcast";
    case OpType::Reduce: return "reduce";
    case OpType::AllToAll: return "all_to_all";
    case OpType::Barrier: return "barrier";
    case OpType::Send: return "send";
    case OpType::Recv: return "recv";
    case OpType::SendRecv: return "sendrecv";
    case OpType::Split: return "split";
  }
  return "?";
}

const char* to_string(OpRecord::State s) {
  switch (s) {
    case OpRecord::State::Issued: return "issued";
    case OpRecord::State::Started: return "started";
    case OpRecord::State::Completed: return "completed";
    case OpRecord::State::Failed: return "failed";
  }
  return "?";
}

const std::vector<torch::ScalarType>& comm_dtypes() {
  static const std::vector<torch::ScalarType> kDtypes = {
      torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16,
      torch::kInt32,   torch::kInt64,   torch::kInt8,    torch::kUInt8};
  return kDtypes;
}

bool is_comm_dtype(torch::ScalarType t) {
  const auto& all = comm_dtypes();
  return std::find(all.begin(), all.end(), t) != all.end();
}

void finish_avg(ReduceOp op, const torch::Tensor& t, int n) {
  if (op != ReduceOp::Avg || n == 1) return;
  torch::Tensor out = t;  // div_ needs a non-const handle; the storage is the caller's
  if (out.is_floating_point())
    out.div_(n);
  else
    out.div_(n, "trunc");
}

double bus_factor(OpType op, int n) {
  // nccl-tests: broadcast and reduce have factor 1 at any size; the rest vanish at n = 1.
  if (n <= 1)
    return op == OpType::Send || op == OpType::Recv || op == OpType::SendRecv ||
                   op == OpType::Broadcast || op == OpType::Reduce
               ? 1.0
               : 0.0;
  switch (op) {
    case OpType::AllReduce: return 2.0 * (n - 1) / n;
    case OpType::ReduceScatter:
    case OpType::AllGather:
    case OpType::AllToAll: return 1.0 * (n - 1) / n;
    case OpType::Barrier:
    case OpType::Split: return 0.0;
    default: return 1.0;
  }
}

// ---------------------------------------------------------------- Work

void Work::wait() {
  if (state_) state_->wait();
}
bool Work::is_completed() const { return !state_ || state_->is_completed(); }

// ---------------------------------------------------------------- stats and records

const OpStats& CommStats::operator[](OpType op) const {
  static const OpStats kNone;
  auto it = ops.find(op);
  return it == ops.end() ? kNone : it->second;
}
int64_t CommStats::total_count() const {
  int64_t n = 0;
  for (auto& [op, s] : ops) n += s.count;
  return n;
}
int64_t CommStats::total_bytes() const {
  int64_t n = 0;
  for (auto& [op, s] : ops) n += s.bytes;
  return n;
}
double CommStats::total_wire_bytes() const {
  double n = 0;
  for (auto& [op, s] : ops) n += s.wire_bytes;
  return n;
}
std::string CommStats::to_string() const {
  std::string out;
  for (auto& [op, s] : ops)
    out += fmt::format("{}{}: {} ops, {} B (wire {:.0f} B)", out.empty() ? "" : "; ",
                       dtl::to_string(op), s.count, s.bytes, s.wire_bytes);
  return out.empty() ? "no ops" : out;
}

std::string OpRecord::describe() const {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? "," : "") + std::to_string(shape[i]);
  std::string who;
  if (peer >= 0) {
    const char* role = (op == OpType::Broadcast || op == OpType::Reduce) ? "root" :
                       op == OpType::Recv ? "src" : "dst";
    who = fmt::format(" {} {}", role, peer);
  }
  double ref = state == State::Completed || state == State::Failed ? finished :
               state == State::Started ? started : issued;
  return fmt::format("{} #{} {}[{}] ({} B){} {} {:.1f}s ago", dtl::to_string(op), seq,
                     dtype.empty() ? "-" : dtype, dims, bytes, who, dtl::to_string(state),
                     now_seconds() - ref);
}

// Registry of live Comms, for describe_all() (the watchdog's diagnosis).
static std::mutex& registry_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
// Never destroyed: a Comm held by a static elsewhere (a cache of sub-Comms) may die after this
// translation unit's statics, and must still find its registry.
static std::set<Comm*>& registry() {
  static auto* comms = new std::set<Comm*>;
  return *comms;
}

Comm::Comm(int rank, int size, std::string name, std::vector<int> world_ranks)
    : rank_(rank), size_(size), name_(std::move(name)), world_ranks_(std::move(world_ranks)),
      recent_(kRecent) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(this);
}

Comm::~Comm() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(this);
}

Comm::Snapshot Comm::snapshot() const {
  Snapshot s;
  s.name = name_;
  s.backend = backend();
  s.rank = rank_;
  s.size = size_;
  s.ops_issued = ops_issued();
  s.pending = pending_ops();
  s.recent = recent_ops();
  return s;
}

std::vector<Comm::Snapshot> Comm::snapshot_all() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<Snapshot> out;
  for (Comm* c : registry()) out.push_back(c->snapshot());
  std::sort(out.begin(), out.end(),
            [](const Snapshot& a, const Snapshot& b) { return a.name < b.name; });
  return out;
}

std::string Comm::describe_all() {
  std::string out;
  for (const Snapshot& c : snapshot_all()) {
    out += fmt::format("  comm '{}' ({} rank {}/{}): {} ops issued", c.name, c.backend, c.rank,
                       c.size, c.ops_issued);
    if (c.pending.empty()) {
      out += c.recent.empty() ? ", idle\n" : ", idle; last: " + c.recent.back().describe() + "\n";
    } else {
      out += ", not completed:\n";
      for (auto& r : c.pending) out += "    " + r.describe() + "\n";
    }
  }
  return out;
}

CommStats Comm::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}
void Comm::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = CommStats{};
}
uint64_t Comm::ops_issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_ - 1;
}
std::vector<OpRecord> Comm::recent_ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OpRecord> out;
  for (size_t i = 0; i < kRecent; ++i) {
    auto& r = recent_[(recent_head_ + i) % kRecent];
    if (r) out.push_back(*r);
  }
  return out;
}
std::vector<OpRecord> Comm::pending_ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OpRecord> out;
  for (auto& [seq, r] : pending_) out.push_back(*r);
  return out;
}

// ---------------------------------------------------------------- op observers

namespace {
// Observers are called under a shared lock (many ops at once), added and removed under the
// exclusive one, so that remove_op_observer returns only once no call is running. The count
// lets an op skip all of it while nobody observes.
struct Observers {
  std::shared_mutex mu;
  std::map<int, Comm::OpObserver> fns;
  int next_id = 1;
  std::atomic<int> count{0};
};
Observers& observers() {
  static auto* o = new Observers;  // never destroyed: Comms may outlive this TU's statics
  return *o;
}
}  // namespace

int Comm::add_op_observer(OpObserver observer) {
  DTL_CHECK(observer != nullptr, "Comm::add_op_observer: the observer is empty");
  Observers& o = observers();
  std::unique_lock<std::shared_mutex> lock(o.mu);
  const int id = o.next_id++;
  o.fns.emplace(id, std::move(observer));
  o.count.store(static_cast<int>(o.fns.size()));
  return id;
}

void Comm::remove_op_observer(int id) {
  Observers& o = observers();
  std::unique_lock<std::shared_mutex> lock(o.mu);
  o.fns.erase(id);
  o.count.store(static_cast<int>(o.fns.size()));
}

void Comm::notify_observers(const OpRecord& r) const {
  Observers& o = observers();
  if (o.count.load(std::memory_order_relaxed) == 0) return;
  std::shared_lock<std::shared_mutex> lock(o.mu);
  for (const auto& [id, fn] : o.fns) fn(*this, r);
}

void Comm::mark_started(OpRecord& r) {
  OpRecord copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.state = OpRecord::State::Started;
    r.started = now_seconds();
    copy = r;
  }
  notify_observers(copy);
}

void Comm::mark_finished(OpRecord& r, bool ok) {
  OpRecord copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.state = ok ? OpRecord::State::Completed : OpRecord::State::Failed;
    r.finished = now_seconds();
    pending_.erase(r.seq);
    copy = r;
  }
  notify_observers(copy);
  if (trace::enabled()) trace::record_comm(copy, name_);
}

std::string Comm::where(const OpRecord& r) const {
  return fmt::format("{}{} #{} on comm '{}': ", rank_prefix(), to_string(r.op), r.seq, name_);
}

// ---------------------------------------------------------------- argument checks

void Comm::check_tensor(const torch::Tensor& t, const char* what, OpType op) const {
  DTL_CHECK(t.defined(), fmt::format("{}: {} tensor is undefined", to_string(op), what));
  DTL_CHECK(t.device() == device(),
            fmt::format("{}: {} tensor is on {} but comm '{}' ({} backend) moves {} tensors; "
                        "use --backend {} or move the tensor with .to()",
                        to_string(op), what, t.device().str(), name_, backend(), device().str(),
                        t.is_cuda() ? "nccl" : "mpi"));
  DTL_CHECK(!t.is_sparse(), fmt::format("{}: sparse tensors are not supported", to_string(op)));
  DTL_CHECK(is_comm_dtype(t.scalar_type()),
            fmt::format("{}: {} tensor has dtype {}, which is not supported (float32, float64, "
                        "float16, bfloat16, int32, int64, int8, uint8 are)", to_string(op), what,
                        c10::toString(t.scalar_type())));
  DTL_CHECK(t.numel() <= std::numeric_limits<int32_t>::max(),
            fmt::format("{}: {} tensor has {} elements; at most 2^31-1 per call",
                        to_string(op), what, t.numel()));
}

void Comm::check_peer(int peer, const char* what, OpType op, bool allow_self) const {
  DTL_CHECK(peer >= 0 && peer < size_,
            fmt::format("{}: {} {} is out of range for comm '{}' of size {}", to_string(op), what,
                        peer, name_, size_));
  DTL_CHECK(allow_self || peer != rank_,
            fmt::format("{}: {} {} is this rank itself; a blocking {} to self would deadlock "
                        "(use sendrecv or a local copy)", to_string(op), what, peer, to_string(op)));
}

torch::Tensor Comm::input_buffer(const torch::Tensor& t) const { return t.contiguous(); }

// Outputs must be written in place. A non-contiguous output gets a contiguous scratch buffer
// whose contents are copied back when the op completes (Op::finish).
torch::Tensor Comm::output_buffer(const torch::Tensor& t, Op& op) const {
  if (t.is_contiguous()) return t;
  torch::Tensor buf = t.contiguous();
  torch::Tensor user = t;
  op.finish = [user, buf]() mutable { user.copy_(buf); };
  return buf;
}

static std::string dtype_name(const torch::Tensor& t) {
  if (!t.defined()) return "";
  std::string s = std::string(c10::toString(t.scalar_type()));
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

// Set by the blocking wrappers for the one op they issue: a backend may then run the op on
// the caller's thread when its worker is idle (same order, no thread hand-off).
static thread_local bool t_blocking_call = false;
struct BlockingCall {
  BlockingCall() { t_blocking_call = true; }
  ~BlockingCall() { t_blocking_call = false; }
};

Work Comm::issue(Op op, const std::vector<int64_t>& shape, int64_t bytes, double wire_bytes) {
  op.blocking = t_blocking_call;
  t_blocking_call = false;
  auto rec = std::make_shared<OpRecord>();
  rec->op = op.type;
  rec->dtype = dtype_name(op.recv.defined() ? op.recv : op.send);
  rec->shape = shape;
  rec->bytes = bytes;
  rec->peer = op.peer;
  rec->issued = now_seconds();
  {
    std::lock_guard<std::mutex> lock(mu_);
    rec->seq = next_seq_++;
    OpStats& s = stats_.ops[op.type];
    s.count += 1;
    s.bytes += bytes;
    s.wire_bytes += wire_bytes;
    recent_[recent_head_] = rec;
    recent_head_ = (recent_head_ + 1) % kRecent;
    pending_[rec->seq] = rec;
  }
  notify_observers(*rec);  // before launch: no thread can have started the op yet
  op.record = rec;
  return launch(std::move(op));
}

// ---------------------------------------------------------------- the ops

static std::vector<int64_t> shape_of(const torch::Tensor& t) {
  return t.defined() ? t.sizes().vec() : std::vector<int64_t>{};
}
static int64_t nbytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

Work Comm::all_reduce_async(const torch::Tensor& tensor, ReduceOp reduce) {
  check_tensor(tensor, "input", OpType::AllReduce);
  Op op;
  op.type = OpType::AllReduce;
  op.reduce = reduce;
  op.recv = output_buffer(tensor, op);
  op.send = op.recv;
  int64_t b = nbytes(tensor);
  return issue(std::move(op), shape_of(tensor), b, b * bus_factor(OpType::AllReduce, size_));
}

Work Comm::reduce_scatter_async(const torch::Tensor& output, const torch::Tensor& input,
                                ReduceOp reduce) {
  check_tensor(output, "output", OpType::ReduceScatter);
  check_tensor(input, "input", OpType::ReduceScatter);
  DTL_CHECK(input.scalar_type() == output.scalar_type(),
            fmt::format("reduce_scatter: input dtype {} differs from output dtype {}",
                        dtype_name(input), dtype_name(output)));
  const int64_t chunk = split_range(input.numel(), size_, rank_).size();
  DTL_CHECK(output.numel() == chunk,
            fmt::format("reduce_scatter: output has {} elements but rank {}'s chunk of the {}-element "
                        "input over {} ranks holds {} (split_range)", output.numel(), rank_,
                        input.numel(), size_, chunk));
  Op op;
  op.type = OpType::ReduceScatter;
  op.reduce = reduce;
  op.send = input_buffer(input);
  op.recv = output_buffer(output, op);
  int64_t b = nbytes(input);
  return issue(std::move(op), shape_of(input), b, b * bus_factor(OpType::ReduceScatter, size_));
}

Work Comm::all_gather_async(const torch::Tensor& output, const torch::Tensor& input) {
  check_tensor(output, "output", OpType::AllGather);
  check_tensor(input, "input", OpType::AllGather);
  DTL_CHECK(input.scalar_type() == output.scalar_type(),
            fmt::format("all_gather: input dtype {} differs from output dtype {}",
                        dtype_name(input), dtype_name(output)));
  const int64_t chunk = split_range(output.numel(), size_, rank_).size();
  DTL_CHECK(input.numel() == chunk,
            fmt::format("all_gather: input has {} elements but rank {}'s chunk of the {}-element "
                        "output over {} ranks holds {} (split_range)", input.numel(), rank_,
                        output.numel(), size_, chunk));
  Op op;
  op.type = OpType::AllGather;
  op.send = input_buffer(input);
  op.recv = output_buffer(output, op);
  int64_t b = nbytes(output);
  return issue(std::move(op), shape_of(output), b, b * bus_factor(OpType::AllGather, size_));
}

Work Comm::broadcast_async(const torch::Tensor& tensor, int root) {
  check_tensor(tensor, "input", OpType::Broadcast);
  check_peer(root, "root", OpType::Broadcast, true);
  Op op;
  op.type = OpType::Broadcast;
  op.peer = root;
  op.recv = output_buffer(tensor, op);
  op.send = op.recv;
  int64_t b = nbytes(tensor);
  return issue(std::move(op), shape_of(tensor), b, b * bus_factor(OpType::Broadcast, size_));
}

Work Comm::reduce_async(const torch::Tensor& tensor, int root, ReduceOp reduce) {
  check_tensor(tensor, "input", OpType::Reduce);
  check_peer(root, "root", OpType::Reduce, true);
  Op op;
  op.type = OpType::Reduce;
  op.reduce = reduce;
  op.peer = root;
  op.recv = output_buffer(tensor, op);
  op.send = op.recv;
  int64_t b = nbytes(tensor);
  return issue(std::move(op), shape_of(tensor), b, b * bus_factor(OpType::Reduce, size_));
}

Work Comm::all_to_all_async(const torch::Tensor& output, const torch::Tensor& input) {
  check_tensor(output, "output", OpType::AllToAll);
  check_tensor(input, "input", OpType::AllToAll);
  DTL_CHECK(input.scalar_type() == output.scalar_type(),
            fmt::format("all_to_all: input dtype {} differs from output dtype {}",
                        dtype_name(input), dtype_name(output)));
  DTL_CHECK(input.numel() == output.numel(),
            fmt::format("all_to_all: input has {} elements, output {}; they must match",
                        input.numel(), output.numel()));
  DTL_CHECK(input.numel() % size_ == 0,
            fmt::format("all_to_all: {} elements do not split into {} equal chunks",
                        input.numel(), size_));
  Op op;
  op.type = OpType::AllToAll;
  op.send = input_buffer(input);
  op.recv = output_buffer(output, op);
  int64_t b = nbytes(input);
  return issue(std::move(op), shape_of(input), b, b * bus_factor(OpType::AllToAll, size_));
}

Work Comm::barrier_async() {
  Op op;
  op.type = OpType::Barrier;
  return issue(std::move(op), {}, 0, 0);
}

Work Comm::send_async(const torch::Tensor& tensor, int dst, int tag) {
  check_tensor(tensor, "input", OpType::Send);
  check_peer(dst, "dst", OpType::Send, false);
  Op op;
  op.type = OpType::Send;
  op.send = input_buffer(tensor);
  op.peer = dst;
  op.tag = tag;
  int64_t b = nbytes(tensor);
  return issue(std::move(op), shape_of(tensor), b, b);
}

Work Comm::recv_async(const torch::Tensor& tensor, int src, int tag) {
  check_tensor(tensor, "output", OpType::Recv);
  check_peer(src, "src", OpType::Recv, false);
  Op op;
  op.type = OpType::Recv;
  op.recv = output_buffer(tensor, op);
  op.peer = src;
  op.tag = tag;
  return issue(std::move(op), shape_of(tensor), nbytes(tensor), 0);
}

Work Comm::sendrecv_async(const torch::Tensor& send_tensor, int dst,
                          const torch::Tensor& recv_tensor, int src, int tag) {
  check_tensor(send_tensor, "send", OpType::SendRecv);
  check_tensor(recv_tensor, "recv", OpType::SendRecv);
  check_peer(dst, "dst", OpType::SendRecv, true);
  check_peer(src, "src", OpType::SendRecv, true);
  Op op;
  op.type = OpType::SendRecv;
  op.send = input_buffer(send_tensor);
  op.recv = output_buffer(recv_tensor, op);
  op.peer = dst;
  op.peer2 = src;
  op.tag = tag;
  int64_t b = nbytes(send_tensor);
  return issue(std::move(op), shape_of(send_tensor), b, b);
}

std::shared_ptr<Comm> Comm::split(int color, int key, const std::string& name) {
  std::shared_ptr<Comm> result;
  Op op;
  op.type = OpType::Split;
  op.color = color;
  op.key = key;
  op.split_name = name.empty() ? fmt::format("{}/split({})", name_, color) : name;
  op.split_result = &result;
  BlockingCall blocking;
  issue(std::move(op), {}, 0, 0).wait();
  return result;
}

// Blocking = async + wait: the single path keeps ordering identical for both.
void Comm::all_reduce(const torch::Tensor& t, ReduceOp op) { BlockingCall b; all_reduce_async(t, op).wait(); }
void Comm::reduce_scatter(const torch::Tensor& out, const torch::Tensor& in, ReduceOp op) {
  BlockingCall b;
  reduce_scatter_async(out, in, op).wait();
}
void Comm::all_gather(const torch::Tensor& out, const torch::Tensor& in) {
  BlockingCall b;
  all_gather_async(out, in).wait();
}
void Comm::broadcast(const torch::Tensor& t, int root) { BlockingCall b; broadcast_async(t, root).wait(); }
void Comm::reduce(const torch::Tensor& t, int root, ReduceOp op) {
  BlockingCall b;
  reduce_async(t, root, op).wait();
}
void Comm::all_to_all(const torch::Tensor& out, const torch::Tensor& in) {
  BlockingCall b;
  all_to_all_async(out, in).wait();
}
void Comm::barrier() { BlockingCall b; barrier_async().wait(); }
void Comm::send(const torch::Tensor& t, int dst, int tag) { BlockingCall b; send_async(t, dst, tag).wait(); }
void Comm::recv(const torch::Tensor& t, int src, int tag) { BlockingCall b; recv_async(t, src, tag).wait(); }
void Comm::sendrecv(const torch::Tensor& s, int dst, const torch::Tensor& r, int src, int tag) {
  BlockingCall b;
  sendrecv_async(s, dst, r, src, tag).wait();
}

}  // namespace dtl
