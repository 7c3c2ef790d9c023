// Grading tests of lab 09 (hidden from students until the due date). Same oracles as the public
// tests, in places the public tests do not look: training over several steps, a tp group that
// is a sub-group of a dp x tp mesh, float64, other shapes, targets and ids that all belong to one
// rank, non-contiguous inputs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "dtl/harness/checks.hpp"
#include "tests/tpt_test_util.hpp"
#include "tp_transformer.hpp"

namespace dtl::lab09 {
namespace {

using namespace lab09_test;  // NOLINT

// Three AdamW steps on different batches: the losses and the parameters stay the serial ones.
TEST(GradeTraining, ThreeAdamWStepsEqualSerial) {
  expect_training_equals_serial<TensorParallelGPT>(config(2, /*tied=*/true));
}

// dp x tp on a mesh: tp is a sub-group, the loss trajectory and the parameters follow serial.
TEST(GradeMesh, DataTimesTensorParallelFollowsSerialTraining) {
  expect_mesh_training_follows_serial<TensorParallelGPT>(config(2, /*tied=*/false), 3);
}

// float64 logits, every target owned by the last rank, a non-contiguous view as input.
TEST(GradeCrossEntropy, DoublesTargetsOfOneRankAndViews) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const int64_t V = 12 * n, N = 7;
  const Range r = mine(V, *comm);
  const torch::Tensor full =
      (same_input({V, N}, 30).to(torch::kFloat64) * 2).t().requires_grad_(true);  // [N, V], a view
  const torch::Tensor targets = torch::full(
      {N}, V - 1 - (N % 3), torch::TensorOptions().dtype(torch::kInt64).device(device()));
  const torch::Tensor local = full.detach().narrow(-1, r.begin, r.size()).requires_grad_(true);
  ASSERT_FALSE(local.is_contiguous());
  const torch::Tensor loss = vocab_parallel_cross_entropy(local, targets, *comm);
  const torch::Tensor expected = torch::nn::functional::cross_entropy(full, targets);
  EXPECT_EQ(OBSERVE(loss.scalar_type()), torch::kFloat64);
  DTL_EXPECT_CLOSE(loss, expected, 1e-12, 1e-12);
  (loss * 0.3).backward();
  (expected * 0.3).backward();
  DTL_EXPECT_CLOSE(local.grad(), full.grad().narrow(-1, r.begin, r.size()), 1e-12, 1e-12);
}

// Ids that all belong to rank 0: the others look up nothing, and their gradient rows stay zero.
TEST(GradeEmbedding, IdsOfOneRankAndDoubles) {
  auto comm = fresh_comm();
  const int64_t V = 24, d = 6;
  const torch::Tensor full = same_input({V, d}, 31).to(torch::kFloat64);
  VocabParallelEmbedding emb(full, *comm);
  EXPECT_EQ(OBSERVE(emb->weight.scalar_type()), torch::kFloat64);
  const int64_t owned = V / comm->size();
  const torch::Tensor idx = same_tokens(4, 9, owned, 32);  // ids in [0, V/tp): rank 0's
  const torch::Tensor table = full.clone().requires_grad_(true);
  const torch::Tensor expected = torch::nn::functional::embedding(idx, table);
  const torch::Tensor got = emb(idx);
  DTL_EXPECT_CLOSE(got, expected, 1e-12, 1e-12);
  got.sum().backward();
  expected.sum().backward();
  const Range r = mine(V, *comm);
  DTL_EXPECT_CLOSE(emb->weight.grad(), table.grad().narrow(0, r.begin, r.size()), 1e-12, 1e-12);
}

// Two dimensions per head, float64, a single position: the same heads arithmetic.
TEST(GradeAttention, DoublesTinyHeadsOnePosition) {
  auto comm = fresh_comm();
  const int64_t d = 24, heads = 12;
  // torch's default init and random biases, the same on every rank (serial() seeds the draw).
  auto s = dtl::testing::serial(40, [&] {
    dtl::model::CausalSelfAttention a(dtl::testing::gpt_config(1, d, heads, 12, 4));
    torch::NoGradGuard no_grad;
    a->qkv->bias.normal_();
    a->proj->bias.normal_();
    return a;
  });
  s->to(device(), torch::kFloat64);
  ParallelAttention attn(s->qkv->weight, s->qkv->bias, s->proj->weight, s->proj->bias, heads,
                         *comm);
  for (int64_t T : {1, 5}) {
    const torch::Tensor x = same_input({3, T, d}, 41).to(torch::kFloat64).requires_grad_(true);
    const torch::Tensor xs = x.detach().clone().requires_grad_(true);
    const torch::Tensor y = attn(x), ys = s->forward(xs);
    DTL_EXPECT_CLOSE(y, ys, 1e-10, 1e-12) << "T=" << T;
    y.sum().backward();
    ys.sum().backward();
    DTL_EXPECT_CLOSE(x.grad(), xs.grad(), 1e-10, 1e-12) << "T=" << T;
  }
}

// One block, a custom d_ff, an untied head with biases, a batch shorter than the context.
TEST(GradeGPT, OtherShapesEqualSerial) {
  auto comm = fresh_comm();
  GPTConfig cfg = config(1, /*tied=*/false, /*bias=*/true);
  cfg.d_ff = 72;  // divisible by 1-4
  cfg.seq_len = 12;
  GPT serial = serial_gpt(cfg, 7);
  TensorParallelGPT gpt(*serial, *comm);
  const torch::Tensor tokens = same_tokens(3, 6, cfg.vocab_size, 42);  // T = 5 < seq_len
  const torch::Tensor loss = gpt->loss(tokens);
  const torch::Tensor expected = serial->loss(tokens);
  DTL_EXPECT_CLOSE(loss, expected, 1e-5, 1e-6);
  loss.backward();
  expected.backward();
  expect_shards_of_serial(*gpt, *serial, cfg, comm->size(), comm->rank(), /*grads=*/true);
}

}  // namespace
}  // namespace dtl::lab09
