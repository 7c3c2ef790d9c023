// Tests of dtl/model.hpp: deterministic init, parameter layout, causality, training sanity.
#include "dtl/model.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dtl/data.hpp"
#include "dtl/error.hpp"

namespace dtl {
namespace model {
namespace {

bool bit_identical(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (const auto& item : pa) {
    const torch::Tensor* other = pb.find(item.key());
    if (other == nullptr || !torch::equal(item.value(), *other)) return false;
  }
  return true;
}

// A tiny batch from the synthetic corpus: [B, T + 1] tokens.
torch::Tensor corpus_batch(const GPTConfig& cfg, int64_t batch, uint64_t seed = 7) {
  data::SyntheticCorpus corpus(cfg.vocab_size, seed);
  return data::GlobalBatchSampler(corpus, batch, cfg.seq_len).global_batch_at(0);
}

// Expects `fn` to throw dtl::Error whose message contains `needle`.
template <typename Fn>
void expect_error_mentions(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected dtl::Error mentioning \"" << needle << "\"";
  } catch (const dtl::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

TEST(Model, SameConfigIsBitIdenticalAndSeedMatters) {
  GPTConfig cfg = GPTConfig::tiny();
  GPT a(cfg), b(cfg);
  EXPECT_TRUE(bit_identical(*a, *b));
  cfg.seed += 1;
  GPT c(cfg);
  EXPECT_FALSE(bit_identical(*a, *c));
  // Every weight matrix differs, not just one.
  EXPECT_FALSE(torch::equal(a->wte->weight, c->wte->weight));
  EXPECT_FALSE(torch::equal(a->block(1)->mlp->fc->weight, c->block(1)->mlp->fc->weight));
}

TEST(Model, InitNormalIsOrderIndependentAndSliceCompatible) {
  const uint64_t seed = 99;
  torch::Tensor x1 = init_normal(seed, "x.weight", {8, 16}, 0.02);
  torch::Tensor y1 = init_normal(seed, "y.weight", {8, 16}, 0.02);
  torch::Tensor y2 = init_normal(seed, "y.weight", {8, 16}, 0.02);
  torch::Tensor x2 = init_normal(seed, "x.weight", {8, 16}, 0.02);
  EXPECT_TRUE(torch::equal(x1, x2));
  EXPECT_TRUE(torch::equal(y1, y2));
  EXPECT_FALSE(torch::equal(x1, y1));
  EXPECT_NEAR(init_normal(seed, "big", {256, 256}, 0.02).std().item<double>(), 0.02, 0.001);

  // Torch's global RNG neither influences init nor is advanced by building a model.
  torch::manual_seed(5);
  const torch::Tensor expected_draw = torch::rand({4});
  torch::manual_seed(5);
  GPTConfig cfg = GPTConfig::tiny();
  GPT model(cfg);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected_draw));

  // Each parameter is the full init_normal tensor of its name: a rank owning heads [1, 2) of
  // the qkv projection gets its shard by slicing the same rows of the full tensor.
  const std::string name = "blocks.1.attn.qkv.weight";
  torch::Tensor full = init_normal(cfg.seed, name, {3 * cfg.d_model, cfg.d_model}, 0.02);
  EXPECT_TRUE(torch::equal(model->block(1)->attn->qkv->weight, full));
  const int64_t dh = cfg.head_dim(), d = cfg.d_model;
  for (int64_t section = 0; section < 3; ++section) {
    torch::Tensor shard = model->block(1)->attn->qkv->weight.narrow(0, section * d + dh, dh);
    EXPECT_TRUE(torch::equal(shard, full.narrow(0, section * d + dh, dh)));
  }
  const double residual_std = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  EXPECT_TRUE(torch::equal(
      model->block(0)->mlp->proj->weight,
      init_normal(cfg.seed, "blocks.0.mlp.proj.weight", {cfg.d_model, cfg.ff()}, residual_std)));

  // Deeper models share the first blocks' (non-residual) weights: no dependence on how many
  // parameters were created before.
  GPTConfig deeper = cfg;
  deeper.n_layer = 3;
  GPT big(deeper);
  EXPECT_TRUE(torch::equal(big->block(1)->attn->qkv->weight, full));
  EXPECT_TRUE(torch::equal(big->wte->weight, model->wte->weight));

