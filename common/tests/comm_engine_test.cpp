// The NCCL backend's engine (dtl/comm_engine.hpp) on a fake device layer, on CPU, at every
// world size: every op, the padding of uneven sizes, keep-alive, completion in any order,
// timeouts, device and asynchronous errors, launches that block or throw, abort while a launch
// is inside the device, a tensor and a Work outliving their Comm, splits. The fake moves the
// data over MPI on a "stream" thread of its own and records every breach of the device-layer
// contract (a freed buffer read, an abort while a launch is inside, a close with ops in flight).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "dtl/comm_engine.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"
#include "dtl/split.hpp"
#include "dtl/timer.hpp"

namespace {

using dtl::Comm;
using dtl::OpType;
using dtl::ReduceOp;
using dtl::Work;
using dtl::engine::DeviceCall;
using dtl::engine::DeviceLayer;
using dtl::engine::DeviceOp;
using dtl::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

// What the fake does with the n-th op enqueued on a device (1-based).
struct Fault {
  int delay_ms = 0;                  // runs this long (a slow kernel)
  bool never = false;                // never ends until abort() (a peer that never joins)
  bool fail = false;                 // ends with a device error
  int late_ms = 0;                   // its completion shows this much later (out of order)
  int block_enqueue_ms = 0;          // enqueue() blocks the host (NCCL's first p2p handshake)
  bool throw_after_enqueue = false;  // enqueue() queues the op, then throws
};

// A plan: `fault` for the `which`-th op (1-based), none for the others.
std::function<Fault(int)> for_op(int which, Fault fault) {
  return [which, fault](int k) { return k == which ? fault : Fault(); };
}

// What the fakes of one test saw; shared by a device and the devices split from it.
struct FakeLog {
  std::mutex mu;
  std::vector<std::string> violations;  // breaches of the device-layer contract
  int aborts = 0, closes = 0;
  std::function<Fault(int)> plan = [](int) { return Fault(); };
  std::string async_error;
  void violate(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    violations.push_back(what);
  }
  std::vector<std::string> seen() {
    std::lock_guard<std::mutex> lock(mu);
    return violations;
  }
};

// A buffer the way a device holds it: an address, not an owner. lock() gives a tensor over
// the same memory while its storage lives, or an undefined tensor once it was freed.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(const torch::Tensor& t) {
    if (!t.defined()) return;
    weak_.emplace(t.storage().getWeakStorageImpl());
    data_ = t.data_ptr();
    sizes_ = t.sizes().vec();
    dtype_ = t.scalar_type();
  }
  bool defined() const { return weak_.has_value(); }
  // `alive` holds the storage while the tensor is used.
  torch::Tensor lock(c10::intrusive_ptr<c10::StorageImpl>& alive) const {
    alive = weak_->lock();
    if (!alive) return torch::Tensor();
    return torch::from_blob(data_, sizes_, torch::TensorOptions().dtype(dtype_));
  }

 private:
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> weak_;
  void* data_ = nullptr;
  std::vector<int64_t> sizes_;
  torch::ScalarType dtype_ = torch::kFloat32;
};

struct FakeOpState {
  std::mutex mu;
  DeviceOp::Status status = DeviceOp::Status::Queued;
  std::string error;
  double visible_at = 0;  // Done shows from then on
};

class FakeOp : public DeviceOp {
 public:
  explicit FakeOp(std::shared_ptr<FakeOpState> s) : s_(std::move(s)) {}
  Status query(std::string& error) noexcept override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->status == Status::Done && dtl::now_seconds() < s_->visible_at) return Status::Running;
    error = s_->error;
    return s_->status;
  }
  void order_caller_after() override {}  // no streams: the host is the caller

 private:
  std::shared_ptr<FakeOpState> s_;
};

