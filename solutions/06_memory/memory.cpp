// Reference solution of lab 06: where the bytes of a training step go, predicted and measured.
#include "memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "dtl/error.hpp"
#include "dtl/memory.hpp"
#include "dtl/train.hpp"

namespace dtl::lab06 {
namespace {

// Bytes per element: bf16 halves the weights, grads and activations; the master copy and
// Adam's moments stay float32 because bf16's 8-bit mantissa cannot hold lr x update added to a
// weight (the update would round away).
int64_t model_bytes(Precision p) { return p == Precision::kFP32 ? 4 : 2; }

void check_shape(const GPTConfig& cfg, int64_t batch, int64_t seq) {
  cfg.validate();
  DTL_CHECK(batch >= 1, fmt::format("lab06: batch = {} must be >= 1", batch));
  DTL_CHECK(seq >= 1 && seq <= cfg.seq_len,
            fmt::format("lab06: seq = {} must be in [1, seq_len = {}]", seq, cfg.seq_len));
}

}  // namespace

int64_t parameter_count(const GPTConfig& cfg) {
  const int64_t d = cfg.d_model, f = cfg.ff(), V = cfg.vocab_size;
  const int64_t b = cfg.bias ? 1 : 0;
  // Per block: qkv [3d, d] (+3d), proj [d, d] (+d), fc [f, d] (+f), proj [d, f] (+d), and two
  // LayerNorms with a gain and a bias each (4d). Biases are what `bias = false` removes.
  const int64_t block = 3 * d * d + d * d + 2 * d * f + b * (3 * d + d + f + d) + 4 * d;
  // Token and position embeddings, the final LayerNorm; an untied head is one more [V, d].
  const int64_t head = cfg.tied_head ? 0 : V * d;
  return V * d + cfg.seq_len * d + cfg.n_layer * block + 2 * d + head;
}

int64_t activation_bytes_per_layer(const GPTConfig& cfg, int64_t batch, int64_t seq,
                                   Precision precision) {
  check_shape(cfg, batch, seq);
  const int64_t e = model_bytes(precision);
  const int64_t B = batch, T = seq, d = cfg.d_model, f = cfg.ff(), H = cfg.n_head;
  // What autograd holds on to at the end of forward, per block:
  //  [B,T,d] x 8: ln1 out (qkv's input), q/k/v copies (the batched matmul cannot use the
  //               strided head views, so it copies them contiguous and saves the copies), the
  //               attention output made contiguous (proj's input), h (ln2's input), ln2 out
  //               (fc's input), and the block output (the next block's ln1 input).
  //  [B,T,f] x 2: fc out (GELU's input: GELU's backward needs x, not y) and GELU out.
  //  [B,H,T,T]:   the softmax output. Scores and the masked scores are freed at once (scaling
  //               and masked_fill need no input for their backward): quadratic in T, but only
  //               once per layer. This is what FlashAttention removes.
  return e * (B * T * (8 * d + 2 * f) + B * H * T * T);
}

Breakdown estimate(const GPTConfig& cfg, int64_t batch, int64_t seq, Precision precision,
                   OptimizerKind optimizer) {
  check_shape(cfg, batch, seq);
  const int64_t N = parameter_count(cfg);
  const int64_t e = model_bytes(precision);
  const int64_t BT = batch * seq;
  Breakdown b;
  b.params = e * N;
  b.grads = e * N;
  b.master = precision == Precision::kFP32 ? 0 : 4 * N;
  b.optimizer = optimizer == OptimizerKind::kAdamW ? 8 * N : 0;
  // The embedding's output feeds block 0 (the blocks count their OUTPUT, so the input of block
  // 0 is extra); ln_f's output feeds the head matmul.
  b.activations = e * BT * cfg.d_model +
                  cfg.n_layer * activation_bytes_per_layer(cfg, batch, seq, precision) +
                  e * BT * cfg.d_model;
  // cross_entropy = log_softmax + nll_loss: log_softmax saves its [B*T, V] output. The logits
  // themselves die when the loss is computed (nothing saves them).
  b.logits = e * BT * cfg.vocab_size;

  // What each high-water mark adds to the bytes resident when its step starts.
  // Backward's first steps: nll_loss's gradient [B*T, V] and log_softmax's gradient (the
  // logits' gradient) are live together with everything forward saved.
  const int64_t backward_start = b.activations + b.logits + 2 * e * BT * cfg.vocab_size;
  // The last block's attention backward: the gradient of the probabilities (from P V's
  // backward) and of the scores (softmax's backward) are two more [B, H, T, T] tensors while
  // everything forward saved is still live. The loss's tensors are gone by then.
  const int64_t BHTT = batch * cfg.n_head * seq * seq;
  const int64_t attention_backward = b.activations + 2 * e * BHTT;
  // The optimizer step: AdamW's update computes sqrt(v) and sqrt(v) / c as new float32
  // tensors, so two temporaries the size of the largest parameter (an embedding or fc) appear.
  const int64_t d = cfg.d_model;
  const int64_t largest = std::max({cfg.vocab_size * d, cfg.seq_len * d, cfg.ff() * d, 3 * d * d});
  const int64_t step_temp = optimizer == OptimizerKind::kAdamW ? 2 * 4 * largest : 0;
  // The first step starts with only the weights (bf16 and, in mixed precision, the float32
  // master copy); grads appear during backward, m and v in the optimizer step, parameter by
  // parameter, all of them live by its end.
  const int64_t weights = b.params + b.master;
  b.peak =
      std::max({weights + backward_start, weights + attention_backward, b.state() + step_temp});
  // Every later step starts with all of the state resident (the grads are zeroed in place, not
  // freed), so forward and backward pile up on top of it: a run needs this, not peak.
  b.steady_peak = b.state() + std::max({backward_start, attention_backward, step_temp});
  return b;
}

Measured measure(GPT& model, torch::optim::Optimizer& optimizer, const torch::Tensor& batch) {
  memory::install();
  Measured m;
  m.before = static_cast<int64_t>(memory::current_bytes());
  memory::reset_peak();  // the analogue of torch.cuda.reset_peak_memory_stats()
  train_step(model, optimizer, batch);
  m.peak = static_cast<int64_t>(memory::peak_bytes());
  m.after = static_cast<int64_t>(memory::current_bytes());
  return m;
}

TwoSteps measure_two_steps(GPT& model, torch::optim::Optimizer& optimizer,
                           const torch::Tensor& batch) {
  TwoSteps r;
  r.first = measure(model, optimizer, batch);
  r.second.before = static_cast<int64_t>(memory::current_bytes());
  memory::reset_peak();
  {
    // Zeroed in place, kept: the second step starts with grads, m and v all live.
    for (torch::Tensor& p : model->parameters()) {
      if (p.grad().defined()) p.grad().zero_();
    }
    torch::Tensor loss = model->loss(batch);
    loss.backward();
    optimizer.step();
  }  // the loss dies here, as in train_step: `after` is the state alone
  r.second.peak = static_cast<int64_t>(memory::peak_bytes());
  r.second.after = static_cast<int64_t>(memory::current_bytes());
  return r;
}

std::string breakdown_table(const Breakdown& p, const Measured* m, int64_t baseline,
                            const Measured* second) {
  auto row = [&](const char* name, int64_t predicted, int64_t measured, bool has) {
    std::string out = fmt::format("{:<22} {:>12}", name, memory::format_bytes(predicted));
    if (m == nullptr) return out + "\n";
    if (!has) return out + fmt::format(" {:>12} {:>7}\n", "-", "-");
    const double ratio = predicted > 0 ? double(measured) / double(predicted) : 0.0;
    return out + fmt::format(" {:>12} {:>7.3f}\n", memory::format_bytes(measured), ratio);
  };
  std::string t = fmt::format("{:<22} {:>12}", "category", "predicted");
  t += m ? fmt::format(" {:>12} {:>7}\n", "measured", "ratio") : "\n";
  // The tracker sees totals, not categories: params are the live bytes before the step, the
  // state the live bytes after it, activations + logits what the peak held beyond params.
  const int64_t params = m ? m->before - baseline : 0;
  const int64_t state = m ? m->after - baseline : 0;
  t += row("params", p.params, params, true);
  t += row("grads", p.grads, 0, false);
  t += row("master", p.master, 0, false);
  t += row("optimizer", p.optimizer, 0, false);
  t += row("state (after step)", p.state(), state, true);
  t += row("activations + logits", p.activations + p.logits, 0, false);
  t += row("peak (first step)", p.peak, m ? m->peak - baseline : 0, true);
  t += row("steady peak (step 2+)", p.steady_peak, second ? second->peak - baseline : 0,
           second != nullptr);
  return t;
}

}  // namespace dtl::lab06
