// labs/10_sequence_parallel/tests/sp_test_util.hpp — helpers shared by the public tests
// (sequence_parallel_test.cpp) and the grading tests (grading/10_sequence_parallel/).
//
// Oracles as in lab 09 (its tpt_test_util.hpp: the serial GPT with perturbed biases, shards by
// parameter name), plus what sequence parallelism adds: inputs and outputs are this rank's chunk
// of the sequence (sequence_chunk), and the gradients of parameters applied to chunks are
// partial until summed over tp.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "dtl/harness/checks.hpp"
#include "dtl/model.hpp"
#include "sequence_parallel.hpp"
#include "tests/tpt_test_util.hpp"  // lab 09's: config, serial_gpt, expected_shard, ...

namespace lab10_test {

using namespace lab09_test;  // NOLINT: config, serial_gpt, same_tokens, fresh_comm, ...
using dtl::lab10::sequence_chunk;

// A GPT every tp of 1-4 divides, with a context every tp of 1-4 divides (24 positions).
inline GPTConfig sp_config(int64_t layers = 2, bool tied = true, bool bias = true) {
  GPTConfig c = config(layers, tied, bias);
  c.seq_len = 24;
  return c;
}

// This rank's chunk of the sequence (dimension 1) as a new leaf that requires grad.
inline torch::Tensor chunk_leaf(const torch::Tensor& full, const Comm& comm) {
  return sequence_chunk(full.detach(), 1, comm).clone().requires_grad_(true);
}

// Rank q's own tensor, known to every rank (so every rank can compute the expected sums).
inline torch::Tensor input_of_rank(int q, at::IntArrayRef shape, uint64_t seed) {
  return same_input(shape, seed + 1000 * static_cast<uint64_t>(q));
}

// Wire bytes of all collectives counted since `before`: the student's code's traffic, MEASURED
// (take `before` with measured_stats).
inline double wire_since(const dtl::CommStats& before, const Comm& comm,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return measured_stats(comm, file, line).total_wire_bytes() - before.total_wire_bytes();
}
// The same for the oracle's traffic (lab 09's reference model, run by the test itself): the
// process's own counters, unobserved (take `before` with comm.stats()). In the autograder's split
// run that is the driver's own run of the oracle.
inline double oracle_wire_since(const dtl::CommStats& before, const Comm& comm) {
  return comm.stats().total_wire_bytes() - before.total_wire_bytes();
}

}  // namespace lab10_test
