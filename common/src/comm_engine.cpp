// The device-independent half of the NCCL backend (design: dtl/comm_engine.hpp). Everything
// here runs in CI on CPU against a fake device layer; comm_nccl.cpp only adds NCCL calls and
// CUDA events.
#include "dtl/comm_engine.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"
#include "dtl/log.hpp"
#include "dtl/split.hpp"
#include "dtl/timer.hpp"

namespace dtl {
namespace engine {
namespace {

// One op from the moment it enters the device layer until the device let go of its buffers.
struct Entry {
  enum class State { Launching, Pending, Done, Failed };
  std::shared_ptr<OpRecord> record;
  std::string where;                  // "[rank 1/4] all_reduce #3 on comm 'world': "
  std::unique_ptr<DeviceOp> dev;      // null while launching, or when the launch threw
  std::vector<torch::Tensor> keep;    // buffers and temporaries: alive until the device is done
  std::function<void()> finish;       // copy-back (holds its tensors too)
  double deadline = 0;                // now_seconds() past which the op has timed out
  bool started = false;               // the record says Started
  bool claimed = false;               // its record was (or is being) marked finished
  bool in_device = false;             // its launch has not returned yet (core mu)
  State state = State::Launching;     // guarded by Core::mu
  std::string error;                  // when Failed
};

// What an EngineComm shares with its Works: a Work may outlive the Comm.
struct Core {
  std::mutex mu;
  std::condition_variable changed;   // an entry changed state; the poller has work
  std::deque<std::shared_ptr<Entry>> inflight;  // issue order; Failed ones until the device let go
  bool aborted = false;
  std::string error;                 // why the comm was aborted
  int host_waiters = 0;              // threads blocked on an op: poll faster
  bool stop = false;                 // poller: exit

  // Under mu. The device is done with `e`: drop its buffers and forget it.
  void release(const std::shared_ptr<Entry>& e) {
    e->keep.clear();
    e->finish = nullptr;
    for (auto it = inflight.begin(); it != inflight.end(); ++it)
      if (*it == e) {
        inflight.erase(it);
        return;
      }
  }

  void block_until_resolved(const Entry& e) {
    std::unique_lock<std::mutex> lock(mu);
    ++host_waiters;
    changed.notify_all();
    changed.wait(lock, [&] {
      return e.state == Entry::State::Done || e.state == Entry::State::Failed;
    });
    --host_waiters;
  }
};

struct EngineWork : Work::State {
  std::shared_ptr<Core> core;
  std::shared_ptr<Entry> entry;
  bool block_host = false;  // barrier, or Options::blocking_wait
  bool waited = false;

  void wait() override {
    if (block_host) core->block_until_resolved(*entry);
    {
      std::lock_guard<std::mutex> lock(core->mu);
      if (entry->state == Entry::State::Failed) throw Error(entry->error);
    }
    if (waited || !entry->dev) return;
    entry->dev->order_caller_after();
    waited = true;
  }

  // True once the poller saw the op complete (and so marked its record): a caller polling
  // is_completed() and then reading pending_ops() sees the same answer.
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(core->mu);
    if (entry->state == Entry::State::Failed) throw Error(entry->error);
    return entry->state == Entry::State::Done;
  }
};

class EngineComm : public Comm {
 public:
  EngineComm(std::shared_ptr<Comm> bootstrap, std::unique_ptr<DeviceLayer> device,
             const std::string& name, const Options& options)
      : Comm(bootstrap->rank(), bootstrap->size(), name, bootstrap->world_ranks()),
        bootstrap_(std::move(bootstrap)),
        device_(std::move(device)),
        options_(options),
        core_(std::make_shared<Core>()) {
    DTL_CHECK(device_ != nullptr, "engine::make_comm: no device layer");
    poller_ = std::thread([this] { poll_loop(); });
  }

