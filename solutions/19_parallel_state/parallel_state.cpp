// Lab 19 reference solution: Megatron's rank generator, its groups as sub-Comms, and the
// translation of Megatron and DeepSpeed configurations into one plan.
#include "parallel_state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab19 {

namespace {

std::vector<std::string> split_tokens(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dash = s.find('-', start);
    out.push_back(s.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) return out;
    start = dash + 1;
  }
}

// The coordinates of `index` in a grid of `shape`, the first dimension fastest.
std::vector<int> decompose(int index, const std::vector<int>& shape) {
  std::vector<int> idx;
  for (int s : shape) {
    idx.push_back(index % s);
    index /= s;
  }
  return idx;
}

}  // namespace

// ---------------------------------------------------------------- Task 1: the rank generator

std::vector<std::vector<int>> rank_groups(const std::vector<int>& sizes, const std::vector<bool>& mask) {
  DTL_CHECK(sizes.size() == mask.size(),
            fmt::format("rank_groups: {} sizes but {} mask entries", sizes.size(), mask.size()));
  for (int s : sizes) DTL_CHECK(s >= 1, fmt::format("rank_groups: size {} must be >= 1", s));
  // A rank is sum(coord[i] * stride[i]) with stride the prefix products of the sizes. Split the
  // dimensions into those a group spans (masked) and those that tell groups apart (unmasked).
  std::vector<int> masked, unmasked, masked_stride, unmasked_stride;
  int stride = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? masked : unmasked).push_back(sizes[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(stride);
    stride *= sizes[i];
  }
  int group_size = 1, groups = 1;
  for (int s : masked) group_size *= s;
  for (int s : unmasked) groups *= s;
  std::vector<std::vector<int>> out;
  for (int g = 0; g < groups; ++g) {
    const auto at = decompose(g, unmasked);
    int base = 0;
    for (size_t i = 0; i < at.size(); ++i) base += at[i] * unmasked_stride[i];
    std::vector<int> group;
    for (int k = 0; k < group_size; ++k) {
      const auto in = decompose(k, masked);
      int rank = base;
      for (size_t i = 0; i < in.size(); ++i) rank += in[i] * masked_stride[i];
      group.push_back(rank);
    }
    out.push_back(std::move(group));
  }
  return out;
}

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order) {
  const std::vector<std::pair<std::string, int>> named = {{"tp", tp}, {"ep", ep}, {"dp", dp},
                                                          {"pp", pp}, {"cp", cp}};
  for (const auto& [name, size] : named)
    DTL_CHECK(size >= 1, fmt::format("RankGenerator: size {}={} must be >= 1", name, size));
  DTL_CHECK(ep == 1 || cp == 1,
            fmt::format("RankGenerator: ep={} and cp={}: one grid has expert or context "
                        "parallelism, not both (Megatron's dense grid has cp, its expert grid ep)",
                        ep, cp));
  std::set<std::string> seen;
  for (const auto& token : split_tokens(order)) {
    const auto it = std::find_if(named.begin(), named.end(), [&](const auto& n) { return n.first == token; });
    DTL_CHECK(it != named.end(), fmt::format("RankGenerator: order '{}' has an unknown token '{}' "
                                             "(tp, cp, ep, dp, pp)", order, token));
    DTL_CHECK(seen.insert(token).second,
              fmt::format("RankGenerator: order '{}' names {} twice", order, token));
    tokens_.push_back(token);
    sizes_.push_back(it->second);
  }
  // A dimension of size 1 goes anywhere: at the end, in the order of Megatron's name_to_size.
  for (const char* name : {"tp", "pp", "dp", "ep", "cp"}) {
    if (seen.count(name)) continue;
    const int size = std::find_if(named.begin(), named.end(), [&](const auto& n) { return n.first == name; })->second;
    DTL_CHECK(size == 1, fmt::format("RankGenerator: {}={} but the order '{}' does not place it",
                                     name, size, order));
    tokens_.push_back(name);
    sizes_.push_back(1);
  }
  order_ = fmt::format("{}", fmt::join(tokens_, "-"));
}

