// Public tests of lab 08. Run: ./lab test 08   (world sizes 1, 2, 3 and 4; tp = the world)
//
// The oracles: for the operators, the sums and concatenations they stand for, computed from
// every rank's known inputs; for the layers and the MLP, the serial layer from the same seed:
// equal outputs, equal input gradients, and parameter gradients that are exactly this rank's
// slices of the serial ones. Comm::stats() counts the collectives.
#include "tensor_parallel.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "dtl/harness/checks.hpp"  // defines: serial, DTL_EXPECT_CLOSE, error_of
#include "dtl/model.hpp"           // defines: GPTConfig, MLP (the serial oracle of Task 3)
#include "tests/tp_test_util.hpp"

namespace dtl::lab08 {
namespace {

using namespace lab08_test;  // NOLINT: serial_linear, same_input, mine, fresh_comm, ...
using ::testing::HasSubstr;

// ---------------------------------------------------------------- Task 1

// f: identity forward, no communication; backward sums the ranks' gradients.
void expect_copy_to_tp(Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  const torch::Tensor x = same_input({3, 5}, 1).requires_grad_(true);
  const auto before = comm.stats();
  const torch::Tensor y = copy_to_tp(x, comm);
  EXPECT_EQ(count_since(before, comm, OpType::AllReduce), 0) << "forward must not communicate";
  DTL_EXPECT_EQUAL(y, x);
  EXPECT_NE(y.data_ptr(), x.data_ptr()) << "a new tensor, not the input itself";
  // Rank r weighs the output by (r + 1): dL/dx = sum over ranks of (r + 1) = n (n + 1) / 2.
  (y * static_cast<double>(r + 1)).sum().backward();
  EXPECT_EQ(count_since(before, comm, OpType::AllReduce), n > 1 ? 1 : 0)
      << "one all-reduce in backward (none at tp 1)";
  DTL_EXPECT_CLOSE(x.grad(), torch::full({3, 5}, n * (n + 1) / 2.0, device_options()));
}

TEST(CopyToTP, IdentityForwardAllReduceBackward) { expect_copy_to_tp(*fresh_comm()); }
// The tp group is the Comm passed in, not the world: here two groups run side by side.
TEST(CopyToTP, UsesOnlyItsGroup) { expect_copy_to_tp(*half_group()); }

// g: sum forward; backward passes the gradient through untouched, no communication.
void expect_reduce_from_tp(Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  const torch::Tensor x = torch::full({4, 2}, static_cast<float>(r + 1), device_options())
                              .requires_grad_(true);
  const torch::Tensor y = reduce_from_tp(x, comm);
  DTL_EXPECT_CLOSE(y, torch::full({4, 2}, n * (n + 1) / 2.0, device_options()));
  DTL_EXPECT_EQUAL(x, torch::full({4, 2}, static_cast<float>(r + 1), device_options()))
      << "the input must stay as it was";
  const auto before = comm.stats();
  const torch::Tensor w = rank_input({4, 2});
  (y * w).sum().backward();
  EXPECT_EQ(count_since(before, comm, OpType::AllReduce), 0) << "backward must not communicate";
  DTL_EXPECT_CLOSE(x.grad(), w);
}

TEST(ReduceFromTP, AllReduceForwardIdentityBackward) { expect_reduce_from_tp(*fresh_comm()); }
TEST(ReduceFromTP, UsesOnlyItsGroup) { expect_reduce_from_tp(*half_group()); }

// Keep my slice of the last dimension; backward reassembles the full gradient on every rank.
void expect_scatter_to_tp(Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  const torch::Tensor x = same_input({2, 3, 4 * n}, 2).requires_grad_(true);
  const torch::Tensor y = scatter_to_tp(x, comm);
  ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{2, 3, 4}));
  DTL_EXPECT_EQUAL(y, x.narrow(-1, 4 * r, 4));
  // Rank q's output gradient is all (q + 1): the input gradient is block q = q + 1.
  y.backward(torch::full({2, 3, 4}, static_cast<float>(r + 1), device_options()));
  std::vector<torch::Tensor> blocks;
  for (int q = 0; q < n; ++q)
    blocks.push_back(torch::full({2, 3, 4}, static_cast<float>(q + 1), device_options()));
  DTL_EXPECT_EQUAL(x.grad(), torch::cat(blocks, -1));
}

TEST(ScatterToTP, KeepsTheSliceAndGathersTheGradient) { expect_scatter_to_tp(*fresh_comm()); }
TEST(ScatterToTP, UsesOnlyItsGroup) { expect_scatter_to_tp(*half_group()); }

