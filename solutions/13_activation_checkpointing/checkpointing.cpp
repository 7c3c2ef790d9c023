// Reference solution of lab 13: activation checkpointing, selective and full, and the plan that
// fits a memory budget with the least recomputation.
#include "checkpointing.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/memory.hpp"

namespace dtl::lab13 {
namespace {

// ---------------------------------------------------------------- Task 1: checkpoint

// The random-number generators a recomputation must replay: the CPU generator always (CPU ops
// draw from it, and LibTorch's CPU dropout is one of them), and the default generator of every
// CUDA device an input lives on (CUDA dropout draws from that one).
std::vector<at::Generator> generators_of(const std::vector<torch::Tensor>& inputs) {
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator()};
  std::vector<c10::Device> seen;
  for (const torch::Tensor& t : inputs) {
    if (!t.defined() || !t.is_cuda()) continue;
    bool known = false;
    for (const c10::Device& d : seen) known = known || d == t.device();
    if (known) continue;
    seen.push_back(t.device());
    gens.push_back(at::globalContext().defaultGenerator(t.device()));
  }
  return gens;
}

std::vector<torch::Tensor> get_states(const std::vector<at::Generator>& gens) {
  std::vector<torch::Tensor> states;
  for (at::Generator g : gens) {  // a handle: copies share the generator
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());  // a copy: later draws do not change it
  }
  return states;
}

void set_states(const std::vector<at::Generator>& gens, const std::vector<torch::Tensor>& states) {
  for (size_t i = 0; i < gens.size(); ++i) {
    at::Generator g = gens[i];
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(states[i]);
  }
}

// Sets the generators to `replay` for its lifetime and puts back what they held before, like
// PyTorch's torch.random.fork_rng: backward replays forward's random draws without disturbing
// the stream that the rest of training sees.
class ReplayRng {
 public:
  ReplayRng(std::vector<at::Generator> gens, const std::vector<torch::Tensor>& replay)
      : gens_(std::move(gens)), outer_(get_states(gens_)) {
    set_states(gens_, replay);
  }
  ~ReplayRng() { set_states(gens_, outer_); }
  ReplayRng(const ReplayRng&) = delete;
  ReplayRng& operator=(const ReplayRng&) = delete;

 private:
  std::vector<at::Generator> gens_;
  std::vector<torch::Tensor> outer_;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // Runs with grad mode off (Function::apply turns it off around forward): fn builds no graph,
  // so every intermediate dies as soon as the next op has used it. Only the inputs are kept.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const CheckpointFn& fn,
                               at::TensorList inputs) {
    const std::vector<torch::Tensor> in = inputs.vec();
    // The generators' states BEFORE fn draws anything: backward starts its replay here.
    const std::vector<at::Generator> gens = generators_of(in);
    const std::vector<torch::Tensor> states = get_states(gens);
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;  // already off inside apply; said here because it is the point
      out = fn(in);
    }
    DTL_CHECK(out.defined(), "checkpoint: fn returned an undefined output tensor");
    ctx->save_for_backward(in);
    ctx->saved_data["fn"] = wrap_fn(fn);
    ctx->saved_data["rng"] = torch::List<torch::Tensor>(states);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const CheckpointFn& fn = unwrap_fn(ctx->saved_data["fn"]);
    std::vector<torch::Tensor> states;
    const c10::List<torch::Tensor> rng = ctx->saved_data["rng"].toTensorList();
    for (size_t i = 0; i < rng.size(); ++i) states.push_back(rng.get(i));  // (g++ 14: no dangling ref)

    // Fresh leaves that share the inputs' storage: the recomputed graph ends at them, so the
    // inner backward stops there and leaves their gradients in .grad(), which we hand on to the
    // outer graph. Parameters fn uses are leaves of both graphs: they accumulate as usual.
    std::vector<torch::Tensor> leaves;
    for (const torch::Tensor& t : saved) {
      leaves.push_back(t.detach().requires_grad_(t.requires_grad()));
    }
    torch::Tensor out;
    {
      ReplayRng replay(generators_of(leaves), states);  // the same dropout masks as forward
      torch::AutoGradMode grad_on(true);  // backward runs with grad off; recompute needs a graph
      out = fn(leaves);
    }
    if (out.requires_grad() && grad_outputs[0].defined()) {
      torch::autograd::backward({out}, {grad_outputs[0]});
    }
    // One gradient per argument of forward: none for fn, then one per input.
    torch::autograd::variable_list grads{torch::Tensor()};
    for (const torch::Tensor& leaf : leaves) {
      grads.push_back(leaf.requires_grad() ? leaf.grad() : torch::Tensor());
    }
    return grads;
  }
};

}  // namespace

