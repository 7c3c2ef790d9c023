// The first-GPU-machine suite of `./lab gpu-check` (mpirun -n N nccl_smoke --device cuda, one
// GPU per rank, N = 1, 2, 3, 4, 8 as available). Each test targets one way the NCCL backend can
// be wrong without failing the plain functional tests (nccl_test.cpp): stream ordering behind
// the caller's kernels, tensor lifetimes of dropped Works, non-contiguous outputs, every dtype
// and reduction, point-to-point matching, concurrent comms, barrier semantics, and a mismatched
// collective that must end in an error within DTL_NCCL_TIMEOUT instead of a hang.
// Built everywhere (CI compiles it); it skips unless the world is an NCCL comm.
#include <gmock/gmock.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#if DTL_TORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "dtl/comm.hpp"
#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"
#include "scenarios.hpp"

namespace {

using dtl::ReduceOp;
using dtl::testing::error_of;
using ::testing::AnyOf;
using ::testing::HasSubstr;

dtl::Comm& W() { return dtl::world(); }

torch::TensorOptions gpu(torch::ScalarType dtype = torch::kFloat32) {
  return torch::TensorOptions().dtype(dtype).device(W().device());
}

bool all_equal(const torch::Tensor& t, double value) {
  return torch::all(t == value).item<bool>();  // .item() waits for the current stream
}

class Smoke : public ::testing::Test {
 protected:
  void SetUp() override {
    if (W().backend() != "nccl") GTEST_SKIP() << "run with --device cuda (./lab gpu-check)";
  }
};

// Keeps the current stream busy for a while (about 0.1-1 s on a datacenter GPU) and returns
// a fresh tensor whose every element is exactly `value` once the kernels ran: 1/4096 and
// small integers are exact, also in TF32.
torch::Tensor long_matmul(float value, int rounds = 40) {
  const int64_t k = 4096;
  auto a = torch::full({k, k}, 1.0f / k, gpu());
  auto x = torch::full({k, k}, value, gpu());
  for (int i = 0; i < rounds; ++i) x = a.matmul(x);  // each product is a new buffer
  return x;
}

TEST_F(Smoke, CollectiveRightAfterALongMatmulOnTheDefaultStream) {
  const int n = W().size(), r = W().rank();
  auto x = long_matmul(static_cast<float>(r + 1));
  auto work = W().all_reduce_async(x);  // must run after the matmuls that write x
  // Honest completion: with the matmuls still queued, the op cannot be done yet.
  const bool done_at_once = work.is_completed();
  const auto pending = W().pending_ops();
  work.wait();
  EXPECT_TRUE(all_equal(x, n * (n + 1) / 2.0)) << "the all_reduce read x before the matmuls wrote it";
  EXPECT_FALSE(done_at_once) << "is_completed() before the GPU got to the op";
  ASSERT_FALSE(pending.empty()) << "the op left pending_ops() at enqueue time";
  EXPECT_EQ(pending.back().op, dtl::OpType::AllReduce);
  W().barrier();
  EXPECT_TRUE(W().pending_ops().empty());
}

TEST_F(Smoke, CollectiveRightAfterALongMatmulOnAPoolStream) {
#if DTL_TORCH_HAS_CUDA
  const int n = W().size(), r = W().rank();
  auto stream = c10::cuda::getStreamFromPool(false, W().device().index());
  c10::cuda::CUDAStreamGuard on_pool(stream);
  auto x = long_matmul(static_cast<float>(r + 1));
  W().all_reduce(x);  // orders after the pool stream's matmuls; the pool stream waits for it
  EXPECT_TRUE(all_equal(x, n * (n + 1) / 2.0));
  auto y = long_matmul(static_cast<float>(r + 1), 8);
  auto work = W().all_reduce_async(y);
  work.wait();
  y.mul_(2);  // on the pool stream, after the wait: must see the reduced values
  EXPECT_TRUE(all_equal(y, n * (n + 1.0)));
#else
  GTEST_SKIP() << "needs a CUDA LibTorch (DTL_TORCH_HAS_CUDA): no stream API without one";
#endif
}

TEST_F(Smoke, DroppedAsyncWorkOnATemporaryWhileTheAllocatorChurns) {
  const int r = W().rank();
  const int64_t m = 1 << 22;  // 16 MiB of float32
  std::vector<torch::Tensor> junk;
  for (int i = 0; i < 16; ++i) {
    auto busy = long_matmul(1.0f, 4);  // the all_reduce stays queued behind these
    // Work and tensor dropped at once: the backend must hold the tensor until the op is done,
    // or the allocator hands its block to `junk`, which the all_reduce then overwrites.
    W().all_reduce_async(torch::full({m}, static_cast<float>(r + 1), gpu()));
    junk.push_back(torch::full({m}, -7.0f, gpu()));
  }
  W().barrier();  // every op of the comm done, on every rank
  for (size_t i = 0; i < junk.size(); ++i)
    EXPECT_TRUE(all_equal(junk[i], -7.0)) << "tensor " << i << " was overwritten by a dropped op";
  EXPECT_TRUE(W().pending_ops().empty());
}

// Rank r's element i: (i mod 5) + r, exact in every dtype for up to 8 ranks (sums <= 60).
torch::Tensor contribution(int r, int64_t numel) {
  return torch::arange(numel, torch::kFloat64).remainder(5) + r;
}

// The reduction over ranks 0..n-1 of contribution(), in float64; integer Avg truncates.
torch::Tensor reduced(ReduceOp op, int n, int64_t numel, bool integer) {
  auto c = torch::arange(numel, torch::kFloat64).remainder(5);
  switch (op) {
    case ReduceOp::Sum: return c * n + n * (n - 1) / 2.0;
    case ReduceOp::Max: return c + (n - 1);
    case ReduceOp::Min: return c;
    case ReduceOp::Avg: {
      auto avg = (c * n + n * (n - 1) / 2.0) / n;
      return integer ? avg.floor() : avg;
    }
  }
  return c;
}

TEST_F(Smoke, EveryDtypeAndReduceOpWithNonContiguousTensors) {
  const int n = W().size(), r = W().rank();
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16,
                     torch::kInt32, torch::kInt64, torch::kInt8, torch::kUInt8}) {
    const bool integer = !c10::isFloatingType(dtype);
    const double tol = dtype == torch::kBFloat16 ? 2e-2 : dtype == torch::kFloat16 ? 2e-3 : 1e-6;
    for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      SCOPED_TRACE(fmt::format("{} {}", c10::toString(dtype), dtl::to_string(op)));
      // all_reduce in place on every other column of [10, 12]: input and output non-contiguous.
      auto storage = torch::zeros({10, 12}, gpu(dtype));
      auto view = storage.slice(1, 0, 12, 2);
      view.copy_(contribution(r, 60).reshape({10, 6}).to(dtype));
      W().all_reduce(view, op);
      auto got = storage.cpu().to(torch::kFloat64);
      DTL_EXPECT_CLOSE(got.slice(1, 0, 12, 2).reshape({60}), reduced(op, n, 60, integer), tol, tol);
      EXPECT_TRUE(all_equal(got.slice(1, 1, 12, 2), 0)) << "the copy-back wrote outside the view";

      // reduce_scatter from a strided input into a strided output.
      auto in_storage = torch::zeros({4 * n, 2}, gpu(dtype));
      auto in = in_storage.select(1, 0);
      in.copy_(contribution(r, 4 * n).to(dtype));
      auto out_storage = torch::zeros({4, 3}, gpu(dtype));
      auto out = out_storage.select(1, 1);
      W().reduce_scatter(out, in, op);
      DTL_EXPECT_CLOSE(out.cpu().to(torch::kFloat64),
                       reduced(op, n, 4 * n, integer).slice(0, 4 * r, 4 * r + 4), tol, tol);
    }
    // all_gather and all_to_all with strided outputs.
    auto gathered_storage = torch::zeros({n * 3, 2}, gpu(dtype));
    auto gathered = gathered_storage.select(1, 1);
    W().all_gather(gathered, contribution(r, 3).to(dtype).to(W().device()));
    for (int p = 0; p < n; ++p)
      DTL_EXPECT_EQUAL(gathered.slice(0, 3 * p, 3 * p + 3).cpu(), contribution(p, 3).to(dtype));
    auto a2a_out_storage = torch::zeros({n * 2, 2}, gpu(dtype));
    auto a2a_out = a2a_out_storage.select(1, 0);
    auto a2a_in = torch::full({n * 2}, r, torch::TensorOptions().dtype(dtype)).to(W().device());
    W().all_to_all(a2a_out, a2a_in);
    for (int p = 0; p < n; ++p)
      EXPECT_TRUE(all_equal(a2a_out.slice(0, 2 * p, 2 * p + 2), p)) << "chunk from rank " << p;
  }
}