int RankGenerator::world_size() const {
  int w = 1;
  for (int s : sizes_) w *= s;
  return w;
}
const std::string& RankGenerator::order() const { return order_; }

int RankGenerator::size(const std::string& token) const {
  const auto it = std::find(tokens_.begin(), tokens_.end(), token);
  DTL_CHECK(it != tokens_.end(), fmt::format("RankGenerator: no token '{}' in order '{}'", token, order_));
  return sizes_[static_cast<size_t>(it - tokens_.begin())];
}

std::vector<std::vector<int>> RankGenerator::get_ranks(const std::string& token) const {
  std::vector<bool> mask(tokens_.size(), false);
  for (const auto& t : split_tokens(token)) {
    const auto it = std::find(tokens_.begin(), tokens_.end(), t);
    DTL_CHECK(it != tokens_.end(),
              fmt::format("RankGenerator::get_ranks: token '{}' names '{}', which the order '{}' "
                          "does not have", token, t, order_));
    mask[static_cast<size_t>(it - tokens_.begin())] = true;
  }
  return rank_groups(sizes_, mask);
}

// ---------------------------------------------------------------- Task 2: ParallelState

struct ParallelState::State {
  std::map<std::string, int> sizes;
  std::map<std::string, int> coords;
  std::map<std::string, std::vector<std::vector<int>>> groups;
  std::map<std::string, std::shared_ptr<Comm>> comms;
  int rank = 0;
};

const std::vector<std::string>& ParallelState::group_names() {
  static const std::vector<std::string> names = {
      "tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-dp", "tp-dp-cp", "tp-pp", "embedding",
      "position_embedding", "ep", "expert_dp", "tp-ep", "tp-ep-pp"};
  return names;
}

ParallelState::ParallelState(Comm& world, const ParallelConfig& c) : s_(std::make_unique<State>()) {
  State& s = *s_;
  const int n = world.size();
  s.rank = world.rank();
  DTL_CHECK(c.tp >= 1 && c.cp >= 1 && c.pp >= 1 && c.ep >= 1,
            fmt::format("ParallelState: tp={} cp={} pp={} ep={} must be >= 1", c.tp, c.cp, c.pp, c.ep));
  const int model = c.tp * c.cp * c.pp;
  DTL_CHECK(n % model == 0, fmt::format("ParallelState: tp={} x cp={} x pp={} = {} does not divide "
                                        "the world of {} ranks", c.tp, c.cp, c.pp, model, n));
  const int dp = n / model;
  DTL_CHECK(c.dp == 0 || c.dp == dp,
            fmt::format("ParallelState: dp={} but world {} / (tp x cp x pp = {}) = {}", c.dp, n, model, dp));
  DTL_CHECK((dp * c.cp) % c.ep == 0,
            fmt::format("ParallelState: ep={} must divide dp x cp = {} (the experts' ranks come "
                        "out of the dense layers' data-parallel ranks)", c.ep, dp * c.cp));
  // The two grids over the same ranks (Megatron-Core's decoder and expert rank generators).
  const RankGenerator dense(c.tp, 1, dp, c.pp, c.cp, c.order);
  const RankGenerator expert(c.tp, c.ep, dp * c.cp / c.ep, c.pp, 1, c.order);
  // Megatron's two refusals: the experts' and the attention's layers of one pipeline stage must
  // be the same ranks.
  const bool pp_last = c.order.size() >= 2 && c.order.compare(c.order.size() - 2, 2, "pp") == 0;
  DTL_CHECK(pp_last || c.pp == 1 || dp * c.cp / c.ep == dp,
            fmt::format("ParallelState: order '{}' with pp={}: when not using pp-last rank "
                        "ordering, the data parallel size of the attention ({}) and moe layers "
                        "(dp x cp / ep = {}) must be the same", c.order, c.pp, dp, dp * c.cp / c.ep));
  DTL_CHECK(dense.get_ranks("pp") == expert.get_ranks("pp"),
            fmt::format("ParallelState: order '{}': the pipeline groups of the dense grid and the "
                        "expert grid differ (a layer's attention and experts on different stages)",
                        c.order));
  for (const char* name : {"tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-dp", "tp-dp-cp", "tp-pp"})
    s.groups[name] = dense.get_ranks(name);
  for (const auto& pp : s.groups["pp"]) {
    s.groups["embedding"].push_back(pp.size() == 1 ? std::vector<int>{pp.front()}
                                                   : std::vector<int>{pp.front(), pp.back()});
    s.groups["position_embedding"].push_back({pp.front()});
  }
  s.groups["ep"] = expert.get_ranks("ep");
  s.groups["expert_dp"] = expert.get_ranks("dp");
  s.groups["tp-ep"] = expert.get_ranks("tp-ep");
  s.groups["tp-ep-pp"] = expert.get_ranks("tp-ep-pp");
  s.sizes = {{"tp", c.tp}, {"cp", c.cp}, {"ep", c.ep}, {"dp", dp}, {"pp", c.pp},
             {"expert_dp", dp * c.cp / c.ep}};
  // Coordinates: this rank's position in its group along each single dimension.
  for (const char* dim : {"tp", "cp", "dp", "pp", "ep", "expert_dp"}) {
    const auto mine = group_of(dim);
    s.coords[dim] = static_cast<int>(std::find(mine.begin(), mine.end(), s.rank) - mine.begin());
  }
  // One sub-Comm per name, in group_names() order on every rank: color = the group's index,
  // key = the position in it (so the sub-Comm's rank is the group's order).
  for (const auto& name : group_names()) {
    const auto& gs = s.groups[name];
    int color = -1, key = 0;
    for (size_t g = 0; g < gs.size(); ++g) {
      const auto it = std::find(gs[g].begin(), gs[g].end(), s.rank);
      if (it != gs[g].end()) {
        color = static_cast<int>(g);
        key = static_cast<int>(it - gs[g].begin());
      }
    }
    auto sub = world.split(color, key, world.name() + "/" + name);
    if (sub) s.comms[name] = std::move(sub);
  }
}