class FakeDevice : public DeviceLayer {
 public:
  FakeDevice(const std::shared_ptr<Comm>& bootstrap, std::shared_ptr<FakeLog> log)
      : mpi_(bootstrap->dup()), control_(bootstrap->dup()), log_(std::move(log)) {
    stream_ = std::thread([this] { run(); });
  }
  ~FakeDevice() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    stream_.join();
  }

  torch::Device device() const override { return torch::kCPU; }

  std::unique_ptr<DeviceOp> enqueue(const DeviceCall& call,
                                    const std::function<void()>& finish) override {
    Item item;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++inside_;
      if (aborted_) log_->violate("enqueue() after abort()");
      item.fault = log_->plan(++enqueued_);
    }
    struct Leave {
      FakeDevice& d;
      ~Leave() {
        std::lock_guard<std::mutex> lock(d.mu_);
        --d.inside_;
      }
    } leave{*this};
    if (item.fault.block_enqueue_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(item.fault.block_enqueue_ms));
    item.n = enqueued_;
    item.call = call;
    item.send = Buffer(call.send);
    item.recv = Buffer(call.recv);
    item.call.send = torch::Tensor();  // hold no references: the engine must
    item.call.recv = torch::Tensor();
    item.finish = finish ? &finish : nullptr;
    item.state = std::make_shared<FakeOpState>();
    auto op = std::make_unique<FakeOp>(item.state);
    const bool throw_now = item.fault.throw_after_enqueue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (throw_now) throw dtl::Error("injected launch failure");
    return op;
  }

  std::string async_error() noexcept override {
    std::lock_guard<std::mutex> lock(log_->mu);
    return log_->async_error;
  }

  void abort() noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (inside_ > 0) log_->violate("abort() while a thread was inside enqueue()");
      if (aborted_) log_->violate("abort() twice");
      aborted_ = true;
    }
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      ++log_->aborts;
    }
    cv_.notify_all();
  }

  bool idle() noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.empty();
  }

  void close() noexcept override {
    // An op that reported Done leaves the queue a moment later: only one still running counts.
    bool running = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& item : queue_) {
        std::lock_guard<std::mutex> op_lock(item.state->mu);
        running |= item.state->status != DeviceOp::Status::Done &&
                   item.state->status != DeviceOp::Status::Failed;
      }
    }
    if (running) log_->violate("close() with ops still on the device");
    std::lock_guard<std::mutex> lock(log_->mu);
    ++log_->closes;
  }

  // Collective over every member of this device's communicator, as ncclCommSplit is: a member
  // that opted out (sub null) still takes part. A member that does not call it leaves the others
  // waiting here (the test's watchdog then fails the test).
  std::unique_ptr<DeviceLayer> split(const std::shared_ptr<Comm>& sub, int color, int key) override {
    auto joined = control_->split(sub ? color : -1, key);
    if (!sub) return nullptr;
    if (!joined || joined->size() != sub->size())
      log_->violate(fmt::format("split: the device's group has {} members, the bootstrap's {}",
                                joined ? joined->size() : 0, sub->size()));
    return std::make_unique<FakeDevice>(sub, log_);
  }

 private:
  struct Item {
    int n = 0;
    Fault fault;
    DeviceCall call;  // without tensors
    Buffer send, recv;
    const std::function<void()>* finish = nullptr;  // the engine's: alive until Done or Failed
    std::shared_ptr<FakeOpState> state;
  };

  void set(Item& item, DeviceOp::Status status, const std::string& error = "") {
    std::lock_guard<std::mutex> lock(item.state->mu);
    item.state->status = status;
    item.state->error = error;
    item.state->visible_at = dtl::now_seconds() + item.fault.late_ms / 1000.0;
  }

  // The stream: ops one at a time, in enqueue order; an op leaves the queue when it is over.
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Item& item = queue_.front();
      lock.unlock();
      execute(item);
      lock.lock();
      queue_.pop_front();
    }
  }

  // Waits until `ms` passed (or forever when ms < 0); false if aborted (or stopped) first.
  bool sleep_unless_aborted(int ms) {
    std::unique_lock<std::mutex> lock(mu_);
    auto stopped = [&] { return aborted_ || stop_; };
    if (ms < 0) {
      cv_.wait(lock, stopped);
      return false;
    }
    return !cv_.wait_for(lock, std::chrono::milliseconds(ms), stopped);
  }

  void execute(Item& item) {
    bool ended = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended = !aborted_;
    }
    // An aborted op still runs on the stream (and returns at once): its buffers must live.
    if (ended) {
      set(item, DeviceOp::Status::Running);
      ended = sleep_unless_aborted(item.fault.never ? -1 : item.fault.delay_ms);
    }
    // The kernel reads and writes its buffers until it returns, aborted or not.
    c10::intrusive_ptr<c10::StorageImpl> send_alive, recv_alive;
    torch::Tensor send = item.send.defined() ? item.send.lock(send_alive) : torch::Tensor();
    torch::Tensor recv = item.recv.defined() ? item.recv.lock(recv_alive) : torch::Tensor();
    if ((item.send.defined() && !send.defined()) || (item.recv.defined() && !recv.defined())) {
      log_->violate(fmt::format("op {} ({}) touched a buffer that was already freed", item.n,
                                dtl::to_string(item.call.type)));
      return set(item, DeviceOp::Status::Failed, "freed buffer");
    }
    if (!ended) return set(item, DeviceOp::Status::Failed, "aborted");
    if (item.fault.fail) return set(item, DeviceOp::Status::Failed, "injected device error");
    try {
      transfer(item.call, send, recv);
      if (item.finish) (*item.finish)();
      set(item, DeviceOp::Status::Done);
    } catch (const std::exception& e) {
      log_->violate(fmt::format("op {}: {}", item.n, e.what()));
      set(item, DeviceOp::Status::Failed, e.what());
    }
  }

  // What NCCL would do, over MPI; and what NCCL would reject.
  void transfer(const DeviceCall& c, const torch::Tensor& send, const torch::Tensor& recv) {
    const int n = mpi_->size();
    DTL_CHECK(c.size == n, "DeviceCall::size is not the communicator's size");
    switch (c.type) {
      case OpType::AllReduce: return mpi_->all_reduce(recv, c.reduce);
      case OpType::ReduceScatter:
        DTL_CHECK(send.numel() == n * recv.numel(), "uneven reduce_scatter reached the device");
        return mpi_->reduce_scatter(recv, send, c.reduce);
      case OpType::AllGather:
        DTL_CHECK(recv.numel() == n * send.numel(), "uneven all_gather reached the device");
        return mpi_->all_gather(recv, send);
      case OpType::Broadcast: return mpi_->broadcast(recv, c.peer);
      case OpType::Reduce: return mpi_->reduce(recv, c.peer, c.reduce);
      case OpType::AllToAll: return mpi_->all_to_all(recv, send);
      case OpType::Barrier:
        DTL_CHECK(!send.defined() && !recv.defined(), "barrier with buffers");
        return mpi_->barrier();
      case OpType::Send: return mpi_->send(send, c.peer);
      case OpType::Recv: return mpi_->recv(recv, c.peer);
      case OpType::SendRecv: return mpi_->sendrecv(send, c.peer, recv, c.peer2);
      case OpType::Split: break;
    }
    throw dtl::Error("split reached enqueue()");
  }

  std::shared_ptr<Comm> mpi_;  // the data path: a dup of the bootstrap, used by run() only
  std::shared_ptr<Comm> control_;  // host-side collectives (split), never on the stream thread
  std::shared_ptr<FakeLog> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;     // front: the op running now
  int enqueued_ = 0, inside_ = 0;
  bool aborted_ = false, stop_ = false;
  std::thread stream_;
};