  ~EngineComm() override {
    {
      std::unique_lock<std::mutex> lock(core_->mu);
      ++core_->host_waiters;
      core_->changed.notify_all();
      // Drain: the poller completes in-flight ops, or fails them all at the first deadline.
      core_->changed.wait(lock, [&] { return core_->aborted || !has_pending(); });
      // After an abort, give the device until one more timeout to let go of failed ops'
      // buffers (aborted NCCL kernels return promptly) before the layer is destroyed.
      if (core_->aborted)
        core_->changed.wait_for(lock, std::chrono::duration<double>(options_.timeout_s),
                                [&] { return core_->inflight.empty(); });
      --core_->host_waiters;
      core_->stop = true;
    }
    core_->changed.notify_all();
    if (poller_.joinable()) poller_.join();
    // Ops not let go of by now keep their buffers in the Core (alive while any Work is).
    if (!core_->aborted) device_->close();  // destroy, which flushes: only when all completed
    device_.reset();
  }

  std::string backend() const override { return options_.backend; }
  torch::Device device() const override { return device_->device(); }

 private:
  Work launch(Op op) override {
    // Enqueue in sequence order: Comm::issue numbers ops under its own lock, so two threads
    // may reach launch() out of order; each waits for its turn.
    std::unique_lock<std::mutex> lock(issue_mu_);
    turn_.wait(lock, [&] { return next_launch_ == op.record->seq; });
    struct NextTurn {
      EngineComm& c;
      ~NextTurn() {
        ++c.next_launch_;
        c.turn_.notify_all();
      }
    } next_turn{*this};
    return op.type == OpType::Split ? launch_split(op) : launch_op(op);
  }

  // ---- issue ----

  // NCCL's reduce-scatter and all-gather need equal chunks; Comm's follow split_range (the first
  // N mod n chunks one element longer). For uneven sizes, run the device op on chunks padded to
  // the largest one and move the real elements in and out with copies ordered around it.
  void pad_uneven(Op& op) const {
    if (op.type != OpType::ReduceScatter && op.type != OpType::AllGather) return;
    const torch::Tensor full = op.type == OpType::ReduceScatter ? op.send : op.recv;
    const int64_t total = full.numel(), parts = size();
    if (total % parts == 0) return;
    const int64_t largest = split_range(total, parts, 0).size();
    // By value: `finish` keeps a copy of this lambda and runs after this function returned.
    auto range = [total, parts](int64_t p) { return split_range(total, parts, p); };
    std::function<void()> then = std::move(op.finish);
    torch::Tensor out = op.recv;
    if (op.type == OpType::ReduceScatter) {
      // In: chunk p at [p * largest, ...), zero tail. Out: this rank's largest-sized slot.
      torch::Tensor padded_in = torch::zeros({parts * largest}, full.options());
      for (int64_t p = 0; p < parts; ++p)
        padded_in.narrow(0, p * largest, range(p).size())
            .copy_(full.narrow(0, range(p).begin, range(p).size()));
      torch::Tensor padded_out = torch::empty({largest}, full.options());
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
      torch::Tensor padded_out = torch::empty({parts * largest}, full.options());
      op.send = padded_in;
      op.recv = padded_out;
      op.finish = [padded_out, out, range, parts, largest, then]() mutable {
        for (int64_t p = 0; p < parts; ++p)
          out.narrow(0, range(p).begin, range(p).size())
              .copy_(padded_out.narrow(0, p * largest, range(p).size()));
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
    DeviceCall call;
    try {
      // ---- everything that can throw before the device is involved (Comm's checks of dtype,
      // device and size ran when the op was issued) ----
      if (op.type == OpType::Send || op.type == OpType::Recv || op.type == OpType::SendRecv)
        nccl_check_p2p_tag(op.tag, what);
      pad_uneven(op);
      call.type = op.type;
      call.reduce = op.reduce;
      call.send = op.send;
      call.recv = op.recv;
      call.peer = op.peer;
      call.peer2 = op.peer2;
      call.size = size();
      // Held until the device is done with the op: no buffer is freed (and so none is reused
      // by the caching allocator) while the device may still read or write it, even if the
      // caller drops the Work unwaited.
      for (const torch::Tensor* t : {&op.send, &op.recv})
        if (t->defined() && !(t == &op.recv && op.recv.is_same(op.send))) e->keep.push_back(*t);
      e->finish = std::move(op.finish);
      enter_device(e->where, e);  // throws if the comm was aborted
    } catch (...) {
      mark_finished(rec, false);  // a record never stays pending for an op that never ran
      throw;
    }

    std::unique_ptr<DeviceOp> dev;
    std::exception_ptr failed_launch;
    try {
      dev = device_->enqueue(call, e->finish);
    } catch (...) {
      failed_launch = std::current_exception();
    }
    call = DeviceCall();  // the entry alone holds the buffers now
    leave_device(e, std::move(dev), failed_launch);

    auto work = std::make_shared<EngineWork>();
    work->core = core_;
    work->entry = e;
    work->block_host = op.type == OpType::Barrier || options_.blocking_wait;
    return Work(work);
  }

  // A thread is about to enter the device layer (a launch, or a split when `e` is null). Throws
  // if the comm was aborted. A launch's entry is registered as launching, its deadline running
  // from here: a launch that blocks in the device counts against the op's timeout.
  void enter_device(const std::string& at, const std::shared_ptr<Entry>& e) {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->aborted)
      throw Error(at + "this comm was aborted after an earlier failure: " + core_->error);
    inside_device_ = true;
    if (!e) return;
    e->state = Entry::State::Launching;
    e->in_device = true;
    e->deadline = now_seconds() + options_.timeout_s;
    core_->inflight.push_back(e);
    core_->changed.notify_all();
  }

  // Under core mu: the thread left the device layer. Returns whether an abort fell due meanwhile
  // (the caller runs it, outside the lock).
  bool left_device() {
    inside_device_ = false;
    const bool run_abort = abort_deferred_;
    abort_deferred_ = false;
    return run_abort;
  }

  // The launch is back from the device: run an abort that came due meanwhile, adopt the device
  // op, and throw if the launch failed or the comm was aborted while it was inside.
  void leave_device(const std::shared_ptr<Entry>& e, std::unique_ptr<DeviceOp> dev,
                    std::exception_ptr failed_launch) {
    bool run_abort = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      run_abort = left_device();
      e->in_device = false;
      e->dev = std::move(dev);
      if (e->state == Entry::State::Launching && !failed_launch) e->state = Entry::State::Pending;
      core_->changed.notify_all();
    }
    if (run_abort) abort_device();
    if (failed_launch) {
      std::string why;
      try {
        std::rethrow_exception(failed_launch);
      } catch (const std::exception& ex) {
        why = ex.what();
      } catch (...) {
        why = "unknown exception";
      }
      // Part of the op may be on the device: abort so no peer waits for the rest, and keep
      // the buffers (the entry stays in flight) until the device is idle.
      abort_comm(e->where + "launch failed: " + why + "; the communicator was aborted", e);
    }
    std::lock_guard<std::mutex> lock(core_->mu);
    if (e->state == Entry::State::Failed) throw Error(e->error);
  }

