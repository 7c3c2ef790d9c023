// dtl/net.hpp — defines: net::Link, net::Spec (parse, presets), net::set/current, net::Charge.
//
// The network emulator: makes the MPI backend pay the time a real cluster's links would take,
// so a laptop shows a cluster's trade-offs (overlap, topology, pipeline bubbles). A transfer of
// B bytes over a link costs alpha + B / beta (latency alpha, bandwidth beta). Ranks live on
// emulated nodes of `ranks_per_node` consecutive world ranks; a link is intra-node or
// inter-node. Each transfer occupies a window [start, start + cost] and completes at
// max(real transfer done, window end): the real bytes move inside the window, so a slow real
// transfer on a loaded machine does not add to the modelled time. Waiting is sleeping (no core
// is burned), on the Comm's worker, so async communication genuinely overlaps with compute.
//
//   point-to-point (send, sendrecv's send half): alpha + B/beta on the sender's egress link;
//       one transfer at a time per rank and link class, so concurrent sends queue. The window
//       starts when the sender issues (or its link frees up); the receiver completes no
//       earlier than the window's end.
//   built-in collectives, n ranks, S bytes, on their bottleneck link (inter-node if the Comm
//   spans nodes, else intra-node), also queued on that egress link; the window starts when
//   the last rank arrives. Costs are the textbook ring/tree alpha-beta costs (Thakur,
//   Rabenseifner and Gropp 2005; nccl-tests doc/PERFORMANCE.md for the bus factors):
//       all_reduce       2(n-1) alpha + 2(n-1)/n S/beta      (ring)
//       reduce_scatter   (n-1) alpha + (n-1)/n S/beta         (S = the whole input)
//       all_gather       (n-1) alpha + (n-1)/n S/beta         (S = the whole output)
//       all_to_all       (n-1) alpha + (n-1)/n S/beta
//       broadcast/reduce (n-1) alpha + S/beta                 (pipelined ring)
//       barrier          ceil(log2 n) alpha
//
// Spec syntax (--net or DTL_NET): a preset name (see presets()), or
//   "intra=BW,LAT;inter=BW,LAT;ranks_per_node=K;time_scale=X"   (or nodes=N)
// with BW like 200MB/s, 25GB/s, 1.5e9 (bytes/s; decimal units B KB MB GB, "/s" optional) and
// LAT like 3ms, 10us, 0.002s. Omitted fields: inter = intra; everyone on one node;
// time_scale 1. A preset may be followed by overrides: "ib-2node;time_scale=1".
//
// time_scale: every emulated cost is multiplied by it. The presets describe real hardware and
// use time_scale=1000, because a CPU core runs the labs' matmuls roughly a thousand times
// slower than a GPU: scaling communication by the same factor keeps a cluster's
// compute:communication ratio, which is what the trade-offs depend on.
#pragma once

#include <string>
#include <vector>

namespace dtl::net {

struct Link {
  double bandwidth = 0;  // bytes per second
  double latency = 0;    // seconds
  // alpha + bytes / beta
  double time(double bytes) const { return latency + (bandwidth > 0 ? bytes / bandwidth : 0.0); }
};

struct Spec {
  std::string name = "none";
  bool enabled = false;
  Link intra, inter;
  int ranks_per_node = 0;  // 0: derived from nodes (or all ranks on one node)
  int nodes = 0;           // 0: derived from ranks_per_node
  double time_scale = 1;   // multiplies every cost

  // Throws dtl::Error naming the bad field ("net spec: bad bandwidth 'fast' in intra=fast,1ms").
  static Spec parse(const std::string& text);
  std::string describe() const;  // "ib-2node: intra 200 MB/s + 3 ms, inter 25 MB/s + 10 ms, 2 nodes"
  int node_of(int world_rank, int world_size) const;
};

struct Preset {
  std::string name;
  std::string spec;         // in the custom syntax
  std::string represents;   // the real hardware, and where its numbers come from
};
const std::vector<Preset>& presets();

// The emulator of this process (all ranks must set the same spec: the Runtime does so from
// --net). set() with a disabled spec (or "none") turns it off.
void set(const Spec& spec);
const Spec& current();
bool enabled();

// Emulated cost (seconds) of an op, given the members' world ranks; 0 when disabled.
// `op` is the name used by OpType's to_string ("all_reduce", ...).
double collective_cost(const std::string& op, double bytes, const std::vector<int>& members);
double p2p_cost(double bytes, int src_world_rank, int dst_world_rank);

// Books a transfer of `cost` seconds on this rank's egress link of the given class (or the
// bottleneck class of a collective), starting no earlier than `earliest` (now_seconds() time):
// the link carries one transfer at a time, so the window starts when the link is free.
// Returns the window's end. Nothing waits here: the caller moves the real bytes, then
// sleep_until(end).
double book(double cost, bool inter_node, double earliest);
// Sleeps (no core is burned) until now_seconds() reaches `t`.
void sleep_until(double t);
bool spans_nodes(const std::vector<int>& members);
bool is_inter_node(int a_world_rank, int b_world_rank);

}  // namespace dtl::net