class Engine : public ::testing::Test {
 protected:
  std::shared_ptr<FakeLog> log = std::make_shared<FakeLog>();
  const int n = dtl::world().size(), r = dtl::world().rank();

  std::shared_ptr<Comm> make(double timeout_s = 30, bool blocking_wait = true,
                             bool read_env = false) {
    auto boot = dtl::world().dup();
    dtl::engine::Options options;
    options.timeout_s = timeout_s;
    options.blocking_wait = blocking_wait;
    options.read_env = read_env;
    return dtl::engine::make_comm(boot, std::make_unique<FakeDevice>(boot, log), "eng", options);
  }
  void TearDown() override { EXPECT_THAT(log->seen(), ::testing::IsEmpty()); }
};

torch::Tensor range_of(int64_t begin, int64_t end) {
  return torch::arange(begin, end, torch::kFloat32);
}

TEST_F(Engine, EveryOpAgreesWithItsFormula) {
  log->plan = [](int k) {  // staggered: copy-backs run long after their launch returned
    Fault f;
    f.delay_ms = k % 3;
    return f;
  };
  auto c = make();
  const double tri = n * (n - 1) / 2.0;
  auto t = torch::full({5}, r + 1.0);
  c->all_reduce(t);
  DTL_EXPECT_EQUAL(t, torch::full({5}, n * (n + 1) / 2.0));
  t = torch::full({4}, 2.0 * r);
  c->all_reduce(t, ReduceOp::Avg);
  DTL_EXPECT_EQUAL(t, torch::full({4}, n - 1.0));
  t = torch::full({3}, 1.0 * r);
  c->all_reduce(t, ReduceOp::Max);
  DTL_EXPECT_EQUAL(t, torch::full({3}, n - 1.0));

  for (int64_t total : {int64_t(2 * n), int64_t(3 * n + 1)}) {  // even, then uneven (n > 1)
    const auto mine = dtl::split_range(total, n, r);
    auto out = torch::empty({mine.size()});
    c->reduce_scatter(out, range_of(0, total) + r);
    DTL_EXPECT_EQUAL(out, range_of(mine.begin, mine.end) * n + tri);
    auto gathered = torch::empty({total, 2}).select(1, 0);  // non-contiguous: a second copy-back
    c->all_gather(gathered, range_of(mine.begin, mine.end));
    DTL_EXPECT_EQUAL(gathered, range_of(0, total));
  }

  t = r == n - 1 ? range_of(0, 6) : torch::zeros({6});
  c->broadcast(t, n - 1);
  DTL_EXPECT_EQUAL(t, range_of(0, 6));
  t = torch::full({3}, r + 1.0);
  c->reduce(t, 0);
  if (r == 0) {
    DTL_EXPECT_EQUAL(t, torch::full({3}, n * (n + 1) / 2.0));
  }

  auto a2a_in = torch::empty({n, 2}), a2a_out = torch::empty({n, 2});
  for (int j = 0; j < n; ++j) a2a_in[j].fill_(100 * r + j);
  c->all_to_all(a2a_out, a2a_in);
  for (int j = 0; j < n; ++j) DTL_EXPECT_EQUAL(a2a_out[j], torch::full({2}, 100.0 * j + r));

  c->barrier();
  c->barrier_async().wait();

  if (n > 1) {  // a ring of send/recv pairs (even ranks send first), then of sendrecv
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    auto got = torch::empty({4});
    if (r % 2 == 0) {
      c->send(torch::full({4}, 1.0 * r), next);
      c->recv(got, prev);
    } else {
      c->recv(got, prev);
      c->send(torch::full({4}, 1.0 * r), next);
    }
    DTL_EXPECT_EQUAL(got, torch::full({4}, 1.0 * prev));
    got.zero_();
    c->sendrecv(torch::full({4}, 10.0 * r), next, got, prev);
    DTL_EXPECT_EQUAL(got, torch::full({4}, 10.0 * prev));
  }
  EXPECT_THAT(c->pending_ops(), ::testing::IsEmpty());
  for (const auto& rec : c->recent_ops())
    EXPECT_EQ(rec.state, dtl::OpRecord::State::Completed) << rec.describe();
}