  // init_parameters on a standalone block with its prefix reproduces the full model's block.
  Block alone(cfg);
  init_parameters(*alone, cfg, "blocks.1.");
  EXPECT_TRUE(bit_identical(*alone, *model->block(1)));
}

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_layout(const GPTConfig& c) {
  const int64_t d = c.d_model, ff = c.ff();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out{{"wte.weight", {c.vocab_size, d}},
                                                                {"wpe.weight", {c.seq_len, d}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    out.push_back({b + "ln1.weight", {d}});
    out.push_back({b + "ln1.bias", {d}});
    out.push_back({b + "attn.qkv.weight", {3 * d, d}});
    if (c.bias) out.push_back({b + "attn.qkv.bias", {3 * d}});
    out.push_back({b + "attn.proj.weight", {d, d}});
    if (c.bias) out.push_back({b + "attn.proj.bias", {d}});
    out.push_back({b + "ln2.weight", {d}});
    out.push_back({b + "ln2.bias", {d}});
    out.push_back({b + "mlp.fc.weight", {ff, d}});
    if (c.bias) out.push_back({b + "mlp.fc.bias", {ff}});
    out.push_back({b + "mlp.proj.weight", {d, ff}});
    if (c.bias) out.push_back({b + "mlp.proj.bias", {d}});
  }
  out.push_back({"ln_f.weight", {d}});
  out.push_back({"ln_f.bias", {d}});
  if (!c.tied_head) out.push_back({"lm_head.weight", {c.vocab_size, d}});
  return out;
}

TEST(Model, ParameterNamesAndShapes) {
  GPTConfig tied = GPTConfig::tiny();
  GPTConfig untied = tied;
  untied.tied_head = false;
  untied.bias = false;
  untied.d_ff = 48;
  for (const GPTConfig& cfg : {tied, untied}) {
    GPT model(cfg);
    auto params = model->named_parameters();
    auto expected = expected_layout(cfg);
    ASSERT_EQ(params.size(), expected.size()) << cfg.to_string();
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(params[i].key(), expected[i].first);
      EXPECT_EQ(params[i].value().sizes().vec(), expected[i].second) << expected[i].first;
    }
    EXPECT_TRUE(model->named_parameters().find("blocks.0.ln1.weight")->eq(1).all().item<bool>());
    if (cfg.bias) {
      EXPECT_TRUE(
          model->named_parameters().find("blocks.0.attn.qkv.bias")->eq(0).all().item<bool>());
    }
  }
}

TEST(Model, NumParametersMatchesFormula) {
  auto formula = [](const GPTConfig& c) {
    const int64_t d = c.d_model, ff = c.ff(), V = c.vocab_size, b = c.bias ? 1 : 0;
    const int64_t per_block = 2 * d                    // ln1
                              + 3 * d * d + b * 3 * d  // qkv
                              + d * d + b * d          // attn proj
                              + 2 * d                  // ln2
                              + ff * d + b * ff        // fc
                              + d * ff + b * d;        // mlp proj
    return V * d + c.seq_len * d + c.n_layer * per_block + 2 * d + (c.tied_head ? 0 : V * d);
  };
  GPTConfig tied = GPTConfig::tiny();
  GPTConfig untied;  // the defaults: 256 vocab, 64 positions, 2 x 4 heads x 64
  untied.tied_head = false;
  untied.d_ff = 100;
  for (const GPTConfig& cfg : {tied, untied}) {
    GPT model(cfg);
    EXPECT_EQ(num_parameters(*model), formula(cfg)) << cfg.to_string();
  }
  // Hand-checked numbers: tiny tied = 64*32 + 16*32 + 2*(64 + 3168 + 1056 + 64 + 4224 + 4128)
  // + 64 = 28032.
  EXPECT_EQ(formula(tied), 28032);
}

TEST(Model, CausalChangeOfTokenTOnlyAffectsPositionsFromT) {
  GPTConfig cfg = GPTConfig::tiny();
  GPT model(cfg);
  torch::Tensor idx = corpus_batch(cfg, 3).narrow(1, 0, cfg.seq_len).contiguous();
  torch::NoGradGuard no_grad;
  torch::Tensor base = model->forward(idx);
  for (int64_t t : {0L, 5L, cfg.seq_len - 1}) {
    torch::Tensor changed = idx.clone();
    changed.select(1, t).add_(1).remainder_(cfg.vocab_size);
    torch::Tensor out = model->forward(changed);
    if (t > 0) {
      EXPECT_TRUE(torch::allclose(out.narrow(1, 0, t), base.narrow(1, 0, t), 0.0, 1e-6))
          << "logits before position " << t << " changed";
    }
    EXPECT_FALSE(torch::allclose(out.select(1, t), base.select(1, t))) << "position " << t;
  }
}

TEST(Model, CausalAttentionFirstPositionSeesOnlyItself) {
  torch::manual_seed(3);
  torch::Tensor q = torch::randn({2, 3, 5, 4}), k = torch::randn({2, 3, 5, 4}),
                v = torch::randn({2, 3, 5, 4});
  torch::Tensor y = causal_attention(q, k, v, 0.0, false);
  EXPECT_TRUE(torch::allclose(y.select(2, 0), v.select(2, 0)));
  // The last position is ordinary softmax attention over everything.
  torch::Tensor s = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / 2.0, -1);
  EXPECT_TRUE(torch::allclose(y.select(2, 4), torch::matmul(s, v).select(2, 4), 1e-5, 1e-6));
}

TEST(Model, LossAtInitIsAboutLogV) {
  for (GPTConfig cfg : {GPTConfig::tiny(), GPTConfig()}) {
    GPT model(cfg);
    torch::NoGradGuard no_grad;
    const double loss = model->loss(corpus_batch(cfg, 4)).item<double>();
    EXPECT_NEAR(loss, std::log(static_cast<double>(cfg.vocab_size)), 0.3) << cfg.to_string();
  }
}

TEST(Model, AdamWStepsReduceLossOnAFixedBatch) {
  GPTConfig cfg = GPTConfig::tiny();
  GPT model(cfg);
  torch::Tensor batch = corpus_batch(cfg, 8);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 15; ++step) {
    opt.zero_grad();
    torch::Tensor loss = model->loss(batch);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first - 0.5) << "first " << first << " last " << last;
}

