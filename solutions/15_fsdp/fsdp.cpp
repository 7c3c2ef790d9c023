// Lab 15 reference solution: FSDP over per-unit FlatParameters, driven by autograd hooks.
//
//   construction   broadcast -> units (policy + root) -> strategies -> communicators ->
//                  FlatParameters (shard, release) -> AdamW over the pieces -> hooks
//   forward        root gathered; per unit: gather (or wait for its prefetch), maybe prefetch
//                  the next, run its blocks, hook its output for backward, release
//   backward       output hook: gather again, prefetch the unit before it; last gradient of a
//                  unit: flatten, reduce-scatter (+ all-reduce across nodes), add into the
//                  shard's gradient, drop the parameters' gradients, release
#include "fsdp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/log.hpp"
#include "dtl/trace.hpp"

namespace dtl::lab15 {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool sharded(ShardingStrategy s) { return s != ShardingStrategy::NO_SHARD; }
// The strategies whose units are released after forward, gathered again in backward, and
// prefetched.
bool reshards_after_forward(ShardingStrategy s) {
  return s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD;
}

void check_formula_args(const std::vector<int64_t>& unit_numels,
                        const std::vector<ShardingStrategy>& strategies, int shard, int world) {
  DTL_CHECK(unit_numels.size() == strategies.size(),
            fmt::format("{} unit sizes but {} strategies: strategies needs one per unit",
                        unit_numels.size(), strategies.size()));
  DTL_CHECK(shard >= 1, fmt::format("shard={} must be >= 1", shard));
  DTL_CHECK(world >= 1, fmt::format("world={} must be >= 1", world));
}

}  // namespace

// ---------------------------------------------------------------- Task 1: the formulas

ParamBytes param_bytes(const std::vector<int64_t>& unit_numels,
                       const std::vector<ShardingStrategy>& strategies, int shard, int world,
                       bool prefetch, int limit_all_gathers, int64_t element_bytes) {
  check_formula_args(unit_numels, strategies, shard, world);
  ParamBytes b;
  std::vector<int64_t> padded(unit_numels.size(), 0);  // P of the units released after forward
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const int64_t n = unit_numels[u];
    if (!sharded(strategies[u])) {
      b.sharded += n;  // the "shard" of a NO_SHARD unit is the full unit, always there
      continue;
    }
    const int64_t S = ceil_div(n, shard), P = shard * S;
    b.sharded += S;
    if (u == 0 || strategies[u] == ShardingStrategy::SHARD_GRAD_OP) {
      b.unsharded += P;  // the root all step; SHARD_GRAD_OP units all by the end of forward
    } else {
      padded[u] = P;
    }
  }
  // FULL_SHARD / HYBRID_SHARD: one unit at a time, or the unit and the one it prefetches.
  const bool pairs = prefetch && (limit_all_gathers == 0 || limit_all_gathers >= 2);
  int64_t most = 0;
  for (size_t u = 1; u < padded.size(); ++u) {
    const int64_t next = pairs && u + 1 < padded.size() ? padded[u + 1] : 0;
    if (padded[u] > 0) most = std::max(most, padded[u] + next);
  }
  b.unsharded += most;
  b.sharded *= element_bytes;
  b.unsharded *= element_bytes;
  return b;
}

StepTraffic step_traffic(const std::vector<int64_t>& unit_numels,
                         const std::vector<ShardingStrategy>& strategies, int shard, int world,
                         int64_t element_bytes) {
  check_formula_args(unit_numels, strategies, shard, world);
  StepTraffic t;
  for (size_t u = 0; u < unit_numels.size(); ++u) {
    const int64_t n = unit_numels[u];
    const ShardingStrategy s = strategies[u];
    if (!sharded(s)) {
      if (world > 1) t.all_reduce += n;
      continue;
    }
    const int64_t S = ceil_div(n, shard), P = shard * S;
    if (shard > 1) {
      const int gathers = u == 0 || s == ShardingStrategy::SHARD_GRAD_OP ? 1 : 2;
      t.all_gather += gathers * P;
      t.reduce_scatter += P;
    }
    if (s == ShardingStrategy::HYBRID_SHARD && world / shard > 1) t.all_reduce += S;
  }
  t.all_gather *= element_bytes;
  t.reduce_scatter *= element_bytes;
  t.all_reduce *= element_bytes;
  return t;
}

