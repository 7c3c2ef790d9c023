// solutions/10_sequence_parallel/sequence_parallel.cpp — reference solution of lab 10.
//
// Read it in this order: the three sequence operators (lab 08's operators, along the sequence
// instead of the features), the block and the model (lab 09's arithmetic with the collectives
// swapped: all-gather where copy_to_tp was, reduce-scatter where reduce_from_tp was), the
// gradient sync the swap makes necessary, and ring attention (an online softmax over K/V chunks
// that travel around the ring, forward and backward).
#include "sequence_parallel.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab10 {
namespace {

using dtl::lab08::save_comm;
using dtl::lab08::saved_comm;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// My chunk of the sequence (dimension 1), as its own tensor.
torch::Tensor my_chunk(const torch::Tensor& x, Comm& tp) {
  return sequence_chunk(x, 1, tp).contiguous().clone();
}

// All ranks' chunks [B, T/tp, ...] -> [B, T, ...]. Comm::all_gather concatenates flat buffers in
// rank order, i.e. along dimension 0: move the sequence there, gather, move it back.
torch::Tensor all_gather_seq(const torch::Tensor& x, Comm& tp) {
  if (tp.size() == 1) return x.clone();
  const torch::Tensor seq_first = x.transpose(0, 1).contiguous();  // [Tc, B, ...]
  std::vector<int64_t> shape = seq_first.sizes().vec();
  shape[0] *= tp.size();
  torch::Tensor out = torch::empty(shape, seq_first.options());
  tp.all_gather(out, seq_first);
  return out.transpose(0, 1).contiguous();
}

// [B, T, ...] partial sums -> [B, T/tp, ...], my chunk of the sum over ranks.
torch::Tensor reduce_scatter_seq(const torch::Tensor& x, Comm& tp) {
  if (tp.size() == 1) return x.clone();
  dtl::lab08::shard_of(x.size(1), tp.size(), tp.rank(), "sequence length");
  const torch::Tensor seq_first = x.transpose(0, 1).contiguous();  // [T, B, ...]
  std::vector<int64_t> shape = seq_first.sizes().vec();
  shape[0] /= tp.size();
  torch::Tensor out = torch::empty(shape, seq_first.options());
  tp.reduce_scatter(out, seq_first);
  return out.transpose(0, 1).contiguous();
}

struct ScatterToSP : torch::autograd::Function<ScatterToSP> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* tp) {
    save_comm(ctx, *tp);
    return my_chunk(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_seq(grads[0], saved_comm(ctx)), torch::Tensor()};
  }
};

// Gather forward; every rank then used every position, so a chunk's gradient is the SUM of the
// ranks' gradients for it: reduce-scatter.
struct GatherFromSP : torch::autograd::Function<GatherFromSP> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* tp) {
    save_comm(ctx, *tp);
    return all_gather_seq(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_seq(grads[0], saved_comm(ctx)), torch::Tensor()};
  }
};

// Sum and keep my chunk forward; my chunk of the output depended on every rank's whole input
// with weight one, so each rank's input gradient is the whole gathered output gradient.
struct ReduceScatterToSP : torch::autograd::Function<ReduceScatterToSP> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Comm* tp) {
    save_comm(ctx, *tp);
    return reduce_scatter_seq(x, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_seq(grads[0], saved_comm(ctx)), torch::Tensor()};
  }
};

void check_operand(const torch::Tensor& x, const char* op) {
  DTL_CHECK(x.defined() && x.dim() >= 2,
            fmt::format("{}: the input must be [B, T, ...] (at least two dimensions)", op));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// ---------------------------------------------------------------- Task 1

torch::Tensor scatter_to_sp(const torch::Tensor& x, Comm& tp) {
  check_operand(x, "scatter_to_sp");
  sequence_chunk(x, 1, tp);  // divisible, or say so before anything happens
  return ScatterToSP::apply(x, &tp);
}
torch::Tensor gather_from_sp(const torch::Tensor& x, Comm& tp) {
  check_operand(x, "gather_from_sp");
  return GatherFromSP::apply(x, &tp);
}
torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, Comm& tp) {
  check_operand(x, "reduce_scatter_to_sp");
  sequence_chunk(x, 1, tp);
  return ReduceScatterToSP::apply(x, &tp);
}

// ---------------------------------------------------------------- Task 2

SequenceParallelBlockImpl::SequenceParallelBlockImpl(const dtl::model::BlockImpl& serial,
                                                     const GPTConfig& cfg, Comm& tp)
    : tp_(&tp) {
  // Lab 09 already knows how to slice a block; sequence parallelism changes only the forward.
  dtl::lab09::ParallelBlock shards(serial, cfg, tp);
  ln1 = register_module("ln1", shards->ln1);
  attn = register_module("attn", shards->attn);
  ln2 = register_module("ln2", shards->ln2);
  mlp = register_module("mlp", shards->mlp);
}

