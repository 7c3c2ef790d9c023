// Grading tests of lab 10 (hidden from students until the due date). Same oracles as the public
// tests, where those do not look: float64 and views through the operators, training over
// several steps, tp as a sub-group of a dp x tp mesh, ring attention with one position per rank
// and with large scores, and ring attention inside a whole attention layer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "dtl/harness/checks.hpp"
#include "sequence_parallel.hpp"
#include "tests/sp_test_util.hpp"

namespace dtl::lab10 {
namespace {

using namespace lab10_test;  // NOLINT

// float64, a non-contiguous input, trailing dimensions: gather then reduce-scatter round trip.
TEST(GradeOperators, DoublesViewsAndRoundTrips) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  // [B, Tc, 3, 2] as a transposed view of [B, 2, 3, Tc]... made per rank.
  const torch::Tensor base = input_of_rank(r, {2, 2, 3, 4}, 40).to(torch::kFloat64);
  const torch::Tensor x = base.permute({0, 3, 2, 1}).requires_grad_(false);  // [2, 4, 3, 2]
  ASSERT_FALSE(x.is_contiguous());
  const torch::Tensor xg = x.clone().requires_grad_(true);
  const torch::Tensor gathered = gather_from_sp(x, *comm);
  std::vector<torch::Tensor> all;
  for (int q = 0; q < n; ++q)
    all.push_back(input_of_rank(q, {2, 2, 3, 4}, 40).to(torch::kFloat64).permute({0, 3, 2, 1}));
  DTL_EXPECT_EQUAL(gathered, torch::cat(all, 1));
  // Scatter of the gather is the identity; reduce-scatter of the gather is n times it.
  DTL_EXPECT_EQUAL(scatter_to_sp(gather_from_sp(xg, *comm), *comm), x);
  const torch::Tensor twice = reduce_scatter_to_sp(gather_from_sp(xg, *comm), *comm);
  DTL_EXPECT_CLOSE(twice, x * n, 1e-12, 1e-12);
  twice.sum().backward();
  // d/dx of n copies summed: every rank's all-gathered ones, reduce-scattered: n per element.
  DTL_EXPECT_CLOSE(xg.grad(), torch::full_like(x, static_cast<double>(n)), 1e-12, 1e-12);
}

// Three AdamW steps with the grad sync: losses and parameters stay the serial ones.
TEST(GradeTraining, ThreeAdamWStepsEqualSerial) {
  expect_training_equals_serial<SequenceParallelGPT>(
      sp_config(2, /*tied=*/false),
      [](torch::nn::Module& m, Comm& tp) { sync_sequence_parallel_grads(m, tp); });
}

// dp x tp on a mesh, with the gradient sync: follows serial training.
TEST(GradeMesh, DataTimesSequenceParallelFollowsSerialTraining) {
  expect_mesh_training_follows_serial<SequenceParallelGPT>(
      sp_config(2), 2, [](torch::nn::Module& m, Comm& tp) { sync_sequence_parallel_grads(m, tp); });
}

// One position per rank (every chunk but the first is entirely past or future), float64, and
// scores in the hundreds (the online softmax must rescale, not overflow).
TEST(GradeRing, OnePositionPerRankDoublesLargeScores) {
  auto comm = fresh_comm();
  const int64_t t = comm->size();
  for (double scale : {1.0, 40.0}) {
    std::vector<torch::Tensor> full;
    for (uint64_t s = 60; s < 63; ++s)
      full.push_back(
          (same_input({1, 3, t, 16}, s) * scale).to(torch::kFloat64).requires_grad_(true));
    auto chunk = [&](const torch::Tensor& x) {
      return sequence_chunk(x.detach(), 2, *comm).clone().requires_grad_(true);
    };
    const torch::Tensor q = chunk(full[0]), k = chunk(full[1]), v = chunk(full[2]);
    const torch::Tensor out = ring_attention(q, k, v, *comm);
    ASSERT_TRUE(OBSERVE(torch::isfinite(out).all().item<bool>())) << "scale " << scale;
    const torch::Tensor ref = dtl::model::causal_attention(full[0], full[1], full[2], 0.0, false);
    DTL_EXPECT_CLOSE(out, sequence_chunk(ref.detach(), 2, *comm), 1e-10, 1e-10)
        << "scale " << scale;
    out.sum().backward();
    ref.sum().backward();
    DTL_EXPECT_CLOSE(q.grad(), sequence_chunk(full[0].grad(), 2, *comm), 1e-8, 1e-9) << "dq";
    DTL_EXPECT_CLOSE(k.grad(), sequence_chunk(full[1].grad(), 2, *comm), 1e-8, 1e-9) << "dk";
    DTL_EXPECT_CLOSE(v.grad(), sequence_chunk(full[2].grad(), 2, *comm), 1e-8, 1e-9) << "dv";
  }
}

// Ring attention as the core of a context-parallel attention layer: the serial attention's
// weights on every rank, each rank its chunk of the sequence; outputs and weight gradients
// (summed over cp, as a dp-like all-reduce would) equal the serial layer's.
TEST(GradeRing, InsideAnAttentionLayer) {
  auto comm = fresh_comm();
  const int64_t heads = 4, d = 32, tc = 3, t = tc * comm->size();
  auto layer = dtl::testing::serial(70, [&] {
    return dtl::model::CausalSelfAttention(dtl::testing::gpt_config(1, d, heads, 8, t));
  });
  layer->to(device());
  const torch::Tensor x = same_input({2, t, d}, 71);
  const torch::Tensor xc = sequence_chunk(x, 1, *comm).clone().requires_grad_(true);
  auto heads_of = [&](const torch::Tensor& p) {  // [2, tc, d] -> [2, H, tc, Dh]
    return p.view({2, tc, heads, d / heads}).transpose(1, 2);
  };
  std::vector<torch::Tensor> qkv = layer->qkv(xc).split(d, -1);
  torch::Tensor y = ring_attention(heads_of(qkv[0]), heads_of(qkv[1]), heads_of(qkv[2]), *comm);
  y = layer->proj(y.transpose(1, 2).contiguous().view({2, tc, d}));
  const torch::Tensor ys = layer->forward(x);
  DTL_EXPECT_CLOSE(y, sequence_chunk(ys.detach(), 1, *comm), 1e-4, 1e-5);
  y.sum().backward();
  torch::Tensor g = layer->qkv->weight.grad().clone();
  if (comm->size() > 1) comm->all_reduce(g);
  layer->zero_grad();
  ys.sum().backward();
  DTL_EXPECT_CLOSE(g, layer->qkv->weight.grad(), 1e-4, 1e-5)
      << "qkv weight gradient summed over cp";
}

}  // namespace
}  // namespace dtl::lab10
