// The course GPT's units (dtl/units.hpp).
#include "dtl/units.hpp"

#include <fmt/format.h>

#include "dtl/error.hpp"

namespace dtl {

std::vector<Unit> gpt_units(model::GPT& model) {
  std::vector<Unit> units;
  units.push_back({"embed", {}});
  for (int64_t i = 0; i < model->config().n_layer; ++i)
    units.push_back({fmt::format("blocks.{}", i), {}});
  units.push_back({"head", {}});
  // named_parameters() lists a tied weight once, under its first name (wte.weight).
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    size_t u = units.size() - 1;  // ln_f.*, lm_head.*
    if (name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0) {
      u = 0;
    } else if (name.rfind("blocks.", 0) == 0) {
      u = 1 + static_cast<size_t>(std::stoll(name.substr(7, name.find('.', 7) - 7)));
    }
    units[u].params.push_back(name);
  }
  return units;
}

std::vector<int64_t> unit_numels(model::GPT& model, const std::vector<Unit>& units) {
  auto named = model->named_parameters();
  std::vector<int64_t> numels;
  for (const Unit& unit : units) {
    int64_t n = 0;
    for (const auto& name : unit.params) {
      DTL_CHECK(named.contains(name), fmt::format("unit_numels: unit {} names {}, which the model "
                                                  "does not have", unit.name, name));
      n += named[name].numel();
    }
    numels.push_back(n);
  }
  return numels;
}

std::vector<int64_t> unit_numels(model::GPT& model) { return unit_numels(model, gpt_units(model)); }

std::vector<std::vector<int64_t>> unit_calls(model::GPT& model) {
  const int64_t L = model->config().n_layer;
  std::vector<std::vector<int64_t>> calls = {{0}};
  for (int64_t i = 0; i < L; ++i) calls.push_back({1 + i});
  if (model->config().tied_head) {
    calls.push_back({L + 1, 0});
  } else {
    calls.push_back({L + 1});
  }
  return calls;
}

}  // namespace dtl
