// Lab 16 reference solution: exposed communication from a trace, DDP's bucket model, and an
// all-gather fused with its matmul around a ring.
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

namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Sorted, non-overlapping intervals covering the same time as `v`.
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [s, e] : v) {
    if (!out.empty() && s <= out.back().second) {
      out.back().second = std::max(out.back().second, e);
    } else {
      out.emplace_back(s, e);
    }
  }
  return out;
}

double length(const Intervals& v) {
  double n = 0;
  for (const auto& [s, e] : v) n += e - s;
  return n;
}

// Time covered by both of two merged interval lists: a two-pointer sweep.
double intersection(const Intervals& a, const Intervals& b) {
  double n = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second ? i : j)++;  // drop the interval that ends first
  }
  return n;
}

}  // namespace

std::vector<RankOverlap> overlap_from_chrome(const std::string& chrome_json, double from_s,
                                             double to_s) {
  using nlohmann::json;
  const json doc = json::parse(chrome_json, nullptr, false);
  DTL_CHECK(!doc.is_discarded() && doc.is_object() && doc.contains("traceEvents") &&
                doc["traceEvents"].is_array(),
            "overlap_from_chrome: not a Chrome trace (a JSON object with a \"traceEvents\" array)");
  DTL_CHECK(from_s < 0 || to_s < 0 || from_s <= to_s,
            fmt::format("overlap_from_chrome: window from {} s to {} s ends before it starts", from_s, to_s));
  struct Rank {
    Intervals compute, comm;
    double first = std::numeric_limits<double>::infinity(), last = -first;
  };
  std::map<int, Rank> ranks;  // ordered: by increasing rank
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;  // metadata: process and thread names
    Rank& r = ranks[e.value("pid", 0)];
    const double start = e.value("ts", 0.0) * 1e-6, end = start + e.value("dur", 0.0) * 1e-6;
    r.first = std::min(r.first, start);
    r.last = std::max(r.last, end);
    (e.value("cat", "") == "comm" ? r.comm : r.compute).emplace_back(start, end);
  }
  std::vector<RankOverlap> out;
  for (auto& [rank, r] : ranks) {
    const double from = from_s < 0 ? r.first : from_s, to = to_s < 0 ? r.last : to_s;
    auto clip = [&](const Intervals& v) {
      Intervals c;
      for (const auto& [s, e] : v)
        if (std::min(e, to) > std::max(s, from)) c.emplace_back(std::max(s, from), std::min(e, to));
      return merged(c);
    };
    const Intervals compute = clip(r.compute), comm = clip(r.comm);
    RankOverlap o;
    o.rank = rank;
    o.wall = std::max(0.0, to - from);  // an open bound can put a rank's end before `from`
    o.compute = length(compute);
    o.comm = length(comm);
    o.exposed_comm = o.comm - intersection(compute, comm);
    out.push_back(o);
  }
  return out;
}

std::string overlap_report(const std::vector<RankOverlap>& ranks) {
  std::string out = fmt::format("{:>5} {:>11} {:>11} {:>11} {:>13} {:>8}\n", "rank", "wall ms",
                                "compute ms", "comm ms", "exposed ms", "hidden");
  for (const auto& r : ranks)
    out += fmt::format("{:>5} {:>11.2f} {:>11.2f} {:>11.2f} {:>13.2f} {:>8}\n", r.rank, r.wall * 1e3,
                       r.compute * 1e3, r.comm * 1e3, r.exposed_comm * 1e3,
                       r.comm > 0 ? fmt::format("{:.0f}%", 100 * r.hidden_comm() / r.comm) : "-");
  return out;
}

// ---------------------------------------------------------------- Task 2: the bucket model

BucketTiming bucket_timing(const BackwardProfile& p, int64_t first_bucket_bytes,
                           int64_t bucket_cap_bytes) {
  DTL_CHECK(p.ready_at.size() == p.grad_bytes.size(),
            fmt::format("bucket_timing: {} ready_at times for {} gradients", p.ready_at.size(),
                        p.grad_bytes.size()));
  for (double t : p.ready_at)
    DTL_CHECK(t >= 0 && t <= p.backward,
              fmt::format("bucket_timing: ready_at {} s outside the backward's [0, {}] s", t, p.backward));
  DTL_CHECK(p.alpha >= 0, fmt::format("bucket_timing: alpha={} must be >= 0", p.alpha));
  DTL_CHECK(p.beta >= 0, fmt::format("bucket_timing: beta={} must be >= 0", p.beta));
  const auto buckets = lab04::assign_buckets(p.grad_bytes, first_bucket_bytes, bucket_cap_bytes);
  BucketTiming t;
  t.buckets = static_cast<int>(buckets.size());
  double end = 0;  // when the previous bucket's all-reduce ends: one at a time on the worker
  for (const auto& bucket : buckets) {
    double ready = 0;
    int64_t bytes = 0;
    for (int64_t i : bucket) {
      ready = std::max(ready, p.ready_at[static_cast<size_t>(i)]);
      bytes += p.grad_bytes[static_cast<size_t>(i)];
    }
    end = std::max(ready, end) + p.alpha + p.beta * static_cast<double>(bytes);
  }
  t.total = std::max(p.backward, end);
  t.exposed = t.total - p.backward;
  return t;
}

