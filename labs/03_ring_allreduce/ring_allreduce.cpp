// labs/03_ring_allreduce/ring_allreduce.cpp — YOUR code for lab 03 (the handout: README.md).
//
// Fill in the TODO(lab03) blocks in task order. The contracts (chunk layout, errors, how many
// messages each algorithm may send) are in ring_allreduce.hpp; the tests check all of them.
// Communicate with point-to-point calls only: comm.sendrecv(send, dst, recv, src) and
// comm.sendrecv_async(...) (plus comm.send / comm.recv where a transfer goes one way).
#include "ring_allreduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab03 {
namespace {

// Your helpers go here. Given (in ring_allreduce.hpp and dtl/comm.hpp): check_tensor,
// chunk_range, combine, finish_avg.

}  // namespace

// ---------------------------------------------------------------- Task 1: the cost model

double alpha_beta_time(Algorithm algo, int n, double bytes, double alpha, double beta) {
  // TODO(lab03): return the alpha-beta prediction of the header's formulas, in seconds.
  //  - First reject bad arguments with DTL_CHECK (n >= 1, bytes >= 0, alpha >= 0, beta > 0),
  //    naming the argument and its value: fmt::format("beta = {} must be > 0 ...", beta).
  //  - n == 1 costs nothing. beta is a bandwidth in bytes/s, so m bytes take m / beta seconds.
  //  - Recursive doubling: count the rounds (lg n, or floor(lg n) + 2 when n is not a power
  //    of two); each round pays alpha + S / beta.
  DTL_UNIMPLEMENTED("lab 03: alpha_beta_time (Task 1)");
}

// ---------------------------------------------------------------- Task 2: ring reduce-scatter

void ring_reduce_scatter(Comm& comm, const torch::Tensor& output, const torch::Tensor& input,
                         ReduceOp op) {
  // TODO(lab03): the n-1 reduce-scatter steps of the ring.
  //  - Check the arguments (check_tensor, same dtype, output.numel() == size of chunk `rank`
  //    of the input: chunk_range(input.numel(), n, rank); the error message says "chunk").
  //  - Work on a flat view: input.contiguous().view({-1}) (no copy when input is contiguous).
  //  - Rank r sends to right = (r+1) % n and receives from left = (r-1+n) % n. In step s it
  //    sends its partial of chunk (r-1-s) and receives left's partial of chunk (r-2-s) (indices
  //    mod n), then combines it with its own elements of that chunk: that is what it sends in
  //    step s+1. After n-1 steps chunk r is complete. Draw it for n = 3 before coding.
  //  - Leave `input` untouched: keep partials in a scratch tensor, not in the input.
  //  - A non-contiguous output: compute into output.contiguous() and copy back.
  //  - Avg: dtl::finish_avg(op, result, n) on the result.
  DTL_UNIMPLEMENTED("lab 03: ring_reduce_scatter (Task 2)");
}

// ---------------------------------------------------------------- Task 3: ring all-gather

void ring_all_gather(Comm& comm, const torch::Tensor& output, const torch::Tensor& input) {
  // TODO(lab03): the n-1 all-gather steps of the ring.
  //  - Check the arguments (input.numel() == size of chunk `rank` of the output).
  //  - Copy input into its chunk of a flat output, then in step s send chunk (r-s) to the right
  //    and receive chunk (r-1-s) from the left, straight into its place (no scratch needed).
  //  - input may be the very slice of output it is copied into: that is fine with copy_.
  DTL_UNIMPLEMENTED("lab 03: ring_all_gather (Task 3)");
}

// ---------------------------------------------------------------- Task 4: ring all-reduce

void ring_all_reduce(Comm& comm, const torch::Tensor& tensor, ReduceOp op) {
  // TODO(lab03): reduce-scatter then all-gather, in place in `tensor`.
  //  - Reuse your steps from Tasks 2 and 3 (factor them into helpers that take a flat buffer).
  //    In place, partials can accumulate in the tensor itself: one scratch chunk suffices.
  //  - `tensor` may be a non-contiguous view: the result must land in it.
  //  - Count your messages: 2(n-1) sendrecv calls; the tests check Comm::stats().
  //  - Then make it fast (README, "Performance"): no needless copies, and run the ring on
  //    segments: ONE segment count K for every chunk, from the largest chunk (its bytes / 1 MiB,
  //    rounded up), each chunk split into exactly K segments with chunk_range(chunk numel, K,
  //    k). Counts computed per chunk make neighbours disagree, and the ring hangs.
  DTL_UNIMPLEMENTED("lab 03: ring_all_reduce (Task 4)");
}

// ---------------------------------------------------------------- Task 5: recursive doubling

void recursive_doubling_all_reduce(Comm& comm, const torch::Tensor& tensor, ReduceOp op) {
  // TODO(lab03): lg n rounds of whole-tensor exchanges with rank ^ mask, in place.
  //  - Exchange into a scratch tensor, then combine(data, data, incoming, op) (given in the header).
  //  - n not a power of two: fold the extra ranks in first and out at the end (header).
  DTL_UNIMPLEMENTED("lab 03: recursive_doubling_all_reduce (Task 5)");
}

}  // namespace dtl::lab03