// Gather along the last dimension in rank order; backward keeps my slice.
void expect_gather_from_tp(Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  // Rank q contributes [3, 2] filled with 10 q + column index.
  auto piece = [&](int q) {
    return (torch::arange(2, device_options()) + 10.0 * q).expand({3, 2}).contiguous();
  };
  const torch::Tensor x = piece(r).requires_grad_(true);
  const torch::Tensor y = gather_from_tp(x, comm);
  std::vector<torch::Tensor> all;
  for (int q = 0; q < n; ++q) all.push_back(piece(q));
  DTL_EXPECT_EQUAL(y, torch::cat(all, -1));
  const torch::Tensor g = same_input({3, 2 * n}, 3);
  y.backward(g);
  DTL_EXPECT_EQUAL(x.grad(), g.narrow(-1, 2 * r, 2));
}

TEST(GatherFromTP, ConcatenatesInRankOrderAndSlicesTheGradient) {
  expect_gather_from_tp(*fresh_comm());
}
TEST(GatherFromTP, UsesOnlyItsGroup) { expect_gather_from_tp(*half_group()); }

TEST(ScatterToTP, RejectsALastDimensionTpDoesNotDivide) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "every size divides by 1";
  const torch::Tensor x = torch::ones({2, comm->size() + 1}, device_options());
  const std::string msg = testing::error_of([&] { scatter_to_tp(x, *comm); });
  EXPECT_THAT(msg, HasSubstr("divisible"));
  EXPECT_THAT(msg, HasSubstr("last dimension"));
}

// ---------------------------------------------------------------- Task 2

// Column parallel against the serial Linear: output (gathered or this rank's slice), input
// gradient, and the weight and bias gradients as this rank's rows.
void expect_column_matches_serial(bool gather_output, bool bias, Comm& comm) {
  const Range rows = mine(kOut, comm);
  torch::nn::Linear serial = serial_linear(kIn, kOut, bias, 10);
  ColumnParallelLinear col(serial->weight, bias ? serial->bias : torch::Tensor(), comm,
                           gather_output);
  EXPECT_EQ(col->weight.sizes().vec(), (std::vector<int64_t>{rows.size(), kIn}));
  EXPECT_EQ(col->named_parameters().size(), bias ? 2u : 1u);

  const torch::Tensor x = same_input({5, kIn}, 11);
  const torch::Tensor xs = x.clone().requires_grad_(true), xp = x.clone().requires_grad_(true);
  const torch::Tensor ys = serial(xs), yp = col(xp);
  // The same loss on both sides: a fixed weighting of the full output.
  const torch::Tensor w = same_input({5, kOut}, 12);
  (ys * w).sum().backward();
  if (gather_output) {
    DTL_EXPECT_CLOSE(yp, ys);
    (yp * w).sum().backward();
  } else {
    DTL_EXPECT_CLOSE(yp, ys.narrow(-1, rows.begin, rows.size()));
    (yp * w.narrow(-1, rows.begin, rows.size())).sum().backward();
  }
  DTL_EXPECT_CLOSE(xp.grad(), xs.grad()) << "the input gradient must be the full serial one";
  DTL_EXPECT_CLOSE(col->weight.grad(), serial->weight.grad().narrow(0, rows.begin, rows.size()));
  if (bias) {
    DTL_EXPECT_CLOSE(col->bias.grad(), serial->bias.grad().narrow(0, rows.begin, rows.size()));
  }
}

TEST(ColumnParallelLinear, SplitOutputMatchesTheSerialSlice) {
  expect_column_matches_serial(false, true, *fresh_comm());
}
TEST(ColumnParallelLinear, GatheredOutputMatchesSerial) {
  expect_column_matches_serial(true, true, *fresh_comm());
}
TEST(ColumnParallelLinear, WithoutBias) { expect_column_matches_serial(false, false, *fresh_comm()); }
// Sliced by the group's rank, gathered over the group: never dtl::world().
TEST(ColumnParallelLinear, UsesOnlyItsGroup) {
  expect_column_matches_serial(true, true, *half_group());
}

// Row parallel against the serial Linear: the output is the full serial output on every rank.
void expect_row_matches_serial(bool input_is_parallel, bool bias, Comm& comm) {
  const Range cols = mine(kIn, comm);
  torch::nn::Linear serial = serial_linear(kIn, kOut, bias, 20);
  RowParallelLinear row(serial->weight, bias ? serial->bias : torch::Tensor(), comm,
                        input_is_parallel);
  EXPECT_EQ(row->weight.sizes().vec(), (std::vector<int64_t>{kOut, cols.size()}));

  const torch::Tensor x = same_input({2, 3, kIn}, 21);
  const torch::Tensor xs = x.clone().requires_grad_(true);
  const torch::Tensor xp = (input_is_parallel ? x.narrow(-1, cols.begin, cols.size()) : x)
                               .clone()
                               .requires_grad_(true);
  const torch::Tensor ys = serial(xs), yp = row(xp);
  DTL_EXPECT_CLOSE(yp, ys);
  const torch::Tensor w = same_input({2, 3, kOut}, 22);
  (ys * w).sum().backward();
  (yp * w).sum().backward();
  const torch::Tensor x_grad = input_is_parallel ? xs.grad().narrow(-1, cols.begin, cols.size())
                                                 : xs.grad();
  DTL_EXPECT_CLOSE(xp.grad(), x_grad);
  DTL_EXPECT_CLOSE(row->weight.grad(), serial->weight.grad().narrow(1, cols.begin, cols.size()));
  if (bias) {
    DTL_EXPECT_CLOSE(row->bias.grad(), serial->bias.grad()) << "the bias is not split";
  }
}

