// labs/04_ddp/tests/ddp_test_util.hpp — models and helpers shared by the public tests
// (ddp_test.cpp) and the grading tests (grading/04_ddp/).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ddp.hpp"
#include "dtl/comm.hpp"
#include "dtl/harness/checks.hpp"  // defines: serial, flat_params, flat_grads
#include "dtl/model.hpp"           // defines: GPT, GPTConfig
#include "dtl/optim.hpp"           // defines: OptimConfig, make_adamw
#include "dtl/runtime.hpp"         // defines: world()
#include "dtl/split.hpp"           // defines: split_range
#include "dtl/timer.hpp"           // defines: now_seconds
#include "dtl/train.hpp"           // defines: train_step (the single-process ground truth)

namespace lab04_test {

using dtl::Comm;
using dtl::OpRecord;
using dtl::OpType;
using dtl::lab04::DDPOptions;
using dtl::lab04::DistributedDataParallel;
using dtl::model::GPT;
using dtl::model::GPTConfig;

using dtl::testing::device;      // the Runtime's device
using dtl::testing::fresh_comm;  // a dup of the world per test

// AdamW for the equality tests. eps 1e-6: Adam divides by sqrt(v) + eps, which amplifies the
// last-bit differences between a serial sum and a sum of shards for gradients near eps.
inline dtl::OptimConfig ddp_adamw(double weight_decay = 0.1) {
  dtl::OptimConfig oc;
  oc.eps = 1e-6;
  oc.weight_decay = weight_decay;
  return oc;
}

// Options with the given bucket caps (and flags).
inline DDPOptions caps(int64_t first_bucket_bytes, int64_t bucket_cap_bytes,
                       bool find_unused_parameters = false, bool gradient_as_bucket_view = false) {
  DDPOptions o;
  o.first_bucket_bytes = first_bucket_bytes;
  o.bucket_cap_bytes = bucket_cap_bytes;
  o.find_unused_parameters = find_unused_parameters;
  o.gradient_as_bucket_view = gradient_as_bucket_view;
  return o;
}

// A chain of Linear layers with known sizes: layer i maps widths[i] -> widths[i + 1], so its
// weight has widths[i + 1] x widths[i] elements and its bias widths[i + 1]. Registered as
// "l0", "l1", ... in forward order.
struct ChainImpl : torch::nn::Module {
  explicit ChainImpl(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i)
      layers.push_back(register_module("l" + std::to_string(i),
                                       torch::nn::Linear(widths[i], widths[i + 1])));
    torch::manual_seed(7);  // the same weights on every rank (tests reseed as they need)
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.copy_(torch::randn_like(p) * 0.3);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = torch::tanh(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Chain);

// Registered in one order, used in the other: `late` is registered first but applied last,
// so its gradients are ready FIRST although it comes first in registration order.
//   registration: late.weight (0), late.bias (1), early.weight (2), early.bias (3)
//   forward:      y = late(tanh(early(x)))      early: 16 -> 8, late: 8 -> 4
struct SwappedImpl : torch::nn::Module {
  SwappedImpl() {
    late = register_module("late", torch::nn::Linear(8, 4));
    early = register_module("early", torch::nn::Linear(16, 8));
    torch::manual_seed(11);
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.copy_(torch::randn_like(p) * 0.3);
  }
  torch::Tensor forward(const torch::Tensor& x) { return late(torch::tanh(early(x))); }
  torch::nn::Linear late{nullptr}, early{nullptr};
};
TORCH_MODULE(Swapped);

// A trunk plus two heads: `unused` never takes part in forward; `sometimes` only when the
// caller says so (e.g. on some ranks only).
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    trunk = register_module("trunk", torch::nn::Linear(6, 5));
    unused = register_module("unused", torch::nn::Linear(5, 5));
    sometimes = register_module("sometimes", torch::nn::Linear(5, 5));
    head = register_module("head", torch::nn::Linear(5, 3));
    torch::manual_seed(13);
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.copy_(torch::randn_like(p) * 0.3);
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_sometimes) {
    torch::Tensor h = torch::tanh(trunk(x));
    if (use_sometimes) h = h + sometimes(h);
    return head(h);
  }
  torch::nn::Linear trunk{nullptr}, unused{nullptr}, sometimes{nullptr}, head{nullptr};
};
TORCH_MODULE(Branchy);