TEST_F(Engine, BuffersLiveUntilTheDeviceIsDoneWithThem) {
  log->plan = [](int k) {
    Fault f;
    f.delay_ms = k < 4 ? 100 : 0;  // the first three run after the caller dropped everything
    return f;
  };
  auto c = make(30, false);
  const int64_t total = 2 * n + 1;
  const auto mine = dtl::split_range(total, n, r);
  // The caller keeps neither tensors nor Works: only the engine holds the buffers, the padded
  // temporaries and the copy-back targets.
  c->all_gather_async(torch::empty({total}), range_of(mine.begin, mine.end));
  c->reduce_scatter_async(torch::empty({mine.size() * 2}).slice(0, 0, mine.size() * 2, 2),
                          range_of(0, total));
  c->all_reduce_async(torch::ones({1000}));
  c->barrier();
  EXPECT_THAT(c->pending_ops(), ::testing::IsEmpty());
}

TEST_F(Engine, OpsCompleteInWhateverOrderTheDeviceFinishesThem) {
  Fault late;
  late.late_ms = 3000;  // the first op's completion shows long after the second's
  log->plan = for_op(1, late);
  auto c = make(30, false);
  auto first = torch::full({3}, 1.0), second = torch::full({3}, 2.0);
  Work w1 = c->all_reduce_async(first);
  Work w2 = c->all_reduce_async(second);
  dtl::Timer timer;
  auto poll = [&](Work& w) {
    while (!w.is_completed() && timer.seconds() < 20)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return w.is_completed();
  };
  ASSERT_TRUE(poll(w2));
  EXPECT_LT(timer.seconds(), 2.5) << "the second op waited for the first one's completion";
  EXPECT_FALSE(w1.is_completed()) << "the first op's completion is 3 s late";
  DTL_EXPECT_EQUAL(second, torch::full({3}, 2.0 * n));
  ASSERT_TRUE(poll(w1));
  DTL_EXPECT_EQUAL(first, torch::full({3}, 1.0 * n));
  EXPECT_THAT(c->pending_ops(), ::testing::IsEmpty());
}

