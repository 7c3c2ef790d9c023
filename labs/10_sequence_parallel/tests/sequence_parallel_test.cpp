// Public tests of lab 10. Run: ./lab test 10   (world sizes 1-4; tp = cp = the world)
//
// The oracles: for the operators, the concatenations and sums they stand for, computed from
// every rank's known inputs; for the block and the GPT, the serial model from the same seed on
// the whole sequence (this rank's chunk of its outputs, shards of its gradients); for ring
// attention, dtl::model::causal_attention on the whole sequence. Comm::stats() counts the
// traffic against the formulas, and the memory tracker the activations kept.
#include "sequence_parallel.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "dtl/harness/checks.hpp"  // defines: DTL_EXPECT_CLOSE, expect_error_mentions
#include "dtl/memory.hpp"          // defines: memory::install, current_bytes
#include "tests/sp_test_util.hpp"

namespace dtl::lab10 {
namespace {

using namespace lab10_test;  // NOLINT
using dtl::testing::expect_error_mentions;

constexpr int64_t B = 2, T = 24;

// ---------------------------------------------------------------- Task 1

TEST(ScatterToSP, KeepsMyChunkAndGathersTheGradient) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const torch::Tensor x = same_input({B, T, 5}, 1).requires_grad_(true);
  auto before = measured_stats(*comm);
  const torch::Tensor y = scatter_to_sp(x, *comm);
  EXPECT_EQ(measured_stats(*comm).total_count(), before.total_count())
      << "forward communicates nothing";
  DTL_EXPECT_EQUAL(y, sequence_chunk(x.detach(), 1, *comm));
  // Rank q's gradient is q + 1 everywhere: x's gradient is chunk q = q + 1.
  y.backward(torch::full(y.sizes(), static_cast<float>(r + 1), device_options()));
  std::vector<torch::Tensor> chunks;
  for (int q = 0; q < n; ++q)
    chunks.push_back(torch::full({B, T / n, 5}, static_cast<float>(q + 1), device_options()));
  DTL_EXPECT_EQUAL(x.grad(), torch::cat(chunks, 1));
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), n > 1 ? 1 : 0);
}

TEST(GatherFromSP, ConcatenatesChunksAndReduceScattersTheGradient) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const int64_t tc = 3;
  const torch::Tensor x = input_of_rank(r, {B, tc, 4}, 2).requires_grad_(true);
  auto before = measured_stats(*comm);
  const torch::Tensor y = gather_from_sp(x, *comm);
  std::vector<torch::Tensor> xs, ws;
  for (int q = 0; q < n; ++q) {
    xs.push_back(input_of_rank(q, {B, tc, 4}, 2));
    ws.push_back(input_of_rank(q, {B, n * tc, 4}, 3));
  }
  DTL_EXPECT_EQUAL(y, torch::cat(xs, 1));
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), n > 1 ? 1 : 0);
  before = measured_stats(*comm);
  (y * ws[r]).sum().backward();
  // Every rank used all positions: my chunk's gradient is the sum of all ranks' for it.
  DTL_EXPECT_CLOSE(x.grad(), torch::stack(ws).sum(0).narrow(1, r * tc, tc));
  EXPECT_EQ(count_since(before, *comm, OpType::ReduceScatter), n > 1 ? 1 : 0);
  EXPECT_EQ(others_since(before, *comm, OpType::ReduceScatter), "");
}

TEST(ReduceScatterToSP, SumsAndKeepsMyChunkThenGathersTheGradient) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const int64_t tc = 2;
  const torch::Tensor x = input_of_rank(r, {B, n * tc, 6}, 4).requires_grad_(true);
  auto before = measured_stats(*comm);
  const torch::Tensor y = reduce_scatter_to_sp(x, *comm);
  std::vector<torch::Tensor> xs, gs;
  for (int q = 0; q < n; ++q) {
    xs.push_back(input_of_rank(q, {B, n * tc, 6}, 4));
    gs.push_back(input_of_rank(q, {B, tc, 6}, 5));
  }
  DTL_EXPECT_CLOSE(y, torch::stack(xs).sum(0).narrow(1, r * tc, tc));
  EXPECT_EQ(count_since(before, *comm, OpType::ReduceScatter), n > 1 ? 1 : 0);
  before = measured_stats(*comm);
  y.backward(gs[r]);
  DTL_EXPECT_EQUAL(x.grad(), torch::cat(gs, 1));
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), n > 1 ? 1 : 0);
  EXPECT_EQ(others_since(before, *comm, OpType::AllGather), "");
}