// Gradient bytes of `module`'s managed parameters (registration order, trainable, once each).
inline std::vector<int64_t> managed_bytes(torch::nn::Module& module) {
  std::vector<int64_t> bytes;
  std::vector<const void*> seen;
  for (const auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    if (std::find(seen.begin(), seen.end(), p.unsafeGetTensorImpl()) != seen.end()) continue;
    seen.push_back(p.unsafeGetTensorImpl());
    bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
  }
  return bytes;
}

// The all-reduces among `ops` (a Comm's recent_ops()), oldest first.
inline std::vector<OpRecord> all_reduces(const std::vector<OpRecord>& ops) {
  std::vector<OpRecord> out;
  for (const auto& r : ops)
    if (r.op == OpType::AllReduce) out.push_back(r);
  return out;
}

inline int64_t numel_of(const OpRecord& r) {
  int64_t n = 1;
  for (int64_t d : r.shape) n *= d;
  return n;
}

// Elements of bucket b of `ddp`.
inline int64_t bucket_numel(const DistributedDataParallel& ddp, size_t b) {
  int64_t n = 0;
  for (int64_t i : ddp.buckets()[b]) n += ddp.parameters()[static_cast<size_t>(i)].numel();
  return n;
}

// What the tests assert on about a wrapper's buckets, observed (dtl/harness/observe.hpp): in the
// autograder's split run these are the student's wrapper's, whatever the driver's own holds.
// Elements of every bucket, in bucket order.
inline std::vector<int64_t> observed_bucket_numels(const DistributedDataParallel& ddp,
                                                   const char* file = __builtin_FILE(),
                                                   int line = __builtin_LINE()) {
  std::vector<int64_t> numels;
  for (size_t b = 0; b < ddp.buckets().size(); ++b) numels.push_back(bucket_numel(ddp, b));
  return dtl::testing::observe(std::move(numels), "the buckets' element counts",
                               dtl::testing::Source::kComputed, file, line);
}
// The names of every bucket's parameters, in bucket order.
inline std::vector<std::vector<std::string>> observed_bucket_names(
    const DistributedDataParallel& ddp, const char* file = __builtin_FILE(),
    int line = __builtin_LINE()) {
  std::vector<std::vector<std::string>> names;
  for (const auto& bucket : ddp.buckets()) {
    names.emplace_back();
    for (int64_t i : bucket) names.back().push_back(ddp.parameter_names()[static_cast<size_t>(i)]);
  }
  return dtl::testing::observe(std::move(names), "the buckets' parameter names",
                               dtl::testing::Source::kComputed, file, line);
}

// The all-reduces among `comm`'s recent ops, oldest first, as the student's process recorded
// them (MEASURED: shape, bytes, issue and finish times; the other fields are left empty).
inline std::vector<OpRecord> measured_all_reduces(const Comm& comm,
                                                  const char* file = __builtin_FILE(),
                                                  int line = __builtin_LINE()) {
  using dtl::testing::observe;
  using dtl::testing::Source;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> bytes;
  std::vector<double> issued, finished;
  for (const OpRecord& r : all_reduces(comm.recent_ops())) {
    shapes.push_back(r.shape);
    bytes.push_back(r.bytes);
    issued.push_back(r.issued);
    finished.push_back(r.finished);
  }
  shapes = observe(std::move(shapes), "the all-reduces' shapes", Source::kMeasured, file, line);
  bytes = observe(std::move(bytes), "the all-reduces' bytes", Source::kMeasured, file, line);
  issued =
      observe(std::move(issued), "the all-reduces' issue times", Source::kMeasured, file, line);
  finished =
      observe(std::move(finished), "the all-reduces' finish times", Source::kMeasured, file, line);
  std::vector<OpRecord> out(shapes.size());
  const double missing = std::numeric_limits<double>::quiet_NaN();  // fails every comparison
  for (size_t i = 0; i < out.size(); ++i) {  // a malformed stream may leave fields missing
    out[i].op = OpType::AllReduce;
    out[i].shape = shapes[i];
    out[i].bytes = i < bytes.size() ? bytes[i] : -1;
    out[i].issued = i < issued.size() ? issued[i] : missing;
    out[i].finished = i < finished.size() ? finished[i] : missing;
  }
  return out;
}

