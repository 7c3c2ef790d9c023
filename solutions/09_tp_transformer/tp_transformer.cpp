// solutions/09_tp_transformer/tp_transformer.cpp — reference solution of lab 09.
//
// Read it in this order: attention (lab 08's column/row pair, cut along heads), the embedding
// and the loss (the vocabulary split: one all-reduce of rows, then per-token scalars instead of
// logits), and the model that strings them together. No new collective is needed beyond lab
// 08's operators and two small all-reduces in the loss.
#include "tp_transformer.hpp"

#include <fmt/format.h>

#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab09 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The full fused qkv tensor with its rows reordered rank by rank: rank 0's heads (q, k, v), then
// rank 1's, ... Lab 08's ColumnParallelLinear keeps the contiguous block shard_of(3d) of its
// full weight, which in this order is exactly rank r's rows qkv_rows(r). One reordering at
// construction, nothing per step.
torch::Tensor rank_major_qkv(const torch::Tensor& full, int64_t d, int64_t n_head, int tp) {
  if (!full.defined()) return full;
  std::vector<int64_t> order;
  for (int r = 0; r < tp; ++r) {
    const std::vector<int64_t> rows = qkv_rows(d, n_head, tp, r);
    order.insert(order.end(), rows.begin(), rows.end());
  }
  const torch::Tensor index = torch::tensor(order, torch::kInt64).to(full.device());
  return full.detach().index_select(0, index);
}

}  // namespace

// ---------------------------------------------------------------- Task 1

ParallelAttentionImpl::ParallelAttentionImpl(const torch::Tensor& qkv_weight,
                                             const torch::Tensor& qkv_bias,
                                             const torch::Tensor& proj_weight,
                                             const torch::Tensor& proj_bias, int64_t n_head_,
                                             Comm& tp)
    : n_head(n_head_) {
  DTL_CHECK(
      qkv_weight.defined() && qkv_weight.dim() == 2 && qkv_weight.size(0) == 3 * qkv_weight.size(1),
      "ParallelAttention: the full qkv weight must be [3 d, d]");
  const int64_t d = qkv_weight.size(1);
  DTL_CHECK(n_head > 0 && d % n_head == 0,
            fmt::format("ParallelAttention: n_head={} does not divide d_model={}", n_head, d));
  // Heads are the unit of the split: a head's q, k and v must live on one rank, because its
  // softmax needs all of q_h k_h^T. shard_of names n_head if tp does not divide it.
  local_heads = dtl::lab08::shard_of(n_head, tp.size(), tp.rank(), "n_head").size();
  head_dim = d / n_head;
  qkv = register_module("qkv",
                        ColumnParallelLinear(rank_major_qkv(qkv_weight, d, n_head, tp.size()),
                                             rank_major_qkv(qkv_bias, d, n_head, tp.size()), tp,
                                             /*gather_output=*/false));
  // proj's input features are the heads side by side ([B, T, H * Dh]), so rank r's heads are
  // its contiguous column slice: exactly lab 08's row-parallel cut.
  proj = register_module("proj",
                         RowParallelLinear(proj_weight, proj_bias, tp, /*input_is_parallel=*/true));
}

torch::Tensor ParallelAttentionImpl::forward(const torch::Tensor& x) {
  DTL_CHECK(x.dim() == 3, "ParallelAttention: x must be [B, T, d]");
  // qkv(x) = this rank's q, k, v sections [B, T, 3 d/tp] (copy_to_tp inside sums dL/dx in
  // backward); attention of my heads only, no communication; then proj, the block's first
  // all-reduce: the heads' partial projections summed.
  return proj(attention_of_heads(qkv(x), local_heads, head_dim));
}

// ---------------------------------------------------------------- Task 2

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::Tensor& full_weight, Comm& tp)
    : tp_(&tp) {
  DTL_CHECK(full_weight.defined() && full_weight.dim() == 2,
            "VocabParallelEmbedding: the full table must be [vocab_size, d]");
  vocab_size = full_weight.size(0);
  const Range rows = dtl::lab08::shard_of(vocab_size, tp.size(), tp.rank(), "vocab_size");
  vocab_begin = rows.begin;
  vocab_end = rows.end;
  weight = register_parameter(
      "weight",
      full_weight.detach().narrow(0, rows.begin, rows.size()).clone().set_requires_grad(true));
}

