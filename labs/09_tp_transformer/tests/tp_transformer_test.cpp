// Public tests of lab 09. Run: ./lab test 09   (world sizes 1, 2, 3 and 4; tp = the world)
//
// The oracle: the serial course GPT from the same seed (biases and LayerNorms perturbed, so a
// wrongly sliced bias shows). Every tensor-parallel piece must give the serial outputs, the
// serial input gradients, and parameter gradients that are exactly its shards of the serial
// ones; Comm::stats() counts the collectives against Megatron's formula.
#include "tp_transformer.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "dtl/harness/checks.hpp"  // defines: DTL_EXPECT_CLOSE, expect_error_mentions
#include "tests/tpt_test_util.hpp"

namespace dtl::lab09 {
namespace {

using namespace lab09_test;  // NOLINT: config, serial_gpt, expected_shard, fresh_comm, ...
using dtl::testing::expect_error_mentions;

constexpr int64_t B = 2, T = 16;

// ---------------------------------------------------------------- Task 1

ParallelAttention parallel_attention_of(const dtl::model::CausalSelfAttentionImpl& s,
                                        const GPTConfig& cfg, Comm& tp) {
  return ParallelAttention(s.qkv->weight, s.qkv->bias, s.proj->weight, s.proj->bias, cfg.n_head,
                           tp);
}

// Heads split over tp: output, input gradient and every weight gradient equal the serial
// attention's (or its shard).
void expect_attention_equals_serial(Comm& comm) {
  const GPTConfig cfg = config();
  GPT serial = serial_gpt(cfg);
  auto s = serial->block(0)->attn;
  ParallelAttention attn = parallel_attention_of(*s, cfg, comm);
  EXPECT_EQ(OBSERVE(attn->local_heads), cfg.n_head / comm.size());
  expect_shards_of_serial(*attn, *s, cfg, comm.size(), comm.rank(), /*grads=*/false,
                          "blocks.0.attn.");

  const torch::Tensor x = same_input({B, T, cfg.d_model}, 3).requires_grad_(true);
  const torch::Tensor xs = x.detach().clone().requires_grad_(true);
  const torch::Tensor w = same_input({B, T, cfg.d_model}, 4);  // the upstream gradient
  const torch::Tensor y = attn(x);
  const torch::Tensor ys = s->forward(xs);
  DTL_EXPECT_CLOSE(y, ys, 1e-4, 1e-5);
  (y * w).sum().backward();
  (ys * w).sum().backward();
  DTL_EXPECT_CLOSE(x.grad(), xs.grad(), 1e-4, 1e-5) << "the input gradient, summed over tp";
  expect_shards_of_serial(*attn, *s, cfg, comm.size(), comm.rank(), /*grads=*/true,
                          "blocks.0.attn.");
}

TEST(ParallelAttention, EqualsTheSerialAttention) { expect_attention_equals_serial(*fresh_comm()); }
// The tp group is the Comm passed in, never dtl::world(): two groups side by side.
TEST(ParallelAttention, UsesOnlyItsGroup) { expect_attention_equals_serial(*half_group()); }

// Megatron's count: the row-parallel proj's all-reduce forward, the column-parallel qkv's input
// gradient backward, nothing else.
TEST(ParallelAttention, OneAllReduceEachWay) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  GPT serial = serial_gpt(cfg);
  auto s = serial->block(0)->attn;
  ParallelAttention attn = parallel_attention_of(*s, cfg, *comm);
  const torch::Tensor x = same_input({B, T, cfg.d_model}, 3).requires_grad_(true);
  const torch::Tensor xs = x.detach().clone().requires_grad_(true);
  const int64_t expected = comm->size() > 1 ? 1 : 0;
  auto before = measured_stats(*comm);
  const torch::Tensor y = attn(x);
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), expected) << "forward";
  before = measured_stats(*comm);
  y.sum().backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), expected) << "backward";
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "");
  // The counts are measured in the process under test; what they carried is checked too.
  const torch::Tensor ys = s->forward(xs);
  ys.sum().backward();
  DTL_EXPECT_CLOSE(y, ys, 1e-4, 1e-5);
  DTL_EXPECT_CLOSE(x.grad(), xs.grad(), 1e-4, 1e-5);
}

