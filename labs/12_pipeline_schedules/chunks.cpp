// chunks.cpp — lab 12: the given part (model chunks, the links, naming actions, the measured
// bubble).
// Your work is in pipeline_schedules.cpp.
#include <fmt/format.h>

#include <algorithm>

#include "dtl/error.hpp"
#include "pipeline_schedules.hpp"

namespace dtl::lab12 {

std::string describe(const Action& a, int v) {
  const char kind = a.kind == Action::Forward ? 'F' : 'B';
  return v == 1 ? fmt::format("{}{}", kind, a.micro)
                : fmt::format("{}{}.{}", kind, a.micro, a.chunk);
}

struct ModelChunks::State {
  Comm* comm = nullptr;
  int v = 1, p = 1, r = 0;
  // One lab 11 stage per chunk, used as a container of its units (run_units).
  std::vector<std::unique_ptr<dtl::lab11::PipelineStage>> stages;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<Comm> embedding_group;  // the ranks holding a copy of the tied matrix
};

ModelChunks::ModelChunks(const GPTConfig& cfg, Comm& comm, int v, const std::vector<Range>& parts)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.comm = &comm;
  s.v = v;
  s.p = comm.size();
  s.r = comm.rank();
  DTL_CHECK(v >= 1, fmt::format("ModelChunks: v={} must be >= 1", v));
  dtl::lab11::check_parts(cfg, parts, s.p * v);  // p v runs cutting the whole model, in order
  s.module = std::make_shared<torch::nn::Module>("ModelChunks");
  for (int c = 0; c < v; ++c) {
    const int vs = c * s.p + s.r;
    s.stages.push_back(std::make_unique<dtl::lab11::PipelineStage>(
        cfg, comm, parts[static_cast<size_t>(vs)], vs, s.p * v));
    // Not owned twice: the module lives in the stage, the holder only registers it.
    s.module->register_module(
        fmt::format("chunk_{}", c),
        std::shared_ptr<torch::nn::Module>(&s.stages.back()->module(), [](torch::nn::Module*) {}));
  }
  bool holder = false;
  for (const auto& st : s.stages)
    for (const auto& [name, p] : st->named_parameters()) holder = holder || name == "wte.weight";
  holder = holder && cfg.tied_head && s.p * v > 1;
  s.embedding_group = comm.split(holder ? 0 : -1, s.r, comm.name() + "/tied-embedding");
}

ModelChunks::~ModelChunks() = default;
int ModelChunks::num_chunks() const { return s_->v; }
int ModelChunks::ranks() const { return s_->p; }
int ModelChunks::rank() const { return s_->r; }
int ModelChunks::virtual_stage(int chunk) const { return chunk * s_->p + s_->r; }
bool ModelChunks::is_first(int chunk) const { return virtual_stage(chunk) == 0; }
bool ModelChunks::is_last(int chunk) const { return virtual_stage(chunk) == s_->p * s_->v - 1; }
int ModelChunks::prev_rank(int) const { return (s_->r + s_->p - 1) % s_->p; }
int ModelChunks::next_rank(int) const { return (s_->r + 1) % s_->p; }
dtl::lab11::PipelineStage& ModelChunks::stage(int chunk) {
  DTL_CHECK(chunk >= 0 && chunk < s_->v,
            fmt::format("ModelChunks::stage: chunk {} out of range [0, {})", chunk, s_->v));
  return *s_->stages[static_cast<size_t>(chunk)];
}
torch::nn::Module& ModelChunks::module() { return *s_->module; }
Comm& ModelChunks::comm() const { return *s_->comm; }

std::vector<std::pair<std::string, torch::Tensor>> ModelChunks::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& st : s_->stages)
    for (auto& np : st->named_parameters()) out.push_back(np);
  return out;
}

void ModelChunks::sum_tied_embedding_grads() {
  if (!s_->embedding_group) return;
  // This rank's copies (two on one rank when p = 1 and v > 1), summed locally, then over the
  // holders; every copy gets the total.
  std::vector<torch::Tensor> copies;
  for (auto& [name, p] : named_parameters())
    if (name == "wte.weight" && p.grad().defined()) copies.push_back(p);
  if (copies.empty()) return;
  torch::Tensor total = copies[0].grad().clone();
  for (size_t i = 1; i < copies.size(); ++i) total += copies[i].grad();
  if (s_->embedding_group->size() > 1) s_->embedding_group->all_reduce(total);
  for (auto& c : copies) c.mutable_grad().copy_(total);
}

PipelineLinks::PipelineLinks(Comm& comm) : r_(comm.rank()), p_(comm.size()) {
  if (p_ == 1) return;  // one rank: chunks hand over in memory
  // Every rank takes part in every split (collective), in the same order.
  for (int i = 0; i < p_; ++i) {
    const int j = (i + 1) % p_;
    activations_.push_back(
        comm.split(0, comm.rank(), fmt::format("{}/act {}->{}", comm.name(), i, j)));
    grads_.push_back(comm.split(0, comm.rank(), fmt::format("{}/grad {}->{}", comm.name(), j, i)));
  }
}

static Comm& link(const std::vector<std::shared_ptr<Comm>>& links, int i, const char* what) {
  DTL_CHECK(!links.empty(),
            fmt::format("PipelineLinks::{}: a pipeline of one rank has no links", what));
  return *links[static_cast<size_t>(i)];
}
Comm& PipelineLinks::activations_to_next() { return link(activations_, r_, "activations_to_next"); }
Comm& PipelineLinks::activations_from_prev() {
  return link(activations_, (r_ + p_ - 1) % p_, "activations_from_prev");
}
Comm& PipelineLinks::grads_to_prev() { return link(grads_, (r_ + p_ - 1) % p_, "grads_to_prev"); }
Comm& PipelineLinks::grads_from_next() { return link(grads_, r_, "grads_from_next"); }

double measured_bubble(const StepResult& mine, Comm& comm) {
  double busy = 0;
  for (const ActionTiming& t : mine.timeline) busy += t.end - t.start;
  // Both over the pipeline's ranks (comm), which need not be every rank of the run.
  torch::Tensor total_busy = torch::tensor({busy}, torch::kFloat64).to(comm.device());
  torch::Tensor longest = torch::tensor({mine.seconds}, torch::kFloat64).to(comm.device());
  comm.all_reduce(total_busy);
  comm.all_reduce(longest, ReduceOp::Max);
  return 1.0 -
         total_busy.item<double>() / (static_cast<double>(comm.size()) * longest.item<double>());
}

}  // namespace dtl::lab12