// This rank's rows of `global` (the course's splitting rule).
inline torch::Tensor my_rows(const torch::Tensor& global, const Comm& comm) {
  const dtl::Range r = dtl::split_range(global.size(0), comm.size(), comm.rank());
  return global.narrow(0, r.begin, r.size());
}

// One DDP training step of the course GPT on this rank's rows of `global`. DDP averages over
// ranks with equal weight, so the local loss is scaled by n * rows / B: then the average is the
// gradient of the global-batch mean loss even when the shards are uneven (as ddp.hpp says).
inline float ddp_step(GPT& model, torch::optim::Optimizer& opt, const torch::Tensor& global,
                      const Comm& comm) {
  opt.zero_grad();
  const torch::Tensor local = my_rows(global, comm);
  const double weight =
      static_cast<double>(comm.size()) * local.size(0) / static_cast<double>(global.size(0));
  torch::Tensor loss = model->loss(local);
  (loss * weight).backward();
  opt.step();
  return loss.item<float>();
}

// Lab 02's naive averaging: each defined gradient of `module` all-reduced on its own and divided
// by the world size; parameters without a gradient are skipped (they take no part).
inline void average_defined_grads(torch::nn::Module& module, Comm& comm) {
  for (auto& p : module.parameters()) {
    if (!p.grad().defined()) continue;
    comm.all_reduce(p.mutable_grad());
    p.mutable_grad().div_(comm.size());
  }
}

// The oracle of DDP's gradients: a plain model(cfg) after backward on this rank's `rows`, each
// gradient all-reduced on its own and divided by the world size (lab 02's naive averaging), on a
// Comm of its own so that the Comm under test counts nothing of it.
inline GPT naive_averaged(const GPTConfig& cfg, const torch::Tensor& rows) {
  auto comm = dtl::testing::fresh_comm();
  GPT naive(cfg);
  naive->to(device());
  naive->loss(rows).backward();
  average_defined_grads(*naive, *comm);
  return naive;
}

// Forward and backward of the GPT's loss on `tokens` ([B, T + 1]), with a hook on the
// embedding output's gradient. Autograd computes that gradient after every block and the
// head, just before the embedding's own backward (the last op of backward). Returns the
// moment the hook ran (dtl::now_seconds()): a marker for "backward is about to end".
inline double backward_marking_the_embedding(GPT& model, const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1) - 1;
  double marker = 0;
  torch::Tensor x = model->embed(tokens.narrow(1, 0, T));
  x.register_hook([&marker](const torch::Tensor& g) {
    marker = dtl::now_seconds();
    return g;
  });
  for (int64_t l = 0; l < model->config().n_layer; ++l) x = model->block(l)->forward(x);
  dtl::model::lm_loss(model->head(x), tokens.narrow(1, 1, T)).backward();
  return marker;
}

// Parameters after `steps` serial steps (dtl::train_step on the whole global batch).
template <typename MakeOpt, typename Sampler>
torch::Tensor serial_params(const GPTConfig& cfg, const Sampler& sampler, int steps,
                            MakeOpt make_opt, const std::vector<std::string>& frozen = {}) {
  return dtl::testing::serial(1, [&] {
    GPT m(cfg);
    for (const auto& name : frozen) m->named_parameters()[name].set_requires_grad(false);
    m->to(device());
    auto opt = make_opt(m);
    for (int s = 0; s < steps; ++s) dtl::train_step(m, *opt, sampler.global_batch_at(s).to(device()));
    return dtl::testing::flat_params(*m);
  });
}

}  // namespace lab04_test