  // The split itself is host-side: membership over the bootstrap (MPI), the new device
  // communicator from the device layer (ncclCommSplit, or a fresh one over the new MPI comm).
  Work launch_split(Op& op) {
    OpRecord& rec = *op.record;
    const std::string at = where(rec);
    try {
      enter_device(at, nullptr);
    } catch (...) {
      mark_finished(rec, false);
      throw;
    }
    mark_started(rec);
    // The child's options: read now, when it is created, as the world's were (notes/gpu.md).
    const Options child_options = options_.read_env ? options_from_env(options_) : options_;
    std::unique_ptr<DeviceLayer> child;
    std::shared_ptr<Comm> sub;
    std::exception_ptr failed;
    try {
      sub = bootstrap_->split(op.color, op.key);
      child = device_->split(sub, op.color, op.key);
    } catch (...) {
      failed = std::current_exception();
    }
    bool run_abort = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      run_abort = left_device();
    }
    if (run_abort) abort_device();
    mark_finished(rec, !failed);
    if (failed) std::rethrow_exception(failed);
    if (sub) {
      DTL_CHECK(child != nullptr, at + "the device layer made no communicator for this member");
      *op.split_result = std::make_shared<EngineComm>(sub, std::move(child), op.split_name,
                                                      child_options);
    }
    return Work();
  }

  // ---- the poller: completion, asynchronous errors, timeouts, letting go after an abort ----

