// stage_state.hpp — lab 11: what a PipelineStage holds (given; read it, do not edit).
//
// defines: PipelineStage::State
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipeline.hpp"

namespace dtl::lab11 {

struct PipelineStage::State {
  GPTConfig cfg;
  Comm* comm = nullptr;
  int stage = 0, stages = 1;
  Range units;  // [begin, end) of the unit chain (pipeline.hpp)
  torch::Device device = torch::kCPU;

  // The units' modules, registered in `module` (names without dots: "wte", "block_3", ...).
  std::shared_ptr<torch::nn::Module> module;
  torch::nn::Embedding wte{nullptr};   // unit 0, and the tied head's matrix on the last stage
  torch::nn::Embedding wpe{nullptr};   // unit 0
  std::vector<model::Block> blocks;    // the blocks of this stage, in order
  int64_t first_block = 0;             // global index of blocks[0]
  torch::nn::LayerNorm ln_f{nullptr};  // the head
  torch::nn::Linear lm_head{nullptr};  // the head, untied models only
  std::vector<std::pair<std::string, torch::Tensor>> named;  // serial GPT names
  std::shared_ptr<Comm> embedding_group;  // first + last stage of a tied model, else null

  // Micro-batches in flight, by number (0 = the first forwarded since finish_step).
  struct Saved {
    torch::Tensor input;   // the received activation (a leaf that requires grad); undefined on
                           // the first stage, whose input is tokens
    torch::Tensor output;  // the activation sent on, or the loss on the last stage
  };
  std::map<int64_t, Saved> saved;
  int64_t next_micro = 0;  // number of the next forward
  int64_t peak = 0;        // most micro-batches in flight at once since finish_step
};

}  // namespace dtl::lab11
