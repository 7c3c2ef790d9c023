// units.cpp — lab 14: the given part (the GPT's units and calls, storage surgery).
// Your work is in zero.cpp.
#include <fmt/format.h>

#include "dtl/error.hpp"
#include "zero.hpp"

namespace dtl::lab14 {

std::vector<Unit> gpt_units(GPT& model) {
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

std::vector<int64_t> unit_numels(GPT& model) {
  auto named = model->named_parameters();
  std::vector<int64_t> numels;
  for (const Unit& unit : gpt_units(model)) {
    int64_t n = 0;
    for (const auto& name : unit.params) n += named[name].numel();
    numels.push_back(n);
  }
  return numels;
}

std::vector<std::vector<int64_t>> unit_calls(GPT& model) {
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

void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

void alloc_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  DTL_CHECK(s->allocator() != nullptr, "alloc_storage: the storage has no allocator");
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

}  // namespace dtl::lab14
