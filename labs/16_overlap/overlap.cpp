// Lab 16: exposed communication from a trace, DDP's bucket model, a collective matmul.
// Your code goes here; the contract is overlap.hpp. Tasks in order: README.md.
#include "overlap.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab16 {

// ---------------------------------------------------------------- Task 1: reading a trace

std::vector<RankOverlap> overlap_from_chrome(const std::string& chrome_json, double from_s,
                                             double to_s) {
  // TODO(lab16): parse with nlohmann::json::parse(text, nullptr, false) (no exception: check
  // is_discarded()); group the "X" events by "pid"; per rank, clip every interval to the window,
  // merge the compute intervals and the comm intervals separately (sort, then join overlapping
  // ones), and measure: the two unions' lengths, and comm minus the time both cover.
  DTL_UNIMPLEMENTED("lab 16: overlap_from_chrome (Task 1)");
}

std::string overlap_report(const std::vector<RankOverlap>& ranks) {
  // TODO(lab16): a header line, then one line per rank (milliseconds, the hidden share in %).
  DTL_UNIMPLEMENTED("lab 16: overlap_report (Task 1)");
}

// ---------------------------------------------------------------- Task 2: the bucket model

BucketTiming bucket_timing(const BackwardProfile& p, int64_t first_bucket_bytes,
                           int64_t bucket_cap_bytes) {
  // TODO(lab16): check the profile; the buckets (lab04::assign_buckets); walk them in order:
  // each starts when its last gradient is ready and the previous bucket's all-reduce is done.
  DTL_UNIMPLEMENTED("lab 16: bucket_timing (Task 2)");
}

int64_t best_bucket_cap(const BackwardProfile& p, const std::vector<int64_t>& caps) {
  // TODO(lab16): the cap with the smallest total (every bucket capped at it); ties: the smallest.
  DTL_UNIMPLEMENTED("lab 16: best_bucket_cap (Task 2)");
}

// ---------------------------------------------------------------- Task 3: a collective matmul

torch::Tensor allgather_matmul(const torch::Tensor& x_local, const torch::Tensor& weight,
                               Comm& comm, bool overlap) {
  // TODO(lab16): check the arguments and the row counts (one all_gather of an int64 each); y =
  // empty [n R, N]; each chunk's rows of y with at::mm_out inside DTL_SCOPE("matmul chunk <s>");
  // plain: all_gather x, then compute; ring: sendrecv_async the chunk in hand to rank + 1 while
  // receiving the next from rank - 1 (into a buffer of your own, never into x_local), compute,
  // wait, n - 1 times; then the last chunk.
  DTL_UNIMPLEMENTED("lab 16: allgather_matmul (Task 3)");
}

}  // namespace dtl::lab16
