// The GPT of dtl/model.hpp: configuration checks, deterministic init, attention, modules.
#include "dtl/model.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (it moved here from format.h in fmt 11)

#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "dtl/error.hpp"

namespace dtl {
namespace model {
namespace {

// FNV-1a, 64 bit: a stable hash of a parameter name. std::hash is not specified to be equal
// across compilers, library versions or even runs, and every rank must agree on it.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// splitmix64 finaliser: turns structured inputs (small seeds, similar hashes) into
// well-mixed bits.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Restores torch's global CPU generator on scope exit. torch::nn::Linear and Embedding draw
// their default init from it; we overwrite those values anyway, and a model constructor that
// silently moved the global stream would make dropout masks depend on which parts of the
// model a rank happens to build.
class GlobalRngRestore {
 public:
  GlobalRngRestore() : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    state_ = gen_.get_state();
  }
  ~GlobalRngRestore() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(state_);
  }

 private:
  at::Generator gen_;
  torch::Tensor state_;
};

}  // namespace

// ---- GPTConfig ----

int64_t GPTConfig::ff() const { return d_ff > 0 ? d_ff : 4 * d_model; }

int64_t GPTConfig::head_dim() const { return n_head > 0 ? d_model / n_head : 0; }

void GPTConfig::validate() const {
  DTL_CHECK(vocab_size > 0, fmt::format("GPTConfig: vocab_size={} must be > 0", vocab_size));
  DTL_CHECK(seq_len > 0, fmt::format("GPTConfig: seq_len={} must be > 0", seq_len));
  DTL_CHECK(n_layer > 0, fmt::format("GPTConfig: n_layer={} must be > 0", n_layer));
  DTL_CHECK(n_head > 0, fmt::format("GPTConfig: n_head={} must be > 0", n_head));
  DTL_CHECK(d_model > 0, fmt::format("GPTConfig: d_model={} must be > 0", d_model));
  DTL_CHECK(d_ff >= 0, fmt::format("GPTConfig: d_ff={} must be >= 0 (0 means 4 * d_model)", d_ff));
  DTL_CHECK(d_model % n_head == 0,
            fmt::format("GPTConfig: n_head={} does not divide d_model={}", n_head, d_model));
  DTL_CHECK(dropout >= 0.0 && dropout < 1.0,
            fmt::format("GPTConfig: dropout={} must be in [0, 1)", dropout));
}

std::string GPTConfig::to_string() const {
  return fmt::format(
      "GPTConfig(vocab_size={} seq_len={} n_layer={} n_head={} d_model={} d_ff={} dropout={} "
      "tied_head={} bias={} seed={})",
      vocab_size, seq_len, n_layer, n_head, d_model, ff(), dropout, tied_head, bias, seed);
}

GPTConfig GPTConfig::small() {
  GPTConfig c;
  c.vocab_size = 256;
  c.seq_len = 64;
  c.n_layer = 4;
  c.n_head = 4;
  c.d_model = 128;
  return c;
}

GPTConfig GPTConfig::tiny() {
  GPTConfig c;
  c.vocab_size = 64;
  c.seq_len = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  return c;
}

GPTConfig GPTConfig::gpt3_175b() {
  GPTConfig c;
  c.vocab_size = 50257;
  c.seq_len = 2048;
  c.n_layer = 96;
  c.n_head = 96;
  c.d_model = 12288;
  return c;
}

GPTConfig GPTConfig::llama2_7b_like() {
  GPTConfig c;
  c.vocab_size = 32000;
  c.seq_len = 4096;
  c.n_layer = 32;
  c.n_head = 32;
  c.d_model = 4096;
  c.d_ff = 16512;
  c.tied_head = false;
  c.bias = false;
  return c;
}

// ---- initialisation ----

torch::Tensor init_normal(uint64_t seed, const std::string& name, at::IntArrayRef shape,
                          double std) {
  const uint64_t mixed = mix64(seed ^ mix64(fnv1a(name)));
  // The CPU generator (mt19937) keeps only the low 32 bits of its seed: fold the high half in
  // so every bit of (seed, name) matters.
  const uint64_t folded = (mixed ^ (mixed >> 32)) & 0xffffffffULL;
  at::Generator gen = at::detail::createCPUGenerator(folded);
  torch::NoGradGuard no_grad;
  return torch::empty(shape, torch::kFloat32).normal_(0.0, std, gen);
}

void init_parameters(torch::nn::Module& module, const GPTConfig& cfg, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layer));
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string name = prefix + item.key();
    torch::Tensor& p = item.value();
    const std::string leaf = name.substr(name.rfind('.') + 1);  // "bias" of "ln1.bias"
    if (leaf == "bias") {
      p.zero_();  // Linear and LayerNorm biases
    } else if (p.dim() == 1) {
      p.fill_(1.0);  // LayerNorm weights
    } else {
      // GPT-2: residual projections are scaled down so the residual stream's variance does
      // not grow with depth (each block adds two of them).
      const bool residual =
          ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.proj.weight");
      p.copy_(init_normal(cfg.seed, name, p.sizes(), residual ? residual_std : 0.02));
    }
  }
}