ParallelState::~ParallelState() = default;

int ParallelState::size(const std::string& dim) const {
  const auto it = s_->sizes.find(dim);
  DTL_CHECK(it != s_->sizes.end(), fmt::format("ParallelState: no dimension '{}'", dim));
  return it->second;
}
int ParallelState::coord(const std::string& dim) const {
  const auto it = s_->coords.find(dim);
  DTL_CHECK(it != s_->coords.end(), fmt::format("ParallelState: no dimension '{}'", dim));
  return it->second;
}
const std::vector<std::vector<int>>& ParallelState::groups(const std::string& name) const {
  const auto it = s_->groups.find(name);
  DTL_CHECK(it != s_->groups.end(), fmt::format("ParallelState: no group '{}'", name));
  return it->second;
}
std::vector<int> ParallelState::group_of(const std::string& name) const {
  for (const auto& g : groups(name))
    if (std::find(g.begin(), g.end(), s_->rank) != g.end()) return g;
  return {};
}
Comm& ParallelState::comm(const std::string& name) const {
  const auto it = s_->comms.find(name);
  DTL_CHECK(it != s_->comms.end(),
            fmt::format("ParallelState: rank {} is in no '{}' group (only the first and last "
                        "pipeline stages hold the embeddings)", s_->rank, name));
  return *it->second;
}
bool ParallelState::has(const std::string& name) const { return s_->comms.count(name) > 0; }

// ---------------------------------------------------------------- Task 3: config translation

namespace {

// The checks both translations share: the plan's sizes against the world and the model.
void check_model_fits(const ParallelPlan& p, const GPTConfig& m, const std::string& tp_name,
                      const std::string& pp_name) {
  DTL_CHECK(m.n_head % p.tp == 0, fmt::format("{} {}: the model's n_head={} is not divisible by it",
                                              tp_name, p.tp, m.n_head));
  DTL_CHECK(m.vocab_size % p.tp == 0,
            fmt::format("{} {}: the model's vocab_size={} is not divisible by it (Megatron pads "
                        "the vocabulary to a multiple of tp; this course does not)", tp_name, p.tp,
                        m.vocab_size));
  DTL_CHECK(m.n_layer % p.pp == 0, fmt::format("{} {}: the model's n_layer={} is not divisible by it",
                                               pp_name, p.pp, m.n_layer));
}

}  // namespace