torch::Tensor checkpoint(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs) {
  DTL_CHECK(fn != nullptr, "checkpoint: fn is empty");
  DTL_CHECK(!inputs.empty(), "checkpoint: inputs is empty: it needs at least one tensor");
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTL_CHECK(inputs[i].defined(), fmt::format("checkpoint: input {} is undefined", i));
  }
  return CheckpointFunction::apply(fn, at::TensorList(inputs));
}

// ---------------------------------------------------------------- Task 2: the policies

namespace {

// CausalSelfAttentionImpl::forward, written out so that the attention core can be wrapped.
torch::Tensor attention(model::CausalSelfAttentionImpl& attn, const torch::Tensor& x,
                        bool selective) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2);
  const int64_t H = attn.n_head, Dh = attn.head_dim;
  std::vector<torch::Tensor> parts = attn.qkv(x).split(d, /*dim=*/-1);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, Dh}).transpose(1, 2); };
  const torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  const double p = attn.dropout;
  const bool training = attn.is_training();
  torch::Tensor y;
  if (selective) {
    // The core, softmax(q k^T / sqrt(Dh)) v with dropout on the probabilities: its saved
    // tensors are the [B, H, T, T] ones (Korthikanti et al.'s 5as/h term), yet it costs only
    // 4 B T^2 d of the block's 24 B T d^2 + 4 B T^2 d FLOPs to redo. Captured by value: the
    // lambda outlives this call (backward runs it again).
    auto core = [p, training](const std::vector<torch::Tensor>& in) {
      return model::causal_attention(in[0], in[1], in[2], p, training);
    };
    y = checkpoint(core, {q, k, v});
  } else {
    y = model::causal_attention(q, k, v, p, training);
  }
  return attn.proj(y.transpose(1, 2).contiguous().view({B, T, d}));
}

// BlockImpl::forward with the attention core optionally checkpointed: the same ops in the same
// order, so the same random draws and the same bits.
torch::Tensor block_body(model::BlockImpl& b, const torch::Tensor& x, bool selective) {
  const bool training = b.is_training();
  torch::Tensor h =
      x + torch::dropout(attention(*b.attn, b.ln1(x), selective), b.dropout, training);
  return h + torch::dropout(b.mlp(b.ln2(h)), b.dropout, training);
}

}  // namespace

torch::Tensor block_forward(Block block, const torch::Tensor& x, Policy policy) {
  DTL_CHECK(!block.is_empty(), "block_forward: the block is empty");
  switch (policy) {
    case Policy::kNone:
      return block_body(*block, x, false);
    case Policy::kSelective:
      return block_body(*block, x, true);
    case Policy::kFull: {
      // Only x is kept; backward reruns the whole block. The Block holder is a shared_ptr:
      // copying it into the lambda keeps the module alive as long as the graph.
      return checkpoint(
          [impl = block.ptr()](const std::vector<torch::Tensor>& in) {
            return block_body(*impl, in[0], false);
          },
          {x});
    }
  }
  throw Error("block_forward: unknown policy");
}

torch::Tensor gpt_loss(GPT& model, const torch::Tensor& tokens, Policy policy) {
  DTL_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2,
            fmt::format("gpt_loss: tokens must be [B, T + 1] with T >= 1, got {}",
                        fmt::join(tokens.sizes(), "x")));
  const int64_t T = tokens.size(1) - 1;
  torch::Tensor x = model->embed(tokens.narrow(1, 0, T));
  for (int64_t i = 0; i < model->config().n_layer; ++i)
    x = block_forward(model->block(i), x, policy);
  return model::lm_loss(model->head(x), tokens.narrow(1, 1, T));
}

// ---------------------------------------------------------------- Task 3: memory and plans

