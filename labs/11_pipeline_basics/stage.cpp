// stage.cpp — lab 11: the given part of a pipeline stage (building the units, running them).
// Your work is in pipeline.cpp.
#include <fmt/format.h>

#include <cmath>

#include "dtl/error.hpp"
#include "dtl/runtime.hpp"
#include "pipeline.hpp"
#include "stage_state.hpp"

namespace dtl::lab11 {

int64_t num_units(const GPTConfig& cfg) { return cfg.n_layer + 2; }

std::vector<double> unit_costs(const GPTConfig& cfg) {
  const double d = static_cast<double>(cfg.d_model), T = static_cast<double>(cfg.seq_len);
  const double V = static_cast<double>(cfg.vocab_size);
  std::vector<double> costs;
  costs.push_back(2 * d);  // lookup + add
  for (int64_t i = 0; i < cfg.n_layer; ++i) costs.push_back(24 * d * d + 4 * T * d);
  costs.push_back(2 * d * V);  // logits
  return costs;
}

std::vector<Range> even_parts(const GPTConfig& cfg, int stages) {
  std::vector<Range> parts;
  for (int s = 0; s < stages; ++s) parts.push_back(split_range(num_units(cfg), stages, s));
  return parts;
}

void check_parts(const GPTConfig& cfg, const std::vector<Range>& parts, int stages) {
  DTL_CHECK(
      static_cast<int>(parts.size()) == stages,
      fmt::format("pipeline parts: parts has {} entries for {} stages", parts.size(), stages));
  int64_t next = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    DTL_CHECK(parts[s].begin == next && parts[s].end > parts[s].begin,
              fmt::format("pipeline parts: parts[{}] = [{}, {}) is not a non-empty run starting "
                          "at unit {}",
                          s, parts[s].begin, parts[s].end, next));
    next = parts[s].end;
  }
  DTL_CHECK(next == num_units(cfg), fmt::format("pipeline parts: parts cover {} units, the model "
                                                "has {}",
                                                next, num_units(cfg)));
}

namespace {

// This rank's run of a checked cut (the delegating constructor needs it as one expression).
Range own_part(const GPTConfig& cfg, const std::vector<Range>& parts, const Comm& comm) {
  check_parts(cfg, parts, comm.size());
  return parts[static_cast<size_t>(comm.rank())];
}

}  // namespace

PipelineStage::PipelineStage(const GPTConfig& cfg, Comm& comm, const std::vector<Range>& parts)
    : PipelineStage(cfg, comm, own_part(cfg, parts, comm), comm.rank(), comm.size()) {
  // Megatron's embedding group: the two holders of the tied matrix. Collective on every rank.
  State& s = *s_;
  const bool holder = cfg.tied_head && s.stages > 1 && (s.stage == 0 || s.stage == s.stages - 1);
  s.embedding_group = comm.split(holder ? 0 : -1, s.stage, comm.name() + "/embedding");
}

PipelineStage::PipelineStage(const GPTConfig& cfg, Comm& comm, Range units, int stage, int stages)
    : s_(std::make_unique<State>()) {
  cfg.validate();
  DTL_CHECK(units.begin >= 0 && units.end > units.begin && units.end <= num_units(cfg),
            fmt::format("PipelineStage: units [{}, {}) are not a non-empty run of the model's {}",
                        units.begin, units.end, num_units(cfg)));
  State& s = *s_;
  s.cfg = cfg;
  s.comm = &comm;
  s.stage = stage;
  s.stages = stages;
  s.device = Runtime::get().device();
  s.units = units;

  // The units' modules, built on the CPU, initialised by name exactly as the serial GPT, then
  // moved to the device.
  const int64_t L = cfg.n_layer;
  s.module = std::make_shared<torch::nn::Module>("PipelineStage");
  const bool has_embedding = s.units.begin == 0;
  const bool has_head = s.units.end == L + 2;
  if (has_embedding || (has_head && cfg.tied_head)) {
    s.wte = s.module->register_module("wte", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    model::init_parameters(*s.wte, cfg, "wte.");
    s.named.emplace_back("wte.weight", s.wte->weight);
  }
  if (has_embedding) {
    s.wpe = s.module->register_module("wpe", torch::nn::Embedding(cfg.seq_len, cfg.d_model));
    model::init_parameters(*s.wpe, cfg, "wpe.");
    s.named.emplace_back("wpe.weight", s.wpe->weight);
  }
  s.first_block = std::max<int64_t>(s.units.begin, 1) - 1;
  for (int64_t u = std::max<int64_t>(s.units.begin, 1); u < std::min(s.units.end, L + 1); ++u) {
    const int64_t i = u - 1;
    auto block = s.module->register_module(fmt::format("block_{}", i), model::Block(cfg));
    const std::string prefix = fmt::format("blocks.{}.", i);
    model::init_parameters(*block, cfg, prefix);
    for (auto& p : block->named_parameters()) s.named.emplace_back(prefix + p.key(), p.value());
    s.blocks.push_back(block);
  }
  if (has_head) {
    s.ln_f = s.module->register_module(
        "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    model::init_parameters(*s.ln_f, cfg, "ln_f.");
    for (auto& p : s.ln_f->named_parameters()) s.named.emplace_back("ln_f." + p.key(), p.value());
    if (!cfg.tied_head) {
      s.lm_head = s.module->register_module(
          "lm_head",
          torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));
      model::init_parameters(*s.lm_head, cfg, "lm_head.");
      s.named.emplace_back("lm_head.weight", s.lm_head->weight);
    }
  }
  s.module->to(s.device);
}

PipelineStage::~PipelineStage() = default;

int PipelineStage::stage() const { return s_->stage; }
int PipelineStage::num_stages() const { return s_->stages; }
bool PipelineStage::is_first() const { return s_->stage == 0; }
bool PipelineStage::is_last() const { return s_->stage == s_->stages - 1; }
Range PipelineStage::units() const { return s_->units; }
Comm& PipelineStage::comm() const { return *s_->comm; }
const GPTConfig& PipelineStage::config() const { return s_->cfg; }
torch::nn::Module& PipelineStage::module() { return *s_->module; }
std::vector<std::pair<std::string, torch::Tensor>> PipelineStage::named_parameters() const {
  return s_->named;
}
Comm* PipelineStage::embedding_group() const { return s_->embedding_group.get(); }
int64_t PipelineStage::in_flight() const { return static_cast<int64_t>(s_->saved.size()); }
int64_t PipelineStage::peak_in_flight() const { return s_->peak; }

torch::Tensor PipelineStage::run_units(const torch::Tensor& x) {
  State& s = *s_;
  const int64_t L = s.cfg.n_layer;
  torch::Tensor h = x;
  for (int64_t u = s.units.begin; u < s.units.end; ++u) {
    if (u == 0) {
      const int64_t T = h.size(1);
      h = s.wte(h) + s.wpe(torch::arange(T, h.options()));
    } else if (u <= L) {
      h = s.blocks[static_cast<size_t>(u - 1 - s.first_block)]->forward(h);
    } else {
      h = s.ln_f(h);
      h = s.cfg.tied_head ? torch::matmul(h, s.wte->weight.t()) : s.lm_head(h);
    }
  }
  return h;
}

void PipelineStage::finish_step() {
  DTL_CHECK(
      s_->saved.empty(),
      fmt::format("PipelineStage::finish_step: {} micro-batch(es) still in flight on stage {}",
                  s_->saved.size(), s_->stage));
  s_->next_micro = 0;
  s_->peak = 0;
}

}  // namespace dtl::lab11
