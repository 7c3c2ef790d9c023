// solutions/03_ring_allreduce/ring_allreduce.cpp — reference solution of lab 03.
//
// Read it in this order: the cost model (what we are trying to achieve), the ring
// reduce-scatter (the one part with arithmetic), the ring all-gather, the all-reduce that
// chains them, then recursive doubling (the latency-optimal alternative).
//
// Two engineering choices make the ring fast (notes/03, "Making the ring fast on a CPU"):
//   1. No copies the algorithm does not need. The all-reduce works directly in the caller's
//      tensor: partial sums accumulate in place, and the all-gather receives each chunk straight
//      into its final position. The only scratch is one segment for incoming partials.
//   2. Segments. A large chunk is cut into 1 MiB segments and the ring runs segment by segment
//      (as NCCL runs its ring slice by slice), so each message is of the size the transport
//      moves best and a segment is combined while it is still in the CPU cache.
#include "ring_allreduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "dtl/error.hpp"

namespace dtl::lab03 {
namespace {

// ---------------------------------------------------------------- small helpers

int mod(int a, int n) { return ((a % n) + n) % n; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

torch::Tensor slice(const torch::Tensor& flat, ChunkRange c) {
  return flat.slice(0, c.begin, c.end);
}

// Runs fn(flat) on a 1-D contiguous tensor with t's elements. When t is contiguous, flat is a
// view of t's own memory (true in-place, no copy); otherwise flat is a contiguous copy whose
// result is copied back into t, so the caller's (non-contiguous) view still sees the result.
template <typename Fn>
void with_flat(const torch::Tensor& t, Fn&& fn) {
  if (t.is_contiguous()) {
    fn(t.view({-1}));
    return;
  }
  torch::Tensor flat = t.contiguous().view({-1});
  fn(flat);
  t.copy_(flat.view(t.sizes()));
}

// ---------------------------------------------------------------- the ring engine

// Segment size. One ring step moves one chunk (S/n bytes); a large chunk is cut into segments of
// at most this many bytes, and the ring runs segment by segment: segment k of every chunk forms a
// small ring problem of its own (about n x 1 MiB) that runs all its steps while its data is hot
// in the CPU cache, and every message stays in the size range the transport moves best. On the
// course machine a 16 MiB all-reduce cut into 1 MiB segments runs 5-8x faster than the same ring
// moving whole 8 MiB chunks, and 256 KiB or 4 MiB segments are slower (notes/03, "What limits
// it"). Must stay >= 64 KiB: the header promises one sendrecv per step for chunks up to 64 KiB.
//
// The transfers are blocking on purpose. Posting segment k+1 with sendrecv_async while adding
// segment k was measured slower here: on a CPU the "transfer" is a memcpy by a core, so with one
// core per rank there is nothing idle to overlap with. On GPUs the NIC moves bytes by itself, but
// NCCL's copies and reductions are kernels on the SMs: overlap there is cheaper than serialising,
// not free, since it takes SMs and memory bandwidth from compute (notes/03 and 16).
constexpr int64_t kSegmentBytes = int64_t{1} << 20;

// Segment k of chunk c = the k-th piece of the same balanced split, applied inside the chunk.
// Every rank derives the same count from (numel, n, dtype), so message sequences match.
class Segments {
 public:
  Segments(int64_t numel, int n, int64_t element_size) : numel_(numel), n_(n) {
    const int64_t max_chunk = ceil_div(numel, n);
    count_ = std::max<int64_t>(1, ceil_div(max_chunk * element_size, kSegmentBytes));
    capacity_ = ceil_div(max_chunk, count_);
  }
  int64_t count() const { return count_; }
  int64_t capacity() const { return capacity_; }  // elements of the largest segment
  ChunkRange of(int chunk, int64_t k) const {
    const ChunkRange c = chunk_range(numel_, n_, mod(chunk, n_));
    const ChunkRange piece = chunk_range(c.size(), static_cast<int>(count_), static_cast<int>(k));
    return ChunkRange{c.begin + piece.begin, c.begin + piece.end};
  }

 private:
  int64_t numel_;
  int n_;
  int64_t count_ = 1, capacity_ = 0;
};

// The n-1 reduce-scatter steps of the ring for segment k. `data` is this rank's contribution
// (flat, contiguous). Rank r sends to its right neighbour r+1 and receives from its left r-1:
//
//   step s: send my partial of chunk (r-1-s)      -> right
//           recv left's partial of chunk (r-2-s)  <- left, combine it with my own elements
//
// What arrives in step s is exactly what leaves in step s+1, one hop further; after n-1 steps
// the partial of chunk r - n = r has visited every rank: rank r holds the complete chunk r.
// For 4 ranks (chunk c written "c"; * = carries partial sums that arrived):
//
//   step 0:  r0 sends 3,  r1 sends 0,  r2 sends 1,  r3 sends 2
//   step 1:  r0 sends 2*, r1 sends 3*, r2 sends 0*, r3 sends 1*
//   step 2:  r0 sends 1*, r1 sends 2*, r2 sends 3*, r3 sends 0*   -> rank r owns chunk r
//
// `incoming` is scratch for one segment. In place (all-reduce: `partial` undefined) partials
// accumulate in `data`. Out of place (reduce-scatter) `data` stays untouched: partials go to
// the one-segment scratch `partial`, and the last step writes into `result` (chunk r's elements).
void reduce_scatter_segment(Comm& comm, const Segments& seg, int64_t k, const torch::Tensor& data,
                            const torch::Tensor& incoming, const torch::Tensor& partial,
                            const torch::Tensor& result, ReduceOp op) {
  const int n = comm.size(), r = comm.rank();
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const bool in_place = !partial.defined();
  for (int s = 0; s < n - 1; ++s) {
    const ChunkRange out = seg.of(r - 1 - s, k), in = seg.of(r - 2 - s, k);
    // Step 0 sends my own elements; later steps the partial combined in the step before.
    const torch::Tensor send =
        (s == 0 || in_place) ? slice(data, out) : partial.narrow(0, 0, out.size());
    const torch::Tensor arrived = incoming.narrow(0, 0, in.size());
    comm.sendrecv(send, right, arrived, left);
    const torch::Tensor own = slice(data, in);
    if (in_place) {
      combine(own, own, arrived, op);  // accumulate in the caller's tensor
    } else if (s == n - 2) {
      const int64_t base = chunk_range(data.numel(), n, r).begin;
      combine(result.slice(0, in.begin - base, in.end - base), own, arrived, op);
    } else {
      combine(partial.narrow(0, 0, in.size()), own, arrived, op);
    }
  }
}

// The n-1 all-gather steps for segment k, in place in `data` (flat, contiguous; segment k of
// chunk r already holds this rank's piece). Step s forwards chunk (r-s) — my own in step 0,
// afterwards the one that just arrived — to the right, and receives chunk (r-1-s) from the left
// straight into its final place: no scratch, no copy.
void all_gather_segment(Comm& comm, const Segments& seg, int64_t k, const torch::Tensor& data) {
  const int n = comm.size(), r = comm.rank();
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s)
    comm.sendrecv(slice(data, seg.of(r - s, k)), right, slice(data, seg.of(r - 1 - s, k)), left);
}

int floor_log2(int n) {
  int lg = 0;
  while ((2 << lg) <= n) ++lg;
  return lg;
}

}  // namespace

// ---------------------------------------------------------------- Task 1: the cost model

double alpha_beta_time(Algorithm algo, int n, double bytes, double alpha, double beta) {
  DTL_CHECK(n >= 1, fmt::format("alpha_beta_time: n = {} ranks; need at least 1", n));
  DTL_CHECK(bytes >= 0, fmt::format("alpha_beta_time: bytes = {} must be >= 0", bytes));
  DTL_CHECK(alpha >= 0, fmt::format("alpha_beta_time: alpha = {} s must be >= 0", alpha));
  DTL_CHECK(beta > 0,
            fmt::format("alpha_beta_time: beta = {} must be > 0 (bandwidth in bytes/s)", beta));
  if (n == 1) return 0.0;
  // A ring step moves one chunk, S/n bytes, to the neighbour: alpha + (S/n)/beta.
  const double step = alpha + bytes / n / beta;
  switch (algo) {
    case Algorithm::RingAllReduce:
      return 2.0 * (n - 1) * step;  // = 2(n-1)a + 2(n-1)/n S/b
    case Algorithm::RingReduceScatter:
    case Algorithm::RingAllGather:
      return (n - 1) * step;  // = (n-1)a + (n-1)/n S/b
    case Algorithm::RecursiveDoublingAllReduce: {
      // Every round moves the whole tensor; folding the extra ranks in and out costs 2 more.
      const int lg = floor_log2(n);
      const int rounds = (1 << lg) == n ? lg : lg + 2;
      return rounds * (alpha + bytes / beta);
    }
  }
  DTL_CHECK(false, "alpha_beta_time: unknown algorithm");
  return 0.0;
}

// ---------------------------------------------------------------- Task 2: ring reduce-scatter

void ring_reduce_scatter(Comm& comm, const torch::Tensor& output, const torch::Tensor& input,
                         ReduceOp op) {
  check_tensor(comm, input, "ring_reduce_scatter", "input");
  check_tensor(comm, output, "ring_reduce_scatter", "output");
  DTL_CHECK(input.scalar_type() == output.scalar_type(),
            fmt::format("ring_reduce_scatter: input dtype {} differs from output dtype {}",
                        c10::toString(input.scalar_type()), c10::toString(output.scalar_type())));
  const int n = comm.size(), r = comm.rank();
  const ChunkRange mine = chunk_range(input.numel(), n, r);
  DTL_CHECK(output.numel() == mine.size(),
            fmt::format("ring_reduce_scatter: output has {} elements but chunk {} of a "
                        "{}-element input over {} ranks has {} (elements [{}, {}))",
                        output.numel(), r, input.numel(), n, mine.size(), mine.begin, mine.end));
  const torch::Tensor data = input.contiguous().view({-1});  // a view unless input is strided
  with_flat(output, [&](const torch::Tensor& result) {
    if (n == 1) {
      result.copy_(data);
      return;
    }
    const Segments seg(data.numel(), n, data.element_size());
    torch::Tensor incoming = torch::empty({seg.capacity()}, data.options());
    torch::Tensor partial = torch::empty({seg.capacity()}, data.options());
    for (int64_t k = 0; k < seg.count(); ++k)
      reduce_scatter_segment(comm, seg, k, data, incoming, partial, result, op);
    finish_avg(op, result, n);
  });
}

// ---------------------------------------------------------------- Task 3: ring all-gather

void ring_all_gather(Comm& comm, const torch::Tensor& output, const torch::Tensor& input) {
  check_tensor(comm, input, "ring_all_gather", "input");
  check_tensor(comm, output, "ring_all_gather", "output");
  DTL_CHECK(input.scalar_type() == output.scalar_type(),
            fmt::format("ring_all_gather: input dtype {} differs from output dtype {}",
                        c10::toString(input.scalar_type()), c10::toString(output.scalar_type())));
  const int n = comm.size(), r = comm.rank();
  const ChunkRange mine = chunk_range(output.numel(), n, r);
  DTL_CHECK(input.numel() == mine.size(),
            fmt::format("ring_all_gather: input has {} elements but chunk {} of a {}-element "
                        "output over {} ranks has {} (elements [{}, {}))",
                        input.numel(), r, output.numel(), n, mine.size(), mine.begin, mine.end));
  with_flat(output, [&](const torch::Tensor& data) {
    // A no-op copy when input already is this slice of output (in-place all-gather).
    slice(data, mine).copy_(input.reshape({-1}));
    const Segments seg(data.numel(), n, data.element_size());
    for (int64_t k = 0; k < seg.count(); ++k) all_gather_segment(comm, seg, k, data);
  });
}

// ---------------------------------------------------------------- Task 4: ring all-reduce

// All-reduce = reduce-scatter + all-gather, both in the caller's memory. Each rank sends
// 2(n-1) chunks of S/n bytes: 2(n-1)/n S in total, independent of n — bandwidth-optimal.
// Segment by segment: the all-gather of segment k follows its reduce-scatter while the
// segment's data is still in cache.
void ring_all_reduce(Comm& comm, const torch::Tensor& tensor, ReduceOp op) {
  check_tensor(comm, tensor, "ring_all_reduce", "input");
  const int n = comm.size(), r = comm.rank();
  if (n == 1) return;  // the sum over one rank is the tensor; Avg divides by 1
  with_flat(tensor, [&](const torch::Tensor& data) {
    const Segments seg(data.numel(), n, data.element_size());
    torch::Tensor incoming = torch::empty({seg.capacity()}, data.options());
    for (int64_t k = 0; k < seg.count(); ++k) {
      reduce_scatter_segment(comm, seg, k, data, incoming, /*partial=*/torch::Tensor(),
                             /*result=*/torch::Tensor(), op);
      // Avg: divide only what this rank owns (1/n of the work); the all-gather spreads it.
      finish_avg(op, slice(data, seg.of(r, k)), n);
      all_gather_segment(comm, seg, k, data);
    }
  });
}

// ---------------------------------------------------------------- Task 5: recursive doubling

// lg n rounds; in round j rank r swaps its whole partial result with rank r XOR 2^j, so after
// round j it holds the reduction over its aligned group of 2^(j+1) ranks. Latency-optimal
// (lg n messages instead of 2(n-1)) but every round moves all S bytes: lg n x S per rank.
// Both partners compute a (op) b vs b (op) a, which are bitwise equal (IEEE + and max are
// commutative), so every rank ends with the same bits.
void recursive_doubling_all_reduce(Comm& comm, const torch::Tensor& tensor, ReduceOp op) {
  check_tensor(comm, tensor, "recursive_doubling_all_reduce", "input");
  const int n = comm.size(), r = comm.rank();
  if (n == 1) return;                // Avg over one rank: nothing to divide
  const int p = 1 << floor_log2(n);  // the largest power of two <= n
  const int extra = n - p;           // ranks that fold into a partner
  with_flat(tensor, [&](const torch::Tensor& data) {
    torch::Tensor incoming = torch::empty_like(data);
    // Fold in: among the first 2*extra ranks, even rank 2i hands its tensor to 2i+1 and sits
    // out; the others are renumbered 0..p-1 ("virtual ranks") for the power-of-two rounds.
    int vrank = -1;
    if (r < 2 * extra) {
      if (r % 2 == 0) {
        comm.send(data, r + 1);
      } else {
        comm.recv(incoming, r - 1);
        combine(data, data, incoming, op);
        vrank = r / 2;
      }
    } else {
      vrank = r - extra;
    }
    if (vrank >= 0) {
      for (int mask = 1; mask < p; mask <<= 1) {
        const int vpeer = vrank ^ mask;
        const int peer = vpeer < extra ? 2 * vpeer + 1 : vpeer + extra;
        comm.sendrecv(data, peer, incoming, peer);
        combine(data, data, incoming, op);
      }
    }
    // Fold out: hand the result back to the ranks that sat out.
    if (r < 2 * extra) {
      if (r % 2 == 1)
        comm.send(data, r - 1);
      else
        comm.recv(data, r + 1);
    }
    finish_avg(op, data, n);
  });
}

}  // namespace dtl::lab03