TEST_F(Engine, ATensorAndAWorkOutliveTheirComm) {
  log->plan = [](int) {
    Fault f;
    f.delay_ms = 200;
    return f;
  };
  auto t = torch::full({4}, 1.0);
  Work w;
  {
    auto c = make();
    w = c->all_reduce_async(t);
  }  // the Comm drains its op, then closes the device: no close with an op in flight
  EXPECT_EQ(log->closes, 1);
  EXPECT_TRUE(w.is_completed());
  w.wait();
  DTL_EXPECT_EQUAL(t, torch::full({4}, 1.0 * n));
  t = torch::Tensor();  // freed after its comm and device are gone
}

TEST_F(Engine, ATimeoutOnAFirstOpFailsItAndEveryLaterOne) {
  Fault fault;
  fault.never = true;
  log->plan = for_op(1, fault);
  auto c = make(0.4);
  dtl::Timer timer;
  const int64_t total = 2 * n + 1;
  const auto mine = dtl::split_range(total, n, r);
  Work w1 = c->all_gather_async(torch::empty({total}), range_of(mine.begin, mine.end));
  Work w2 = c->all_reduce_async(torch::ones({2}));
  EXPECT_THAT(error_of([&] { w1.wait(); }),
              AllOf(HasSubstr("all_gather #1 on comm 'eng'"),
                    HasSubstr("did not complete within 0.4 s (DTL_NCCL_TIMEOUT)"),
                    HasSubstr("compare the op numbers")));
  EXPECT_LT(timer.seconds(), 10);
  EXPECT_THAT(error_of([&] { w2.wait(); }),
              AllOf(HasSubstr("all_reduce #2 on comm 'eng'"),
                    HasSubstr("aborted because an earlier op failed")));
  EXPECT_THAT(error_of([&] { c->all_reduce(torch::ones({1})); }),
              AllOf(HasSubstr("all_reduce #3"), HasSubstr("was aborted after an earlier failure")));
  EXPECT_EQ(log->aborts, 1);
  EXPECT_THAT(c->pending_ops(), ::testing::IsEmpty());
  for (const auto& rec : c->recent_ops())
    EXPECT_EQ(rec.state, dtl::OpRecord::State::Failed) << rec.describe();
  c.reset();  // waits until the device let go of the aborted ops' buffers
  EXPECT_EQ(log->closes, 0) << "an aborted communicator is not closed";
}

