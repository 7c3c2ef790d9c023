// Tests of Comm (MPI backend) at world sizes 1-4. Every expectation is computed independently
// on each rank from a formula of (rank, index), never from another Comm call.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "dtl/comm.hpp"
#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"
#include "dtl/split.hpp"

namespace {

using dtl::Comm;
using dtl::OpType;
using dtl::ReduceOp;

Comm& W() { return dtl::world(); }

// Rank r's contribution: element i = i + r (small integers, exact in every dtype incl. bf16).
torch::Tensor contribution(int r, int64_t numel, torch::ScalarType dtype) {
  return (torch::arange(numel, torch::kFloat64).remainder(11) + r).to(dtype);
}

// Reduction of all ranks' contributions, computed in closed form.
torch::Tensor expected_reduce(int n, int64_t numel, torch::ScalarType dtype, ReduceOp op) {
  auto base = torch::arange(numel, torch::kFloat64).remainder(11);
  torch::Tensor out;
  switch (op) {
    case ReduceOp::Sum: out = base * n + n * (n - 1) / 2.0; break;
    case ReduceOp::Max: out = base + (n - 1); break;
    case ReduceOp::Min: out = base; break;
    case ReduceOp::Avg: {
      auto sum = base * n + n * (n - 1) / 2.0;
      out = c10::isIntegralType(dtype, false) ? (sum / n).trunc() : sum / n;
      break;
    }
  }
  return out.to(dtype);
}

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kInt32,
                                                torch::kInt64,   torch::kBFloat16, torch::kFloat16,
                                                torch::kInt8,    torch::kUInt8};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

std::string label(torch::ScalarType d, ReduceOp op, int64_t numel) {
  return std::string(c10::toString(d)) + " " + dtl::to_string(op) + " numel " + std::to_string(numel);
}

TEST(Comm, AllReduceEveryDtypeOpAndSize) {
  const int n = W().size(), r = W().rank();
  for (auto dtype : kDtypes)
    for (auto op : kOps)
      for (int64_t numel : {0, 1, 3, 7, 1000}) {
        if (dtype == torch::kBFloat16 && op == ReduceOp::Avg && n == 3) continue;  // 1/3 inexact
        if (dtype == torch::kFloat16 && op == ReduceOp::Avg && n == 3) continue;
        auto t = contribution(r, numel, dtype);
        W().all_reduce(t, op);
        auto expected = expected_reduce(n, numel, dtype, op);
        if (c10::isFloatingType(dtype))
          DTL_EXPECT_CLOSE(t, expected, 1e-2, 1e-2) << label(dtype, op, numel);
        else
          DTL_EXPECT_EQUAL(t, expected) << label(dtype, op, numel);
      }
}

TEST(Comm, AllReduceAvgOfFloatsUnderThree) {
  const int n = W().size();
  auto t = torch::full({5}, static_cast<double>(W().rank()), torch::kFloat64);
  W().all_reduce(t, ReduceOp::Avg);
  DTL_EXPECT_CLOSE(t, torch::full({5}, (n - 1) / 2.0, torch::kFloat64));
}

TEST(Comm, LargeAllReduce) {
  const int n = W().size();
  auto t = torch::full({1 << 20}, 1.0f + W().rank());
  W().all_reduce(t);
  DTL_EXPECT_CLOSE(t, torch::full({1 << 20}, n * (n + 1) / 2.0f));
}

TEST(Comm, ReduceScatter) {
  const int n = W().size(), r = W().rank();
  for (auto dtype : {torch::kFloat32, torch::kInt64, torch::kBFloat16})
    for (int64_t chunk : {0, 1, 5}) {
      auto input = contribution(r, chunk * n, dtype);
      auto output = torch::full({chunk}, -1, dtype);
      W().reduce_scatter(output, input, ReduceOp::Sum);
      auto full = expected_reduce(n, chunk * n, dtype, ReduceOp::Sum);
      DTL_EXPECT_EQUAL(output, full.slice(0, r * chunk, (r + 1) * chunk))
          << c10::toString(dtype) << " chunk " << chunk;
    }
}

TEST(Comm, ReduceScatterAvgAndMax) {
  const int n = W().size(), r = W().rank();
  auto input = contribution(r, 4 * n, torch::kFloat64);
  auto out = torch::empty({4}, torch::kFloat64);
  W().reduce_scatter(out, input, ReduceOp::Max);
  DTL_EXPECT_EQUAL(out, expected_reduce(n, 4 * n, torch::kFloat64, ReduceOp::Max).slice(0, 4 * r, 4 * r + 4));
  W().reduce_scatter(out, input, ReduceOp::Avg);
  DTL_EXPECT_CLOSE(out, expected_reduce(n, 4 * n, torch::kFloat64, ReduceOp::Avg).slice(0, 4 * r, 4 * r + 4));
}

