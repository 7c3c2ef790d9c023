// solutions/07_topology/topology.cpp — reference solution of lab 07.
//
// Read it in task order: bus bandwidth (how a benchmark table is read), the alpha-beta fit (how
// a link is measured), the hierarchical all-reduce (how to use a topology instead of fighting
// it), and the two cost models with the chooser (how a library such as NCCL decides).
//
// The idea of the lab in one line: a flat ring over two nodes pushes 2(n-1)/n S bytes through
// every link of the ring, the slow inter-node links included; the hierarchical all-reduce
// pushes only a 1/k share of the tensor across nodes and does the rest on the fast links
// inside each node.
#include "topology.hpp"

#include <fmt/format.h>

#include <cmath>
#include <mutex>
#include <set>
#include <vector>

#include "dtl/error.hpp"
#include "dtl/split.hpp"

namespace dtl::lab07 {
namespace {

bool finite(double x) { return std::isfinite(x); }

void check_layout(int comm_size, int ranks_per_node) {
  DTL_CHECK(ranks_per_node >= 1,
            fmt::format("hierarchy: ranks_per_node={} must be >= 1", ranks_per_node));
  DTL_CHECK(comm_size % ranks_per_node == 0,
            fmt::format("hierarchy: ranks_per_node={} does not divide {} ranks (nodes must hold "
                        "the same number of ranks)",
                        ranks_per_node, comm_size));
}

void check_link(const LinkModel& link, const char* name) {
  DTL_CHECK(finite(link.alpha) && link.alpha >= 0,
            fmt::format("topology: {} link alpha = {} s must be >= 0", name, link.alpha));
  DTL_CHECK(finite(link.beta) && link.beta > 0,
            fmt::format("topology: {} link beta = {} bytes/s must be > 0", name, link.beta));
}

// Checks what the models use (the intra link only with several ranks per node, the inter link
// only with several nodes), so a one-node topology needs no inter-node numbers.
void check_topology(const Topology& t, double bytes) {
  DTL_CHECK(t.ranks_per_node >= 1,
            fmt::format("topology: ranks_per_node={} must be >= 1", t.ranks_per_node));
  DTL_CHECK(t.nodes >= 1, fmt::format("topology: nodes={} must be >= 1", t.nodes));
  if (t.ranks_per_node > 1) check_link(t.intra, "intra-node");
  if (t.nodes > 1) check_link(t.inter, "inter-node");
  DTL_CHECK(finite(bytes) && bytes >= 0, fmt::format("topology: bytes = {} must be >= 0", bytes));
}

// Ring all-reduce over n ranks on one link: 2(n-1) steps, each rank sending 2(n-1)/n S bytes.
double ring_all_reduce_time(int n, double bytes, const LinkModel& link) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * link.alpha + 2.0 * (n - 1) / n * bytes / link.beta;
}

// Reduce-scatter or all-gather over n ranks on one link: half of the above.
double ring_half_time(int n, double bytes, const LinkModel& link) {
  if (n <= 1) return 0;
  return (n - 1) * link.alpha + (n - 1.0) / n * bytes / link.beta;
}

}  // namespace

// ================================================================ Task 1: reading a benchmark

Bandwidth bus_bandwidth(OpType op, double bytes, double seconds, int n) {
  DTL_CHECK(op != OpType::Barrier && op != OpType::Split,
            fmt::format("bus_bandwidth: op {} moves no payload, so it has no bandwidth",
                        to_string(op)));
  DTL_CHECK(n >= 1, fmt::format("bus_bandwidth: n = {} ranks, must be >= 1", n));
  DTL_CHECK(finite(bytes) && bytes >= 0,
            fmt::format("bus_bandwidth: bytes = {} must be >= 0", bytes));
  DTL_CHECK(finite(seconds) && seconds > 0,
            fmt::format("bus_bandwidth: seconds = {} must be > 0", seconds));
  // The factor is the share of S that crosses each rank's link under the bandwidth-optimal
  // algorithm (nccl-tests, doc/PERFORMANCE.md). Multiplying by it turns "my S bytes took t"
  // into "my link moved this many bytes per second", which a datasheet can be compared with.
  double factor = 1;
  switch (op) {
    case OpType::AllReduce:
      factor = 2.0 * (n - 1) / n;  // reduce-scatter + all-gather: each (n-1)/n S
      break;
    case OpType::ReduceScatter:
    case OpType::AllGather:
    case OpType::AllToAll:
      factor = (n - 1.0) / n;  // every rank receives all but its own 1/n of S
      break;
    default:
      factor = 1;  // broadcast, reduce (pipelined: S through every link), send/recv
      break;
  }
  const double algbw = bytes / seconds;
  return Bandwidth{algbw, algbw * factor};
}