// A head cannot be split: n_head = 5 over tp 2, 3 or 4 is rejected by name.
TEST(ParallelAttention, RejectsHeadsTpDoesNotDivide) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "every head count divides over tp = 1";
  const int64_t d = 40, heads = 5;
  const torch::Tensor qkv = torch::randn({3 * d, d}, device_options());
  const torch::Tensor proj = torch::randn({d, d}, device_options());
  const std::string msg = dtl::testing::error_of(
      [&] { ParallelAttention(qkv, torch::Tensor(), proj, torch::Tensor(), heads, *comm); });
  EXPECT_NE(msg.find("n_head"), std::string::npos) << msg;
  EXPECT_NE(msg.find("divisible"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- Task 2

// Every token's row arrives on every rank; the table's gradient lands in the owner's rows.
void expect_embedding_equals_serial(Comm& comm) {
  const int64_t V = 96, d = 48;
  const torch::Tensor full = same_input({V, d}, 5);
  VocabParallelEmbedding emb(full, comm);
  const Range r = mine(V, comm);
  EXPECT_EQ(OBSERVE(emb->vocab_begin), r.begin);
  EXPECT_EQ(OBSERVE(emb->vocab_end), r.end);
  ASSERT_EQ(OBSERVE(emb->weight.sizes().vec()), (std::vector<int64_t>{V / comm.size(), d}));

  // Ids of every rank's range, some repeated.
  const torch::Tensor idx = same_tokens(3, 40, V, 6);
  const torch::Tensor table = full.clone().requires_grad_(true);
  const torch::Tensor expected = torch::nn::functional::embedding(idx, table);
  // This rank's part: its ids' rows, zeros elsewhere.
  const torch::Tensor foreign = (idx < r.begin).logical_or(idx >= r.end).unsqueeze(-1);
  DTL_EXPECT_CLOSE(emb->lookup_local(idx), expected.detach().masked_fill(foreign, 0.0));
  const torch::Tensor got = emb(idx);
  DTL_EXPECT_CLOSE(got, expected);
  const torch::Tensor w = same_input({3, 40, d}, 7);
  (got * w).sum().backward();
  (expected * w).sum().backward();
  DTL_EXPECT_CLOSE(emb->weight.grad(), table.grad().narrow(0, r.begin, r.size()));
}

TEST(VocabParallelEmbedding, EqualsTheSerialLookup) { expect_embedding_equals_serial(*fresh_comm()); }
TEST(VocabParallelEmbedding, UsesOnlyItsGroup) { expect_embedding_equals_serial(*half_group()); }

// reduce_from_tp's count: one all-reduce forward, none backward.
TEST(VocabParallelEmbedding, OneAllReduceForwardNoneBackward) {
  auto comm = fresh_comm();
  const torch::Tensor full = same_input({96, 48}, 5);
  VocabParallelEmbedding emb(full, *comm);
  const torch::Tensor idx = same_tokens(2, 16, 96, 6);
  auto before = measured_stats(*comm);
  const torch::Tensor y = emb(idx);
  DTL_EXPECT_CLOSE(y, torch::nn::functional::embedding(idx, full)) << "what the all-reduce summed";
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), comm->size() > 1 ? 1 : 0);
  EXPECT_EQ(measured_stats(*comm)[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes,
            comm->size() > 1 ? y.numel() * 4 : 0);
  before = measured_stats(*comm);
  y.sum().backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), 0);
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "");
}