torch::Tensor VocabParallelEmbeddingImpl::lookup_local(const torch::Tensor& idx) {
  DTL_CHECK(idx.scalar_type() == torch::kInt64, "VocabParallelEmbedding: token ids must be int64");
  // Every rank checks the same ids, so a bad id fails everywhere before any collective.
  DTL_CHECK(idx.numel() == 0 ||
                (idx.min().item<int64_t>() >= 0 && idx.max().item<int64_t>() < vocab_size),
            fmt::format("VocabParallelEmbedding: a token id is outside [0, {})", vocab_size));
  // Tokens of other ranks look up row 0 (any valid row) and are zeroed afterwards: the lookup
  // stays one dense gather, and the zeroed rows give those tokens no gradient here.
  const torch::Tensor foreign = (idx < vocab_begin).logical_or(idx >= vocab_end);
  const torch::Tensor local = (idx - vocab_begin).masked_fill(foreign, 0);
  return torch::nn::functional::embedding(local, weight).masked_fill(foreign.unsqueeze(-1), 0.0);
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& idx) {
  // Each token's row is non-zero on exactly one rank: the sum is the serial lookup.
  return dtl::lab08::reduce_from_tp(lookup_local(idx), *tp_);
}

// ---------------------------------------------------------------- Task 3

namespace {

// The loss as one autograd node: forward needs collectives over per-token numbers, backward is
// local (the gradient of cross-entropy is softmax - one_hot, and this rank holds its columns of
// both).
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& local_logits,
                               const torch::Tensor& targets, Comm* tp) {
    const int64_t local_v = local_logits.size(-1);
    const int64_t begin = tp->rank() * local_v;
    const torch::Tensor logits = local_logits.detach().reshape({-1, local_v});
    const torch::Tensor target = targets.reshape({-1});
    const int64_t n = target.numel();

    // 1. The max over the FULL vocabulary, so exp() cannot overflow on any rank.
    torch::Tensor max = std::get<0>(logits.max(/*dim=*/1));
    if (tp->size() > 1) tp->all_reduce(max, ReduceOp::Max);
    const torch::Tensor shifted = logits - max.unsqueeze(1);

    // 2. The target's (shifted) logit lives on one rank; the others contribute 0. And the sum of
    //    exponentials over the full vocabulary is the sum of the ranks' partial sums. Both are
    //    sums of one number per token: one all-reduce of [2, N] instead of Megatron's two of [N].
    const torch::Tensor mine = (target >= begin).logical_and(target < begin + local_v);
    const torch::Tensor local_target = (target - begin).masked_fill(mine.logical_not(), 0);
    const torch::Tensor exp = shifted.exp();
    torch::Tensor sums = torch::stack({shifted.gather(1, local_target.unsqueeze(1))
                                           .squeeze(1)
                                           .masked_fill(mine.logical_not(), 0.0),
                                       exp.sum(/*dim=*/1)});
    if (tp->size() > 1) tp->all_reduce(sums);
    const torch::Tensor target_logit = sums[0], sum_exp = sums[1];

    // loss_i = log(sum_j e^{z_ij - m_i}) - (z_i,t - m_i): the max cancels.
    const torch::Tensor loss = (sum_exp.log() - target_logit).mean();

    // What backward needs, all local: my columns of the softmax, and where my targets are.
    ctx->save_for_backward({exp / sum_exp.unsqueeze(1), local_target, mine});
    ctx->saved_data["n"] = n;
    ctx->saved_data["shape"] = local_logits.sizes().vec();
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& softmax = saved[0];
    const torch::Tensor& local_target = saved[1];
    const torch::Tensor& mine = saved[2];
    const double n = static_cast<double>(ctx->saved_data["n"].toInt());
    // d mean(loss) / d z = (softmax - one_hot(target)) / N; the one-hot's 1 is in my columns
    // only for the tokens whose target I own.
    torch::Tensor grad = softmax.clone();
    grad.scatter_add_(1, local_target.unsqueeze(1), -mine.to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(grads[0] / n);
    return {grad.view(ctx->saved_data["shape"].toIntVector()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits,
                                           const torch::Tensor& targets, Comm& tp) {
  // Checks before apply() and before any collective, identically on every rank.
  DTL_CHECK(local_logits.defined() && local_logits.dim() >= 1 && targets.defined() &&
                targets.scalar_type() == torch::kInt64 &&
                targets.sizes() == local_logits.sizes().slice(0, local_logits.dim() - 1),
            "vocab_parallel_cross_entropy: targets must be int64 with the logits' shape "
            "without their last dimension");
  const int64_t vocab = local_logits.size(-1) * tp.size();
  DTL_CHECK(targets.numel() > 0 && targets.min().item<int64_t>() >= 0 &&
                targets.max().item<int64_t>() < vocab,
            fmt::format("vocab_parallel_cross_entropy: a target is outside [0, {})", vocab));
  return VocabParallelCrossEntropy::apply(local_logits, targets, &tp);
}

// ---------------------------------------------------------------- Task 4

ParallelBlockImpl::ParallelBlockImpl(const dtl::model::BlockImpl& serial, const GPTConfig& cfg,
                                     Comm& tp) {
  check_tp_config(cfg, tp.size());
  ln1 = register_module("ln1", copy_of(*serial.ln1));
  attn = register_module("attn", ParallelAttention(serial.attn->qkv->weight, serial.attn->qkv->bias,
                                                   serial.attn->proj->weight,
                                                   serial.attn->proj->bias, cfg.n_head, tp));
  ln2 = register_module("ln2", copy_of(*serial.ln2));
  mlp = register_module("mlp",
                        TensorParallelMLP(serial.mlp->fc->weight, serial.mlp->fc->bias,
                                          serial.mlp->proj->weight, serial.mlp->proj->bias, tp));
}

torch::Tensor ParallelBlockImpl::forward(const torch::Tensor& x) {
  // The serial block's arithmetic; each sub-layer returns the full [B, T, d] on every rank, so
  // the residual stream stays replicated.
  const torch::Tensor h = x + attn(ln1(x));
  return h + mlp(ln2(h));
}

TensorParallelGPTImpl::TensorParallelGPTImpl(const dtl::model::GPTImpl& serial, Comm& tp)
    : cfg_(serial.config()), tp_(&tp) {
  check_tp_config(cfg_, tp.size());
  wte = register_module("wte", VocabParallelEmbedding(serial.wte->weight, tp));
  // A copy given as the table: no random init, so torch's global generator does not move.
  wpe = register_module("wpe",
                        torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg_.seq_len, cfg_.d_model)
                                                 ._weight(serial.wpe->weight.detach().clone())));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg_.n_layer; ++i)
    blocks->push_back(ParallelBlock(*serial.block(i), cfg_, tp));
  ln_f = register_module("ln_f", copy_of(*serial.ln_f));
  if (!cfg_.tied_head) {
    lm_head = register_module(
        "lm_head",
        ColumnParallelLinear(serial.lm_head->weight, torch::Tensor(), tp, /*gather_output=*/false));
  }
}