TEST(SequenceOperators, RejectSequencesTpDoesNotDivide) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "every length divides over tp = 1";
  const torch::Tensor x = same_input({2, 7, 3}, 6);  // 7 is prime
  for (const std::string& msg : {dtl::testing::error_of([&] { scatter_to_sp(x, *comm); }),
                                 dtl::testing::error_of([&] { reduce_scatter_to_sp(x, *comm); })}) {
    EXPECT_NE(msg.find("sequence length"), std::string::npos) << msg;
    EXPECT_NE(msg.find("divisible"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------- Task 2

// The gradient of a parameter applied to chunks, summed over tp (what Task 3's sync does).
void sum_partial_grads(torch::nn::Module& m, Comm& tp) {
  for (auto& p : m.named_parameters()) {
    const std::string& name = p.key();
    const bool partial =
        name.rfind("ln", 0) == 0 || name == "attn.proj.bias" || name == "mlp.proj.bias";
    if (partial && tp.size() > 1) tp.all_reduce(p.value().mutable_grad());
  }
}

TEST(SequenceParallelBlock, EqualsTheSerialBlockOnChunks) {
  auto comm = fresh_comm();
  const GPTConfig cfg = sp_config();
  GPT serial = serial_gpt(cfg);
  auto s = serial->block(1);
  SequenceParallelBlock block(*s, cfg, *comm);
  expect_shards_of_serial(*block, *s, cfg, comm->size(), comm->rank(), /*grads=*/false,
                          "blocks.1.");

  const torch::Tensor x = same_input({B, T, cfg.d_model}, 7).requires_grad_(true);
  const torch::Tensor w = same_input({B, T, cfg.d_model}, 8);
  const torch::Tensor xc = chunk_leaf(x, *comm);
  const torch::Tensor y = block(xc);
  const torch::Tensor ys = s->forward(x);
  DTL_EXPECT_CLOSE(y, sequence_chunk(ys.detach(), 1, *comm), 1e-4, 1e-5)
      << "this rank's chunk of the serial output";
  (y * sequence_chunk(w, 1, *comm)).sum().backward();
  (ys * w).sum().backward();
  DTL_EXPECT_CLOSE(xc.grad(), sequence_chunk(x.grad(), 1, *comm), 1e-4, 1e-5);
  sum_partial_grads(*block, *comm);
  expect_shards_of_serial(*block, *s, cfg, comm->size(), comm->rank(), /*grads=*/true, "blocks.1.");
}

// Same wire bytes as lab 09's block: 2 all-gathers + 2 reduce-scatters each way instead of 2
// all-reduces.
TEST(SequenceParallelBlock, SameWireBytesAsTensorParallel) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const GPTConfig cfg = sp_config();
  GPT serial = serial_gpt(cfg);
  SequenceParallelBlock sp(*serial->block(0), cfg, *comm);
  dtl::lab09::ParallelBlock tp(*serial->block(0), cfg, *comm);
  const torch::Tensor x = same_input({B, T, cfg.d_model}, 9).requires_grad_(true);

  auto before = measured_stats(*comm);
  const torch::Tensor y = sp(chunk_leaf(x, *comm));
  // Counts are measured in the process under test: what they carried is checked too.
  DTL_EXPECT_CLOSE(y, sequence_chunk(serial->block(0)->forward(x).detach(), 1, *comm), 1e-4, 1e-5)
      << "this rank's chunk of the serial block's output";
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), n > 1 ? 2 : 0) << "forward";
  EXPECT_EQ(count_since(before, *comm, OpType::ReduceScatter), n > 1 ? 2 : 0) << "forward";
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), 0) << "forward";
  y.sum().backward();
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), n > 1 ? 4 : 0) << "forward + backward";
  EXPECT_EQ(count_since(before, *comm, OpType::ReduceScatter), n > 1 ? 4 : 0);
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), 0);
  const double sp_wire = wire_since(before, *comm);

  before = comm->stats();  // lab 09's reference block: the oracle, counted by this process
  tp(x).sum().backward();
  EXPECT_DOUBLE_EQ(sp_wire, oracle_wire_since(before, *comm)) << "lab 09's block, same input";
}