TEST_F(Engine, ADeviceErrorAbortsTheComm) {
  Fault fault;
  fault.fail = true;
  log->plan = for_op(1, fault);
  auto c = make(5);  // the only op fails: a missed failure shows as its timeout instead
  EXPECT_THAT(error_of([&] { c->all_reduce(torch::ones({2})); }),
              AllOf(HasSubstr("all_reduce #1 on comm 'eng'"), HasSubstr("injected device error"),
                    HasSubstr("the communicator was aborted")));
  EXPECT_EQ(log->aborts, 1);
}

TEST_F(Engine, AnAsynchronousErrorAbortsTheComm) {
  Fault fault;
  fault.never = true;
  log->plan = for_op(1, fault);
  auto c = make(5);  // the only op fails: a missed failure shows as its timeout instead
  Work w = c->broadcast_async(torch::ones({2}), 0);
  {
    std::lock_guard<std::mutex> lock(log->mu);
    log->async_error = "NCCL async error: remote process exited (injected)";
  }
  EXPECT_THAT(error_of([&] { w.wait(); }),
              AllOf(HasSubstr("broadcast #1 on comm 'eng'"), HasSubstr("remote process exited")));
  EXPECT_EQ(log->aborts, 1);
}

TEST_F(Engine, ALaunchBlockedInTheDeviceTimesOutAndAbortsWhenItReturns) {
  Fault blocked;  // a first recv waiting in NCCL's handshake for a peer that never sends
  blocked.block_enqueue_ms = 1200;
  blocked.never = true;
  log->plan = for_op(1, blocked);
  auto c = make(0.3);
  dtl::Timer timer;
  EXPECT_THAT(error_of([&] { c->all_reduce(torch::ones({2})); }),
              AllOf(HasSubstr("all_reduce #1 on comm 'eng'"),
                    HasSubstr("still inside the device layer's launch after 0.3 s")));
  EXPECT_GE(timer.seconds(), 1.1) << "the launch had to return first";
  EXPECT_EQ(log->aborts, 1);  // after the launch left the device (the fake checks)
}

TEST_F(Engine, AnAbortDueWhileALaunchIsInsideTheDeviceWaitsForIt) {
  log->plan = [](int k) {
    Fault f;
    // The first op times out at 0.4 s while the second one's launch is inside the device.
    f.never = k <= 2;
    f.block_enqueue_ms = k == 2 ? 1500 : 0;
    return f;
  };
  auto c = make(0.4);
  Work w1 = c->all_reduce_async(torch::ones({2}));
  EXPECT_THAT(error_of([&] { c->all_reduce(torch::ones({2})); }),
              AllOf(HasSubstr("all_reduce #2 on comm 'eng'"), HasSubstr("aborted")));
  EXPECT_THAT(error_of([&] { w1.wait(); }), HasSubstr("all_reduce #1 on comm 'eng'"));
  EXPECT_EQ(log->aborts, 1);
}