torch::Tensor SequenceParallelBlockImpl::forward(const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  auto add_bias = [](const torch::Tensor& t, const torch::Tensor& bias) {
    return bias.defined() ? t + bias : t;
  };
  // Attention: LayerNorm on my chunk; gather the sequence for the column-parallel qkv (every
  // query needs every key); my heads; the row-parallel proj's partial sums reduce-scattered back
  // to my chunk; the bias once, on the chunk.
  torch::Tensor a = gather_from_sp(ln1(x), *tp_);
  a = dtl::lab09::attention_of_heads(F::linear(a, attn->qkv->weight, attn->qkv->bias),
                                     attn->local_heads, attn->head_dim);
  a = reduce_scatter_to_sp(F::linear(a, attn->proj->weight), *tp_);
  const torch::Tensor h = x + add_bias(a, attn->proj->bias);
  // The MLP the same way: gather, fc, GELU, proj, reduce-scatter.
  torch::Tensor m = gather_from_sp(ln2(h), *tp_);
  m = torch::gelu(F::linear(m, mlp->fc->weight, mlp->fc->bias), "tanh");
  m = reduce_scatter_to_sp(F::linear(m, mlp->proj->weight), *tp_);
  return h + add_bias(m, mlp->proj->bias);
}

// ---------------------------------------------------------------- Task 3

SequenceParallelGPTImpl::SequenceParallelGPTImpl(const dtl::model::GPTImpl& serial, Comm& tp)
    : cfg_(serial.config()), tp_(&tp) {
  dtl::lab09::check_tp_config(cfg_, tp.size());
  wte = register_module("wte", dtl::lab09::VocabParallelEmbedding(serial.wte->weight, tp));
  wpe = register_module("wpe",
                        torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg_.seq_len, cfg_.d_model)
                                                 ._weight(serial.wpe->weight.detach().clone())));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg_.n_layer; ++i)
    blocks->push_back(SequenceParallelBlock(*serial.block(i), cfg_, tp));
  ln_f = register_module("ln_f", dtl::lab09::copy_of(*serial.ln_f));
  if (!cfg_.tied_head) {
    lm_head = register_module("lm_head", dtl::lab08::ColumnParallelLinear(
                                             serial.lm_head->weight, torch::Tensor(), tp, false));
  }
}

torch::Tensor SequenceParallelGPTImpl::forward(const torch::Tensor& idx) {
  DTL_CHECK(
      idx.dim() == 2 && idx.size(1) <= cfg_.seq_len,
      fmt::format("SequenceParallelGPT: idx must be [B, T] with T <= seq_len={}", cfg_.seq_len));
  const Range mine = dtl::lab08::shard_of(idx.size(1), tp_->size(), tp_->rank(), "sequence length");
  // The embedding's partial rows summed AND split in one collective: my chunk of the sequence.
  torch::Tensor x = reduce_scatter_to_sp(wte->lookup_local(idx), *tp_) +
                    wpe(torch::arange(mine.begin, mine.end, idx.options()));
  for (const auto& block : *blocks) x = block->as<SequenceParallelBlockImpl>()->forward(x);
  // The head needs every position for its vocabulary columns: one gather, whose backward sums
  // the ranks' dL/dh (the role copy_to_tp played in lab 09).
  const torch::Tensor h = gather_from_sp(ln_f(x), *tp_);
  return torch::nn::functional::linear(h, cfg_.tied_head ? wte->weight : lm_head->weight);
}

torch::Tensor SequenceParallelGPTImpl::loss(const torch::Tensor& tokens) {
  DTL_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2,
            "SequenceParallelGPT::loss: tokens must be [B, T + 1] with T >= 1");
  const int64_t T = tokens.size(1) - 1;
  return dtl::lab09::vocab_parallel_cross_entropy(forward(tokens.narrow(1, 0, T)),
                                                  tokens.narrow(1, 1, T), *tp_);
}

bool is_sequence_parallel_param(const std::string& name) {
  // Everything that touches only my chunk of the sequence: LayerNorms, the biases added after
  // the reduce-scatter, and the positions (my chunk's rows of wpe).
  auto in = [&](const char* part) { return name.find(part) != std::string::npos; };
  return in("ln1.") || in("ln2.") || name.rfind("ln_f.", 0) == 0 ||
         ends_with(name, "attn.proj.bias") || ends_with(name, "mlp.proj.bias") ||
         ends_with(name, "wpe.weight");
}