// LayerNorm inputs (and everything between the reduce-scatter and the next gather) are kept for
// one chunk of the sequence instead of all of it.
TEST(SequenceParallelBlock, KeepsLessActivationMemory) {
  if (!dtl::Runtime::get().device().is_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  auto comm = fresh_comm();
  const int n = comm->size();
  if (n == 1) GTEST_SKIP() << "nothing to divide at tp = 1";
  dtl::memory::install();
  const GPTConfig cfg = sp_config();
  GPT serial = serial_gpt(cfg);
  SequenceParallelBlock sp(*serial->block(0), cfg, *comm);
  dtl::lab09::ParallelBlock tp(*serial->block(0), cfg, *comm);
  const torch::Tensor x = same_input({B, T, cfg.d_model}, 10).requires_grad_(true);
  const torch::Tensor xc = chunk_leaf(x, *comm);
  auto kept = [](auto&& forward) {  // bytes alive after forward, graph and output included
    const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
    const torch::Tensor y = forward();
    return static_cast<int64_t>(dtl::memory::current_bytes()) - before;
  };
  // Keep each graph alive while measuring: the lambda returns the output, whose graph holds
  // the saved activations until the next statement.
  torch::Tensor y_tp, y_sp;
  // Lab 09's reference block is the oracle (this process's own figure); the student's block's
  // figure is the student's process's (MEASURED).
  const int64_t kept_tp = kept([&] { return y_tp = tp(x); });
  const int64_t kept_sp = MEASURED(kept([&] { return y_sp = sp(xc); }));
  // Keeping less is easy when nothing is computed: the chunk must be the serial block's.
  DTL_EXPECT_CLOSE(y_sp, sequence_chunk(y_tp.detach(), 1, *comm), 1e-4, 1e-5);
  // At least the LayerNorm inputs are kept for a chunk only: ln2's (the residual stream h) and
  // ln1's of the next block (this block's output): 2 x [B, T, d] floats, tp-fold smaller.
  const int64_t region = 2 * B * T * cfg.d_model * 4;
  EXPECT_GE(kept_tp - kept_sp, region * (n - 1) / n * 9 / 10)
      << "kept by lab 09's block " << kept_tp << " B, by yours " << kept_sp << " B";
}

// ---------------------------------------------------------------- Task 3

// The whole model against the serial GPT, with the gradient sync after backward (lab 09's
// expect_model_equals_serial).
void expect_sp_gpt_equals_serial(const GPTConfig& cfg) {
  expect_model_equals_serial<SequenceParallelGPT>(
      cfg, B, T, [](torch::nn::Module& m, Comm& tp) { sync_sequence_parallel_grads(m, tp); });
}

TEST(SequenceParallelGPT, TiedHeadEqualsSerialAfterTheGradSync) {
  expect_sp_gpt_equals_serial(sp_config());
}

// The tp group is the Comm passed in, never dtl::world(): two groups side by side.
TEST(SequenceParallelGPT, UsesOnlyItsGroup) {
  expect_model_equals_serial<SequenceParallelGPT>(
      sp_config(1), B, T, [](torch::nn::Module& m, Comm& tp) { sync_sequence_parallel_grads(m, tp); },
      *half_group());
}

TEST(SequenceParallelGPT, UntiedHeadWithoutBiasesEqualsSerial) {
  expect_sp_gpt_equals_serial(sp_config(2, /*tied=*/false, /*bias=*/false));
}

TEST(SequenceParallelGPT, SequenceParallelParamsByName) {
  for (const char* yes : {"blocks.0.ln1.weight", "blocks.3.ln2.bias", "ln_f.weight",
                          "blocks.1.attn.proj.bias", "blocks.0.mlp.proj.bias", "wpe.weight"})
    EXPECT_TRUE(OBSERVE(is_sequence_parallel_param(yes))) << yes;
  for (const char* no :
       {"wte.weight", "lm_head.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias",
        "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.bias", "blocks.2.mlp.proj.weight"})
    EXPECT_FALSE(OBSERVE(is_sequence_parallel_param(no))) << no;
}

// The sync is one all-reduce of exactly the sequence-parallel gradients.
TEST(SequenceParallelGPT, GradSyncIsOneAllReduce) {
  auto comm = fresh_comm();
  const GPTConfig cfg = sp_config();
  GPT serial = serial_gpt(cfg);
  SequenceParallelGPT gpt(*serial, *comm);
  gpt->loss(same_tokens(B, T + 1, cfg.vocab_size, 12)).backward();
  int64_t numel = 0;
  for (const auto& p : gpt->named_parameters())
    if (is_sequence_parallel_param(p.key())) numel += p.value().numel();
  numel = OBSERVE(numel);  // by the student's is_sequence_parallel_param
  const auto before = measured_stats(*comm);
  sync_sequence_parallel_grads(*gpt, *comm);
  const bool many = comm->size() > 1;
  EXPECT_EQ(count_since(before, *comm, OpType::AllReduce), many ? 1 : 0);
  EXPECT_EQ(measured_stats(*comm)[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes,
            many ? numel * 4 : 0);
  EXPECT_EQ(others_since(before, *comm, OpType::AllReduce), "");
}

// The model's collectives, counted: forward reduce-scatters the embedding (not an all-reduce
// then a slice) and runs 2 all-gathers + 2 reduce-scatters per block and one all-gather before
// the head; backward the mirror image. Only the loss's per-token numbers are all-reduced, and
// the wire bytes equal lab 09's TensorParallelGPT's on the same batch.
TEST(SequenceParallelGPT, CollectivesOfLab09sWireBytes) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const GPTConfig cfg = sp_config();
  const int64_t L = cfg.n_layer, N = B * T;
  GPT serial = serial_gpt(cfg);
  SequenceParallelGPT sp(*serial, *comm);
  dtl::lab09::TensorParallelGPT tp(*serial, *comm);
  const torch::Tensor tokens = same_tokens(B, T + 1, cfg.vocab_size, 15);

  auto before = measured_stats(*comm);
  const torch::Tensor loss = sp->loss(tokens);
  DTL_EXPECT_CLOSE(loss, serial->loss(tokens).detach(), 1e-4, 1e-5) << "the serial loss";
  EXPECT_EQ(count_since(before, *comm, OpType::ReduceScatter), n > 1 ? 2 * L + 1 : 0)
      << "forward: the embedding's and two per block";
  EXPECT_EQ(count_since(before, *comm, OpType::AllGather), n > 1 ? 2 * L + 1 : 0)
      << "forward: two per block and the head's input";
  EXPECT_LE(measured_stats(*comm)[OpType::AllReduce].bytes - before[OpType::AllReduce].bytes,
            3 * N * 4)
      << "forward all-reduces per-token loss numbers only";
  const double sp_forward = wire_since(before, *comm);
  loss.backward();
  const double sp_wire = wire_since(before, *comm);

  before = comm->stats();  // lab 09's reference model: the oracle, counted by this process
  const torch::Tensor tp_loss = tp->loss(tokens);
  const double tp_forward = oracle_wire_since(before, *comm);
  tp_loss.backward();
  EXPECT_DOUBLE_EQ(sp_forward, tp_forward) << "forward, lab 09's model on the same batch";
  EXPECT_DOUBLE_EQ(sp_wire, oracle_wire_since(before, *comm)) << "forward + backward";
}

TEST(SequenceParallelGPT, RejectsSequencesTpDoesNotDivide) {
  auto comm = fresh_comm();
  if (comm->size() == 1) GTEST_SKIP() << "every length divides over tp = 1";
  const GPTConfig cfg = sp_config();
  GPT serial = serial_gpt(cfg);
  SequenceParallelGPT gpt(*serial, *comm);
  expect_error_mentions([&] { gpt(same_tokens(B, 7, cfg.vocab_size, 13)); }, "sequence length");
}

// ---------------------------------------------------------------- Task 4

// q, k, v [B, H, T, Dh] for the whole sequence, the same on every rank.
struct FullQKV {
  torch::Tensor q, k, v;
};
FullQKV full_qkv(int64_t b, int64_t h, int64_t t, int64_t dh, uint64_t seed) {
  return {same_input({b, h, t, dh}, seed), same_input({b, h, t, dh}, seed + 1),
          same_input({b, h, t, dh}, seed + 2)};
}

void expect_ring_equals_full_attention(Comm& cp) {
  Comm* comm = &cp;
  const int64_t tc = 5, t = tc * comm->size();
  FullQKV f = full_qkv(2, 3, t, 8, 20);
  for (auto* x : {&f.q, &f.k, &f.v}) x->requires_grad_(true);
  auto chunk = [&](const torch::Tensor& x) {
    return sequence_chunk(x.detach(), 2, *comm).clone().requires_grad_(true);
  };
  const torch::Tensor qc = chunk(f.q), kc = chunk(f.k), vc = chunk(f.v);
  const torch::Tensor out = ring_attention(qc, kc, vc, *comm);
  const torch::Tensor full = dtl::model::causal_attention(f.q, f.k, f.v, 0.0, false);
  DTL_EXPECT_CLOSE(out, sequence_chunk(full.detach(), 2, *comm), 1e-5, 1e-6);
  const torch::Tensor w = same_input(full.sizes(), 23);
  (out * sequence_chunk(w, 2, *comm)).sum().backward();
  (full * w).sum().backward();
  DTL_EXPECT_CLOSE(qc.grad(), sequence_chunk(f.q.grad(), 2, *comm), 1e-4, 1e-5) << "dq";
  DTL_EXPECT_CLOSE(kc.grad(), sequence_chunk(f.k.grad(), 2, *comm), 1e-4, 1e-5) << "dk";
  DTL_EXPECT_CLOSE(vc.grad(), sequence_chunk(f.v.grad(), 2, *comm), 1e-4, 1e-5) << "dv";
}

TEST(RingAttention, EqualsFullCausalAttention) { expect_ring_equals_full_attention(*fresh_comm()); }
// The ring is the cp Comm passed in, never dtl::world(): two cp groups side by side.
TEST(RingAttention, UsesOnlyItsGroup) { expect_ring_equals_full_attention(*half_group()); }

TEST(RingAttention, SendsExactlyTheFormula) {
  auto comm = fresh_comm();
  const int64_t b = 2, h = 2, tc = 4, dh = 8;
  const torch::Tensor q = same_input({b, h, tc, dh}, 24).requires_grad_(true);
  const torch::Tensor k = same_input({b, h, tc, dh}, 25).requires_grad_(true);
  const torch::Tensor v = same_input({b, h, tc, dh}, 26).requires_grad_(true);
  const RingBytes formula = ring_attention_bytes(b * h * tc * dh, 4, comm->size());
  auto before = measured_stats(*comm);
  const torch::Tensor out = ring_attention(q, k, v, *comm);
  // What the bytes were for: every rank's chunk is known to all (same_input is rank-independent,
  // so the whole sequence is the chunk repeated), and the output is full causal attention's.
  {
    const torch::Tensor qf = q.detach().repeat({1, 1, comm->size(), 1});
    const torch::Tensor kf = k.detach().repeat({1, 1, comm->size(), 1});
    const torch::Tensor vf = v.detach().repeat({1, 1, comm->size(), 1});
    const torch::Tensor full = dtl::model::causal_attention(qf, kf, vf, 0.0, false);
    DTL_EXPECT_CLOSE(out, sequence_chunk(full, 2, *comm), 1e-5, 1e-6);
  }
  EXPECT_EQ(measured_stats(*comm)[OpType::SendRecv].bytes - before[OpType::SendRecv].bytes,
            formula.forward);
  EXPECT_EQ(others_since(before, *comm, OpType::SendRecv), "") << "forward";
  before = measured_stats(*comm);
  out.sum().backward();
  EXPECT_EQ(measured_stats(*comm)[OpType::SendRecv].bytes - before[OpType::SendRecv].bytes,
            formula.backward);
  EXPECT_EQ(others_since(before, *comm, OpType::SendRecv), "") << "backward";
}

// The ring's direction: every sendrecv goes to rank r + 1 (and receives from r - 1), forward and
// backward (the chunk of rank r - i arrives at step i). Indistinguishable at cp <= 2.
TEST(RingAttention, SendsToTheNextRank) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const torch::Tensor q = same_input({1, 2, 3, 4}, 30).requires_grad_(true);
  const torch::Tensor k = same_input({1, 2, 3, 4}, 31).requires_grad_(true);
  const torch::Tensor v = same_input({1, 2, 3, 4}, 32).requires_grad_(true);
  const torch::Tensor out = ring_attention(q, k, v, *comm);
  {  // the result, not only the peers (q, k, v are the same on every rank: see above)
    const int64_t reps = comm->size();
    const torch::Tensor full = dtl::model::causal_attention(
        q.detach().repeat({1, 1, reps, 1}), k.detach().repeat({1, 1, reps, 1}),
        v.detach().repeat({1, 1, reps, 1}), 0.0, false);
    DTL_EXPECT_CLOSE(out, sequence_chunk(full, 2, *comm), 1e-5, 1e-6);
  }
  out.sum().backward();
  std::vector<int> peers;  // of every sendrecv, as the student's process recorded them
  for (const dtl::OpRecord& op : comm->recent_ops())
    if (op.op == OpType::SendRecv) peers.push_back(op.peer);
  peers = MEASURED(peers);
  for (size_t i = 0; i < peers.size(); ++i)
    EXPECT_EQ(peers[i], (comm->rank() + 1) % n) << "sendrecv #" << i;
  EXPECT_EQ(static_cast<int>(peers.size()), n > 1 ? 2 * n - 1 : 0) << "cp - 1 forward, cp backward";
}