// ---------------------------------------------------------------- Task 2: wrap policies

namespace {

// The names of block b's parameters, in named_parameters() order.
std::vector<std::string> block_params(GPT& model, int64_t b) {
  const std::string prefix = fmt::format("blocks.{}.", b);
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters())
    if (item.key().rfind(prefix, 0) == 0) names.push_back(item.key());
  return names;
}

Unit blocks_unit(GPT& model, int64_t first, int64_t last) {
  Unit unit;
  unit.name = first == last ? fmt::format("blocks.{}", first) : fmt::format("blocks.{}-{}", first, last);
  for (int64_t b = first; b <= last; ++b)
    for (auto& name : block_params(model, b)) unit.params.push_back(name);
  return unit;
}

}  // namespace

std::vector<Unit> transformer_policy(GPT& model) {
  std::vector<Unit> units;
  for (int64_t b = 0; b < model->config().n_layer; ++b) units.push_back(blocks_unit(model, b, b));
  return units;
}

std::vector<Unit> size_based_policy(GPT& model, int64_t min_numel) {
  DTL_CHECK(min_numel >= 1, fmt::format("size_based_policy: min_numel={} must be >= 1", min_numel));
  auto named = model->named_parameters();
  std::vector<Unit> units;
  int64_t first = 0, numel = 0;
  const int64_t L = model->config().n_layer;
  for (int64_t b = 0; b < L; ++b) {
    for (auto& name : block_params(model, b)) numel += named[name].numel();
    if (numel >= min_numel || b == L - 1) {  // the group is big enough (or the blocks ran out)
      units.push_back(blocks_unit(model, first, b));
      first = b + 1;
      numel = 0;
    }
  }
  return units;
}

// ---------------------------------------------------------------- Task 3: FlatParameter

struct FlatParameter::State {
  std::string name;
  std::vector<std::string> param_names;
  std::vector<torch::Tensor> params;
  int world = 1, rank = 0;
  bool keep_full = false;
  int64_t numel = 0, S = 0;
  torch::Tensor full, shard;
  std::vector<ShardPiece> pieces;
};