void sync_sequence_parallel_grads(torch::nn::Module& model, Comm& tp) {
  if (tp.size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (const auto& p : model.named_parameters())
    if (is_sequence_parallel_param(p.key()) && p.value().grad().defined())
      grads.push_back(p.value().grad());
  if (grads.empty()) return;
  // One all-reduce for all of them (they are small: LayerNorms and biases), like a DDP bucket.
  std::vector<torch::Tensor> flat_views;
  for (const auto& g : grads) flat_views.push_back(g.reshape({-1}));
  torch::Tensor flat = torch::cat(flat_views);
  tp.all_reduce(flat);
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

// ---------------------------------------------------------------- Task 4

namespace {

// The scores of my queries against one K chunk, scaled, with the causal mask when the chunk is
// my own (the diagonal block); chunks of earlier ranks are entirely in the past: no mask.
torch::Tensor block_scores(const torch::Tensor& q, const torch::Tensor& k, bool diagonal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (diagonal) {
    const int64_t n = q.size(-2);
    const torch::Tensor future = torch::ones({n, n}, q.options().dtype(torch::kBool)).triu(1);
    s = s.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  return s;
}

// Step i of the ring: rank r holds the chunk that started at rank r - i.
int source_of(int rank, int step, int cp) { return ((rank - step) % cp + cp) % cp; }

struct RingAttention : torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, Comm* cp) {
    const int n = cp->size(), r = cp->rank();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    // Running statistics per query: the max m and sum l of exp(score - m), and the unnormalised
    // output o. Merging a new block rescales the old ones by exp(m_old - m_new).
    torch::Tensor m = torch::full({q.size(0), q.size(1), q.size(2), 1},
                                  -std::numeric_limits<double>::infinity(), q.options());
    torch::Tensor l = torch::zeros_like(m);
    torch::Tensor o = torch::zeros_like(q);
    torch::Tensor kv = torch::stack({k, v});  // one message per step: [2, B, H, Tc, Dh]
    for (int step = 0; step < n; ++step) {
      // Pass the chunk on while computing with it: the transfer hides behind the matmuls.
      torch::Tensor incoming;
      Work transfer;
      if (step + 1 < n) {
        incoming = torch::empty_like(kv);
        transfer = cp->sendrecv_async(kv, next, incoming, prev);
      }
      const int src = source_of(r, step, n);
      if (src <= r) {  // later ranks' keys are in my queries' future: nothing to compute
        const torch::Tensor s = block_scores(q, kv[0], src == r);
        const torch::Tensor m_new = torch::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
        const torch::Tensor p = (s - m_new).exp();
        const torch::Tensor rescale = (m - m_new).exp();
        l = l * rescale + p.sum(-1, /*keepdim=*/true);
        o = o * rescale + torch::matmul(p, kv[1]);
        m = m_new;
      }
      if (step + 1 < n) {
        transfer.wait();
        kv = incoming;
      }
    }
    const torch::Tensor out = o / l;
    // log-sum-exp per query: enough to recompute any block's probabilities in backward.
    ctx->save_for_backward({q, k, v, out, m + l.log()});
    save_comm(ctx, *cp);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3],
                        &lse = saved[4];
    Comm& cp = saved_comm(ctx);
    const int n = cp.size(), r = cp.rank();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const torch::Tensor dout = grads[0].contiguous();
    // D_i = sum_j P_ij dP_ij = <dO_i, O_i>: the softmax backward's per-query correction.
    const torch::Tensor delta = (dout * out).sum(-1, /*keepdim=*/true);
    torch::Tensor dq = torch::zeros_like(q);
    // The travelling message: K and V of a chunk with the dK, dV accumulated for it so far.
    torch::Tensor msg = torch::stack({k, v, torch::zeros_like(k), torch::zeros_like(v)});
    for (int step = 0; step < n; ++step) {
      const int src = source_of(r, step, n);
      if (src <= r) {
        const torch::Tensor kb = msg[0], vb = msg[1];
        const torch::Tensor p = (block_scores(q, kb, src == r) - lse).exp();  // this block's P
        const torch::Tensor dp = torch::matmul(dout, vb.transpose(-2, -1));
        const torch::Tensor ds = p * (dp - delta);
        dq += torch::matmul(ds, kb) * scale;
        msg[2] += torch::matmul(ds.transpose(-2, -1), q) * scale;  // dK of that chunk
        msg[3] += torch::matmul(p.transpose(-2, -1), dout);        // dV of that chunk
      }
      if (n == 1) break;
      // Pass K, V and their partial gradients on; after the last block only dK, dV still
      // travel, one hop, to the chunk's owner (rank r receives its own chunk's gradients).
      const torch::Tensor send = step + 1 < n ? msg : msg.narrow(0, 2, 2).contiguous();
      torch::Tensor incoming = torch::empty_like(send);
      cp.sendrecv(send, next, incoming, prev);
      msg = step + 1 < n ? incoming : torch::cat({msg.narrow(0, 0, 2), incoming});
    }
    return {dq, msg[2], msg[3], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             Comm& cp) {
  DTL_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.sizes() == q.sizes() &&
                v.sizes() == q.sizes(),
            "ring_attention: q, k, v must be [B, H, Tc, Dh] of one shape");
  return RingAttention::apply(q.contiguous(), k.contiguous(), v.contiguous(), &cp);
}

}  // namespace dtl::lab10