TEST(Comm, AllGather) {
  const int n = W().size(), r = W().rank();
  for (auto dtype : kDtypes)
    for (int64_t numel : {0, 1, 6}) {
      auto input = contribution(r, numel, dtype) + 0;
      auto output = torch::empty({n, numel}, dtype);
      W().all_gather(output, input);
      for (int p = 0; p < n; ++p)
        DTL_EXPECT_EQUAL(output[p], contribution(p, numel, dtype)) << c10::toString(dtype) << " chunk " << p;
    }
}

// Chunks follow dtl::split_range: with N not divisible by n the first N mod n ranks hold one more.
TEST(Comm, ReduceScatterAndAllGatherUnevenChunks) {
  const int n = W().size(), r = W().rank();
  for (auto dtype : {torch::kFloat32, torch::kInt64, torch::kBFloat16})
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{2 * n + 1}, int64_t{7 * n + 3}}) {
      const dtl::Range mine = dtl::split_range(numel, n, r);
      auto input = contribution(r, numel, dtype);
      auto output = torch::full({mine.size()}, -1, dtype);
      W().reduce_scatter(output, input, ReduceOp::Sum);
      auto full = expected_reduce(n, numel, dtype, ReduceOp::Sum);
      DTL_EXPECT_EQUAL(output, full.slice(0, mine.begin, mine.end))
          << c10::toString(dtype) << " reduce_scatter numel " << numel;
      // all_gather puts rank p's chunk at split_range(numel, n, p).
      auto gathered = torch::full({numel}, -1, dtype);
      W().all_gather(gathered, full.slice(0, mine.begin, mine.end));
      DTL_EXPECT_EQUAL(gathered, full) << c10::toString(dtype) << " all_gather numel " << numel;
    }
}

TEST(Comm, BroadcastFromEveryRoot) {
  const int n = W().size(), r = W().rank();
  for (int root = 0; root < n; ++root)
    for (auto dtype : {torch::kFloat32, torch::kInt32, torch::kBFloat16}) {
      auto t = contribution(r, 9, dtype);
      W().broadcast(t, root);
      DTL_EXPECT_EQUAL(t, contribution(root, 9, dtype)) << "root " << root;
    }
}

TEST(Comm, ReduceToEveryRoot) {
  const int n = W().size(), r = W().rank();
  for (int root = 0; root < n; ++root)
    for (auto op : kOps) {
      auto t = contribution(r, 6, torch::kFloat64);
      W().reduce(t, root, op);
      if (r == root)
        DTL_EXPECT_CLOSE(t, expected_reduce(n, 6, torch::kFloat64, op)) << "root " << root;
      else
        DTL_EXPECT_EQUAL(t, contribution(r, 6, torch::kFloat64)) << "non-root must be untouched";
    }
}

TEST(Comm, AllToAll) {
  const int n = W().size(), r = W().rank();
  for (int64_t chunk : {0, 1, 3}) {
    // Chunk j of rank r holds 100*r + j: after the exchange, chunk i holds 100*i + r.
    auto input = torch::empty({n, chunk}, torch::kInt64);
    for (int j = 0; j < n; ++j) input[j].fill_(100 * r + j);
    auto output = torch::full({n, chunk}, -1, torch::kInt64);
    W().all_to_all(output, input);
    for (int i = 0; i < n; ++i)
      DTL_EXPECT_EQUAL(output[i], torch::full({chunk}, 100 * i + r, torch::kInt64)) << "chunk " << i;
  }
}

TEST(Comm, SendRecvRing) {
  const int n = W().size(), r = W().rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto out = contribution(r, 5, torch::kFloat32);
  auto in = torch::empty({5});
  // Even ranks send first, odd ranks receive first: blocking point-to-point without deadlock.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    W().send(out, next);
    W().recv(in, prev);
  } else {
    W().recv(in, prev);
    W().send(out, next);
  }
  DTL_EXPECT_EQUAL(in, contribution(prev, 5, torch::kFloat32));
}