// ================================================================ Task 2: fitting a link

LinkModel fit_alpha_beta(const std::vector<Sample>& samples) {
  std::set<double> sizes;
  for (const auto& s : samples) {
    DTL_CHECK(finite(s.bytes) && finite(s.seconds) && s.bytes >= 0 && s.seconds >= 0,
              fmt::format("fit_alpha_beta: sample ({} bytes, {} s) must have bytes >= 0 and "
                          "seconds >= 0",
                          s.bytes, s.seconds));
    sizes.insert(s.bytes);
  }
  DTL_CHECK(sizes.size() >= 2,
            fmt::format("fit_alpha_beta: {} samples of {} distinct size(s); a line needs at "
                        "least 2 distinct sizes",
                        samples.size(), sizes.size()));
  // Least squares with centred sums: slope = cov(S, t) / var(S), intercept = mean t - slope x
  // mean S. Centring first avoids the cancellation of n sum(S^2) - (sum S)^2, which loses
  // digits when the sizes are large and close together.
  const double count = static_cast<double>(samples.size());
  double mean_s = 0, mean_t = 0;
  for (const auto& s : samples) {
    mean_s += s.bytes / count;
    mean_t += s.seconds / count;
  }
  double cov = 0, var = 0;
  for (const auto& s : samples) {
    cov += (s.bytes - mean_s) * (s.seconds - mean_t);
    var += (s.bytes - mean_s) * (s.bytes - mean_s);
  }
  const double slope = cov / var;  // seconds per byte = 1 / beta
  DTL_CHECK(slope > 0, fmt::format("fit_alpha_beta: fitted slope {} s/byte is not positive: "
                                   "time does not grow with size in these samples",
                                   slope));
  const double intercept = mean_t - slope * mean_s;
  return LinkModel{std::max(0.0, intercept), 1.0 / slope};
}

// ================================================================ Task 3: hierarchical all-reduce

// Two splits of `comm`, as Horovod builds its local and cross communicators. The colors name the
// group (the node for local, the local index for cross) and the key orders its members by comm
// rank, so local().rank() = r % k and cross().rank() = r / k.
Hierarchy::Hierarchy(Comm& comm, int ranks_per_node) {
  check_layout(comm.size(), ranks_per_node);  // every rank fails alike, before any split
  const int r = comm.rank(), k = ranks_per_node;
  ranks_per_node_ = k;
  nodes_ = comm.size() / k;
  local_ = comm.split(/*color=*/r / k, /*key=*/r, comm.name() + "/local");
  cross_ = comm.split(/*color=*/r % k, /*key=*/r, comm.name() + "/cross");
}