TEST(RowParallelLinear, ParallelInputMatchesSerial) {
  expect_row_matches_serial(true, true, *fresh_comm());
}
TEST(RowParallelLinear, FullInputMatchesSerial) {
  expect_row_matches_serial(false, true, *fresh_comm());
}
TEST(RowParallelLinear, WithoutBias) { expect_row_matches_serial(true, false, *fresh_comm()); }
TEST(RowParallelLinear, UsesOnlyItsGroup) { expect_row_matches_serial(false, true, *half_group()); }

// A parallel layer computes with the shard it registered, nothing else. Each rank scales its
// own shard by its own factor; the layer must then equal the serial Linear whose full weight
// those shards make up (every rank knows the factors, so no communication is needed to build
// it). A layer that kept the full weight it was built from and computed the serial layer
// locally passes the tests above, and fails these.
torch::Tensor scaled_by_rank(const torch::Tensor& full, int64_t dim, int n) {
  std::vector<torch::Tensor> parts;
  const int64_t k = full.size(dim) / n;
  for (int rank = 0; rank < n; ++rank) parts.push_back(full.narrow(dim, rank * k, k) * (1.0 + 0.25 * (rank + 1)));
  return torch::cat(parts, dim);
}

TEST(ColumnParallelLinear, ComputesWithItsOwnShard) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  torch::nn::Linear serial = serial_linear(kIn, kOut, true, 23);
  ColumnParallelLinear col(serial->weight, serial->bias, *comm, true);
  {
    torch::NoGradGuard no_grad;
    col->weight.mul_(1.0 + 0.25 * (r + 1));
    col->bias.mul_(1.0 + 0.25 * (r + 1));
  }
  torch::nn::Linear changed = serial_linear(kIn, kOut, true, 23);
  {
    torch::NoGradGuard no_grad;
    changed->weight.copy_(scaled_by_rank(changed->weight, 0, n));
    changed->bias.copy_(scaled_by_rank(changed->bias, 0, n));
  }
  const torch::Tensor x = same_input({2, 3, kIn}, 24);
  DTL_EXPECT_CLOSE(col(x), changed(x)) << "the output must come from this rank's registered shard";
}

TEST(RowParallelLinear, ComputesWithItsOwnShard) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  torch::nn::Linear serial = serial_linear(kIn, kOut, true, 25);
  RowParallelLinear row(serial->weight, serial->bias, *comm, false);
  {
    torch::NoGradGuard no_grad;
    row->weight.mul_(1.0 + 0.25 * (r + 1));
  }
  torch::nn::Linear changed = serial_linear(kIn, kOut, true, 25);
  {
    torch::NoGradGuard no_grad;
    changed->weight.copy_(scaled_by_rank(changed->weight, 1, n));
  }
  const torch::Tensor x = same_input({2, 3, kIn}, 26);
  DTL_EXPECT_CLOSE(row(x), changed(x)) << "the output must come from this rank's registered shard";
}

TEST(ParallelLinear, RejectSizesTpDoesNotDivideAndWrongInputs) {
  auto comm = fresh_comm();
  const int n = comm->size();
  torch::nn::Linear serial = serial_linear(kIn, kOut, true, 30);
  if (n > 1) {
    torch::nn::Linear odd = serial_linear(kIn, n + 1, true, 31);  // n + 1 outputs
    std::string msg = testing::error_of(
        [&] { ColumnParallelLinear(odd->weight, odd->bias, *comm, false); });
    EXPECT_THAT(msg, HasSubstr("divisible"));
    EXPECT_THAT(msg, HasSubstr("out_features"));
    torch::nn::Linear odd_in = serial_linear(n + 1, kOut, true, 32);  // n + 1 inputs
    msg = testing::error_of([&] { RowParallelLinear(odd_in->weight, odd_in->bias, *comm, true); });
    EXPECT_THAT(msg, HasSubstr("divisible"));
    EXPECT_THAT(msg, HasSubstr("in_features"));
  }
  ColumnParallelLinear col(serial->weight, serial->bias, *comm, false);
  EXPECT_THAT(testing::error_of([&] { col(torch::ones({2, kIn + 1}, device_options())); }),
              HasSubstr("in_features"));
  RowParallelLinear row(serial->weight, serial->bias, *comm, false);
  EXPECT_THAT(testing::error_of([&] { row(torch::ones({2, kIn / n + 1}, device_options())); }),
              HasSubstr("in_features"));
}

