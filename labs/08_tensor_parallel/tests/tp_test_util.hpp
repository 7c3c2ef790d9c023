// labs/08_tensor_parallel/tests/tp_test_util.hpp — helpers shared by the public tests
// (tensor_parallel_test.cpp) and the grading tests (grading/08_tensor_parallel/).
//
// The oracle of every test: the serial layer (torch::nn::Linear, dtl::model::MLP) built from the
// same seed on every rank, evaluated on the same input. The tensor-parallel side must give the
// same outputs, the same input gradient, and gradients that are exactly its slices of the
// serial gradients.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "dtl/comm.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/model.hpp"
#include "dtl/runtime.hpp"
#include "tensor_parallel.hpp"

namespace lab08_test {

using dtl::Comm;
using dtl::OpType;
using dtl::Range;
using dtl::testing::device;
using dtl::testing::device_options;
using dtl::testing::fresh_comm;

// Sizes every world size 1-4 divides.
constexpr int64_t kIn = 24, kOut = 36;

// A serial Linear [out, in] with torch's default init, the same on every rank (seeded), on the
// Runtime's device.
inline torch::nn::Linear serial_linear(int64_t in, int64_t out, bool bias, uint64_t seed) {
  torch::nn::Linear lin = dtl::testing::serial(seed, [&] {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  });
  lin->to(device());
  return lin;
}

// The same input on every rank (drawn from a seeded generator on the CPU, then moved).
inline torch::Tensor same_input(at::IntArrayRef shape, uint64_t seed) {
  return dtl::testing::serial(seed, [&] { return torch::randn(shape); }).to(device());
}

// This rank's random tensor (torch's RNG is seeded with seed + rank, so ranks differ).
inline torch::Tensor rank_input(at::IntArrayRef shape) { return torch::randn(shape).to(device()); }

// Two tp groups side by side: even and odd world ranks (sizes 1 at world 1 and 2, 2 and 1 at
// world 3, 2 and 2 at world 4). Code that uses dtl::world() where it should use the Comm it was
// given communicates with the wrong ranks (or slices by the wrong rank) here.
inline std::shared_ptr<Comm> half_group() {
  return dtl::world().split(dtl::world().rank() % 2, dtl::world().rank());
}

// The features this rank owns out of `size` over `comm`.
inline Range mine(int64_t size, const Comm& comm) {
  return dtl::lab08::shard_of(size, comm.size(), comm.rank(), "size");
}

// A Comm's counters as the student's process counted them (MEASURED, dtl/harness/observe.hpp).
// Take `before` snapshots with it too: both ends of a difference from the same process.
inline dtl::CommStats measured_stats(const Comm& comm, const char* file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
  return dtl::testing::observe(comm.stats(), "the Comm's counters", dtl::testing::Source::kMeasured,
                               file, line);
}

// Collective ops of one kind a Comm counted since `before`.
inline int64_t count_since(const dtl::CommStats& before, const Comm& comm, OpType op,
                           const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return measured_stats(comm, file, line)[op].count - before[op].count;
}

// Every collective except `allowed` counted since `before`, named ("all_gather x2").
inline std::string others_since(const dtl::CommStats& before, const Comm& comm, OpType allowed,
                                const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  std::string out;
  const dtl::CommStats now = measured_stats(comm, file, line);
  for (OpType op : {OpType::AllReduce, OpType::AllGather, OpType::ReduceScatter, OpType::Broadcast,
                    OpType::Reduce, OpType::AllToAll, OpType::Send, OpType::Recv,
                    OpType::SendRecv}) {
    if (op == allowed) continue;
    const int64_t n = now[op].count - before[op].count;
    if (n > 0) out += (out.empty() ? "" : ", ") + std::string(dtl::to_string(op)) + " x" + std::to_string(n);
  }
  return out;
}

}  // namespace lab08_test
