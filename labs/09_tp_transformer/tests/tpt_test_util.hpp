// labs/09_tp_transformer/tests/tpt_test_util.hpp — helpers shared by the public tests
// (tp_transformer_test.cpp) and the grading tests (grading/09_tp_transformer/).
//
// The oracle of every test: the serial course GPT (dtl::model::GPT) from the same seed, with its
// biases and LayerNorm parameters perturbed (a fresh GPT has zero biases and unit LayerNorm
// weights, which would hide a wrongly sliced bias), the same on every rank. The tensor-parallel
// side must give the same loss, its vocabulary columns of the same logits, and parameter
// gradients that are exactly its shards of the serial gradients (expected_shard says which).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtl/data.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/mesh.hpp"
#include "dtl/model.hpp"
#include "dtl/optim.hpp"
#include "tests/tp_test_util.hpp"  // lab 08's: fresh_comm, count_since, others_since, mine
#include "tp_transformer.hpp"

namespace lab09_test {

using namespace lab08_test;  // NOLINT: fresh_comm, count_since, others_since, device, ...
using dtl::model::GPT;
using dtl::model::GPTConfig;

// A GPT every tp of 1-4 divides: 12 heads of 4, d_ff 192, vocabulary 96.
inline GPTConfig config(int64_t layers = 2, bool tied = true, bool bias = true) {
  GPTConfig c = dtl::testing::gpt_config(layers, /*d=*/48, /*heads=*/12, /*vocab=*/96,
                                         /*seq_len=*/16);
  c.tied_head = tied;
  c.bias = bias;
  return c;
}

// The serial GPT of `cfg`, the same on every rank, with every 1-D parameter (biases, LayerNorm)
// moved off its initial constant by seeded noise; on the Runtime's device.
inline GPT serial_gpt(const GPTConfig& cfg, uint64_t noise_seed = 99) {
  GPT gpt(cfg);
  torch::Generator gen = at::detail::createCPUGenerator(noise_seed);
  torch::NoGradGuard no_grad;
  for (auto& p : gpt->named_parameters())
    if (p.value().dim() == 1) p.value().add_(torch::randn(p.value().sizes(), gen) * 0.1);
  gpt->to(dtl::testing::device());
  return gpt;
}

// Token ids [B, T] in [0, vocab), the same on every rank, on the Runtime's device.
inline torch::Tensor same_tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::randint(vocab, {B, T}, gen, torch::kInt64).to(dtl::testing::device());
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What tp rank `rank` must hold of the serial tensor `full` (a parameter or its gradient) named
// `name`: vocabulary rows of the embedding and head, the head rows of qkv, column slices of the
// row-parallel weights, rows of fc; everything else (LayerNorms, positions, row-parallel biases)
// whole.
inline torch::Tensor expected_shard(const std::string& name, const torch::Tensor& full,
                                    const GPTConfig& cfg, int tp, int rank) {
  auto rows = [&](int64_t size) {
    const dtl::Range r = dtl::lab08::shard_of(size, tp, rank, "size");
    return full.narrow(0, r.begin, r.size());
  };
  auto cols = [&](int64_t size) {
    const dtl::Range r = dtl::lab08::shard_of(size, tp, rank, "size");
    return full.narrow(1, r.begin, r.size());
  };
  if (name == "wte.weight" || name == "lm_head.weight") return rows(cfg.vocab_size);
  if (ends_with(name, "attn.qkv.weight") || ends_with(name, "attn.qkv.bias")) {
    const auto order = dtl::lab09::qkv_rows(cfg.d_model, cfg.n_head, tp, rank);
    return full.index_select(0, torch::tensor(order, torch::kInt64).to(full.device()));
  }
  if (ends_with(name, "attn.proj.weight")) return cols(cfg.d_model);
  if (ends_with(name, "mlp.fc.weight") || ends_with(name, "mlp.fc.bias")) return rows(cfg.ff());
  if (ends_with(name, "mlp.proj.weight")) return cols(cfg.ff());
  return full;
}

// Every parameter of the tensor-parallel module must equal (or, grads = true, have the gradient
// of) this rank's shard of the serial parameter of the same name; names must match one to one.
// `prefix` is the modules' place in the GPT ("blocks.0.attn." for an attention).
inline void expect_shards_of_serial(torch::nn::Module& tp_model, torch::nn::Module& serial,
                                    const GPTConfig& cfg, int tp, int rank, bool grads,
                                    const std::string& prefix = "", double rtol = 1e-4,
                                    double atol = 1e-5) {
  const auto full = serial.named_parameters();
  const auto mine_params = tp_model.named_parameters();
  // The names as the student's module registered them (observed), each against the serial model.
  std::vector<std::string> names;
  for (const auto& p : mine_params) names.push_back(p.key());
  names = OBSERVE(names);
  EXPECT_EQ(names.size(), full.size()) << "the parameter names must match the serial model's";
  for (const std::string& name : names)
    ASSERT_NE(full.find(name), nullptr) << "no serial parameter named " << name;
  for (const auto& p : mine_params) {
    const torch::Tensor* s = full.find(p.key());
    if (s == nullptr) continue;  // (the observed names failed above)
    if (grads) {
      ASSERT_TRUE(OBSERVE(p.value().grad().defined())) << p.key() << " has no gradient";
      ASSERT_TRUE(s->grad().defined()) << "serial " << p.key() << " has no gradient";
      DTL_EXPECT_CLOSE(p.value().grad(), expected_shard(prefix + p.key(), s->grad(), cfg, tp, rank),
                       rtol, atol)
          << "gradient of " << p.key();
    } else {
      DTL_EXPECT_CLOSE(p.value(), expected_shard(prefix + p.key(), *s, cfg, tp, rank), rtol, atol)
          << p.key();
    }
  }
}

// What a sequence-parallel model must do after backward before its gradients are whole (lab
// 10's sync); nothing for lab 09's model.
using AfterBackward = std::function<void(torch::nn::Module&, Comm&)>;

// The whole model (lab 09's TensorParallelGPT, lab 10's SequenceParallelGPT) against the serial
// GPT on one batch [B, T + 1]: this rank's vocabulary columns of the serial logits, the serial
// loss on every rank, and, after backward (and `after`), every gradient a shard of the serial one.
// The model's tp group is `comm` (the overload without it: a fresh copy of the world).
template <typename Model>
void expect_model_equals_serial(const GPTConfig& cfg, int64_t B, int64_t T,
                                const AfterBackward& after, Comm& comm) {
  GPT serial = serial_gpt(cfg);
  Model gpt(*serial, comm);
  expect_shards_of_serial(*gpt, *serial, cfg, comm.size(), comm.rank(), /*grads=*/false);
  const torch::Tensor tokens = same_tokens(B, T + 1, cfg.vocab_size, 14);
  const torch::Tensor idx = tokens.narrow(1, 0, T);

  const torch::Tensor logits = gpt(idx);
  const Range r = mine(cfg.vocab_size, comm);
  ASSERT_EQ(OBSERVE(logits.sizes().vec()), (std::vector<int64_t>{B, T, r.size()}))
      << "this rank's vocabulary columns only";
  DTL_EXPECT_CLOSE(logits, serial(idx).narrow(-1, r.begin, r.size()), 1e-4, 1e-5);

  const torch::Tensor loss = gpt->loss(tokens);
  const torch::Tensor expected = serial->loss(tokens);
  DTL_EXPECT_CLOSE(loss, expected, 1e-5, 1e-6);
  if (comm.size() == dtl::world().size()) {
    DTL_EXPECT_SAME_ON_ALL_RANKS(loss.detach());
  } else {  // the same within the group (another group of another size may round otherwise)
    torch::Tensor hi = loss.detach().clone(), lo = loss.detach().clone();
    comm.all_reduce(hi, dtl::ReduceOp::Max);
    comm.all_reduce(lo, dtl::ReduceOp::Min);
    EXPECT_TRUE(OBSERVE(torch::equal(hi, lo)))
        << "the loss differs between the ranks of the tp group";
  }
  loss.backward();
  expected.backward();
  if (after) after(*gpt, comm);
  expect_shards_of_serial(*gpt, *serial, cfg, comm.size(), comm.rank(), /*grads=*/true);
}

template <typename Model>
void expect_model_equals_serial(const GPTConfig& cfg, int64_t B, int64_t T,
                                const AfterBackward& after = {}) {
  expect_model_equals_serial<Model>(cfg, B, T, after, *fresh_comm());
}

// Three AdamW steps on different batches with tp = the world: the losses and the parameters stay
// the serial ones.
template <typename Model>
void expect_training_equals_serial(const GPTConfig& cfg, const AfterBackward& after = {}) {
  auto comm = fresh_comm();
  GPT serial = serial_gpt(cfg);
  Model gpt(*serial, *comm);
  auto opt = dtl::make_adamw(*gpt);
  auto serial_opt = dtl::make_adamw(*serial);
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor tokens = same_tokens(2, 13, cfg.vocab_size, 20 + step);  // T = 12
    opt->zero_grad();
    serial_opt->zero_grad();
    const torch::Tensor loss = gpt->loss(tokens);
    const torch::Tensor expected = serial->loss(tokens);
    DTL_EXPECT_CLOSE(loss, expected, 1e-5, 1e-6) << "step " << step;
    loss.backward();
    expected.backward();
    if (after) after(*gpt, *comm);
    opt->step();
    serial_opt->step();
  }
  // Adam divides by sqrt(v): see expect_mesh_training_follows_serial.
  expect_shards_of_serial(*gpt, *serial, cfg, comm->size(), comm->rank(), /*grads=*/false, "", 1e-3,
                          1e-4);
}

