// labs/07_topology/topology.cpp — YOUR code for lab 07 (the handout: README.md).
//
// Fill in the TODO(lab07) blocks in task order. Every contract (formulas, layouts, errors, what
// each algorithm may send) is in topology.hpp; the tests check all of it.
#include "topology.hpp"

#include <fmt/format.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/split.hpp"

namespace dtl::lab07 {
namespace {

// Your helpers go here. Given (in topology.hpp, dtl/comm.hpp and dtl/split.hpp): measure_link,
// emulated_topology, is_comm_dtype, finish_avg, split_range.

}  // namespace

// ================================================================ Task 1: reading a benchmark

Bandwidth bus_bandwidth(OpType op, double bytes, double seconds, int n) {
  // TODO(lab07): algbw and busbw as nccl-tests computes them (the factors are in the header).
  //  - Reject bad arguments first with DTL_CHECK, naming the argument and its value, e.g.
  //    fmt::format("bus_bandwidth: seconds = {} must be > 0", seconds).
  //  - Write the factor yourself (dtl::bus_factor is the tests' oracle). Ask: under the
  //    bandwidth-optimal algorithm, what share of S crosses one rank's link?
  DTL_UNIMPLEMENTED("lab 07: bus_bandwidth (Task 1)");
}

// ================================================================ Task 2: fitting a link

LinkModel fit_alpha_beta(const std::vector<Sample>& samples) {
  // TODO(lab07): the least-squares line t = alpha + S / beta through (bytes, seconds) points.
  //  - Check every sample, then that there are at least 2 distinct sizes.
  //  - Slope and intercept of the least-squares line; beta is 1 / slope (check the slope is
  //    positive first), alpha the intercept, clamped at 0.
  //  - Large sizes (1e9 bytes and more) square to 1e18: compute with sums that do not subtract
  //    two huge, nearly equal numbers.
  DTL_UNIMPLEMENTED("lab 07: fit_alpha_beta (Task 2)");
}

// ================================================================ Task 3: hierarchical all-reduce

Hierarchy::Hierarchy(Comm& comm, int ranks_per_node) {
  // TODO(lab07): build local_ and cross_ (and set ranks_per_node_, nodes_).
  //  - Reject a bad ranks_per_node on every rank before any split (the header's words).
  //  - comm.split(color, key, name): the ranks with the same color form a new Comm, ordered by
  //    key. Which color puts the ranks of one node together? Which one groups the ranks that
  //    hold the same local index on every node? (Or build a dtl::DeviceMesh and keep
  //    mesh.comm(...).shared_from_this().)
  DTL_UNIMPLEMENTED("lab 07: Hierarchy constructor (Task 3)");
}

void Hierarchy::all_reduce(const torch::Tensor& tensor, ReduceOp op) const {
  // TODO(lab07): the three phases of the header, in place in `tensor`.
  //  - Check the tensor first (defined, on local_->device(), a dtype is_comm_dtype accepts).
  //  - Work on a flat view (tensor.view({-1}) of a contiguous tensor shares its memory; for a
  //    non-contiguous one, work on tensor.contiguous() and copy the result back at the end).
  //  - Your chunk: split_range(numel, k, local rank), in a buffer of its own.
  //  - ReduceOp::Avg: what must travel on the wire so that integers truncate only once?
  DTL_UNIMPLEMENTED("lab 07: Hierarchy::all_reduce (Task 3)");
}

void hierarchical_all_reduce(Comm& comm, int ranks_per_node, const torch::Tensor& tensor,
                             ReduceOp op) {
  // TODO(lab07): find (or build once) the Hierarchy of (comm, ranks_per_node), then all_reduce.
  //  - Keep the built Hierarchies in a cache that lives across calls (a static in this file).
  //  - Identify a Comm by comm.weak_from_this() (a std::weak_ptr<Comm>): it expires when the Comm
  //    is destroyed, so a dead Comm's entry can be recognised and dropped, and a new Comm that
  //    happens to get the same address is not mistaken for it.
  //  - Reject a bad ranks_per_node before anything else.
  DTL_UNIMPLEMENTED("lab 07: hierarchical_all_reduce (Task 3)");
}

// ================================================================ Task 4: choosing an algorithm

double flat_ring_time(const Topology& topo, double bytes) {
  // TODO(lab07): the flat ring's model of the header. Check the topology and bytes first (only
  // the links the model uses; the header lists the words).
  DTL_UNIMPLEMENTED("lab 07: flat_ring_time (Task 4)");
}

double hierarchical_time(const Topology& topo, double bytes) {
  // TODO(lab07): the hierarchical model of the header: three phases, two links.
  DTL_UNIMPLEMENTED("lab 07: hierarchical_time (Task 4)");
}

AllReduceAlgorithm choose_algorithm(const Topology& topo, double bytes) {
  // TODO(lab07): the cheaper model; ties (within the header's margin) go to the flat ring.
  DTL_UNIMPLEMENTED("lab 07: choose_algorithm (Task 4)");
}

}  // namespace dtl::lab07
