// Grading tests of lab 08 (hidden from students until the deadline). They check nothing the
// header does not promise: other shapes and dtypes, non-contiguous inputs, parameters that are
// copies, the collectives of the flags, several training steps, and the tp = 1 case of the
// operators. (A tp group that is not the world: the public tests' UsesOnlyItsGroup.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "dtl/harness/checks.hpp"
#include "dtl/model.hpp"
#include "dtl/runtime.hpp"
#include "tensor_parallel.hpp"
#include "tests/tp_test_util.hpp"

namespace dtl::lab08 {
namespace {

using namespace lab08_test;  // NOLINT: serial_linear, same_input, mine, fresh_comm, ...
using ::testing::HasSubstr;

// Scatter then gather is the identity, forward and backward, for a non-contiguous float64
// input and for a 1-D one.
TEST(GradeOperators, ScatterThenGatherIsTheIdentity) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const torch::Tensor base = same_input({6 * n, 5}, 50).to(torch::kFloat64);
  const torch::Tensor x = base.t().detach().requires_grad_(true);  // [5, 6n], non-contiguous
  ASSERT_FALSE(x.is_contiguous());
  const torch::Tensor s = scatter_to_tp(x, *comm);
  EXPECT_EQ(OBSERVE(s.scalar_type()), torch::kFloat64);
  const torch::Tensor y = gather_from_tp(s, *comm);
  DTL_EXPECT_EQUAL(y, x);
  const torch::Tensor g = same_input({5, 6 * n}, 51).to(torch::kFloat64);
  y.backward(g);
  DTL_EXPECT_EQUAL(x.grad(), g);

  const torch::Tensor v = same_input({3 * n}, 52).requires_grad_(true);
  const torch::Tensor w = gather_from_tp(scatter_to_tp(v, *comm), *comm);
  DTL_EXPECT_EQUAL(w, v);
}

// Copy then reduce: forward multiplies by tp (every rank adds the same x), backward too.
TEST(GradeOperators, CopyThenReduceScalesByTp) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const torch::Tensor x = same_input({2, 3, 4}, 53).requires_grad_(true);
  const torch::Tensor y = reduce_from_tp(copy_to_tp(x, *comm), *comm);
  DTL_EXPECT_CLOSE(y, x * n);
  y.sum().backward();
  DTL_EXPECT_CLOSE(x.grad(), torch::full({2, 3, 4}, static_cast<float>(n), device_options()));
}

// A group of one: every operator is the identity and communicates nothing.
TEST(GradeOperators, TpOfOneCommunicatesNothing) {
  auto self = dtl::world().split(dtl::world().rank(), 0);
  ASSERT_EQ(self->size(), 1);
  const torch::Tensor x = rank_input({3, 4}).requires_grad_(true);
  const auto before = measured_stats(*self);
  torch::Tensor y = gather_from_tp(scatter_to_tp(reduce_from_tp(copy_to_tp(x, *self), *self), *self), *self);
  DTL_EXPECT_EQUAL(y, x);
  y.sum().backward();
  DTL_EXPECT_EQUAL(x.grad(), torch::ones({3, 4}, device_options()));
  EXPECT_EQ(measured_stats(*self).total_count() - before.total_count(), 0);
}

// Parameters are copies: training the shards must not write into the full weight or the full
// bias (the column layer's bias is a slice of it, the row layer's the whole of it), and every
// shard is a leaf that requires grad and lives where the full weight lives.
TEST(GradeLayers, ParametersAreLeafCopies) {
  auto comm = fresh_comm();
  torch::nn::Linear s = serial_linear(kIn, kOut, true, 63);
  const torch::Tensor weight = s->weight.detach().clone(), bias = s->bias.detach().clone();
  ColumnParallelLinear col(s->weight, s->bias, *comm, true);
  RowParallelLinear row(s->weight, s->bias, *comm, false);
  for (torch::nn::Module* layer : {static_cast<torch::nn::Module*>(col.get()),
                                   static_cast<torch::nn::Module*>(row.get())}) {
    ASSERT_EQ(OBSERVE(layer->named_parameters().size()), 2u) << layer->name();
    for (const auto& p : layer->named_parameters()) {
      EXPECT_TRUE(OBSERVE(p.value().is_leaf() && p.value().requires_grad()))
          << layer->name() << " " << p.key();
      EXPECT_EQ(OBSERVE(p.value().device().str()), s->weight.device().str())
          << layer->name() << " " << p.key();
      torch::NoGradGuard no_grad;
      p.value().fill_(7.0);
    }
  }
  DTL_EXPECT_EQUAL(s->weight, weight) << "a weight shard is a view of the full weight";
  DTL_EXPECT_EQUAL(s->bias, bias) << "a bias is a view of the full bias";
}