TEST(Comm, SendRecvShiftIncludingSelf) {
  const int n = W().size(), r = W().rank();
  for (int shift = 0; shift < n; ++shift) {
    auto out = contribution(r, 8, torch::kFloat64), in = torch::empty({8}, torch::kFloat64);
    W().sendrecv(out, (r + shift) % n, in, (r - shift + n) % n, shift);
    DTL_EXPECT_EQUAL(in, contribution((r - shift + n) % n, 8, torch::kFloat64)) << "shift " << shift;
  }
}

TEST(Comm, NonContiguousInputsAndOutputs) {
  const int n = W().size(), r = W().rank();
  // In-place all_reduce on a transposed view: the user's tensor must see the result.
  auto base = torch::arange(12, torch::kFloat32).reshape({3, 4}) + r;
  auto view = base.t();
  ASSERT_FALSE(view.is_contiguous());
  W().all_reduce(view);
  auto expected = (torch::arange(12, torch::kFloat32).reshape({3, 4}) * n + n * (n - 1) / 2.0f).t();
  DTL_EXPECT_EQUAL(view, expected);
  DTL_EXPECT_EQUAL(base, expected.t());
  // all_gather into a strided output; input is a strided view too.
  auto src = torch::arange(8, torch::kFloat32).reshape({2, 4}) + r;
  auto in = src.t();  // [4, 2], non-contiguous
  auto out_base = torch::zeros({4 * n, 2 * 2});
  auto out = out_base.slice(1, 0, 4, 2);  // every other column: non-contiguous [4n, 2]
  W().all_gather(out, in);
  for (int p = 0; p < n; ++p)
    DTL_EXPECT_EQUAL(out.slice(0, 4 * p, 4 * p + 4), (torch::arange(8, torch::kFloat32).reshape({2, 4}) + p).t());
  DTL_EXPECT_EQUAL(out_base.slice(1, 1, 4, 2), torch::zeros({4 * n, 2}));  // untouched columns
}

TEST(Comm, InterleavedAsyncAndBlockingKeepIssueOrder) {
  const int n = W().size(), r = W().rank();
  std::vector<torch::Tensor> ts;
  std::vector<dtl::Work> works;
  for (int i = 0; i < 6; ++i) {
    ts.push_back(torch::full({1000 * (i + 1)}, static_cast<float>(r + i)));
    works.push_back(W().all_reduce_async(ts.back()));
  }
  // A blocking op issued behind the async ones waits for its turn.
  auto b = torch::full({3}, static_cast<float>(r));
  W().broadcast(b, n - 1);
  EXPECT_TRUE(works.front().is_completed()) << "ops complete in issue order";
  auto g = torch::empty({n});
  auto gw = W().all_gather_async(g, torch::full({1}, static_cast<float>(r)));
  for (int i = 5; i >= 0; --i) works[i].wait();  // waiting out of order is fine
  gw.wait();
  for (int i = 0; i < 6; ++i)
    DTL_EXPECT_CLOSE(ts[i], torch::full({1000 * (i + 1)}, n * (n - 1) / 2.0f + n * i));
  DTL_EXPECT_EQUAL(b, torch::full({3}, static_cast<float>(n - 1)));
  DTL_EXPECT_EQUAL(g, torch::arange(n, torch::kFloat32));
}

// An op observer sees every op of every Comm: issued (before it can start), started, then
// completed, each once; after remove_op_observer, nothing.
TEST(Comm, OpObserversSeeIssueStartAndEndOfEveryOp) {
  auto c = W().split(0, W().rank(), "observed");
  std::mutex mu;
  std::vector<std::pair<uint64_t, dtl::OpRecord::State>> seen;
  const int id = Comm::add_op_observer([&](const Comm& comm, const dtl::OpRecord& r) {
    if (comm.name() != "observed") return;
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(r.seq, r.state);
  });
  auto t = torch::ones({8});
  c->all_reduce(t);
  auto w = c->all_reduce_async(t);
  w.wait();
  c->barrier();
  Comm::remove_op_observer(id);
  c->barrier();
  using S = dtl::OpRecord::State;
  std::vector<std::pair<uint64_t, S>> want;
  for (uint64_t seq = 1; seq <= 3; ++seq)
    for (S s : {S::Issued, S::Started, S::Completed}) want.emplace_back(seq, s);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, want);
}