void Hierarchy::all_reduce(const torch::Tensor& tensor, ReduceOp op) const {
  DTL_CHECK(tensor.defined(), "hierarchical_all_reduce: the tensor is undefined");
  DTL_CHECK(tensor.device() == local_->device(),
            fmt::format("hierarchical_all_reduce: the tensor is on {} but the hierarchy moves {} "
                        "tensors",
                        tensor.device().str(), local_->device().str()));
  DTL_CHECK(is_comm_dtype(tensor.scalar_type()),
            fmt::format("hierarchical_all_reduce: dtype {} cannot be communicated (float32, "
                        "float64, float16, bfloat16, int32, int64, int8, uint8 can)",
                        c10::toString(tensor.scalar_type())));
  const int k = local_->size(), n = k * cross_->size();
  // Avg travels as a Sum and is divided once, by n, at the very end. Averaging in each phase
  // (by k, then by m) would truncate twice for integers and round twice for floats.
  const ReduceOp wire = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  // A 1-D view of the caller's memory when the tensor is contiguous (the all-gather then writes
  // straight into it); otherwise a contiguous copy, copied back at the end.
  const torch::Tensor flat = tensor.contiguous().view({-1});
  // The chunk this rank owns in the node: the same split_range rule Comm::reduce_scatter and
  // Comm::all_gather use, so sizes agree when k does not divide numel (or numel is 0).
  const Range mine = split_range(flat.numel(), k, local_->rank());
  // The chunk gets a buffer of its own (reduce-scatter into a slice of its own input would be
  // an overlapping output), kept and reused across calls: a fresh multi-MiB buffer per call is
  // mapped fresh by glibc each time, and the MPI shared-memory transport pays for meeting new
  // pages (notes/07, "Measured here"), as a fresh cudaMalloc per call would cost on a GPU;
  // PyTorch's caching allocator and NCCL's buffer registration exist for the same reason.
  if (!scratch_.defined() || scratch_.numel() < mine.size() || scratch_.dtype() != flat.dtype() ||
      scratch_.device() != flat.device())
    scratch_ = torch::empty({mine.size()}, flat.options());
  torch::Tensor chunk = scratch_.slice(0, 0, mine.size());
  // 1. Inside the node (fast link): this rank's chunk, reduced over the node's k ranks.
  local_->reduce_scatter(chunk, flat, wire);
  // 2. Across nodes (slow link): only this chunk, S/k bytes, and the k ranks of a node do it
  //    at once, each with its own chunk over its own link (one NIC per GPU).
  cross_->all_reduce(chunk, wire);
  // Divide only the owned chunk, before the all-gather: 1/k of the division work.
  finish_avg(op, chunk, n);
  // 3. Inside the node again: every rank gathers the k finished chunks into place.
  local_->all_gather(flat, chunk);
  if (!tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
}

namespace {

// The Hierarchy of each (Comm, ranks_per_node) seen so far. A Comm is identified by a weak_ptr
// to it (comm.weak_from_this()): comparing the pointer it locks to with &comm is exact, and an
// expired entry belongs to a Comm that is gone (its address may be reused by a new Comm), so it
// is dropped, and its sub-Comms with it. Every rank makes the same calls in the same order, so
// every rank builds (and drops) the same Hierarchies at the same points.
struct CachedHierarchy {
  std::weak_ptr<Comm> comm;
  int ranks_per_node = 0;
  std::shared_ptr<Hierarchy> hierarchy;
};

std::shared_ptr<Hierarchy> hierarchy_for(Comm& comm, int ranks_per_node) {
  // Function-local statics, made on the first call. Lifetime matters here: statics die in the
  // reverse order of their construction, after main returns. The cached sub-Comms unregister
  // from the runtime's table of live Comms when they die, and that table is itself a static made
  // when the first Comm (the world) was; being made after it, the cache dies before it. A cache
  // at namespace scope would be made before main, die after that table, and crash at exit.
  static std::mutex mu;
  static std::vector<CachedHierarchy> cache;
  std::lock_guard<std::mutex> lock(mu);
  cache.erase(std::remove_if(cache.begin(), cache.end(),
                             [](const CachedHierarchy& c) { return c.comm.expired(); }),
              cache.end());
  for (const auto& c : cache)
    if (c.ranks_per_node == ranks_per_node && c.comm.lock().get() == &comm) return c.hierarchy;
  auto h = std::make_shared<Hierarchy>(comm, ranks_per_node);  // collective: splits comm
  cache.push_back(CachedHierarchy{comm.weak_from_this(), ranks_per_node, h});
  return h;
}

}  // namespace

void hierarchical_all_reduce(Comm& comm, int ranks_per_node, const torch::Tensor& tensor,
                             ReduceOp op) {
  check_layout(comm.size(), ranks_per_node);  // reject before touching the cache
  hierarchy_for(comm, ranks_per_node)->all_reduce(tensor, op);
}

// ================================================================ Task 4: choosing an algorithm

double flat_ring_time(const Topology& topo, double bytes) {
  check_topology(topo, bytes);
  // A ring that crosses nodes moves at the pace of its slowest edges: every step waits for the
  // inter-node transfer (real NCCL is a little kinder: its rings cross nodes only m times, so
  // only those steps pay the inter-node latency; the bandwidth term is the same).
  return ring_all_reduce_time(topo.world(), bytes, topo.nodes > 1 ? topo.inter : topo.intra);
}

double hierarchical_time(const Topology& topo, double bytes) {
  check_topology(topo, bytes);
  const int k = topo.ranks_per_node, m = topo.nodes;
  return 2 * ring_half_time(k, bytes, topo.intra)             // reduce-scatter + all-gather
         + ring_all_reduce_time(m, bytes / k, topo.inter);    // the chunk across nodes
}

AllReduceAlgorithm choose_algorithm(const Topology& topo, double bytes) {
  // The relative margin makes a tie a tie: with one node (or one rank per node) both models are
  // the same ring, and two ways of writing it may differ in the last bit.
  const double flat = flat_ring_time(topo, bytes), hier = hierarchical_time(topo, bytes);
  return hier < flat * (1 - 1e-9) ? AllReduceAlgorithm::Hierarchical
             : AllReduceAlgorithm::FlatRing;
}

}  // namespace dtl::lab07