ParallelPlan from_megatron_args(const std::vector<std::string>& args, int world, const GPTConfig& model) {
  // Flags that take a value, and flags that are switches.
  static const std::set<std::string> valued = {
      "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
      "--micro-batch-size", "--global-batch-size", "--num-layers-per-virtual-pipeline-stage",
      "--recompute-granularity", "--clip-grad"};
  static const std::set<std::string> switches = {"--sequence-parallel", "--use-distributed-optimizer",
                                                 "--bf16", "--fp16"};
  std::map<std::string, std::string> v;
  std::set<std::string> on;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (switches.count(flag)) {
      DTL_CHECK(eq == std::string::npos, fmt::format("Megatron flag {} takes no value", flag));
      on.insert(flag);
      continue;
    }
    DTL_CHECK(valued.count(flag), fmt::format("unknown Megatron flag {} (this translation knows {} "
                                              "and {})", flag, fmt::join(valued, " "), fmt::join(switches, " ")));
    if (eq == std::string::npos) {
      DTL_CHECK(i + 1 < args.size(), fmt::format("Megatron flag {} needs a value", flag));
      value = args[++i];
    }
    v[flag] = value;
  }
  auto integer = [&](const std::string& flag, int64_t fallback) -> int64_t {
    if (!v.count(flag)) return fallback;
    try {
      size_t used = 0;
      const int64_t x = std::stoll(v[flag], &used);
      if (used == v[flag].size() && x >= 1) return x;
    } catch (const std::exception&) {
    }
    DTL_CHECK(false, fmt::format("Megatron flag {} needs a positive integer, got '{}'", flag, v[flag]));
    return 0;
  };
  ParallelPlan p;
  p.world = world;
  p.tp = static_cast<int>(integer("--tensor-model-parallel-size", 1));
  p.pp = static_cast<int>(integer("--pipeline-model-parallel-size", 1));
  p.cp = static_cast<int>(integer("--context-parallel-size", 1));
  const int model_parallel = p.tp * p.pp * p.cp;
  DTL_CHECK(world % model_parallel == 0,
            fmt::format("--tensor-model-parallel-size {} x --pipeline-model-parallel-size {} x "
                        "--context-parallel-size {} = {} does not divide the world of {} ranks",
                        p.tp, p.pp, p.cp, model_parallel, world));
  p.dp = world / model_parallel;
  check_model_fits(p, model, "--tensor-model-parallel-size", "--pipeline-model-parallel-size");
  DTL_CHECK(p.cp == 1 || model.seq_len % (2 * p.cp) == 0,
            fmt::format("--context-parallel-size {}: the sequence of {} tokens must split into 2 x "
                        "{} chunks (load-balanced causal attention)", p.cp, model.seq_len, p.cp));
  if (v.count("--num-layers-per-virtual-pipeline-stage")) {
    const int64_t per = integer("--num-layers-per-virtual-pipeline-stage", 1);
    const int64_t per_stage = model.n_layer / p.pp;
    DTL_CHECK(per_stage % per == 0,
              fmt::format("--num-layers-per-virtual-pipeline-stage {}: the {} layers per pipeline "
                          "stage are not divisible by it", per, per_stage));
    p.virtual_stages = static_cast<int>(per_stage / per);
  }
  p.sequence_parallel = on.count("--sequence-parallel") && p.tp > 1;  // Megatron switches it off at tp 1
  p.micro_batch = integer("--micro-batch-size", 1);
  p.global_batch = integer("--global-batch-size", p.micro_batch * p.dp);
  DTL_CHECK(p.global_batch % (p.micro_batch * p.dp) == 0,
            fmt::format("--global-batch-size {} is not divisible by --micro-batch-size {} x data "
                        "parallel size {}", p.global_batch, p.micro_batch, p.dp));
  p.grad_accum = p.global_batch / (p.micro_batch * p.dp);
  p.zero_stage = on.count("--use-distributed-optimizer") ? 1 : 0;
  if (v.count("--recompute-granularity")) {
    p.recompute = v["--recompute-granularity"];
    DTL_CHECK(p.recompute == "selective" || p.recompute == "full",
              fmt::format("--recompute-granularity must be selective or full, got '{}'", p.recompute));
  }
  p.grad_clip = 1.0;  // Megatron's default
  if (v.count("--clip-grad")) {
    try {
      p.grad_clip = std::stod(v["--clip-grad"]);
    } catch (const std::exception&) {
      DTL_CHECK(false, fmt::format("--clip-grad needs a number, got '{}'", v["--clip-grad"]));
    }
  }
  DTL_CHECK(!(on.count("--bf16") && on.count("--fp16")), "--bf16 and --fp16 cannot both be set");
  p.precision = on.count("--bf16") ? "bf16" : on.count("--fp16") ? "fp16" : "fp32";
  return p;
}

