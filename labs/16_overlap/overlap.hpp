// labs/16_overlap/overlap.hpp — the interface of lab 16 (the seam the tests call; do not edit).
//
// defines: RankOverlap, overlap_from_chrome, overlap_report, BackwardProfile, BucketTiming,
// bucket_timing, best_bucket_cap, allgather_matmul.
//
// Communication costs step time only when nothing else runs meanwhile. Every rank has two
// clocks that can run at once: its compute (the main thread: forward, backward, matmuls) and
// its communication (each Comm's own worker, lab 04). A step's time is
//
//     step = compute + exposed_comm,   exposed_comm = comm time during which no compute runs,
//
// so overlapping drives the step from compute + comm toward max(compute, comm). This lab reads
// that off a trace, predicts it for DDP's buckets, and builds one overlapped kernel:
//
//   Task 1  overlap_from_chrome: compute, comm and exposed comm per rank, from the Chrome trace
//           every dtl program writes with --trace;
//   Task 2  bucket_timing / best_bucket_cap: the alpha-beta model of DDP's backward as a
//           function of the bucket size (small buckets pay the latency per bucket; one huge
//           bucket starts only when backward ends), and the size it says is best;
//   Task 3  allgather_matmul: a sequence-parallel all-gather fused with the matmul that
//           consumes it, chunk by chunk around a ring, so each chunk's transfer hides under
//           the previous chunk's matmul (Megatron-LM's tensor-parallel communication overlap).
//
// The demo measures all three, and lab 04's DDP and lab 15's FSDP prefetch, under the network
// emulator (`./lab run 16 -- --net pcie`). Words the tests look for in error messages are
// listed with each function ("...").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp.hpp"        // defines: lab04::assign_buckets (lab 04's bucket rule, its reference)
#include "dtl/comm.hpp"   // defines: Comm, Work
#include "dtl/error.hpp"  // defines: DTL_CHECK
#include "dtl/trace.hpp"  // defines: DTL_SCOPE, trace::Event

namespace dtl::lab16 {

// ---------------------------------------------------------------- Task 1: reading a trace

// One rank's time accounting over a window [from, to] of a trace, in seconds:
//   wall          to - from (0 when the window is empty: an open bound that puts `to` before
//                 `from`, e.g. a rank whose events all end before a given from_s)
//   compute       the length of the union of its compute events' intervals (cat "compute")
//   comm          the length of the union of its communication events' intervals (cat "comm",
//                 any of its Comm tracks: two ops in flight at once count once)
//   exposed_comm  the part of `comm` during which no compute event runs
// Every event is clipped to the window first.
struct RankOverlap {
  int rank = 0;
  double wall = 0, compute = 0, comm = 0, exposed_comm = 0;
  double hidden_comm() const { return comm - exposed_comm; }
};

// Reads a Chrome trace as dtl writes it (`--trace FILE`, trace::chrome_json): a JSON object whose
// "traceEvents" array holds complete events {"ph": "X", "pid": rank, "tid", "name", "cat":
// "compute" | "comm", "ts": start in microseconds, "dur": microseconds} among metadata events
// ("ph": "M", ignored). Returns one RankOverlap per rank that has events, by increasing rank.
// from_s / to_s bound the window in seconds on the trace's clock; a negative bound means the
// rank's first event start / last event end. Raises dtl::Error when the text is not JSON or has
// no "traceEvents" array ("trace"), or when from_s > to_s with both set ("window").
std::vector<RankOverlap> overlap_from_chrome(const std::string& chrome_json, double from_s = -1,
                                             double to_s = -1);

// A table, one line per rank: rank, wall, compute, comm, exposed comm (milliseconds), and the
// share of comm hidden under compute (percent; "-" when there is no comm).
std::string overlap_report(const std::vector<RankOverlap>& ranks);

// ---------------------------------------------------------------- Task 2: the bucket model

// What DDP's backward looks like from the all-reduce's side, measured or assumed:
struct BackwardProfile {
  std::vector<int64_t> grad_bytes;  // per parameter, in registration order (as lab 04 takes them)
  std::vector<double> ready_at;     // seconds after backward starts when each one's gradient is
                                    // ready (the last layers first: decreasing with the index)
  double backward = 0;              // seconds of backward compute
  double alpha = 0;                 // seconds per all-reduce, whatever its size (latency)
  double beta = 0;                  // seconds per byte of an all-reduce (bandwidth term)
};

// DDP's backward with buckets of the given caps (lab 04's rule: dtl::lab04::assign_buckets on
// grad_bytes), each bucket all-reduced as soon as it is full and every bucket before it has
// been issued, one at a time on the Comm's worker:
//   ready_b  = the latest ready_at of bucket b's parameters
//   start_b  = max(ready_b, end_{b-1})           (end_{-1} = 0)
//   end_b    = start_b + alpha + beta * bytes_b
//   total    = max(backward, end_last)           (backward and its communication)
//   exposed  = total - backward
// Raises dtl::Error unless grad_bytes and ready_at have the same size ("ready_at"), every
// ready_at lies in [0, backward] ("ready_at"), alpha >= 0 and beta >= 0 ("alpha", "beta"),
// or as assign_buckets does for bad caps.
struct BucketTiming {
  int buckets = 0;
  double total = 0, exposed = 0;
};
BucketTiming bucket_timing(const BackwardProfile& p, int64_t first_bucket_bytes,
                           int64_t bucket_cap_bytes);

// The cap among `caps` with the smallest bucket_timing(...).total, every bucket (the first
// included) capped at it; the smallest such cap on a tie. Raises dtl::Error when caps is empty
// ("caps").
int64_t best_bucket_cap(const BackwardProfile& p, const std::vector<int64_t>& caps);

// ---------------------------------------------------------------- Task 3: a collective matmul

// y = all_gather(x_local) @ weight^T over the ranks of `comm`: x_local is this rank's [R, K]
// rows of a sequence-sharded activation (rank r holds rows [r R, (r+1) R) of the full [n R, K]),
// weight is [N, K] (a column-parallel Linear's shard, no bias); the result is the full [n R, N],
// rows in rank order, on every rank.
//
// overlap = false: one all_gather of x into an [n R, K] buffer, then the matmul, chunk by chunk:
//   for each source rank s, rows [s R, (s+1) R) of y = chunk s @ weight^T.
// overlap = true: a ring. The chunk in hand starts as x_local; at each of n - 1 steps, first
//   issue sendrecv_async(chunk in hand -> rank + 1, the next chunk <- rank - 1), then compute
//   the chunk in hand's rows of y, then wait for the transfer; the last chunk is computed
//   after the loop. Each chunk's matmul runs in DTL_SCOPE("matmul chunk <s>"), s its source
//   rank, in both modes.
// Both modes compute every chunk with the same matmul (at::mm_out into y's rows), so their
// results are bitwise equal. Communication, both modes first: one all_gather of every rank's row
// count (an int64 each) to check that they agree; then overlap = false issues one all_gather of
// x, overlap = true n - 1 sendrecvs of R x K elements, and nothing else. At one rank: the row
// check only. Raises dtl::Error (on every rank alike) unless x_local is 2-D ("x_local"), weight
// is 2-D with weight.size(1) == x_local.size(1) ("weight"), both are on comm.device() with one
// dtype ("device", "dtype"), and every rank holds the same number of rows ("rows").
torch::Tensor allgather_matmul(const torch::Tensor& x_local, const torch::Tensor& weight,
                               Comm& comm, bool overlap);

}  // namespace dtl::lab16
