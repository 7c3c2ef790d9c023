// Scenarios of the GPU smoke suite that also run on CPU, against the NCCL device layer built on
// the fake CUDA runtime and fake NCCL (common/tests/fake_cuda): the smoke test (smoke_test.cpp,
// real GPUs) and nccl_layer_tests (CPU, every commit) run the very same code, so a protocol
// mistake in the scenario fails on CPU first. What differs between the two is in Hooks.
#pragma once

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/timer.hpp"

namespace dtl_gpu_scenarios {

struct Hooks {
  // Runs `fn` with a new stream as the calling thread's current stream, then blocks the host
  // until that stream ran everything `fn` enqueued.
  std::function<void(const std::function<void()>&)> on_own_stream;
  // Blocks the host until this thread's current stream ran what was enqueued (then results may
  // be read on the host).
  std::function<void()> sync_host;
  // A tensor of ones that slow work on the current stream writes last (a collective issued on
  // it now stays in flight for a while).
  std::function<torch::Tensor()> busy_ones;
};

inline bool all_equal(const torch::Tensor& t, double value) {
  return torch::all(t == value).item<bool>();
}

// A deliberately mismatched op on a dup() made with DTL_NCCL_TIMEOUT=`timeout_s`: rank 0
// receives from rank 1 while every other rank all-reduces. Every rank must get a dtl::Error
// naming its op within the timeout, not hang; freeing the comm must not hang; the parent goes on.
inline void mismatched_op_ends_in_an_error(dtl::Comm& parent, const char* timeout_s,
                                           const Hooks& h) {
  using ::testing::AnyOf;
  using ::testing::HasSubstr;
  const int n = parent.size(), r = parent.rank();
  // The dup reads the variable when it is made; the parent and later dups keep their own.
  setenv("DTL_NCCL_TIMEOUT", timeout_s, 1);
  auto comm = parent.dup();
  unsetenv("DTL_NCCL_TIMEOUT");
  const auto opt = torch::TensorOptions().device(comm->device());
  const int64_t numel = 1 << 16;
  // Warm up with the very ops and size mismatched below. NCCL connects peers lazily, and since
  // 2.22 each new algorithm or protocol too, inside the launch: the first use of an op and size
  // blocks the host until the peers make it as well, before the comm's timeout can act.
  {
    auto a = torch::ones({numel}, opt), b = torch::empty({numel}, opt);
    comm->all_reduce(a);                                  // #1
    comm->sendrecv(a, (r - 1 + n) % n, b, (r + 1) % n);  // #2: rank 0 receives from rank 1
    h.sync_host();
  }
  // Rank 0 skips the all_reduce everyone else issues and waits for a message nobody sends:
  // every rank is stuck until its comm's timeout aborts it. Issued inside the try: a launch
  // that blocks past the timeout throws from the issue itself.
  auto t = torch::ones({numel}, opt);
  dtl::Timer timer;
  std::string msg = "(no error after 60 s)";
  dtl::Work work;
  try {
    work = r == 0 ? comm->recv_async(t, 1) : comm->all_reduce_async(t);
    while (!work.is_completed() && timer.seconds() < 60)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const dtl::Error& e) {
    msg = e.what();
  }
  EXPECT_LT(timer.seconds(), 6 * std::atof(timeout_s) + 5) << msg;
  EXPECT_THAT(msg, HasSubstr(fmt::format("{} #3 on comm '{}/dup'", r == 0 ? "recv" : "all_reduce",
                                         parent.name())));
  EXPECT_THAT(msg, AnyOf(HasSubstr(fmt::format("did not complete within {} s", timeout_s)),
                         HasSubstr("NCCL async error")));
  EXPECT_THROW(work.wait(), dtl::Error);
  EXPECT_TRUE(comm->pending_ops().empty());
  EXPECT_EQ(comm->recent_ops().back().state, dtl::OpRecord::State::Failed);
  EXPECT_THAT(dtl::testing::error_of([&] { comm->all_reduce(t); }), HasSubstr("aborted"));
  dtl::Timer free_timer;
  comm.reset();
  EXPECT_LT(free_timer.seconds(), 10) << "freeing an aborted comm hung";
  auto ok = torch::ones({8}, opt);
  parent.all_reduce(ok);
  h.sync_host();
  EXPECT_TRUE(all_equal(ok, n)) << "the parent comm must be unaffected";
}

// A dup and a split made while the parent has an op in flight, then driven from two threads,
// each on a stream of its own. Two comms' ops on one shared stream may be ordered differently on
// different ranks, which NCCL forbids: a rank's stream waits for comm A's op, which waits for a
// peer whose stream waits for comm B's op, which waits for us. The scenario forces that worst
// order (rank 0 drives the dup first, every other rank the split first), so a shared stream
// deadlocks (until the comms' timeout) instead of passing by luck.
inline void concurrent_split_and_dup(dtl::Comm& parent, const Hooks& h) {
  const int n = parent.size(), r = parent.rank();
  const auto opt = torch::TensorOptions().device(parent.device());
  auto x = h.busy_ones();
  auto in_flight = parent.all_reduce_async(x);
  auto dup = parent.dup();
  auto half = parent.split(r % 2, r);
  in_flight.wait();
  h.sync_host();
  EXPECT_TRUE(all_equal(x, n));
  ASSERT_TRUE(dup && half);
  float half_sum = 0;
  for (int p = r % 2; p < n; p += 2) half_sum += static_cast<float>(p);
  std::vector<torch::Tensor> a(20), b(20);
  std::string errors;
  std::mutex mu;
  std::promise<void> first_issued;
  std::shared_future<void> first = first_issued.get_future().share();
  std::once_flag released;
  auto release = [&] { std::call_once(released, [&] { first_issued.set_value(); }); };
  auto drive = [&](dtl::Comm& c, std::vector<torch::Tensor>& out, bool goes_first) {
    try {
      if (!goes_first) first.wait();
      h.on_own_stream([&] {
        std::vector<dtl::Work> works;
        for (size_t i = 0; i < out.size(); ++i) {
          out[i] = torch::full({1 << 12}, static_cast<float>(r), opt);
          works.push_back(c.all_reduce_async(out[i]));
        }
        for (auto& w : works) w.wait();  // the thread's stream waits; the host does not
        if (goes_first) release();
      });
    } catch (const std::exception& e) {
      if (goes_first) release();
      std::lock_guard<std::mutex> lock(mu);
      errors += e.what();
    }
  };
  const bool dup_first = r == 0;
  std::thread t1(drive, std::ref(*dup), std::ref(a), dup_first);
  std::thread t2(drive, std::ref(*half), std::ref(b), !dup_first);
  t1.join();
  t2.join();
  EXPECT_EQ(errors, "");
  for (auto& t : a) EXPECT_TRUE(all_equal(t, n * (n - 1) / 2.0));
  for (auto& t : b) EXPECT_TRUE(all_equal(t, half_sum));
}

}  // namespace dtl_gpu_scenarios