FlatParameter::FlatParameter(std::string name, std::vector<std::string> param_names,
                             std::vector<torch::Tensor> params, int shard_world, int shard_rank,
                             bool keep_full)
    : s_(std::make_unique<State>()) {
  DTL_CHECK(!params.empty(), fmt::format("FlatParameter {}: empty: no parameters", name));
  DTL_CHECK(shard_world >= 1 && shard_rank >= 0 && shard_rank < shard_world,
            fmt::format("FlatParameter {}: shard rank {} of shard_world {} (need 0 <= rank < world)",
                        name, shard_rank, shard_world));
  DTL_CHECK(!keep_full || shard_world == 1,
            fmt::format("FlatParameter {}: keep_full (NO_SHARD) needs shard_world 1, got {}", name,
                        shard_world));
  for (const auto& p : params)
    DTL_CHECK(p.is_floating_point() && p.scalar_type() == params[0].scalar_type() &&
                  p.device() == params[0].device(),
              fmt::format("FlatParameter {}: every parameter must have one floating dtype and "
                          "device: {} on {} vs {} on {}", name, c10::toString(p.scalar_type()),
                          p.device().str(), c10::toString(params[0].scalar_type()),
                          params[0].device().str()));
  State& s = *s_;
  s.name = std::move(name);
  s.param_names = std::move(param_names);
  s.params = std::move(params);
  s.world = shard_world;
  s.rank = shard_rank;
  s.keep_full = keep_full;
  for (const auto& p : s.params) s.numel += p.numel();
  s.S = ceil_div(s.numel, s.world);

  torch::NoGradGuard no_grad;
  s.full = torch::zeros({s.world * s.S}, s.params[0].options().requires_grad(false));
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (auto& p : s.params) {  // re-point the parameter into the buffer: one memory for both
    offsets.push_back(offset);
    s.full.narrow(0, offset, p.numel()).copy_(p.detach().reshape({-1}));
    p.set_data(s.full.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  // The shard: the full buffer itself (NO_SHARD), or a copy of this rank's slice, which lives on
  // when the full buffer is released.
  s.shard = keep_full ? bucket_view(s.full, 0, {s.S})
                      : s.full.narrow(0, s.rank * s.S, s.S).clone();
  s.shard.requires_grad_(true);
  // Each parameter's overlap with [rank * S, (rank + 1) * S): FSDP's _shard_param_infos.
  const int64_t lo = s.rank * s.S, hi = lo + s.S;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const int64_t begin = std::max(lo, offsets[i]), end = std::min(hi, offsets[i] + s.params[i].numel());
    if (begin >= end) continue;
    ShardPiece piece;
    piece.param = static_cast<int>(i);
    piece.param_offset = begin - offsets[i];
    piece.shard_offset = begin - lo;
    piece.numel = end - begin;
    // Not an autograd view of the shard (bucket_view): a leaf of its own that AdamW can own.
    piece.view = bucket_view(s.shard.detach(), piece.shard_offset, {piece.numel}).requires_grad_(true);
    s.pieces.push_back(std::move(piece));
  }
}

FlatParameter::~FlatParameter() = default;
FlatParameter::FlatParameter(FlatParameter&&) noexcept = default;
FlatParameter& FlatParameter::operator=(FlatParameter&&) noexcept = default;

const std::string& FlatParameter::name() const { return s_->name; }
const std::vector<std::string>& FlatParameter::param_names() const { return s_->param_names; }
const std::vector<torch::Tensor>& FlatParameter::params() const { return s_->params; }
int64_t FlatParameter::numel() const { return s_->numel; }
int64_t FlatParameter::shard_numel() const { return s_->S; }
int64_t FlatParameter::padded_numel() const { return s_->world * s_->S; }
int FlatParameter::shard_world() const { return s_->world; }
int FlatParameter::shard_rank() const { return s_->rank; }
const torch::Tensor& FlatParameter::full() const { return s_->full; }
const torch::Tensor& FlatParameter::shard() const { return s_->shard; }
const std::vector<ShardPiece>& FlatParameter::pieces() const { return s_->pieces; }
bool FlatParameter::is_unsharded() const { return has_storage(s_->full); }
void FlatParameter::release() {
  if (!s_->keep_full && has_storage(s_->full)) free_storage(s_->full);
}
void FlatParameter::allocate() {
  if (!has_storage(s_->full)) alloc_storage(s_->full);
}

// ---------------------------------------------------------------- Tasks 4-6: the wrapper

struct FullyShardedDataParallel::State {
  GPT model{nullptr};
  FSDPConfig config;
  int world = 1, rank = 0;
  std::vector<Unit> units;
  std::vector<ShardingStrategy> strategies;
  std::vector<FlatParameter> flats;
  std::vector<int64_t> unit_of_block;  // block -> unit (0: the root holds it)
  std::shared_ptr<Comm> shard_comm, replicate_comm;
  std::unique_ptr<torch::optim::AdamW> adam;
  std::vector<std::unique_ptr<GradReadyHook>> hooks;

  // One backward's bookkeeping.
  std::vector<Work> gathers;     // per unit: its all-gather in flight (prefetch), if any
  std::vector<size_t> ready;     // per unit: parameters whose gradient has arrived
  std::vector<bool> reduced;     // per unit: gradient reduced in this backward
  bool end_queued = false;

  // For traces (lab 16 reads them): backward's compute, as the spans between the points where
  // this wrapper blocks on communication (a gather before a unit's backward, a reduction after
  // it). Forward's compute is marked by DTL_SCOPEs in loss().
  double span_start = -1;
  void end_compute_span(const std::string& name) {
    if (span_start >= 0 && trace::enabled())
      trace::record({name, "compute", "compute", span_start, trace::now(), log_rank(), ""});
    span_start = -1;
  }
  void start_compute_span() { span_start = trace::enabled() ? trace::now() : -1; }

  // The unit's full parameters in memory: all-gather them from the shards (a copy at a shard
  // group of one). `async`: issue only, wait_gathered() later (a prefetch).
  void unshard(size_t u, bool async = false) {
    FlatParameter& f = flats[u];
    if (!sharded(strategies[u])) return;
    if (f.is_unsharded()) {
      if (!async) wait_gathered(u);
      return;
    }
    torch::NoGradGuard no_grad;
    f.allocate();
    if (f.shard_world() == 1) {
      f.full().copy_(f.shard().detach());
      return;
    }
    Work w = shard_comm->all_gather_async(f.full(), f.shard().detach());
    if (async) {
      gathers[u] = std::move(w);
    } else {
      w.wait();
    }
  }
  void wait_gathered(size_t u) {
    gathers[u].wait();  // a default Work (nothing in flight) is complete
    gathers[u] = Work();
  }
  void reshard(size_t u) {
    wait_gathered(u);  // never free memory a gather is still writing into
    flats[u].release();
  }
  // Units (other than the root) that reshard after forward and hold their full parameters now.
  int unsharded_count() const {
    int n = 0;
    for (size_t u = 1; u < flats.size(); ++u)
      n += reshards_after_forward(strategies[u]) && flats[u].is_unsharded();
    return n;
  }
  void prefetch(size_t u) {
    if (u < 1 || u >= flats.size() || !reshards_after_forward(strategies[u])) return;
    if (flats[u].is_unsharded()) return;
    if (config.limit_all_gathers > 0 && unsharded_count() >= config.limit_all_gathers) return;
    unshard(u, /*async=*/true);
  }

  // Backward, when backward reaches unit u's output: its parameters are needed again.
  void pre_backward(size_t u) {
    queue_end();
    end_compute_span("backward");
    unshard(u);
    if (config.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch(u - 1);
    start_compute_span();
  }
  void on_grad_ready(size_t u) {
    queue_end();
    if (++ready[u] == flats[u].params().size()) {
      end_compute_span("backward");
      reduce(u);
      start_compute_span();
    }
  }
  void queue_end() {
    if (end_queued) return;
    end_queued = true;
    queue_end_of_backward([this] { end_of_backward(); });
  }

  // The unit's gradient, averaged over every rank, added into its shard's gradient. The first
  // collective is issued asynchronously and finished when the next unit's gradient is reduced
  // (or at the end of backward): it runs on the comm worker while autograd computes the next
  // unit's backward, and at most one unit's flat gradient waits in memory for it.
  struct Pending {
    size_t unit = 0;
    Work work;
    torch::Tensor mine, flat;  // the reduced slice (being written), its input (kept alive)
  };
  std::optional<Pending> pending;

  void reduce(size_t u) {
    torch::NoGradGuard no_grad;
    FlatParameter& f = flats[u];
    torch::Tensor flat = torch::zeros({f.padded_numel()}, f.shard().options().requires_grad(false));
    int64_t offset = 0;
    for (const auto& p : f.params()) {
      if (p.grad().defined()) flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape({-1}));
      offset += p.numel();
    }
    for (const auto& p : f.params()) p.mutable_grad().reset();
    reduced[u] = true;
    if (sharded(strategies[u])) reshard(u);  // the flat copy is all the reduction needs
    finish_pending();
    Pending next{u, Work(), flat, flat};  // a shard group of one keeps everything
    if (!sharded(strategies[u])) {
      if (world > 1) next.work = replicate_comm->all_reduce_async(flat, ReduceOp::Sum);
    } else if (f.shard_world() > 1) {
      next.mine = torch::empty({f.shard_numel()}, flat.options());
      next.work = shard_comm->reduce_scatter_async(next.mine, flat, ReduceOp::Sum);
    }
    pending = std::move(next);
  }
  void finish_pending() {
    if (!pending) return;
    Pending p = std::move(*pending);
    pending.reset();
    p.work.wait();
    if (strategies[p.unit] == ShardingStrategy::HYBRID_SHARD && replicate_comm->size() > 1)
      replicate_comm->all_reduce(p.mine, ReduceOp::Sum);  // then across the nodes
    p.mine.div_(world);  // the mean over all ranks: shard group x replicas
    torch::Tensor& grad = flats[p.unit].shard().mutable_grad();
    if (grad.defined()) {
      grad.add_(p.mine);
    } else {
      grad = p.mine;
    }
  }

  // Inside backward, after the last gradient: units whose parameters did not all get a gradient
  // are reduced now (the same order on every rank), every sharded unit is released.
  void end_of_backward() {
    end_compute_span("backward");
    for (size_t u = 0; u < flats.size(); ++u)
      if (!reduced[u] && ready[u] > 0) reduce(u);
    finish_pending();
    for (size_t u = 0; u < flats.size(); ++u) {
      if (sharded(strategies[u])) reshard(u);
      ready[u] = 0;
      reduced[u] = false;
    }
    end_queued = false;
  }
};

FullyShardedDataParallel::FullyShardedDataParallel(GPT model, Comm& comm, const FSDPConfig& config,
                                                   const OptimConfig& optim, Policy policy)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.model = model;
  s.config = config;
  s.world = comm.size();
  s.rank = comm.rank();
  const int64_t L = model->config().n_layer;

  // Units: the policy's, validated, then the root with everything they leave.
  auto named = model->named_parameters();
  std::vector<Unit> mine = policy(model);
  std::set<std::string> claimed;
  s.unit_of_block.assign(static_cast<size_t>(L), 0);
  for (size_t k = 0; k < mine.size(); ++k) {
    const Unit& unit = mine[k];
    DTL_CHECK(!unit.params.empty(), fmt::format("FSDP: wrap policy unit {} is empty", unit.name));
    std::set<int64_t> blocks;
    for (const auto& name : unit.params) {
      DTL_CHECK(named.contains(name),
                fmt::format("FSDP: wrap policy unit {} names {}, which the model does not have",
                            unit.name, name));
      DTL_CHECK(claimed.insert(name).second,
                fmt::format("FSDP: parameter {} is in two units (twice): {} claims it again",
                            name, unit.name));
      DTL_CHECK(name.rfind("blocks.", 0) == 0,
                fmt::format("FSDP: unit {} holds {}: units must be whole blocks (the rest is the "
                            "root's)", unit.name, name));
      blocks.insert(std::stoll(name.substr(7, name.find('.', 7) - 7)));
    }
    size_t expected = 0;
    for (int64_t b : blocks) expected += block_params(model, b).size();
    DTL_CHECK(expected == unit.params.size() &&
                  *blocks.rbegin() - *blocks.begin() + 1 == static_cast<int64_t>(blocks.size()),
              fmt::format("FSDP: unit {} must hold whole blocks, consecutive ones ({} parameters "
                          "of blocks {}..{})", unit.name, unit.params.size(), *blocks.begin(),
                          *blocks.rbegin()));
    for (int64_t b : blocks) {
      DTL_CHECK(s.unit_of_block[b] == 0, fmt::format("FSDP: block {} is in two units (twice)", b));
      s.unit_of_block[b] = static_cast<int64_t>(k) + 1;
    }
  }
  Unit root{"root", {}};
  for (const auto& item : named)
    if (!claimed.count(item.key())) root.params.push_back(item.key());
  s.units.push_back(root);
  for (auto& unit : mine) s.units.push_back(unit);
  // Units must follow forward order (the wrapper gathers them as the blocks run).
  for (int64_t b = 1; b < L; ++b)
    DTL_CHECK(s.unit_of_block[b] == 0 || s.unit_of_block[b - 1] == 0 ||
                  s.unit_of_block[b] >= s.unit_of_block[b - 1],
              "FSDP: the wrap policy must list its units in forward order (whole blocks)");

  // Strategies: the default, per-unit overrides, and the rules for mixing them.
  s.strategies.assign(s.units.size(), config.strategy);
  for (const auto& [name, strategy] : config.unit_strategy) {
    auto it = std::find_if(s.units.begin(), s.units.end(), [&](const Unit& u) { return u.name == name; });
    DTL_CHECK(it != s.units.end(), fmt::format("FSDP: unit_strategy names unit {}, which does not "
                                               "exist", name));
    s.strategies[static_cast<size_t>(it - s.units.begin())] = strategy;
  }
  const auto hybrid = std::count(s.strategies.begin(), s.strategies.end(), ShardingStrategy::HYBRID_SHARD);
  DTL_CHECK(hybrid == 0 || hybrid == static_cast<int64_t>(s.strategies.size()),
            "FSDP: this lab does not mix HYBRID_SHARD with other strategies (one shard group and "
            "one replicate group serve every unit)");
  if (hybrid > 0) {
    DTL_CHECK(config.ranks_per_node >= 1 && s.world % config.ranks_per_node == 0,
              fmt::format("FSDP: HYBRID_SHARD needs ranks_per_node >= 1 dividing the {} ranks, got "
                          "ranks_per_node={}", s.world, config.ranks_per_node));
  } else {
    DTL_CHECK(config.ranks_per_node == 0,
              fmt::format("FSDP: ranks_per_node={} is for HYBRID_SHARD only", config.ranks_per_node));
  }

  // Communicators of our own, so their stats hold this wrapper's traffic only.
  if (hybrid > 0) {
    const int rpn = config.ranks_per_node;
    s.shard_comm = comm.split(s.rank / rpn, s.rank, comm.name() + "/shard");
    s.replicate_comm = comm.split(s.rank % rpn, s.rank, comm.name() + "/replicate");
  } else {
    s.shard_comm = comm.split(0, s.rank, comm.name() + "/shard");
    if (std::count(s.strategies.begin(), s.strategies.end(), ShardingStrategy::NO_SHARD) > 0)
      s.replicate_comm = comm.split(0, s.rank, comm.name() + "/replicate");
  }

  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) comm.broadcast(p.detach(), 0);
  std::vector<torch::Tensor> decay, no_decay;
  for (size_t u = 0; u < s.units.size(); ++u) {
    std::vector<torch::Tensor> params;
    for (const auto& name : s.units[u].params) params.push_back(named[name]);
    const bool whole = !sharded(s.strategies[u]);
    s.flats.emplace_back(s.units[u].name, s.units[u].params, params,
                         whole ? 1 : s.shard_comm->size(), whole ? 0 : s.shard_comm->rank(), whole);
    s.flats.back().release();
    for (const auto& piece : s.flats.back().pieces())
      (params[static_cast<size_t>(piece.param)].dim() >= 2 ? decay : no_decay).push_back(piece.view);
  }
  s.adam = make_adamw_groups(decay, no_decay, optim);
  s.gathers.resize(s.units.size());
  s.ready.assign(s.units.size(), 0);
  s.reduced.assign(s.units.size(), false);
  State* state = &s;
  for (size_t u = 0; u < s.flats.size(); ++u)
    for (const auto& p : s.flats[u].params())
      s.hooks.push_back(std::make_unique<GradReadyHook>(p, [state, u] { state->on_grad_ready(u); }));
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  s_->hooks.clear();  // no hook may run into a dying State
  for (auto& w : s_->gathers) w.wait();
  if (s_->pending) s_->pending->work.wait();
}