TEST(VocabParallelEmbedding, RejectsBadIdsAndVocabularies) {
  auto comm = fresh_comm();
  VocabParallelEmbedding emb(same_input({96, 8}, 5), *comm);
  expect_error_mentions(
      [&] {
        emb(torch::tensor({{3, 96}}, torch::kInt64).to(device()));
      },
      "token id");
  expect_error_mentions(
      [&] {
        emb(torch::tensor({{-1, 3}}, torch::kInt64).to(device()));
      },
      "token id");
  if (comm->size() > 1) {  // 97 is prime: no tp of 2-4 divides it
    const std::string msg = dtl::testing::error_of([&] {
      VocabParallelEmbedding(same_input({97, 8}, 5), *comm);
    });
    EXPECT_NE(msg.find("vocab_size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("divisible"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------- Task 3

// The loss of the full logits and the gradient of this rank's columns, from the columns alone.
// The loss is scaled before backward (as a loss scale or 1/m would): its gradient must carry
// the upstream gradient, not assume it is 1.
void expect_cross_entropy_equals_serial(Comm& comm) {
  const int64_t V = 96;
  const Range r = mine(V, comm);
  const torch::Tensor full = (same_input({B, T, V}, 8) * 3).requires_grad_(true);
  const torch::Tensor local =
      full.detach().narrow(-1, r.begin, r.size()).clone().requires_grad_(true);
  const torch::Tensor targets = same_tokens(B, T, V, 9);

  const torch::Tensor loss = vocab_parallel_cross_entropy(local, targets, comm);
  const torch::Tensor expected =
      torch::nn::functional::cross_entropy(full.view({-1, V}), targets.view({-1}));
  ASSERT_EQ(OBSERVE(loss.dim()), 0) << "a scalar";
  DTL_EXPECT_CLOSE(loss, expected);
  DTL_EXPECT_SAME_ON_ALL_RANKS(loss.detach());
  (loss * 2.5).backward();
  (expected * 2.5).backward();
  DTL_EXPECT_CLOSE(local.grad(), full.grad().narrow(-1, r.begin, r.size()));
}

TEST(VocabParallelCrossEntropy, EqualsTheSerialCrossEntropy) {
  expect_cross_entropy_equals_serial(*fresh_comm());
}
TEST(VocabParallelCrossEntropy, UsesOnlyItsGroup) {
  expect_cross_entropy_equals_serial(*half_group());
}

// Per-token numbers cross the wire, never logits: at most three all-reduces of N values forward,
// nothing backward.
TEST(VocabParallelCrossEntropy, CommunicatesPerTokenNumbersOnly) {
  auto comm = fresh_comm();
  const int64_t V = 96, n = B * T;
  const Range r = mine(V, *comm);
  const torch::Tensor full = same_input({B, T, V}, 8) * 3;
  const torch::Tensor local = full.narrow(-1, r.begin, r.size()).clone().requires_grad_(true);
  const torch::Tensor targets = same_tokens(B, T, V, 9);
  auto before = measured_stats(*comm);
  const torch::Tensor loss = vocab_parallel_cross_entropy(local, targets, *comm);
  DTL_EXPECT_CLOSE(loss, torch::nn::functional::cross_entropy(full.view({-1, V}), targets.view({-1})))
      << "the per-token numbers must add up to the loss";
  const int64_t reduces = count_since(before, *comm, OpType::AllReduce);
  const int64_t bytes =
      measured_stats(*comm)[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes;
  EXPECT_LE(reduces, 3);
  EXPECT_LE(bytes, 3 * n * 4) << "more than three float32 numbers per token were all-reduced";
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "") << "only all-reduces";
  before = measured_stats(*comm);
  loss.backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), 0) << "backward is local";
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "");
}

// Logits in the thousands: exp() would overflow without the max over the full vocabulary.
TEST(VocabParallelCrossEntropy, StableForLargeLogits) {
  auto comm = fresh_comm();
  const int64_t V = 96;
  const Range r = mine(V, *comm);
  const torch::Tensor full = same_input({4, V}, 10) * 1e4;
  const torch::Tensor targets = same_tokens(1, 4, V, 11).view({4});
  const torch::Tensor loss =
      vocab_parallel_cross_entropy(full.narrow(-1, r.begin, r.size()).contiguous(), targets, *comm);
  const double value = OBSERVE(loss.item<double>());
  ASSERT_TRUE(std::isfinite(value)) << "loss " << value;
  DTL_EXPECT_CLOSE(loss, torch::nn::functional::cross_entropy(full, targets), 1e-5, 1e-2);
}

TEST(VocabParallelCrossEntropy, RejectsBadTargets) {
  auto comm = fresh_comm();
  const int64_t V = 96;
  const torch::Tensor local = same_input({2, V / comm->size()}, 8);
  expect_error_mentions(
      [&] {
        vocab_parallel_cross_entropy(
            local, torch::tensor(std::vector<int64_t>{0, V}, torch::kInt64).to(device()), *comm);
      },
      "target");
  expect_error_mentions(
      [&] {
        vocab_parallel_cross_entropy(
            local, torch::tensor(std::vector<int64_t>{0, 1, 2}, torch::kInt64).to(device()), *comm);
      },
      "target");
}

// ---------------------------------------------------------------- Task 4

// One block: the serial block's output and gradients; two all-reduces each way.
TEST(ParallelBlock, EqualsTheSerialBlockWithTwoAllReducesEachWay) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config();
  GPT serial = serial_gpt(cfg);
  auto s = serial->block(1);
  ParallelBlock block(*s, cfg, *comm);
  const torch::Tensor x = same_input({B, T, cfg.d_model}, 12).requires_grad_(true);
  const torch::Tensor xs = x.detach().clone().requires_grad_(true);
  const torch::Tensor w = same_input({B, T, cfg.d_model}, 13);
  const int64_t expected = comm->size() > 1 ? 2 : 0;
  auto before = measured_stats(*comm);
  const torch::Tensor y = block(x);
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), expected) << "forward";
  const torch::Tensor ys = s->forward(xs);
  DTL_EXPECT_CLOSE(y, ys, 1e-4, 1e-5);
  before = measured_stats(*comm);
  (y * w).sum().backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), expected) << "backward";
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "");
  (ys * w).sum().backward();
  DTL_EXPECT_CLOSE(x.grad(), xs.grad(), 1e-4, 1e-5);
  expect_shards_of_serial(*block, *s, cfg, comm->size(), comm->rank(), /*grads=*/true, "blocks.1.");
}