// Forward keeps the output and per-query statistics, never the score blocks: with Tc = 4 Dh,
// one [Tc, Tc] block of scores is as large as four chunks of q. (CPU: the tracker.)
TEST(RingAttention, KeepsNoScoreBlocksForBackward) {
  if (!dtl::Runtime::get().device().is_cpu()) GTEST_SKIP() << "the tracker counts CPU memory";
  auto comm = fresh_comm();
  dtl::memory::install();
  const int64_t b = 2, h = 2, tc = 32, dh = 8;
  const torch::Tensor q = same_input({b, h, tc, dh}, 33).requires_grad_(true);
  const torch::Tensor k = same_input({b, h, tc, dh}, 34).requires_grad_(true);
  const torch::Tensor v = same_input({b, h, tc, dh}, 35).requires_grad_(true);
  const int64_t chunk = b * h * tc * dh * 4;
  ring_attention(q, k, v, *comm).sum().backward();  // warm up: the Comm's staging buffers
  const auto before = static_cast<int64_t>(dtl::memory::current_bytes());
  const torch::Tensor out = ring_attention(q, k, v, *comm);
  comm->barrier();  // the Comm's worker lets go of the last transfer's buffers
  const auto kept = MEASURED(static_cast<int64_t>(dtl::memory::current_bytes()) - before);
  EXPECT_LE(kept, 2 * chunk) << "kept after forward: " << kept << " B; the output is " << chunk
                             << " B, one score block " << 4 * chunk << " B";
  out.sum().backward();  // and backward still works from what was kept
  EXPECT_TRUE(OBSERVE(q.grad().defined()));
}

TEST(RingAttention, RejectsMismatchedShapes) {
  auto comm = fresh_comm();
  const torch::Tensor a = same_input({1, 2, 4, 8}, 27);
  expect_error_mentions([&] { ring_attention(a, a.narrow(2, 0, 3), a, *comm); }, "q, k, v");
  expect_error_mentions([&] { ring_attention(a[0], a[0], a[0], *comm); }, "q, k, v");
}

}  // namespace
}  // namespace dtl::lab10
