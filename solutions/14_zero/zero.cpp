// Lab 14 reference solution: ZeRO stages 1-3 over per-unit flat buffers.
#include "zero.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <string>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab14 {

int64_t shard_size(int64_t numel, int world) {
  DTL_CHECK(numel >= 0, fmt::format("shard_size: numel={} must be >= 0", numel));
  DTL_CHECK(world >= 1, fmt::format("shard_size: world={} must be >= 1", world));
  return (numel + world - 1) / world;
}

ModelStateBytes model_state_bytes(int stage, const std::vector<int64_t>& unit_numels, int world,
                                  const Precision& p) {
  DTL_CHECK(stage >= 0 && stage <= 3, fmt::format("model_state_bytes: stage={} must be 0-3", stage));
  int64_t psi = 0, S = 0;
  for (int64_t n : unit_numels) {
    psi += n;
    S += shard_size(n, world);
  }
  const int64_t P = world * S;  // the padded full units every rank holds in stages 1-2
  ModelStateBytes b;
  b.params = p.param_bytes * (stage == 0 ? psi : stage < 3 ? P : S);
  b.grads = p.grad_bytes * (stage < 2 ? psi : S);
  b.optimizer = p.optimizer_bytes * (stage == 0 ? psi : S);
  return b;
}

namespace {

// One call of unit_calls(): what its autograd node needs in backward.
// The autograd node owns it (through ctx->saved_data), so it lives exactly as long as the
// backward that needs it may still run, whatever step() or zero_grad() do in between.
struct Call : torch::CustomClassHolder {
  std::vector<int64_t> units;
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  bool build_graph = true;  // grad mode at loss(): under NoGradGuard, no graph is kept
  torch::Tensor input;      // the detached input the call's own graph starts from
  torch::Tensor output;     // the call's output, with that graph
};

}  // namespace

namespace {

// Everything the optimizer and its autograd nodes share (ZeroOptimizer::State is this).
struct Sharded {
  GPT model{nullptr};
  Comm* comm = nullptr;
  int stage = 1;
  int world = 1, rank = 0;
  std::vector<Unit> units;
  std::vector<std::vector<torch::Tensor>> params;  // the module's parameters, per unit
  std::vector<std::vector<int64_t>> calls;
  std::vector<int64_t> shard_numel;  // S_u
  std::vector<torch::Tensor> full;   // world * S_u: the unit's parameters, then padding
  std::vector<torch::Tensor> shards;
  std::unique_ptr<torch::optim::AdamW> adam;

  // Stage 3: the unit's full buffer back in memory, filled from every rank's shard.
  void gather(int64_t u) {
    alloc_storage(full[u]);
    comm->all_gather(full[u], shards[u].detach());
  }
  void release(int64_t u) { free_storage(full[u]); }

  // The mean over ranks of a flat padded gradient, this rank's slice of it.
  torch::Tensor reduce_scatter_mean(int64_t u, const torch::Tensor& flat) {
    torch::Tensor out = torch::empty({shard_numel[u]}, flat.options());
    comm->reduce_scatter(out, flat, ReduceOp::Sum);
    return out.div_(world);
  }