ParallelPlan from_deepspeed_config(const std::string& text, int world, int tp, int pp,
                                   const GPTConfig& model) {
  using nlohmann::json;
  const json j = json::parse(text, nullptr, false);
  DTL_CHECK(!j.is_discarded() && j.is_object(), "DeepSpeed config: not a JSON object (json)");
  ParallelPlan p;
  p.world = world;
  p.tp = tp;
  p.pp = pp;
  DTL_CHECK(tp >= 1 && pp >= 1 && world % (tp * pp) == 0,
            fmt::format("DeepSpeed: tp={} x pp={} does not divide the world of {} ranks", tp, pp, world));
  p.dp = world / (tp * pp);
  check_model_fits(p, model, "tp", "pp");
  auto number = [&](const char* key) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) return 0;
    DTL_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() >= 1,
              fmt::format("DeepSpeed: {} must be a positive integer", key));
    return j[key].get<int64_t>();
  };
  int64_t train = number("train_batch_size"), micro = number("train_micro_batch_size_per_gpu"),
          accum = number("gradient_accumulation_steps");
  // DeepSpeed's _set_batch_related_parameters: any two give the third; one alone, accumulation 1.
  if (train && micro && !accum) {
    accum = train / (micro * p.dp);
  } else if (train && accum && !micro) {
    micro = train / (accum * p.dp);
  } else if (micro && accum && !train) {
    train = micro * accum * p.dp;
  } else if (train && !micro && !accum) {
    accum = 1;
    micro = train / p.dp;
  } else if (micro && !train && !accum) {
    accum = 1;
    train = micro * p.dp;
  }
  DTL_CHECK(train && micro && accum && train == micro * accum * p.dp,
            fmt::format("DeepSpeed: train_batch_size {} must equal train_micro_batch_size_per_gpu "
                        "{} x gradient_accumulation_steps {} x data parallel size {}", train, micro,
                        accum, p.dp));
  p.micro_batch = micro;
  p.grad_accum = accum;
  p.global_batch = train;
  if (j.contains("zero_optimization")) {
    p.zero_stage = j["zero_optimization"].value("stage", 0);
    DTL_CHECK(p.zero_stage >= 0 && p.zero_stage <= 3,
              fmt::format("DeepSpeed: zero_optimization.stage {} must be 0-3", p.zero_stage));
  }
  p.grad_clip = j.value("gradient_clipping", 0.0);
  auto enabled = [&](const char* key) { return j.contains(key) && j[key].value("enabled", false); };
  DTL_CHECK(!(enabled("bf16") && enabled("fp16")), "DeepSpeed: bf16 and fp16 cannot both be enabled");
  p.precision = enabled("bf16") ? "bf16" : enabled("fp16") ? "fp16" : "fp32";
  return p;
}

}  // namespace dtl::lab19