torch::Tensor FullyShardedDataParallel::loss(const torch::Tensor& tokens) {
  State& s = *s_;
  DTL_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2,
            fmt::format("FSDP::loss: tokens must be [B, T + 1] with T >= 1, got {}",
                        fmt::join(tokens.sizes(), "x")));
  const bool record = torch::GradMode::is_enabled();
  const int64_t T = tokens.size(1) - 1, L = s.model->config().n_layer;
  s.unshard(0);  // the root: embeddings now, the head at the end, its backward first
  torch::Tensor x;
  {
    DTL_SCOPE("forward root (embed)");
    x = s.model->embed(tokens.narrow(1, 0, T));
  }
  for (int64_t b = 0; b < L; ++b) {
    const size_t u = static_cast<size_t>(s.unit_of_block[b]);
    const bool first = u != 0 && (b == 0 || s.unit_of_block[b - 1] != static_cast<int64_t>(u));
    const bool last = u != 0 && (b == L - 1 || s.unit_of_block[b + 1] != static_cast<int64_t>(u));
    if (first) {
      s.unshard(u);
      if (s.config.forward_prefetch) s.prefetch(u + 1);
    }
    {
      DTL_SCOPE(fmt::format("forward block {}", b));
      x = s.model->block(b)->forward(x);
    }
    if (last) {
      if (record && x.requires_grad()) {
        State* state = &s;
        x.register_hook([state, u](const torch::Tensor& grad) {
          state->pre_backward(u);
          return grad;
        });
      }
      if (reshards_after_forward(s.strategies[u])) s.reshard(u);
    }
  }
  torch::Tensor loss;
  {
    DTL_SCOPE("forward root (head)");
    loss = model::lm_loss(s.model->head(x), tokens.narrow(1, 1, T));
  }
  if (!record || !loss.requires_grad()) {  // no backward will come: nothing stays gathered
    for (size_t u = 0; u < s.flats.size(); ++u)
      if (sharded(s.strategies[u])) s.reshard(u);
  } else if (trace::enabled()) {
    State* state = &s;  // backward's first compute span starts with backward itself
    loss.register_hook([state](const torch::Tensor& grad) {
      state->start_compute_span();
      return grad;
    });
  }
  return loss;
}