TEST(Comm, AsyncOnTwoCommsOverlapIndependently) {
  auto other = W().dup();
  ASSERT_TRUE(other);
  EXPECT_EQ(other->rank(), W().rank());
  EXPECT_EQ(other->size(), W().size());
  auto a = torch::ones({1 << 16}), b = torch::ones({1 << 16});
  auto wa = W().all_reduce_async(a);
  auto wb = other->all_reduce_async(b);
  wb.wait();
  wa.wait();
  DTL_EXPECT_EQUAL(a, torch::full({1 << 16}, static_cast<float>(W().size())));
  DTL_EXPECT_EQUAL(b, torch::full({1 << 16}, static_cast<float>(W().size())));
}

TEST(Comm, SplitByParityAndKeyOrder) {
  const int n = W().size(), r = W().rank();
  auto sub = W().split(r % 2, -r);  // key -r: reversed order inside each group
  ASSERT_TRUE(sub);
  std::vector<int> members;
  for (int p = n - 1; p >= 0; --p)
    if (p % 2 == r % 2) members.push_back(p);
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(sub->world_ranks(), members);
  EXPECT_EQ(sub->world_ranks()[sub->rank()], r);
  auto t = torch::full({4}, static_cast<double>(r), torch::kFloat64);
  sub->all_reduce(t);
  double sum = 0;
  for (int p : members) sum += p;
  DTL_EXPECT_EQUAL(t, torch::full({4}, sum, torch::kFloat64));
  // Ops on the world still match up after the split.
  auto w = torch::ones({2});
  W().all_reduce(w);
  DTL_EXPECT_EQUAL(w, torch::full({2}, static_cast<float>(n)));
  // Names: given, or derived from the parent's.
  EXPECT_EQ(W().split(0, r, "custom")->name(), "custom");
  EXPECT_EQ(W().dup()->name(), W().name() + "/dup");
  // A negative color opts out.
  auto none = W().split(r == 0 ? -1 : 1, 0);
  EXPECT_EQ(none == nullptr, r == 0);
  if (none) {
    EXPECT_EQ(none->size(), n - 1);
    none->barrier();
  }
}

TEST(Comm, StatsCountBytesAndWireBytes) {
  auto c = W().dup();
  const int n = c->size();
  auto t = torch::zeros({256});  // 1 KiB
  c->all_reduce(t);
  c->all_reduce(t);
  auto out = torch::zeros({256 * n});
  c->all_gather(out, t);
  c->barrier();
  auto s = c->stats();
  EXPECT_EQ(s[OpType::AllReduce].count, 2);
  EXPECT_EQ(s[OpType::AllReduce].bytes, 2 * 1024);
  EXPECT_DOUBLE_EQ(s[OpType::AllReduce].wire_bytes, 2 * 1024 * 2.0 * (n - 1) / n);
  EXPECT_EQ(s[OpType::AllGather].bytes, 1024 * n);
  EXPECT_DOUBLE_EQ(s[OpType::AllGather].wire_bytes, 1024.0 * n * (n - 1) / n);
  EXPECT_EQ(s[OpType::Barrier].count, 1);
  EXPECT_EQ(s.total_count(), 4);
  EXPECT_EQ(c->ops_issued(), 4u);
  auto recent = c->recent_ops();
  ASSERT_EQ(recent.size(), 4u);
  EXPECT_EQ(recent.back().op, OpType::Barrier);
  EXPECT_EQ(recent.back().seq, 4u);
  EXPECT_EQ(recent.back().state, dtl::OpRecord::State::Completed);
  EXPECT_TRUE(c->pending_ops().empty());
  // The same, as data for the watchdog.
  auto snaps = Comm::snapshot_all();
  auto it = std::find_if(snaps.begin(), snaps.end(), [&](const Comm::Snapshot& s) { return s.name == c->name(); });
  ASSERT_NE(it, snaps.end());
  EXPECT_EQ(it->ops_issued, 4u);
  EXPECT_TRUE(it->pending.empty());
  ASSERT_FALSE(it->recent.empty());
  EXPECT_EQ(it->recent.back().op, OpType::Barrier);
  c->reset_stats();
  EXPECT_EQ(c->stats().total_count(), 0);
}

// ---- bad input: clear dtl::Error naming the constraint, raised before any communication.

using dtl::testing::error_of;