TEST(Model, ValidateNamesTheBrokenConstraint) {
  GPTConfig cfg;
  cfg.n_head = 3;
  expect_error_mentions([&] { cfg.validate(); }, "GPTConfig: n_head=3 does not divide d_model=64");
  expect_error_mentions([&] { GPT model(cfg); }, "n_head=3 does not divide d_model=64");
  cfg = GPTConfig();
  cfg.dropout = 1.0;
  expect_error_mentions([&] { cfg.validate(); }, "dropout=1 must be in [0, 1)");
  cfg = GPTConfig();
  cfg.vocab_size = 0;
  expect_error_mentions([&] { cfg.validate(); }, "vocab_size=0 must be > 0");
  cfg = GPTConfig();
  cfg.n_layer = -1;
  expect_error_mentions([&] { cfg.validate(); }, "n_layer=-1 must be > 0");
  cfg = GPTConfig();
  cfg.d_ff = -4;
  expect_error_mentions([&] { cfg.validate(); }, "d_ff=-4 must be >= 0");
  EXPECT_NO_THROW(GPTConfig().validate());
  EXPECT_NO_THROW(GPTConfig::tiny().validate());
  EXPECT_NE(GPTConfig().to_string().find("d_ff=256"), std::string::npos);
}

TEST(Model, ForwardRejectsSequencesLongerThanSeqLen) {
  GPTConfig cfg = GPTConfig::tiny();
  GPT model(cfg);
  torch::Tensor too_long = torch::zeros({1, cfg.seq_len + 1}, torch::kInt64);
  expect_error_mentions([&] { model->forward(too_long); }, "T=17 exceeds seq_len=16");
  expect_error_mentions([&] { model->forward(torch::zeros({1, 4})); }, "must be [B, T] int64");
  EXPECT_NO_THROW(model->forward(torch::zeros({1, cfg.seq_len}, torch::kInt64)));
}

TEST(Model, DropoutIsOnlyActiveInTrainMode) {
  GPTConfig cfg = GPTConfig::tiny();
  cfg.dropout = 0.5;
  GPT model(cfg);
  torch::Tensor idx = corpus_batch(cfg, 2).narrow(1, 0, cfg.seq_len).contiguous();
  torch::NoGradGuard no_grad;
  model->eval();
  EXPECT_TRUE(torch::equal(model->forward(idx), model->forward(idx)));
  model->train();
  EXPECT_FALSE(torch::equal(model->forward(idx), model->forward(idx)));
}

}  // namespace
}  // namespace model
}  // namespace dtl