void FullyShardedDataParallel::step() {
  State& s = *s_;
  torch::NoGradGuard no_grad;
  for (auto& f : s.flats) {
    const torch::Tensor& grad = f.shard().grad();
    for (const auto& piece : f.pieces()) {
      torch::Tensor view = piece.view;
      if (grad.defined()) {
        view.mutable_grad() = bucket_view(grad, piece.shard_offset, {piece.numel});
      } else {
        view.mutable_grad().reset();
      }
    }
  }
  s.adam->step();
}

void FullyShardedDataParallel::zero_grad() {
  for (auto& f : s_->flats) {
    torch::Tensor shard = f.shard();
    shard.mutable_grad().reset();
    for (const auto& piece : f.pieces()) {
      torch::Tensor view = piece.view;
      view.mutable_grad().reset();
    }
  }
}

void FullyShardedDataParallel::set_lr(double lr) { dtl::set_lr(*s_->adam, lr); }
const FSDPConfig& FullyShardedDataParallel::config() const { return s_->config; }
const std::vector<Unit>& FullyShardedDataParallel::units() const { return s_->units; }
const std::vector<ShardingStrategy>& FullyShardedDataParallel::strategies() const {
  return s_->strategies;
}
std::vector<int64_t> FullyShardedDataParallel::unit_numels() const {
  std::vector<int64_t> n;
  for (const auto& f : s_->flats) n.push_back(f.numel());
  return n;
}
const std::vector<FlatParameter>& FullyShardedDataParallel::flat_parameters() const {
  return s_->flats;
}
Comm& FullyShardedDataParallel::shard_comm() const { return *s_->shard_comm; }
Comm* FullyShardedDataParallel::replicate_comm() const { return s_->replicate_comm.get(); }