namespace {

void check_shape(const GPTConfig& cfg, int64_t batch, int64_t seq) {
  cfg.validate();
  DTL_CHECK(batch >= 1, fmt::format("lab13: batch = {} must be >= 1", batch));
  DTL_CHECK(seq >= 1 && seq <= cfg.seq_len,
            fmt::format("lab13: seq = {} must be in [1, seq_len = {}]", seq, cfg.seq_len));
}

// The two halves of what one block keeps (see the header): the attention side holds the
// T^2 tensors, the MLP side the widest ones (f = 4d).
struct LayerBytes {
  int64_t attention = 0;  // A
  int64_t mlp = 0;        // M
  int64_t core = 0;       // the T^2 part of A: what kSelective drops
  int64_t none() const { return attention + mlp; }
};

LayerBytes layer_bytes(const GPTConfig& cfg, int64_t B, int64_t T) {
  const int64_t e = 4, d = cfg.d_model, f = cfg.ff(), H = cfg.n_head;
  // CPU dropout keeps a float mask (and the matmul after it keeps the dropped copy): with
  // dropout the core holds three [B, H, T, T] tensors instead of one. Korthikanti et al. count
  // the same three in 16-bit with a 1-byte mask: 2 + 1 + 2 = 5 bytes, their 5as/h term.
  const int64_t D = cfg.dropout > 0.0 ? 1 : 0;
  LayerBytes l;
  l.core = e * (1 + 2 * D) * B * H * T * T;
  l.attention = e * B * T * (5 + D) * d + l.core;
  l.mlp = e * B * T * ((3 + D) * d + 2 * f);
  return l;
}

int64_t layer_saved(const LayerBytes& l, int64_t eBTd, Policy policy) {
  switch (policy) {
    case Policy::kNone:
      return l.none();
    case Policy::kSelective:
      return l.none() - l.core;
    case Policy::kFull:
      return eBTd;  // the checkpoint's input: the previous block's output
  }
  return 0;
}

}  // namespace

ActivationMemory activation_memory(const GPTConfig& cfg, int64_t batch, int64_t seq,
                                   Policy policy) {
  check_shape(cfg, batch, seq);
  const int64_t e = 4, B = batch, T = seq, d = cfg.d_model, f = cfg.ff(), H = cfg.n_head;
  const int64_t eBTd = e * B * T * d, eBTV = e * B * T * cfg.vocab_size;
  const LayerBytes l = layer_bytes(cfg, B, T);
  const int64_t layer = layer_saved(l, eBTd, policy);
  ActivationMemory m;
  m.saved = eBTd + cfg.n_layer * layer + eBTd + eBTV;
  // Backward visits the last block first, while every other block still holds what it saved:
  // that is when recomputation costs the most memory. Under kFull the block is rebuilt whole.
  const int64_t rest = m.saved - eBTV - eBTd - layer;
  const int64_t live = policy == Policy::kFull ? l.none() : layer;
  const int64_t start = m.saved + 2 * eBTV;
  const int64_t mlp_backward = rest + live + e * B * T * (f + 2 * d);
  const int64_t attention_backward = rest + l.attention + 2 * e * B * H * T * T;
  m.peak = std::max({start, mlp_backward, attention_backward});
  return m;
}

double recompute_flops(const GPTConfig& cfg, int64_t batch, int64_t seq, Policy policy) {
  check_shape(cfg, batch, seq);
  const double B = double(batch), T = double(seq), d = double(cfg.d_model), f = double(cfg.ff());
  const double core = 4.0 * B * T * T * d;  // q k^T and P v: 2 B T^2 d each
  const double projections = 2.0 * B * T * (4.0 * d * d + 2.0 * d * f);  // qkv, proj, fc, proj
  switch (policy) {
    case Policy::kNone:
      return 0.0;
    case Policy::kSelective:
      return double(cfg.n_layer) * core;
    case Policy::kFull:
      return double(cfg.n_layer) * (projections + core);
  }
  return 0.0;
}

Plan choose_checkpointing(const GPTConfig& cfg, int64_t batch, int64_t seq, int64_t memory_budget) {
  check_shape(cfg, batch, seq);
  DTL_CHECK(
      memory_budget >= 1,
      fmt::format("choose_checkpointing: memory budget = {} bytes must be >= 1", memory_budget));
  // Recomputation is pure overhead (it is not even counted in MFU): take the cheapest plan that
  // fits. Cheapest is not "in enum order" by decree: compare the FLOPs.
  std::vector<Plan> plans;
  for (Policy p : {Policy::kNone, Policy::kSelective, Policy::kFull}) {
    plans.push_back(
        {p, activation_memory(cfg, batch, seq, p).peak, recompute_flops(cfg, batch, seq, p)});
  }
  const Plan* best = nullptr;
  const Plan* smallest = &plans[0];
  for (const Plan& plan : plans) {
    if (plan.peak_bytes < smallest->peak_bytes) smallest = &plan;
    if (plan.peak_bytes > memory_budget) continue;
    if (best == nullptr || plan.recompute_flops < best->recompute_flops) best = &plan;
  }
  DTL_CHECK(best != nullptr,
            fmt::format("choose_checkpointing: no plan fits the memory budget of {} bytes; the "
                        "smallest peak is {} bytes ({}): use a smaller micro-batch or shorter "
                        "sequences, or shard the activations (lab 10)",
                        memory_budget, smallest->peak_bytes, to_string(smallest->policy)));
  return *best;
}

}  // namespace dtl::lab13
