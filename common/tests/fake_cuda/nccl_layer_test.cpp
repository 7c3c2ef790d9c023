// The NCCL device layer itself (common/src/comm_nccl.cpp, compiled a second time against the
// fake CUDA runtime and fake NCCL beside this file) on CPU, at every world size: what the engine
// tests with their fake layer cannot see. Each test names the mistake of a device layer it
// catches: the comm stream not ordered after the caller's stream, the caller not ordered after
// the op, a split that is not collective over the parent, a communicator left non-blocking under
// NCCL_COMM_BLOCKING=0, a CUDA context created on another rank's GPU, a device-wide
// synchronisation when a comm is freed; and the smoke suite's own scenarios (scenarios.hpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "../../tests_gpu/scenarios.hpp"
#include "dtl/comm_nccl.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"
#include "dtl/split.hpp"
#include "fake_cuda.hpp"

namespace {

using dtl_gpu_scenarios::all_equal;

class Layer : public ::testing::Test {
 protected:
  const int n = dtl::world().size(), r = dtl::world().rank();
  // An NCCL comm over the world's members on fake GPU `device`, with DTL_NCCL_TIMEOUT=timeout.
  std::shared_ptr<dtl::Comm> make(const char* timeout = "20", int device = 0) {
    setenv("DTL_NCCL_TIMEOUT", timeout, 1);
    auto c = dtl::make_nccl_comm(dtl::Runtime::get().cpu_world(), device, "layer", 1);
    unsetenv("DTL_NCCL_TIMEOUT");
    return c;
  }
  void SetUp() override { fake_cuda::take_violations(); }
  void TearDown() override { EXPECT_THAT(fake_cuda::take_violations(), ::testing::IsEmpty()); }
};

dtl_gpu_scenarios::Hooks fake_hooks() {
  dtl_gpu_scenarios::Hooks h;
  h.on_own_stream = [](const std::function<void()>& fn) {
    cudaStream_t s = fake_cuda::new_stream();
    {
      fake_cuda::StreamGuard on_stream(s);
      fn();
    }
    cudaStreamSynchronize(s);
  };
  h.sync_host = [] { fake_cuda::sync_current_stream(); };
  h.busy_ones = [] {
    auto x = torch::zeros({1 << 12});
    fake_cuda::launch(cudaStreamLegacy, [x]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      x.fill_(1);
    });
    return x;
  };
  return h;
}

TEST_F(Layer, EveryOpAgreesWithItsFormula) {
  auto c = make();
  auto t = torch::full({5}, r + 1.0);
  c->all_reduce(t);
  auto avg = torch::full({4}, 2.0 * r);
  c->all_reduce(avg, dtl::ReduceOp::Avg);
  for (int64_t total : {int64_t(2 * n), int64_t(3 * n + 1)}) {  // even, then padded
    const auto mine = dtl::split_range(total, n, r);
    auto out = torch::empty({mine.size()});
    c->reduce_scatter(out, torch::arange(total, torch::kFloat32) + r);
    auto gathered = torch::empty({total, 2}).select(1, 0);  // strided: copied back after the op
    c->all_gather(gathered, torch::arange(mine.begin, mine.end, torch::kFloat32));
    fake_cuda::sync_current_stream();
    DTL_EXPECT_EQUAL(out, torch::arange(mine.begin, mine.end, torch::kFloat32) * n + n * (n - 1) / 2.0);
    DTL_EXPECT_EQUAL(gathered, torch::arange(total, torch::kFloat32));
  }
  auto b = r == 0 ? torch::arange(6, torch::kFloat32) : torch::zeros({6});
  c->broadcast(b, 0);
  auto a2a_in = torch::full({n, 2}, 1.0 * r), a2a_out = torch::empty({n, 2});
  c->all_to_all(a2a_out, a2a_in);
  auto ring = torch::empty({3});
  c->sendrecv(torch::full({3}, 1.0 * r), (r + 1) % n, ring, (r + n - 1) % n);
  c->barrier();  // blocks the host until the barrier ran, and so everything before it
  fake_cuda::sync_current_stream();
  DTL_EXPECT_EQUAL(t, torch::full({5}, n * (n + 1) / 2.0));
  DTL_EXPECT_EQUAL(avg, torch::full({4}, n - 1.0));
  DTL_EXPECT_EQUAL(b, torch::arange(6, torch::kFloat32));
  for (int j = 0; j < n; ++j) DTL_EXPECT_EQUAL(a2a_out[j], torch::full({2}, 1.0 * j));
  DTL_EXPECT_EQUAL(ring, torch::full({3}, 1.0 * ((r + n - 1) % n)));
  EXPECT_TRUE(c->pending_ops().empty());
}

// The layer must order its stream after the caller's (the kernels that write the input), and
// wait() the caller's stream after the op (the kernels that read the output). Rank r's producer
// finishes 100 + 100 r ms late, so on rank 0 the op cannot end before rank n-1's producer did.
TEST_F(Layer, TheOpRunsAfterTheCallersKernelsAndTheCallerAfterTheOp) {
  auto c = make();
  auto x = torch::zeros({1024}), y = torch::zeros({1024});
  fake_cuda::launch(cudaStreamLegacy, [x, this]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 100 * r));
    x.fill_(r + 1);
  });
  auto w = c->all_reduce_async(x);
  w.wait();
  fake_cuda::launch(cudaStreamLegacy, [x, y]() mutable { y.copy_(x); });
  fake_cuda::sync_current_stream();
  EXPECT_TRUE(all_equal(y, n * (n + 1) / 2.0))
      << "got " << y[0].item<float>() << ": the op read its input before the caller's kernel "
      << "wrote it, or the caller's next kernel read the output before the op wrote it";
}