// ---------------------------------------------------------------- Task 3

// The serial MLP of the course GPT (d 24, ff 96) from its seeded init.
dtl::model::MLP serial_mlp() {
  dtl::model::GPTConfig cfg = dtl::model::GPTConfig::tiny();
  cfg.d_model = kIn;
  cfg.n_head = 2;
  dtl::model::MLP m(cfg);
  dtl::model::init_parameters(*m, cfg, "blocks.0.mlp.");
  m->to(device());
  return m;
}

TEST(TensorParallelMLP, EqualsTheSerialMLPWithOneAllReduceEachWay) {
  auto comm = fresh_comm();
  dtl::model::MLP serial = serial_mlp();
  TensorParallelMLP tp(serial->fc->weight, serial->fc->bias, serial->proj->weight,
                       serial->proj->bias, *comm);
  const int64_t ff = serial->fc->weight.size(0);
  const Range hidden = mine(ff, *comm);

  const torch::Tensor x = same_input({2, 4, kIn}, 40);
  const torch::Tensor xs = x.clone().requires_grad_(true), xp = x.clone().requires_grad_(true);
  const auto before = comm->stats();
  const torch::Tensor yp = tp(xp);
  const int64_t forward_reduces = count_since(before, *comm, OpType::AllReduce);
  const int64_t forward_bytes =
      comm->stats()[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes;
  const torch::Tensor ys = serial(xs);
  DTL_EXPECT_CLOSE(yp, ys);
  const torch::Tensor w = same_input({2, 4, kIn}, 41);
  (ys * w).sum().backward();
  (yp * w).sum().backward();
  if (comm->size() > 1) {
    EXPECT_EQ(forward_reduces, 1) << "forward: only proj's all-reduce";
    EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), 2)
        << "backward: only the all-reduce of x's gradient (fc's copy_to_tp)";
    EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "") << "no other communication";
    // What is summed: the output [2, 4, d] forward and x's gradient backward, never weights
    // (all-reducing zero-padded weight shards and computing the whole MLP locally has the same
    // count).
    const int64_t activation_bytes = x.numel() * 4;
    EXPECT_EQ(forward_bytes, activation_bytes) << "forward: one [2, 4, d] float32 all-reduce";
    EXPECT_EQ(comm->stats()[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes,
              2 * activation_bytes)
        << "backward: one [2, 4, d] float32 all-reduce";
  }
  DTL_EXPECT_CLOSE(xp.grad(), xs.grad());
  DTL_EXPECT_CLOSE(tp->fc->weight.grad(),
                   serial->fc->weight.grad().narrow(0, hidden.begin, hidden.size()));
  DTL_EXPECT_CLOSE(tp->proj->weight.grad(),
                   serial->proj->weight.grad().narrow(1, hidden.begin, hidden.size()));
  DTL_EXPECT_CLOSE(tp->proj->bias.grad(), serial->proj->bias.grad());
  std::vector<std::string> names;
  for (const auto& p : tp->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fc.weight", "fc.bias", "proj.weight", "proj.bias"}));
}

// The MLP computes with its layers' registered shards: after each rank scales its own fc and
// proj shards, it equals the serial MLP of the full weights those shards make up. An MLP that
// kept the full weights, computed everything locally and all-reduced a zero-padded copy of the
// result (one all-reduce of the right size each way) passes the test above, and fails this one.
TEST(TensorParallelMLP, ComputesWithItsOwnShards) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  dtl::model::MLP serial = serial_mlp();
  TensorParallelMLP tp(serial->fc->weight, serial->fc->bias, serial->proj->weight,
                       serial->proj->bias, *comm);
  {
    torch::NoGradGuard no_grad;
    tp->fc->weight.mul_(1.0 + 0.25 * (r + 1));
    tp->fc->bias.mul_(1.0 + 0.25 * (r + 1));
    tp->proj->weight.mul_(1.0 + 0.25 * (r + 1));
  }
  dtl::model::MLP changed = serial_mlp();
  {
    torch::NoGradGuard no_grad;
    changed->fc->weight.copy_(scaled_by_rank(changed->fc->weight, 0, n));
    changed->fc->bias.copy_(scaled_by_rank(changed->fc->bias, 0, n));
    changed->proj->weight.copy_(scaled_by_rank(changed->proj->weight, 1, n));
  }
  const torch::Tensor x = same_input({2, 4, kIn}, 42);
  DTL_EXPECT_CLOSE(tp(x), changed(x), 1e-4, 1e-5) << "the output must come from the registered shards";
}

}  // namespace
}  // namespace dtl::lab08