  // The unit's gradients back to back, zeros where a parameter has none, padded.
  torch::Tensor flatten(int64_t u, const std::vector<torch::Tensor>& grads) {
    torch::Tensor flat = torch::zeros({world * shard_numel[u]}, full[u].options());
    int64_t offset = 0;
    for (size_t i = 0; i < params[u].size(); ++i) {
      const int64_t n = params[u][i].numel();
      if (grads[i].defined()) flat.narrow(0, offset, n).copy_(grads[i].reshape({-1}));
      offset += n;
    }
    return flat;
  }
};

// Stages 2-3: one call of the model as an autograd node whose inputs are the call's input and
// the shards of its units. Forward gathers (stage 3), runs the call with its own graph and
// frees; backward gathers again, differentiates that graph, reduce-scatters each unit's
// gradients and hands autograd the owned slices as the shards' gradients.
struct UnitCall : public torch::autograd::Function<UnitCall> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               at::TensorList shards, const c10::intrusive_ptr<Call>& call,
                               int64_t state_address) {
    (void)shards;  // inputs only so that autograd routes their gradients
    auto* s = reinterpret_cast<Sharded*>(state_address);
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    ctx->saved_data["state"] = state_address;
    if (s->stage == 3)
      for (int64_t u : call->units) s->gather(u);
    {
      torch::AutoGradMode grad_on(call->build_graph);
      call->input = x.is_floating_point() ? x.detach().requires_grad_(x.requires_grad()) : x;
      call->output = call->fn(call->input);
    }
    if (s->stage == 3)
      for (int64_t u : call->units) s->release(u);
    return call->output.detach();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* call = static_cast<Call*>(ctx->saved_data["call"].toCapsule().get());
    auto* s = reinterpret_cast<Sharded*>(ctx->saved_data["state"].toInt());
    if (s->stage == 3)
      for (int64_t u : call->units) s->gather(u);
    const bool want_input = call->input.requires_grad();
    std::vector<torch::Tensor> inputs;
    if (want_input) inputs.push_back(call->input);
    for (int64_t u : call->units)
      for (const auto& p : s->params[u]) inputs.push_back(p);
    std::vector<torch::Tensor> grads =
        torch::autograd::grad({call->output}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    call->input = call->output = torch::Tensor();  // the call's graph: done with it
    if (s->stage == 3)
      for (int64_t u : call->units) s->release(u);

    torch::autograd::variable_list out;
    out.push_back(want_input ? grads[0] : torch::Tensor());
    size_t k = want_input ? 1 : 0;
    for (int64_t u : call->units) {
      std::vector<torch::Tensor> unit_grads(grads.begin() + static_cast<int64_t>(k),
                                            grads.begin() + static_cast<int64_t>(k + s->params[u].size()));
      k += s->params[u].size();
      out.push_back(s->reduce_scatter_mean(u, s->flatten(u, unit_grads)));
    }
    out.push_back(torch::Tensor());  // call
    out.push_back(torch::Tensor());  // state_address
    return out;
  }
};

}  // namespace

struct ZeroOptimizer::State : Sharded {};

ZeroOptimizer::ZeroOptimizer(GPT model, Comm& comm, int stage, const OptimConfig& config)
    : s_(std::make_unique<State>()) {
  DTL_CHECK(stage >= 1 && stage <= 3, fmt::format("ZeroOptimizer: stage={} must be 1, 2 or 3", stage));
  DTL_CHECK(config.weight_decay == 0,
            fmt::format("ZeroOptimizer: weight_decay={} must be 0: a flat shard mixes matrices "
                        "(decayed) with biases and gains (not decayed)", config.weight_decay));
  State& s = *s_;
  s.model = model;
  s.comm = &comm;
  s.stage = stage;
  s.world = comm.size();
  s.rank = comm.rank();
  s.units = gpt_units(model);
  s.calls = unit_calls(model);

  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) comm.broadcast(p.detach(), 0);

  std::map<std::string, torch::Tensor> by_name;
  for (const auto& item : model->named_parameters()) by_name[item.key()] = item.value();
  size_t assigned = 0;
  for (const Unit& unit : s.units) {
    std::vector<torch::Tensor> ps;
    int64_t numel = 0;
    for (const auto& name : unit.params) {
      DTL_CHECK(by_name.count(name), fmt::format("ZeroOptimizer: unit {} names {}, which the "
                                                 "model does not have", unit.name, name));
      ps.push_back(by_name[name]);
      numel += ps.back().numel();
    }
    assigned += ps.size();
    const int64_t S = shard_size(numel, s.world);
    torch::Tensor full = torch::zeros({s.world * S}, model->parameters().front().options().requires_grad(false));
    int64_t offset = 0;
    for (auto& p : ps) {  // re-point the parameter into the buffer: writing one writes the other
      full.narrow(0, offset, p.numel()).copy_(p.detach().reshape({-1}));
      p.set_data(full.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
    torch::Tensor own = full.narrow(0, s.rank * S, S);
    // Stages 1-2: the shard IS the owned part of the buffer (AdamW writes the parameters).
    // Stage 3: the shard is the only copy; the buffer comes back only while the unit runs.
    s.shards.push_back((stage == 3 ? own.clone() : own.detach()).requires_grad_(true));
    if (stage == 3) free_storage(full);
    s.params.push_back(std::move(ps));
    s.shard_numel.push_back(S);
    s.full.push_back(full);
  }
  DTL_CHECK(assigned == model->parameters().size(),
            fmt::format("ZeroOptimizer: {} of the model's {} parameters are in no unit", 
                        model->parameters().size() - assigned, model->parameters().size()));
  s.adam = make_adamw(s.shards, config);
}

ZeroOptimizer::~ZeroOptimizer() = default;

torch::Tensor ZeroOptimizer::loss(const torch::Tensor& tokens) {
  State& s = *s_;
  if (s.stage == 1) return s.model->loss(tokens);
  DTL_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2,
            fmt::format("ZeroOptimizer::loss: tokens must be [B, T + 1] with T >= 1, got {}",
                        fmt::join(tokens.sizes(), "x")));
  const int64_t T = tokens.size(1) - 1;
  const int64_t L = s.model->config().n_layer;
  std::shared_ptr<model::GPTImpl> model = s.model.ptr();  // the calls run after loss() returns
  torch::Tensor x = tokens.narrow(1, 0, T);
  for (size_t c = 0; c < s.calls.size(); ++c) {
    auto call = c10::make_intrusive<Call>();
    call->units = s.calls[c];
    call->build_graph = torch::GradMode::is_enabled();
    if (c == 0) {
      call->fn = [model](const torch::Tensor& idx) { return model->embed(idx); };
    } else if (static_cast<int64_t>(c) <= L) {
      call->fn = [model, c](const torch::Tensor& h) {
        return model->block(static_cast<int64_t>(c) - 1)->forward(h);
      };
    } else {
      call->fn = [model](const torch::Tensor& h) { return model->head(h); };
    }
    std::vector<torch::Tensor> shards;
    for (int64_t u : call->units) shards.push_back(s.shards[u]);
    x = UnitCall::apply(x, at::TensorList(shards), call,
                        reinterpret_cast<int64_t>(static_cast<Sharded*>(&s)));
  }
  return model::lm_loss(x, tokens.narrow(1, 1, T));
}