// ncclCommSplit is collective over the parent: a rank that leaves the new comm (color < 0)
// still takes part (NCCL_SPLIT_NOCOLOR), or the others wait for it for good.
TEST_F(Layer, ASplitIsCollectiveOverTheParent) {
  auto c = make();
  auto rest = c->split(r == 0 && n > 1 ? -1 : 0, r);
  if (r == 0 && n > 1) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_NE(rest, nullptr);
    auto t = torch::ones({3});
    rest->all_reduce(t);
    fake_cuda::sync_current_stream();
    EXPECT_TRUE(all_equal(t, n > 1 ? n - 1 : 1));
  }
  c->barrier();
}

// NCCL_COMM_BLOCKING=0 in the environment makes NCCL's communicators non-blocking (calls return
// ncclInProgress), and NCCL takes the variable over the config's `blocking` = 1: the layer must
// settle the variable itself before NCCL reads it.
TEST_F(Layer, CommsStayBlockingUnderNcclCommBlocking0) {
  setenv("NCCL_COMM_BLOCKING", "0", 1);
  std::string error = "(no dtl::Error)";
  try {
    auto c = make();
    auto t = torch::ones({4});
    c->all_reduce(t);
    auto d = c->dup();
    d->all_reduce(t);
    fake_cuda::sync_current_stream();
    EXPECT_TRUE(all_equal(t, n * n));
  } catch (const dtl::Error& e) {
    error = e.what();
  }
  unsetenv("NCCL_COMM_BLOCKING");
  EXPECT_EQ(error, "(no dtl::Error)");
}

// A rank on GPU 1 must create no CUDA context on GPU 0 (it would take memory on another rank's
// GPU), also from a thread that never chose a device.
TEST_F(Layer, NoContextOnAnotherRanksGpu) {
  fake_cuda::reset_contexts();
  std::thread([&] {
    auto c = make("20", 1);
    auto t = torch::ones({4});
    std::thread([&] { c->all_reduce(t); }).join();
    c->barrier();
  }).join();
  EXPECT_EQ(fake_cuda::contexts(), std::set<int>({1}));
}

// Freeing a comm must not synchronise the whole device (cudaFree does): it would wait for every
// other comm's and the caller's kernels.
TEST_F(Layer, FreeingACommDoesNotSynchroniseTheDevice) {
  auto c = make();
  const int before = fake_cuda::device_syncs();
  {
    auto d = c->dup();
    auto t = torch::ones({4});
    d->all_reduce(t);
  }
  c.reset();
  EXPECT_EQ(fake_cuda::device_syncs(), before);
}

// With collectives connecting at first use too (NCCL_RUNTIME_CONNECT=1, forced here): the
// scenario's own warm-up must make the mismatch a timeout, not a block in the launch.
TEST_F(Layer, AMismatchedOpEndsInAnErrorNotAHang) {
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  fake_cuda::set_runtime_connect(1);
  {
    auto c = make();
    dtl_gpu_scenarios::mismatched_op_ends_in_an_error(*c, "2", fake_hooks());
  }
  fake_cuda::set_runtime_connect(-1);
}

// The fake connects as NCCL >= 2.22 does by default (runtime connection, unless the layer sets
// NCCL_RUNTIME_CONNECT=0): rank 0 drives the dup first and the others the split first, so first
// uses that connect inside the launch wait on each other in a cycle (3 ranks and more).
TEST_F(Layer, ConcurrentSplitAndDup) {
  auto c = make("3");  // a deadlock shows as the comms' timeout
  dtl_gpu_scenarios::concurrent_split_and_dup(*c, fake_hooks());
}

// The layer leaves a user's NCCL_RUNTIME_CONNECT alone, and sets 0 when there is none.
TEST_F(Layer, RuntimeConnectIsOffUnlessTheUserSetsIt) {
  setenv("NCCL_RUNTIME_CONNECT", "1", 1);
  make().reset();
  EXPECT_STREQ(std::getenv("NCCL_RUNTIME_CONNECT"), "1");
  unsetenv("NCCL_RUNTIME_CONNECT");
  make().reset();
  EXPECT_STREQ(std::getenv("NCCL_RUNTIME_CONNECT"), "0");
}

// A first use that never connects (rank 0 all-reduces alone; the others come after it gave up):
// the fake gives up on it with the launch failing and the handshake's buffers kept alive, so rank
// 0 gets an error naming the call, the others their comm's timeout, and nobody's memory is
// written after it was freed (today a segfault some seconds later, at 3 ranks).
TEST_F(Layer, AFirstUseThatNeverConnectsEndsInAnError) {
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  fake_cuda::set_runtime_connect(1, 1.0);
  auto c = make("3");
  auto t = torch::ones({256});
  std::string error = "(no dtl::Error)";
  if (r == 0) error = dtl::testing::error_of([&] { c->all_reduce(t); });
  dtl::Runtime::get().cpu_world().barrier();
  // The others' all_reduce waits for rank 0's data until the comm's timeout (the barrier blocks
  // the host until then).
  if (r != 0) {
    error = dtl::testing::error_of([&] {
      c->all_reduce(t);
      c->barrier();
    });
  }
  fake_cuda::set_runtime_connect(-1);
  c.reset();
  // Churn the heap while the peers' handshakes arrive: a write into freed memory shows here.
  for (int i = 0; i < 200; ++i) (void)torch::ones({64 + i}).sum().item<float>();
  dtl::Runtime::get().cpu_world().barrier();
  EXPECT_THAT(error, ::testing::HasSubstr(r == 0 ? "ncclAllReduce failed" : "all_reduce #1"));
  if (r == 0) {
    EXPECT_THAT(fake_cuda::take_violations(),
                ::testing::Contains(::testing::HasSubstr("runtime connection")));
  }
  fake_cuda::take_violations();
}

}  // namespace