TEST(CommErrors, SizeMismatchesNameTheConstraint) {
  const int n = W().size();
  const int64_t chunk = dtl::split_range(3 * n + 1, n, W().rank()).size();
  EXPECT_THAT(error_of([&] { W().reduce_scatter(torch::empty({chunk + 1}), torch::empty({3 * n + 1})); }),
              ::testing::HasSubstr("split_range"));
  EXPECT_THAT(error_of([&] { W().all_gather(torch::empty({3 * n + 1}), torch::empty({chunk + 1})); }),
              ::testing::HasSubstr("split_range"));
  EXPECT_THAT(error_of([&] { W().all_gather(torch::empty({2 * n}, torch::kInt32), torch::empty({2})); }),
              ::testing::HasSubstr("dtype"));
  EXPECT_THAT(error_of([&] { W().all_to_all(torch::empty({n * 2 + 1}), torch::empty({n * 2 + 1})); }),
              n > 1 ? ::testing::HasSubstr("equal chunks") : ::testing::HasSubstr("no dtl::Error"));
  EXPECT_THAT(error_of([&] { W().all_reduce(torch::Tensor()); }), ::testing::HasSubstr("undefined"));
}

TEST(CommErrors, BadPeersAndRoots) {
  const int n = W().size();
  EXPECT_THAT(error_of([&] { W().send(torch::ones({1}), n); }), ::testing::HasSubstr("out of range"));
  EXPECT_THAT(error_of([&] { W().recv(torch::ones({1}), -1); }), ::testing::HasSubstr("out of range"));
  EXPECT_THAT(error_of([&] { W().broadcast(torch::ones({1}), n + 3); }), ::testing::HasSubstr("root"));
  EXPECT_THAT(error_of([&] { W().send(torch::ones({1}), W().rank()); }), ::testing::HasSubstr("would deadlock"));
  // Nothing was issued by the failed calls: the world still works.
  auto t = torch::ones({1});
  W().all_reduce(t);
  EXPECT_EQ(t.item<float>(), static_cast<float>(n));
}

TEST(CommErrors, UnsupportedDtypeIsRejectedBeforeSending) {
  auto c = W().dup();
  auto t = torch::ones({3}, torch::kBool);
  EXPECT_THAT(error_of([&] { c->all_reduce(t); }), ::testing::HasSubstr("not supported"));
  EXPECT_EQ(c->ops_issued(), 0u);  // nothing reached the wire
  EXPECT_FALSE(dtl::is_comm_dtype(torch::kBool));
  EXPECT_EQ(dtl::comm_dtypes().size(), 8u);
}

TEST(Comm, FinishAvgTruncatesIntegers) {
  auto f = torch::tensor({7.0, -7.0});
  dtl::finish_avg(ReduceOp::Avg, f, 2);
  DTL_EXPECT_EQUAL(f, torch::tensor({3.5, -3.5}));
  auto i = torch::tensor({7, -7}, torch::kInt64);
  dtl::finish_avg(ReduceOp::Avg, i, 2);
  DTL_EXPECT_EQUAL(i, torch::tensor({3, -3}, torch::kInt64));  // toward zero, as ncclAvg
  auto s = torch::tensor({7, -7}, torch::kInt64);
  dtl::finish_avg(ReduceOp::Sum, s, 2);
  DTL_EXPECT_EQUAL(s, torch::tensor({7, -7}, torch::kInt64));
}

TEST(CommErrors, ReceivedSizeMismatchIsDetected) {
  const int n = W().size(), r = W().rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto c = W().dup();
  if (r == 0) c->send(torch::ones({4}), 1);
  if (r == 1) {
    auto msg = error_of([&] { c->recv(torch::empty({8}), 0); });
    EXPECT_THAT(msg, ::testing::HasSubstr("rank 0 sent 4 elements but this rank expects 8"));
    EXPECT_THAT(msg, ::testing::HasSubstr("recv #1 on comm"));
  }
  c->barrier();
}

TEST(CommErrors, NcclWithoutGpuIsAClearError) {
  // On a GPU machine this path is not reachable; the full suite then runs with --gpu.
  std::string msg = error_of([] { dtl::cuda_device_count(); });
  if (msg == "(no dtl::Error)") GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THAT(msg, dtl::nccl_compiled() ? ::testing::HasSubstr("cudaGetDeviceCount")
                                        : ::testing::HasSubstr("no NCCL backend"));
  EXPECT_THAT(msg, ::testing::HasSubstr("--device cpu"));
  std::string create = error_of([] { dtl::make_nccl_comm(dtl::Runtime::get().cpu_world(), 0, "x"); });
  EXPECT_THAT(create, ::testing::AnyOf(::testing::HasSubstr("no usable CUDA device"),
                                       ::testing::HasSubstr("no NCCL backend")));
  // The failed attempt left MPI healthy.
  W().barrier();
}

}  // namespace