// The whole model: this rank's columns of the serial logits, the serial loss on every rank, and
// every gradient a shard of the serial one (expect_model_equals_serial in tpt_test_util.hpp).
TEST(TensorParallelGPT, TiedHeadEqualsSerial) {
  expect_model_equals_serial<TensorParallelGPT>(config(2, /*tied=*/true), B, T);
}

TEST(TensorParallelGPT, UntiedHeadWithoutBiasesEqualsSerial) {
  expect_model_equals_serial<TensorParallelGPT>(config(2, /*tied=*/false, /*bias=*/false), B, T);
}

TEST(TensorParallelGPT, UsesOnlyItsGroup) {
  expect_model_equals_serial<TensorParallelGPT>(config(1, /*tied=*/true), B, T, {}, *half_group());
}

// Megatron's count for L blocks: 2L + 1 all-reduces of [B, T, d] forward (embedding, two per
// block) and 2L + 1 backward (two per block, the head's input).
TEST(TensorParallelGPT, TwoAllReducesPerBlockEachWay) {
  auto comm = fresh_comm();
  const GPTConfig cfg = config(/*layers=*/3);
  GPT serial = serial_gpt(cfg);
  TensorParallelGPT gpt(*serial, *comm);
  const torch::Tensor idx = same_tokens(B, T, cfg.vocab_size, 15);
  const int64_t n = comm->size() > 1 ? 2 * cfg.n_layer + 1 : 0;
  const int64_t activation_bytes = B * T * cfg.d_model * 4;
  auto before = measured_stats(*comm);
  const torch::Tensor logits = gpt(idx);
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), n)
      << "forward, " << cfg.n_layer << " blocks";
  // What the all-reduces carried: this rank's vocabulary columns of the serial logits.
  const Range cols = mine(cfg.vocab_size, *comm);
  DTL_EXPECT_CLOSE(logits, serial(idx).detach().narrow(-1, cols.begin, cols.size()), 1e-4,
                   1e-5);
  EXPECT_EQ(measured_stats(*comm)[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes,
            n * activation_bytes);
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "");
  before = measured_stats(*comm);
  (logits * same_input(logits.sizes(), 16)).sum().backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), n) << "backward";
  EXPECT_EQ(measured_stats(*comm)[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes,
            n * activation_bytes);
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "");
}

TEST(TensorParallelGPT, RejectsConfigurationsThatDoNotSplit) {
  auto comm = fresh_comm();
  GPTConfig drop = config();
  drop.dropout = 0.1;
  expect_error_mentions([&] { TensorParallelGPT(*GPT(drop), *comm); }, "dropout");
  if (comm->size() == 1) return;  // every size divides over tp = 1
  GPTConfig heads = dtl::testing::gpt_config(1, 40, 5, 96, 8);
  expect_error_mentions([&] { TensorParallelGPT(*GPT(heads), *comm); }, "n_head");
  GPTConfig vocab = dtl::testing::gpt_config(1, 48, 12, 97, 8);
  expect_error_mentions([&] { TensorParallelGPT(*GPT(vocab), *comm); }, "vocab_size");
}

}  // namespace
}  // namespace dtl::lab09
