// Tests of the NCCL backend on CUDA tensors. Built everywhere (CI compiles them without a GPU);
// run by `./lab test --gpu` on a machine with one GPU per rank, where the Runtime's world is an
// NcclComm (--device cuda). Expectations are computed on the CPU from (rank, index) formulas,
// as in comm_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtl/comm.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"

namespace {

using dtl::ReduceOp;

dtl::Comm& W() { return dtl::world(); }

// On this rank's GPU.
torch::Tensor G(const torch::Tensor& t) { return t.to(W().device()); }

// Rank r's contribution: element i = (i mod 11) + r, exact in every dtype.
torch::Tensor contribution(int r, int64_t numel, torch::ScalarType dtype) {
  return (torch::arange(numel, torch::kFloat64).remainder(11) + r).to(dtype);
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (W().backend() != "nccl") GTEST_SKIP() << "run with --device cuda (./lab test --gpu)";
  }
};

TEST_F(Nccl, AllReduceEveryOpAndDtype) {
  const int n = W().size(), r = W().rank();
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kInt32, torch::kInt64, torch::kBFloat16})
    for (int64_t numel : {0, 1, 7, 1 << 20}) {
      auto base = torch::arange(numel, torch::kFloat64).remainder(11);
      auto t = G(contribution(r, numel, dtype));
      W().all_reduce(t, ReduceOp::Sum);
      DTL_EXPECT_CLOSE(t.cpu(), (base * n + n * (n - 1) / 2.0).to(dtype), 1e-2, 1e-2);
      t = G(contribution(r, numel, dtype));
      W().all_reduce(t, ReduceOp::Max);
      DTL_EXPECT_EQUAL(t.cpu(), (base + (n - 1)).to(dtype));
    }
}

TEST_F(Nccl, ReduceScatterAllGatherAllToAll) {
  const int n = W().size(), r = W().rank();
  auto in = G(contribution(r, 5 * n, torch::kFloat32));
  auto out = G(torch::empty({5}));
  W().reduce_scatter(out, in);
  auto full = torch::arange(5 * n, torch::kFloat64).remainder(11) * n + n * (n - 1) / 2.0;
  DTL_EXPECT_CLOSE(out.cpu(), full.slice(0, 5 * r, 5 * r + 5).to(torch::kFloat32));

  auto gathered = G(torch::empty({n, 3}));
  W().all_gather(gathered, G(contribution(r, 3, torch::kFloat32)));
  for (int p = 0; p < n; ++p) DTL_EXPECT_EQUAL(gathered[p].cpu(), contribution(p, 3, torch::kFloat32));

  auto a2a_in = torch::empty({n, 2}, torch::kInt64);
  for (int j = 0; j < n; ++j) a2a_in[j].fill_(100 * r + j);
  auto a2a_out = G(torch::empty({n, 2}, torch::kInt64));
  W().all_to_all(a2a_out, G(a2a_in));
  for (int i = 0; i < n; ++i) DTL_EXPECT_EQUAL(a2a_out[i].cpu(), torch::full({2}, 100 * i + r, torch::kInt64));
}

TEST_F(Nccl, BroadcastReduceSendRecvBarrier) {
  const int n = W().size(), r = W().rank();
  for (int root = 0; root < n; ++root) {
    auto t = G(contribution(r, 9, torch::kFloat32));
    W().broadcast(t, root);
    DTL_EXPECT_EQUAL(t.cpu(), contribution(root, 9, torch::kFloat32));
    auto s = G(contribution(r, 4, torch::kFloat64));
    W().reduce(s, root);
    if (r == root) {
      DTL_EXPECT_CLOSE(s.cpu(), torch::arange(4, torch::kFloat64).remainder(11) * n + n * (n - 1) / 2.0);
    }
  }
  auto out = G(contribution(r, 6, torch::kFloat32)), in = G(torch::empty({6}));
  W().sendrecv(out, (r + 1) % n, in, (r + n - 1) % n);
  DTL_EXPECT_EQUAL(in.cpu(), contribution((r + n - 1) % n, 6, torch::kFloat32));
  W().barrier();
}

TEST_F(Nccl, AsyncOrderAndSplit) {
  const int n = W().size(), r = W().rank();
  std::vector<torch::Tensor> ts;
  std::vector<dtl::Work> works;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(G(torch::full({1000}, static_cast<float>(r + i))));
    works.push_back(W().all_reduce_async(ts.back()));
  }
  for (auto& w : works) w.wait();
  for (int i = 0; i < 4; ++i)
    DTL_EXPECT_CLOSE(ts[i].cpu(), torch::full({1000}, n * (n - 1) / 2.0f + n * i));
  auto sub = W().split(r % 2, r);
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->backend(), "nccl");
  auto t = G(torch::full({3}, static_cast<float>(r)));
  sub->all_reduce(t);
  float sum = 0;
  for (int p = r % 2; p < n; p += 2) sum += static_cast<float>(p);
  DTL_EXPECT_EQUAL(t.cpu(), torch::full({3}, sum));
}

TEST_F(Nccl, CpuTensorsAreRejectedClearly) {
  EXPECT_THAT(dtl::testing::error_of([] { W().all_reduce(torch::ones({2})); }),
              ::testing::HasSubstr("use --backend mpi or move the tensor"));
}

}  // namespace
