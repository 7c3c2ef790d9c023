// dtl/units.hpp — defines: Unit, gpt_units, unit_numels, unit_calls.
//
// A sharded data-parallel wrapper (ZeRO stage 3, lab 14; FSDP, lab 15) does not move single
// parameters: it flattens groups of them, "units", into one buffer each and gathers, frees and
// reduces a whole unit at a time. This is the course GPT cut into its natural units.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtl/model.hpp"  // defines: model::GPT

namespace dtl {

// A unit: the parameters one flat buffer holds, by name (as named_parameters() lists them).
struct Unit {
  std::string name;
  std::vector<std::string> params;
};

// The course GPT's units, in the order forward first uses them: "embed" (wte, wpe), one unit
// per block ("blocks.0", ...), "head" (ln_f, and lm_head when the head is not tied).
std::vector<Unit> gpt_units(model::GPT& model);
// The number of elements of each unit of gpt_units(model), in the same order.
std::vector<int64_t> unit_numels(model::GPT& model);
// The number of elements of each of `units` (parameter names of `model`).
std::vector<int64_t> unit_numels(model::GPT& model, const std::vector<Unit>& units);

// The forward of the GPT as a sequence of calls, each with the units of gpt_units(model) whose
// parameters it reads: embed -> {embed}, block i -> {block i}, head -> {head}, plus {embed}
// when the head is tied (it reads wte: a tied weight is gathered, and reduce-scattered, once per
// use). unit_calls(model)[c] lists unit indices into gpt_units(model).
std::vector<std::vector<int64_t>> unit_calls(model::GPT& model);

}  // namespace dtl