TEST_F(Smoke, SendRecvSelfSendRecvAndTags) {
  const int n = W().size(), r = W().rank();
  auto mine = torch::full({1000}, static_cast<float>(r), gpu());
  auto self = torch::empty({1000}, gpu());
  W().sendrecv(mine, r, self, r);
  EXPECT_TRUE(all_equal(self, r));
  if (n >= 2) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    // A ring of plain send/recv: even ranks send first, odd ranks receive first.
    auto from_prev_storage = torch::zeros({1000, 2}, gpu());
    auto from_prev = from_prev_storage.select(1, 1);  // strided: copied back after the recv
    if (r % 2 == 0) {
      W().send(mine, next);
      W().recv(from_prev, prev);
    } else {
      W().recv(from_prev, prev);
      W().send(mine, next);
    }
    EXPECT_TRUE(all_equal(from_prev, prev));
    auto ring = torch::empty({1000}, gpu());
    W().sendrecv(mine, next, ring, prev);
    EXPECT_TRUE(all_equal(ring, prev));
    // Tags: refused before anything is enqueued, and the op's record says so.
    EXPECT_THAT(error_of([&] { W().send(mine, next, 3); }), HasSubstr("tag 3 is not supported"));
    auto last = W().recent_ops().back();
    EXPECT_EQ(last.op, dtl::OpType::Send);
    EXPECT_EQ(last.state, dtl::OpRecord::State::Failed);
  }
  W().barrier();
  EXPECT_TRUE(W().pending_ops().empty());
}