// dp x tp training (tp = 2 where the world is even): the model's Comm is the tp sub-group of a
// mesh (not the world); each dp rank trains on its rows of the global batch, gradients are
// averaged over dp, AdamW steps. The loss trajectory and the parameters follow serial training on
// the whole global batch.
// The same over given tp and dp communicators (this rank at position dp.rank() of its dp group):
// lab 19 builds them from its ParallelState, the test below from a DeviceMesh.
template <typename Model>
void expect_training_follows_serial(const GPTConfig& cfg, int steps, Comm& tp, Comm& dp,
                                    const AfterBackward& after = {}) {
  GPT serial = serial_gpt(cfg);
  Model gpt(*serial, tp);
  auto opt = dtl::make_adamw(*gpt);
  auto serial_opt = dtl::make_adamw(*serial);
  dtl::data::SyntheticCorpus corpus(cfg.vocab_size, 5);
  const int64_t local = 2;
  dtl::data::GlobalBatchSampler sampler(corpus, local * dp.size(), cfg.seq_len);
  for (int step = 0; step < steps; ++step) {
    opt->zero_grad();
    const int64_t first = dp.rank() * local;
    torch::Tensor loss = gpt->loss(sampler.rows(step, first, first + local).to(device()));
    loss.backward();
    if (after) after(*gpt, tp);
    for (auto& p : gpt->parameters())
      if (dp.size() > 1) dp.all_reduce(p.grad(), dtl::ReduceOp::Avg);
    opt->step();
    torch::Tensor mean_loss = loss.detach().clone();
    if (dp.size() > 1) dp.all_reduce(mean_loss, dtl::ReduceOp::Avg);

    serial_opt->zero_grad();
    torch::Tensor expected = serial->loss(sampler.global_batch_at(step).to(device()));
    expected.backward();
    serial_opt->step();
    DTL_EXPECT_CLOSE(mean_loss, expected.detach(), 1e-5, 1e-6) << "step " << step;
  }
  // Adam divides by sqrt(v): where a gradient is as small as Adam's eps, summation-order noise
  // in it moves that element's update by a good part of lr (LibTorch 2.6's kernels, summing in
  // another order than 1.13's, moved one element of 4608 by lr/26 in two steps). Parameters
  // compare at lr/10: one step of a wrong gradient moves most elements by ~lr, and the losses
  // above already compare at 1e-5.
  const double lr = dtl::OptimConfig{}.lr;
  expect_shards_of_serial(*gpt, *serial, cfg, tp.size(), tp.rank(), /*grads=*/false, "", 1e-3,
                          lr / 10);
}

template <typename Model>
void expect_mesh_training_follows_serial(const GPTConfig& cfg, int steps,
                                         const AfterBackward& after = {}) {
  const int world = dtl::world().size();
  dtl::DeviceMesh mesh = dtl::DeviceMesh::megatron(dtl::world(), world % 2 == 0 ? 2 : 1);
  expect_training_follows_serial<Model>(cfg, steps, mesh.comm("tp"), mesh.comm("dp"), after);
}

}  // namespace lab09_test