TEST_F(Engine, ALaunchThatThrowsAfterEnqueueingKeepsItsBuffers) {
  Fault fault;
  fault.throw_after_enqueue = true;
  fault.never = true;  // the device still uses the buffers after the throw, until the abort
  log->plan = for_op(1, fault);
  auto c = make();
  const int64_t total = 2 * n + 1;
  const auto mine = dtl::split_range(total, n, r);
  EXPECT_THAT(error_of([&] { c->all_gather(torch::empty({total}), range_of(mine.begin, mine.end)); }),
              AllOf(HasSubstr("all_gather #1 on comm 'eng'"),
                    HasSubstr("launch failed: injected launch failure")));
  EXPECT_EQ(log->aborts, 1);
  EXPECT_THAT(c->pending_ops(), ::testing::IsEmpty());
  c.reset();  // waits for the device to let go
}

TEST_F(Engine, DestroyingACommWithAStuckOpAbortsItAtTheTimeout) {
  log->plan = [](int) {
    Fault f;
    f.never = true;
    return f;
  };
  dtl::Timer timer;
  {
    auto c = make(0.4);
    c->all_reduce_async(torch::ones({2}));
  }
  EXPECT_LT(timer.seconds(), 10);
  EXPECT_EQ(log->aborts, 1);
  EXPECT_EQ(log->closes, 0);
}

TEST_F(Engine, SplitAndDupRunOnDevicesOfTheirOwn) {
  {
    auto c = make();
    auto parity = c->split(r % 2, r, "eng/parity");
    ASSERT_NE(parity, nullptr);
    EXPECT_EQ(parity->name(), "eng/parity");
    EXPECT_EQ(parity->size(), (n + 1 - r % 2) / 2);
    auto t = torch::full({2}, 1.0);
    parity->all_reduce(t);
    DTL_EXPECT_EQUAL(t, torch::full({2}, 1.0 * parity->size()));
    auto d = c->dup();
    EXPECT_EQ(d->name(), "eng/dup");
    t = torch::full({2}, 1.0);
    d->all_reduce(t);
    DTL_EXPECT_EQUAL(t, torch::full({2}, 1.0 * n));
    EXPECT_EQ(c->split(-1, r), nullptr);
  }
  EXPECT_EQ(log->closes, 3);
}

TEST_F(Engine, ErrorsBeforeTheDeviceLeaveNothingPending) {
  auto c = make();
  if (n > 1) {
    EXPECT_THAT(error_of([&] { c->send(torch::ones({1}), (r + 1) % n, 7); }),
                HasSubstr("tag 7 is not supported by the nccl backend"));
  }
  // A tensor on another device than the comm's (here: meta, on a CPU comm; on a GPU: a CPU
  // tensor on an NCCL comm) never reaches the device layer.
  EXPECT_THAT(error_of([&] { c->all_reduce(torch::empty({2}, torch::kMeta)); }),
              AllOf(HasSubstr("tensor is on meta but comm 'eng' (nccl backend) moves cpu tensors"),
                    HasSubstr("move the tensor with .to()")));
  EXPECT_THAT(c->pending_ops(), ::testing::IsEmpty());
  c->barrier();  // the comm still works
}

// A split's device layer is made by every member of the parent, those that opt out included
// (ncclCommSplit is collective over the parent; the fake's split is too).
TEST_F(Engine, EveryMemberOfTheParentTakesPartInASplit) {
  auto c = make();
  auto sub = c->split(r == 0 && n > 1 ? -1 : 1, r, "eng/rest");
  EXPECT_EQ(sub == nullptr, r == 0 && n > 1);
  if (sub) {
    auto t = torch::ones({2});
    sub->all_reduce(t);
    DTL_EXPECT_EQUAL(t, torch::full({2}, n > 1 ? n - 1.0 : 1.0));
  }
  c->barrier();
}