// Shared with the CPU build of the device layer (scenarios.hpp, nccl_layer_tests).
dtl_gpu_scenarios::Hooks gpu_hooks() {
  dtl_gpu_scenarios::Hooks h;
  h.on_own_stream = [](const std::function<void()>& fn) {
#if DTL_TORCH_HAS_CUDA
    auto stream = c10::cuda::getStreamFromPool(false, W().device().index());
    {
      c10::cuda::CUDAStreamGuard on_stream(stream);
      fn();
    }
    stream.synchronize();
#else
    fn();  // not reached: the suite skips without a CUDA LibTorch's NCCL world
#endif
  };
  h.sync_host = [] {};  // .item() waits for the current stream
  h.busy_ones = [] { return long_matmul(1.0f, 8); };
  return h;
}

TEST_F(Smoke, ConcurrentSplitAndDup) { dtl_gpu_scenarios::concurrent_split_and_dup(W(), gpu_hooks()); }

TEST_F(Smoke, AWorkMayOutliveItsComm) {
  const int n = W().size(), r = W().rank();
  dtl::Work work;
  torch::Tensor t = torch::full({1 << 16}, static_cast<float>(r), gpu());
  {
    auto dup = W().dup();
    work = dup->all_reduce_async(t);
  }  // the comm is freed here (after draining its ops)
  work.wait();
  EXPECT_TRUE(work.is_completed());
  EXPECT_TRUE(all_equal(t, n * (n - 1) / 2.0));
}

TEST_F(Smoke, BarrierBlocksTheHostUntilEveryRankArrived) {
  const int n = W().size(), r = W().rank();
  auto x = long_matmul(1.0f, 8);
  W().all_reduce_async(x);  // dropped: the barrier comes after it on the comm stream
  if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  dtl::Timer timer;
  W().barrier();
  const double waited = timer.seconds();
  if (r != 0) {
    EXPECT_GT(waited, 1.0) << "barrier returned before rank 0 arrived";
  }
  EXPECT_TRUE(W().pending_ops().empty()) << "barrier returned with ops of the comm unfinished";
  EXPECT_TRUE(all_equal(x, n));
}

TEST_F(Smoke, AMismatchedCollectiveEndsInAnErrorNotAHang) {
  if (W().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  dtl_gpu_scenarios::mismatched_op_ends_in_an_error(W(), "5", gpu_hooks());
}

}  // namespace