  void poll_loop() {
    device_->bind_thread();
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
        warn_str(where_comm() + "device poller: " + ex.what());
      }
      lock.lock();
      // Fast while a thread blocks on an op (barrier, a draining destructor), relaxed otherwise.
      auto period = core_->host_waiters > 0 ? std::chrono::microseconds(50)
                                            : std::chrono::microseconds(1000);
      core_->changed.wait_for(lock, period);
    }
  }

  void poll_once() {
    std::vector<std::shared_ptr<Entry>> entries;
    bool aborted = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      entries.assign(core_->inflight.begin(), core_->inflight.end());
      aborted = core_->aborted;
    }
    const double now = now_seconds();
    std::vector<std::shared_ptr<Entry>> started, done, let_go;
    std::shared_ptr<Entry> culprit, oldest_unresolved;
    std::string failure;
    bool idle_checked = false, idle = false;
    for (auto& e : entries) {
      Entry::State state;
      DeviceOp* dev;
      bool in_device;
      {
        std::lock_guard<std::mutex> lock(core_->mu);
        state = e->state;
        dev = e->dev.get();
        in_device = e->in_device;
      }
      std::string error;
      const DeviceOp::Status st = dev ? dev->query(error) : DeviceOp::Status::Queued;
      if (state == Entry::State::Failed) {
        // Aborted: hold its buffers until the device let go of them (a launch still inside
        // the device may yet enqueue work that uses them).
        if (in_device) continue;
        bool gone = dev && (st == DeviceOp::Status::Done || st == DeviceOp::Status::Failed);
        if (!gone && aborted) {
          if (!idle_checked) idle = device_->idle(), idle_checked = true;
          gone = idle;
        }
        if (gone) let_go.push_back(e);
        continue;
      }
      if (state == Entry::State::Done || aborted) continue;
      // Ops may complete in any order (several streams, or none): each entry on its own.
      if (state == Entry::State::Pending && !e->started &&
          (st == DeviceOp::Status::Running || st == DeviceOp::Status::Done)) {
        e->started = true;  // only this thread touches `started`
        started.push_back(e);
      }
      if (state == Entry::State::Pending && st == DeviceOp::Status::Done) {
        done.push_back(e);
        continue;
      }
      if (!oldest_unresolved) oldest_unresolved = e;
      if (!failure.empty()) continue;
      if (state == Entry::State::Pending && st == DeviceOp::Status::Failed) {
        failure = e->where + error + "; the communicator was aborted";
        culprit = e;
      } else if (now > e->deadline) {
        culprit = e;
        if (state == Entry::State::Launching) {
          failure = e->where + fmt::format(
              "still inside the device layer's launch after {:.3g} s (DTL_NCCL_TIMEOUT): NCCL "
              "blocks the host until the peer joins in its first point-to-point op between two "
              "ranks and in a split; the peer issued a different op or none, or died. The "
              "communicator is aborted when the launch returns.", options_.timeout_s);
        } else {
          failure = e->where + fmt::format(
              "did not complete within {:.3g} s (DTL_NCCL_TIMEOUT); the communicator was "
              "aborted. A rank issued a different op or none (compare the op numbers # of the "
              "ranks), or a peer died or hangs.", options_.timeout_s);
        }
      }
    }
    if (failure.empty() && !aborted && !entries.empty()) {
      std::string async;
      {
        std::lock_guard<std::mutex> lock(device_mu_);
        if (!device_aborted_) async = device_->async_error();
      }
      if (!async.empty()) {
        culprit = oldest_unresolved;
        failure = (culprit ? culprit->where : where_comm()) + async + "; the communicator was aborted";
      }
    }

    for (auto& e : started) mark_started(*e->record);
    resolve(done, true, "");
    if (!let_go.empty()) {
      std::lock_guard<std::mutex> lock(core_->mu);
      for (auto& e : let_go) core_->release(e);
      core_->changed.notify_all();
    }
    if (!failure.empty()) abort_comm(failure, culprit);
  }

  // Marks each entry's record finished (before a waiter can see the entry resolved: a barrier
  // counts only then), then resolves it. An entry is resolved once: by the poller when done,
  // or by an abort.
  void resolve(const std::vector<std::shared_ptr<Entry>>& entries, bool ok,
               const std::string& why, const std::shared_ptr<Entry>& culprit = nullptr) {
    std::vector<std::shared_ptr<Entry>> mine;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      for (auto& e : entries)
        if (!e->claimed && (!ok || !core_->aborted)) {
          e->claimed = true;
          mine.push_back(e);
        }
    }
    for (auto& e : mine) mark_finished(*e->record, ok);
    if (mine.empty()) return;
    std::lock_guard<std::mutex> lock(core_->mu);
    for (auto& e : mine) {
      if (ok) {
        e->state = Entry::State::Done;
        core_->release(e);
      } else {
        e->state = Entry::State::Failed;  // stays in flight until the device let go
        e->error = e == culprit ? why : e->where + "aborted because an earlier op failed: " + why;
      }
    }
    core_->changed.notify_all();
  }

  std::string where_comm() const {
    return fmt::format("{}comm '{}': ", rank_prefix(), name());
  }

  // Fails every op not completed, and aborts the device (now, or when the launch inside it
  // returns).
  void abort_comm(const std::string& why, const std::shared_ptr<Entry>& culprit) {
    std::vector<std::shared_ptr<Entry>> unresolved;
    bool run_abort = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      if (core_->aborted) return;
      core_->aborted = true;
      core_->error = why;
      for (auto& e : core_->inflight)
        if (e->state == Entry::State::Pending || e->state == Entry::State::Launching)
          unresolved.push_back(e);
      if (inside_device_)
        abort_deferred_ = true;  // never abort under a thread that is inside the device
      else
        run_abort = true;
    }
    // The device first: when wait() throws, the communicator is already aborted (unless a
    // launch is inside it; then when that launch returns).
    if (run_abort) abort_device();
    const std::string prefix = rank_prefix();  // warn_str adds its own
    warn_str(why.compare(0, prefix.size(), prefix) == 0 ? why.substr(prefix.size()) : why);
    resolve(unresolved, false, why, culprit);
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->changed.notify_all();
  }

  void abort_device() {
    std::lock_guard<std::mutex> lock(device_mu_);
    if (device_aborted_) return;
    device_aborted_ = true;
    device_->abort();
  }

  // Under core mu.
  bool has_pending() const {
    for (auto& e : core_->inflight)
      if (e->state == Entry::State::Pending || e->state == Entry::State::Launching) return true;
    return false;
  }

  std::shared_ptr<Comm> bootstrap_;  // MPI comm with the same members: splits
  std::unique_ptr<DeviceLayer> device_;
  const Options options_;
  std::shared_ptr<Core> core_;
  std::mutex device_mu_;             // async_error() and abort() never overlap
  bool device_aborted_ = false;      // guarded by device_mu_
  bool inside_device_ = false;       // a launch or split is in the device layer (core mu)
  bool abort_deferred_ = false;      // abort when it returns (core mu)
  std::mutex issue_mu_;              // one launch at a time, in sequence order
  std::condition_variable turn_;
  uint64_t next_launch_ = 1;         // sequence number allowed to launch next
  std::thread poller_;
};

}  // namespace

Options options_from_env(Options inherited) {
  if (const char* v = std::getenv("DTL_NCCL_TIMEOUT"); v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end != v && *end == '\0' && s > 0 && std::isfinite(s))
      inherited.timeout_s = s;
    else
      warn_str(fmt::format("DTL_NCCL_TIMEOUT='{}' is not a positive number of seconds; keeping "
                           "{:.3g} s", v, inherited.timeout_s));
  }
  if (const char* v = std::getenv("DTL_NCCL_BLOCKING_WAIT"))
    inherited.blocking_wait = *v && std::string(v) != "0";
  return inherited;
}

std::shared_ptr<Comm> make_comm(std::shared_ptr<Comm> bootstrap,
                                std::unique_ptr<DeviceLayer> device, const std::string& name,
                                const Options& options) {
  DTL_CHECK(bootstrap != nullptr, "engine::make_comm: no bootstrap comm");
  DTL_CHECK(options.timeout_s > 0, fmt::format("engine::make_comm: timeout must be positive, "
                                               "got {} s", options.timeout_s));
  return std::make_shared<EngineComm>(std::move(bootstrap), std::move(device), name, options);
}

}  // namespace engine
}  // namespace dtl
