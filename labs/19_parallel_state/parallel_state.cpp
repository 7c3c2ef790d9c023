// Lab 19: Megatron's rank generator, its groups as sub-Comms, and the translation of Megatron and
// DeepSpeed configurations into one plan. Your code goes here; the contract is
// parallel_state.hpp. Tasks in order: README.md.
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

// ---------------------------------------------------------------- Task 1: the rank generator

std::vector<std::vector<int>> rank_groups(const std::vector<int>& sizes, const std::vector<bool>& mask) {
  // TODO(lab19): a rank is sum(coord[i] * stride[i]), stride the prefix products of sizes.
  // Split the dimensions into masked (a group spans them) and unmasked (they tell groups apart);
  // for each group index (decomposed over the unmasked sizes, first fastest) list the ranks of
  // each in-group index (decomposed over the masked sizes).
  DTL_UNIMPLEMENTED("lab 19: rank_groups (Task 1)");
}

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order) {
  // TODO(lab19): check the sizes and the order; fill tokens_ and sizes_ in order (a missing
  // token of size 1 appended at the end) and order_ ("tp-cp-ep-dp-pp" style).
  DTL_UNIMPLEMENTED("lab 19: RankGenerator (Task 1)");
}

int RankGenerator::world_size() const {
  // TODO(lab19): the product of the sizes.
  DTL_UNIMPLEMENTED("lab 19: RankGenerator::world_size (Task 1)");
}
const std::string& RankGenerator::order() const { return order_; }

int RankGenerator::size(const std::string& token) const {
  // TODO(lab19): the size of one token of the order.
  DTL_UNIMPLEMENTED("lab 19: RankGenerator::size (Task 1)");
}

std::vector<std::vector<int>> RankGenerator::get_ranks(const std::string& token) const {
  // TODO(lab19): the mask of the token's dimensions, then rank_groups.
  DTL_UNIMPLEMENTED("lab 19: RankGenerator::get_ranks (Task 1)");
}

// ---------------------------------------------------------------- Task 2: ParallelState

// Yours to shape. A start: the sizes and coordinates by name, every group list by name, this
// rank's sub-Comm by name.
struct ParallelState::State {
  std::map<std::string, int> sizes, coords;
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

ParallelState::ParallelState(Comm& world, const ParallelConfig& config) : s_(std::make_unique<State>()) {
  // TODO(lab19): the checks (before any communication); the dense and the expert
  // RankGenerator; every group by name; this rank's coordinates; then, in group_names() order,
  // one world.split per name (color: the index of this rank's group or -1, key: its position).
  DTL_UNIMPLEMENTED("lab 19: ParallelState (Task 2)");
}

ParallelState::~ParallelState() = default;

int ParallelState::size(const std::string& dim) const {
  // TODO(lab19)
  DTL_UNIMPLEMENTED("lab 19: ParallelState::size (Task 2)");
}
int ParallelState::coord(const std::string& dim) const {
  // TODO(lab19)
  DTL_UNIMPLEMENTED("lab 19: ParallelState::coord (Task 2)");
}
const std::vector<std::vector<int>>& ParallelState::groups(const std::string& name) const {
  // TODO(lab19)
  DTL_UNIMPLEMENTED("lab 19: ParallelState::groups (Task 2)");
}
std::vector<int> ParallelState::group_of(const std::string& name) const {
  // TODO(lab19)
  DTL_UNIMPLEMENTED("lab 19: ParallelState::group_of (Task 2)");
}
Comm& ParallelState::comm(const std::string& name) const {
  // TODO(lab19): this rank's sub-Comm, or a dtl::Error naming the "group".
  DTL_UNIMPLEMENTED("lab 19: ParallelState::comm (Task 2)");
}
bool ParallelState::has(const std::string& name) const {
  // TODO(lab19)
  DTL_UNIMPLEMENTED("lab 19: ParallelState::has (Task 2)");
}

// ---------------------------------------------------------------- Task 3: config translation

ParallelPlan from_megatron_args(const std::vector<std::string>& args, int world, const GPTConfig& model) {
  // TODO(lab19): parse "--flag value" and "--flag=value" (switches take no value); Megatron's
  // defaults; every check of the header, each error naming its flag.
  DTL_UNIMPLEMENTED("lab 19: from_megatron_args (Task 3)");
}

ParallelPlan from_deepspeed_config(const std::string& json, int world, int tp, int pp,
                                   const GPTConfig& model) {
  // TODO(lab19): nlohmann::json::parse(json, nullptr, false); DeepSpeed's batch rules; the
  // checks of the header, each error naming its key.
  DTL_UNIMPLEMENTED("lab 19: from_deepspeed_config (Task 3)");
}

}  // namespace dtl::lab19