// ---- functional pieces ----

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training) {
  DTL_CHECK(
      q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
      fmt::format("causal_attention: q, k, v must all be [B, H, T, Dh], got {}, {}, {}",
                  fmt::join(q.sizes(), "x"), fmt::join(k.sizes(), "x"), fmt::join(v.sizes(), "x")));
  const int64_t T = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  // scores[b, h, i, j] = <q_i, k_j> / sqrt(Dh): [B, H, T, T]
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  // Position i may not look at j > i: -inf there gives probability exactly 0 after softmax.
  torch::Tensor future = torch::ones({T, T}, q.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1);
  probs = torch::dropout(probs, dropout_p, training);
  return torch::matmul(probs, v);
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  DTL_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                logits.size(1) == targets.size(1),
            fmt::format("lm_loss: logits must be [B, T, V] and targets [B, T], got {} and {}",
                        fmt::join(logits.sizes(), "x"), fmt::join(targets.sizes(), "x")));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}),
                                              targets.reshape({-1}));
}

// ---- modules ----

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& cfg)
    : n_head(cfg.n_head), head_dim(cfg.head_dim()), dropout(cfg.dropout) {
  const int64_t d = cfg.d_model;
  qkv =
      register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(d, 3 * d).bias(cfg.bias)));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(d, d).bias(cfg.bias)));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2);
  // [B, T, 3d] -> three [B, T, d] -> [B, T, H, Dh] -> [B, H, T, Dh]
  std::vector<torch::Tensor> parts = qkv(x).split(d, /*dim=*/-1);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({B, T, n_head, head_dim}).transpose(1, 2);
  };
  torch::Tensor y =
      causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), dropout, is_training());
  // [B, H, T, Dh] -> [B, T, H * Dh]: heads side by side again, in head order.
  y = y.transpose(1, 2).contiguous().view({B, T, d});
  return proj(y);
}

MLPImpl::MLPImpl(const GPTConfig& cfg) {
  const int64_t d = cfg.d_model, ff = cfg.ff();
  fc = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(d, ff).bias(cfg.bias)));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(ff, d).bias(cfg.bias)));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return proj(torch::gelu(fc(x), "tanh")); }

BlockImpl::BlockImpl(const GPTConfig& cfg) : dropout(cfg.dropout) {
  const std::vector<int64_t> d{cfg.d_model};
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions(d)));
  attn = register_module("attn", CausalSelfAttention(cfg));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions(d)));
  mlp = register_module("mlp", MLP(cfg));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x + torch::dropout(attn(ln1(x)), dropout, is_training());
  return h + torch::dropout(mlp(ln2(h)), dropout, is_training());
}

GPTImpl::GPTImpl(const GPTConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  GlobalRngRestore keep_global_rng;
  const int64_t d = cfg_.d_model;
  wte = register_module("wte", torch::nn::Embedding(cfg_.vocab_size, d));
  wpe = register_module("wpe", torch::nn::Embedding(cfg_.seq_len, d));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg_.n_layer; ++i) blocks->push_back(Block(cfg_));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  if (!cfg_.tied_head) {
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(d, cfg_.vocab_size).bias(false)));
  }
  init_parameters(*this, cfg_);
}

torch::Tensor GPTImpl::embed(const torch::Tensor& idx) {
  DTL_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kInt64,
            fmt::format("GPT: idx must be [B, T] int64, got {} {}", fmt::join(idx.sizes(), "x"),
                        c10::toString(idx.scalar_type())));
  const int64_t T = idx.size(1);
  DTL_CHECK(T <= cfg_.seq_len,
            fmt::format("GPT: sequence length T={} exceeds seq_len={}", T, cfg_.seq_len));
  torch::Tensor pos = torch::arange(T, idx.options());
  return wte(idx) + wpe(pos);  // [B, T, d] + [T, d] broadcasts over the batch
}

torch::Tensor GPTImpl::head(const torch::Tensor& x) {
  torch::Tensor h = ln_f(x);
  // Tied head: logits = h @ wte^T, the same [V, d] matrix that embeds tokens.
  return cfg_.tied_head ? torch::matmul(h, wte->weight.t()) : lm_head(h);
}

Block GPTImpl::block(int64_t i) const {
  DTL_CHECK(i >= 0 && i < cfg_.n_layer,
            fmt::format("GPT::block: index {} out of range [0, {})", i, cfg_.n_layer));
  return Block(blocks->ptr<BlockImpl>(static_cast<size_t>(i)));
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  torch::Tensor x = embed(idx);
  for (const auto& module : *blocks) x = module->as<BlockImpl>()->forward(x);
  return head(x);
}

torch::Tensor GPTImpl::loss(const torch::Tensor& tokens) {
  DTL_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2,
            fmt::format("GPT::loss: tokens must be [B, T + 1] with T >= 1, got {}",
                        fmt::join(tokens.sizes(), "x")));
  const int64_t T = tokens.size(1) - 1;
  return lm_loss(forward(tokens.narrow(1, 0, T)), tokens.narrow(1, 1, T));
}

int64_t num_parameters(torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

}  // namespace model
}  // namespace dtl