void ZeroOptimizer::step() {
  State& s = *s_;
  torch::NoGradGuard no_grad;
  if (s.stage == 1) {
    for (size_t u = 0; u < s.units.size(); ++u) {
      std::vector<torch::Tensor> grads;
      for (const auto& p : s.params[u]) grads.push_back(p.grad());
      s.shards[u].mutable_grad() = s.reduce_scatter_mean(static_cast<int64_t>(u),
                                                         s.flatten(static_cast<int64_t>(u), grads));
    }
  }
  s.adam->step();
  if (s.stage == 1)
    for (auto& shard : s.shards) shard.mutable_grad().reset();  // scratch: .grad stays in full
  if (s.stage < 3)
    for (size_t u = 0; u < s.units.size(); ++u)  // input: a copy, it must not alias the output
      s.comm->all_gather(s.full[u], s.shards[u].detach().clone());
}

void ZeroOptimizer::zero_grad() {
  State& s = *s_;
  if (s.stage == 1) {
    for (auto& p : s.model->parameters()) p.mutable_grad().reset();
  } else {
    for (auto& shard : s.shards) shard.mutable_grad().reset();
  }
}

void ZeroOptimizer::set_lr(double lr) { dtl::set_lr(*s_->adam, lr); }
int ZeroOptimizer::stage() const { return s_->stage; }
const std::vector<Unit>& ZeroOptimizer::units() const { return s_->units; }
const std::vector<torch::Tensor>& ZeroOptimizer::shards() const { return s_->shards; }

torch::Tensor ZeroOptimizer::full_parameters() {
  State& s = *s_;
  torch::NoGradGuard no_grad;
  if (s.stage == 3)
    for (size_t u = 0; u < s.units.size(); ++u) s.gather(static_cast<int64_t>(u));
  std::vector<torch::Tensor> flat;
  for (const auto& p : s.model->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  if (s.stage == 3)
    for (size_t u = 0; u < s.units.size(); ++u) s.release(static_cast<int64_t>(u));
  return torch::cat(flat);
}

}  // namespace dtl::lab14