int64_t best_bucket_cap(const BackwardProfile& p, const std::vector<int64_t>& caps) {
  DTL_CHECK(!caps.empty(), "best_bucket_cap: caps is empty: nothing to choose from");
  int64_t best = caps.front();
  double best_total = std::numeric_limits<double>::infinity();
  for (int64_t cap : caps) {
    const double total = bucket_timing(p, cap, cap).total;
    if (total < best_total || (total == best_total && cap < best)) {
      best = cap;
      best_total = total;
    }
  }
  return best;
}

// ---------------------------------------------------------------- Task 3: a collective matmul

torch::Tensor allgather_matmul(const torch::Tensor& x_local, const torch::Tensor& weight,
                               Comm& comm, bool overlap) {
  DTL_CHECK(x_local.dim() == 2, fmt::format("allgather_matmul: x_local must be 2-D [R, K], got {}-D",
                                            x_local.dim()));
  DTL_CHECK(weight.dim() == 2 && weight.size(1) == x_local.size(1),
            fmt::format("allgather_matmul: weight must be [N, K] with K = {}, got {}",
                        x_local.size(1), fmt::join(weight.sizes(), "x")));
  DTL_CHECK(x_local.device() == comm.device() && weight.device() == comm.device(),
            fmt::format("allgather_matmul: x_local ({}) and weight ({}) must be on the comm's device {}",
                        x_local.device().str(), weight.device().str(), comm.device().str()));
  DTL_CHECK(x_local.scalar_type() == weight.scalar_type(),
            "allgather_matmul: x_local and weight must have one dtype");
  const int n = comm.size(), rank = comm.rank();
  const int64_t R = x_local.size(0), K = x_local.size(1), N = weight.size(0);
  {  // every rank the same number of rows, or the chunks would not line up
    auto mine = torch::full({1}, R, torch::TensorOptions().dtype(torch::kInt64).device(comm.device()));
    auto all = torch::empty({n}, mine.options());
    comm.all_gather(all, mine);
    DTL_CHECK(all.min().item<int64_t>() == all.max().item<int64_t>(),
              fmt::format("allgather_matmul: every rank must hold the same number of rows; rows "
                          "range from {} to {}", all.min().item<int64_t>(), all.max().item<int64_t>()));
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor x = x_local.contiguous(), wt = weight.t();
  torch::Tensor y = torch::empty({n * R, N}, x.options());
  auto compute = [&](const torch::Tensor& chunk, int source) {
    DTL_SCOPE(fmt::format("matmul chunk {}", source));
    torch::Tensor rows = y.narrow(0, source * R, R);
    at::mm_out(rows, chunk, wt);
  };
  if (n == 1) {  // nothing to gather
    compute(x, 0);
    return y;
  }
  if (!overlap) {
    torch::Tensor full = torch::empty({n * R, K}, x.options());
    comm.all_gather(full, x);
    for (int s = 0; s < n; ++s) compute(full.narrow(0, s * R, R), s);
    return y;
  }
  // The ring: after step j a rank holds the chunk of rank - j - 1. The chunk in hand is sent on
  // while the next one arrives in the other of two buffers (never into x: it is the caller's).
  torch::Tensor buffers[2] = {torch::empty_like(x), torch::empty_like(x)};
  torch::Tensor current = x;
  for (int j = 0; j < n - 1; ++j) {
    torch::Tensor next = buffers[j % 2];
    Work transfer = comm.sendrecv_async(current, (rank + 1) % n, next, (rank - 1 + n) % n);
    compute(current, (rank - j + n) % n);  // overlaps the transfer
    transfer.wait();
    current = next;
  }
  compute(current, (rank + 1) % n);  // the chunk of rank - (n - 1) = rank + 1
  return y;
}

}  // namespace dtl::lab16