torch::Tensor FullyShardedDataParallel::full_parameters() {
  State& s = *s_;
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < s.flats.size(); ++u) s.unshard(u);
  std::vector<torch::Tensor> flat;
  for (const auto& p : s.model->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  for (size_t u = 0; u < s.flats.size(); ++u)
    if (sharded(s.strategies[u])) s.reshard(u);
  return torch::cat(flat);
}

std::map<std::string, torch::Tensor> FullyShardedDataParallel::full_state_dict() {
  State& s = *s_;
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> out;
  for (size_t u = 0; u < s.flats.size(); ++u) {  // one unit at a time: never the whole model
    s.unshard(u);
    if (s.rank == 0)
      for (size_t i = 0; i < s.flats[u].params().size(); ++i)
        out[s.flats[u].param_names()[i]] = s.flats[u].params()[i].detach().clone();
    if (sharded(s.strategies[u])) s.reshard(u);
  }
  return out;
}

std::vector<ShardedEntry> FullyShardedDataParallel::sharded_state_dict() const {
  std::vector<ShardedEntry> out;
  for (const auto& f : s_->flats)
    for (const auto& piece : f.pieces()) {
      const torch::Tensor& p = f.params()[static_cast<size_t>(piece.param)];
      out.push_back({f.param_names()[static_cast<size_t>(piece.param)], p.sizes().vec(),
                     piece.param_offset, piece.view.detach().clone()});
    }
  return out;
}

}  // namespace dtl::lab15