// The nccl backend's comms read DTL_NCCL_TIMEOUT and DTL_NCCL_BLOCKING_WAIT when they are made,
// dup() and split() included: the smoke test's mismatch case sets a short timeout for one dup.
// Unset at a child's creation, a variable keeps the parent's value.
TEST_F(Engine, EachCommReadsTheEnvironmentWhenItIsMade) {
  log->plan = [](int) {
    Fault f;
    f.never = true;  // every op hangs: only the timeout ends it
    return f;
  };
  auto c = make(60, true, /*read_env=*/true);
  setenv("DTL_NCCL_TIMEOUT", "0.3", 1);
  auto quick = c->dup();
  unsetenv("DTL_NCCL_TIMEOUT");
  auto inherits = quick->split(0, r, "eng/dup/again");
  for (auto* comm : {quick.get(), inherits.get()}) {
    dtl::Timer timer;
    EXPECT_THAT(error_of([&] { comm->all_reduce(torch::ones({2})); }),
                HasSubstr("did not complete within 0.3 s (DTL_NCCL_TIMEOUT)"))
        << comm->name();
    EXPECT_LT(timer.seconds(), 10) << comm->name() << " waited for its parent's 60 s";
  }
}

TEST_F(Engine, DtlNcclBlockingWaitIsReadWhenACommIsMade) {
  log->plan = [](int) {
    Fault f;
    f.delay_ms = 300;
    return f;
  };
  auto c = make(30, /*blocking_wait=*/false, /*read_env=*/true);
  setenv("DTL_NCCL_BLOCKING_WAIT", "1", 1);
  auto blocking = c->dup();
  unsetenv("DTL_NCCL_BLOCKING_WAIT");
  Work w = blocking->all_reduce_async(torch::ones({2}));
  w.wait();
  EXPECT_TRUE(w.is_completed()) << "DTL_NCCL_BLOCKING_WAIT=1 at dup(): wait() blocks the host";
  Work v = c->all_reduce_async(torch::ones({2}));
  v.wait();
  EXPECT_FALSE(v.is_completed()) << "the parent's wait() does not block the host";
  c->barrier();
}

// Without read_env (a backend whose options come from elsewhere), children copy the parent's.
TEST_F(Engine, ChildrenCopyTheirParentsOptionsUnlessTheyReadTheEnvironment) {
  log->plan = [](int) {
    Fault f;
    f.never = true;
    return f;
  };
  auto c = make(0.3, true, /*read_env=*/false);
  setenv("DTL_NCCL_TIMEOUT", "60", 1);
  auto d = c->dup();
  unsetenv("DTL_NCCL_TIMEOUT");
  dtl::Timer timer;
  EXPECT_THAT(error_of([&] { d->all_reduce(torch::ones({2})); }),
              HasSubstr("did not complete within 0.3 s"));
  EXPECT_LT(timer.seconds(), 10);
}

TEST(EngineOptions, FromTheEnvironment) {
  dtl::engine::Options base;
  base.timeout_s = 7;
  base.blocking_wait = true;
  unsetenv("DTL_NCCL_TIMEOUT");
  unsetenv("DTL_NCCL_BLOCKING_WAIT");
  auto o = dtl::engine::options_from_env(base);
  EXPECT_EQ(o.timeout_s, 7);
  EXPECT_TRUE(o.blocking_wait);
  setenv("DTL_NCCL_TIMEOUT", "2.5", 1);
  setenv("DTL_NCCL_BLOCKING_WAIT", "0", 1);
  o = dtl::engine::options_from_env(base);
  EXPECT_EQ(o.timeout_s, 2.5);
  EXPECT_FALSE(o.blocking_wait);
  for (const char* bad : {"abc", "-1", "0", "5s"}) {
    setenv("DTL_NCCL_TIMEOUT", bad, 1);
    EXPECT_EQ(dtl::engine::options_from_env(base).timeout_s, 7) << bad;
  }
  unsetenv("DTL_NCCL_TIMEOUT");
  unsetenv("DTL_NCCL_BLOCKING_WAIT");
}

}  // namespace