// Three SGD steps of the tensor-parallel MLP equal three serial steps: shards stay the slices.
TEST(GradeMLP, TrainsLikeTheSerialMLP) {
  auto comm = fresh_comm();
  dtl::model::GPTConfig cfg = dtl::model::GPTConfig::tiny();
  cfg.d_model = 12;  // ff 48: divisible by 1-4
  cfg.n_head = 2;
  dtl::model::MLP serial(cfg);
  dtl::model::init_parameters(*serial, cfg, "blocks.1.mlp.");
  serial->to(device());
  TensorParallelMLP tp(serial->fc->weight, serial->fc->bias, serial->proj->weight,
                       serial->proj->bias, *comm);
  torch::optim::SGD opt_s(serial->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt_p(tp->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor x = same_input({4, 3, 12}, 70 + step);
    opt_s.zero_grad();
    opt_p.zero_grad();
    serial(x).pow(2).mean().backward();
    tp(x).pow(2).mean().backward();
    opt_s.step();
    opt_p.step();
  }
  const Range h = mine(48, *comm);
  DTL_EXPECT_CLOSE(tp->fc->weight, serial->fc->weight.narrow(0, h.begin, h.size()));
  DTL_EXPECT_CLOSE(tp->fc->bias, serial->fc->bias.narrow(0, h.begin, h.size()));
  DTL_EXPECT_CLOSE(tp->proj->weight, serial->proj->weight.narrow(1, h.begin, h.size()));
  DTL_EXPECT_CLOSE(tp->proj->bias, serial->proj->bias);
}

// Forward of gather_output and of a full-input row layer: the collectives the design needs and
// no more (an all-gather each; the row layer's one all-reduce).
TEST(GradeLayers, CommunicationOfTheFlags) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "nothing to communicate at tp 1";
  torch::nn::Linear s = serial_linear(kIn, kOut, true, 80);
  ColumnParallelLinear col(s->weight, s->bias, *comm, true);
  auto before = measured_stats(*comm);
  const torch::Tensor x = same_input({2, kIn}, 81).requires_grad_(true);
  const torch::Tensor xs = x.detach().clone().requires_grad_(true);
  const torch::Tensor y = col(x);
  y.sum().backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), 1) << "gather_output: one all-gather";
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), 1) << "backward: x's gradient";
  // The counts are measured in the process under test: what they carried is checked too.
  const torch::Tensor ys = s(xs);
  ys.sum().backward();
  DTL_EXPECT_CLOSE(y, ys) << "gather_output: the whole serial output";
  DTL_EXPECT_CLOSE(x.grad(), xs.grad()) << "x's gradient, summed over tp";
  torch::nn::Linear t = serial_linear(kIn, kOut, false, 82);
  RowParallelLinear row(t->weight, torch::Tensor(), *comm, false);
  before = measured_stats(*comm);
  const torch::Tensor z = same_input({2, kIn}, 83).requires_grad_(true);
  const torch::Tensor zs = z.detach().clone().requires_grad_(true);
  const torch::Tensor out = row(z);
  out.sum().backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), 1) << "forward: the partial sums";
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), 1) << "backward: z's gradient";
  const torch::Tensor outs = t(zs);
  outs.sum().backward();
  DTL_EXPECT_CLOSE(out, outs) << "the summed partial products";
  DTL_EXPECT_CLOSE(z.grad(), zs.grad()) << "z's gradient, gathered";
}

TEST(GradeBadInput, MalformedFullWeights) {
  auto comm = fresh_comm();
  const torch::Tensor w = torch::ones({kOut, kIn}, device_options());
  EXPECT_THAT(testing::error_of([&] {
                ColumnParallelLinear(w, torch::ones({kOut + 1}, device_options()), *comm, false);
              }),
              HasSubstr("bias"));
  EXPECT_THAT(testing::error_of([&] { scatter_to_tp(torch::ones({}, device_options()), *comm); }),
              HasSubstr("dimension"));
  if (comm->size() > 1) {
    const std::string msg = testing::error_of(
        [&] { TensorParallelMLP(torch::ones({comm->size() + 1, kIn}, device_options()),
                                torch::Tensor(),
                                torch::ones({kIn, comm->size() + 1}, device_options()),
                                torch::Tensor(), *comm); });
    EXPECT_THAT(msg, HasSubstr("divisible"));
  }
}

}  // namespace
}  // namespace dtl::lab08