torch::Tensor TensorParallelGPTImpl::forward(const torch::Tensor& idx) {
  DTL_CHECK(
      idx.dim() == 2 && idx.size(1) <= cfg_.seq_len,
      fmt::format("TensorParallelGPT: idx must be [B, T] with T <= seq_len={}", cfg_.seq_len));
  torch::Tensor x = wte(idx) + wpe(torch::arange(idx.size(1), idx.options()));
  for (const auto& block : *blocks) x = block->as<ParallelBlockImpl>()->forward(x);
  const torch::Tensor h = ln_f(x);
  // My vocabulary columns of the logits. The tied head is a column-parallel layer whose weight
  // is my embedding rows; copy_to_tp sums the ranks' contributions to dL/dh in backward.
  if (cfg_.tied_head)
    return torch::nn::functional::linear(dtl::lab08::copy_to_tp(h, *tp_), wte->weight);
  return lm_head(h);
}

torch::Tensor TensorParallelGPTImpl::loss(const torch::Tensor& tokens) {
  DTL_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2,
            "TensorParallelGPT::loss: tokens must be [B, T + 1] with T >= 1");
  const int64_t T = tokens.size(1) - 1;
  return vocab_parallel_cross_entropy(forward(tokens.narrow(1, 0, T)), tokens.narrow(1, 1, T),
                                      *tp_);
}

}  // namespace dtl::lab09
