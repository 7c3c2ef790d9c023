// The network emulator: spec parsing, presets, alpha-beta costs, and the egress-link queue.
#include "dtl/net.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "dtl/error.hpp"
#include "dtl/log.hpp"
#include "dtl/timer.hpp"

namespace dtl::net {

const std::vector<Preset>& presets() {
  // Real-hardware numbers; time_scale=1000 maps them to laptop compute speed (see net.hpp).
  static const std::vector<Preset> kPresets = {
      {"none", "", "no emulation: the real cost of MPI over shared memory"},
      {"nvlink", "intra=200GB/s,5us;nodes=1;time_scale=1000",
       "one 8-GPU node with NVLink 3 (A100): NCCL all-reduce bus bandwidth ~200-230 GB/s in "
       "nccl-tests, a few microseconds per step"},
      {"pcie", "intra=20GB/s,10us;nodes=1;time_scale=1000",
       "one node whose GPUs talk over PCIe Gen4 x16 (32 GB/s raw, ~20 GB/s achieved), no NVLink"},
      {"ib-2node", "intra=200GB/s,5us;inter=25GB/s,10us;nodes=2;time_scale=1000",
       "two NVLink nodes joined by 200 Gb/s HDR InfiniBand (25 GB/s per NIC; each inter-node transfer pays one NIC), ~10 us "
       "inter-node latency"},
      {"eth-2node", "intra=200GB/s,5us;inter=3.125GB/s,50us;nodes=2;time_scale=1000",
       "two NVLink nodes joined by 25 Gb/s Ethernet (3.1 GB/s) with TCP latency ~50 us"},
  };
  return kPresets;
}

namespace {

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

// "200MB/s" -> 2e8. Units are decimal, as link vendors and nccl-tests use them.
double parse_bandwidth(const std::string& text, const std::string& field) {
  std::string t = lower(trim(text));
  if (t.size() > 2 && t.substr(t.size() - 2) == "/s") t.resize(t.size() - 2);
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (...) {
    throw Error(fmt::format("net spec: bad bandwidth '{}' in {} (write e.g. 200MB/s)", text, field));
  }
  std::string unit = t.substr(used);
  double mult = unit == "" || unit == "b" ? 1 : unit == "kb" ? 1e3 : unit == "mb" ? 1e6
              : unit == "gb" ? 1e9 : -1;
  if (mult < 0 || !(v > 0))
    throw Error(fmt::format("net spec: bad bandwidth '{}' in {} (a positive number with unit B, "
                            "KB, MB or GB per second)", text, field));
  return v * mult;
}

double parse_latency(const std::string& text, const std::string& field) {
  std::string t = lower(trim(text));
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (...) {
    throw Error(fmt::format("net spec: bad latency '{}' in {} (write e.g. 10us)", text, field));
  }
  std::string unit = t.substr(used);
  double mult = unit == "s" || unit == "" ? 1 : unit == "ms" ? 1e-3 : unit == "us" ? 1e-6
              : unit == "ns" ? 1e-9 : -1;
  if (mult < 0 || v < 0)
    throw Error(fmt::format("net spec: bad latency '{}' in {} (a number >= 0 with unit s, ms, us "
                            "or ns)", text, field));
  return v * mult;
}

Link parse_link(const std::string& value, const std::string& field) {
  auto comma = value.find(',');
  if (comma == std::string::npos)
    throw Error(fmt::format("net spec: {} needs BANDWIDTH,LATENCY (e.g. {}=25GB/s,10us)", field,
                            field));
  return Link{parse_bandwidth(value.substr(0, comma), field + "=" + value),
              parse_latency(value.substr(comma + 1), field + "=" + value)};
}

int parse_count(const std::string& value, const std::string& field) {
  try {
    size_t used = 0;
    int v = std::stoi(trim(value), &used);
    if (used == trim(value).size() && v > 0) return v;
  } catch (...) {
  }
  throw Error(fmt::format("net spec: {}={} must be a positive integer", field, value));
}

std::string human_bw(double b) {
  return b >= 1e9 ? fmt::format("{:g} GB/s", b / 1e9) : b >= 1e6 ? fmt::format("{:g} MB/s", b / 1e6)
                                                               : fmt::format("{:g} KB/s", b / 1e3);
}
std::string human_lat(double s) {
  return s >= 1e-3 ? fmt::format("{:g} ms", s * 1e3) : fmt::format("{:g} us", s * 1e6);
}

// ---- state of this process's emulator
std::mutex g_mu;
Spec g_spec;
int g_world_rank = 0, g_world_size = 1;
// When each of this rank's egress links (0 intra, 1 inter) is free again (now_seconds()).
double g_link_free[2] = {0, 0};

}  // namespace

Spec Spec::parse(const std::string& text_in) {
  std::string text = trim(text_in);
  Spec s;
  if (text.empty() || text == "none" || text == "off") return s;
  // A preset name, optionally followed by ";overrides".
  std::string first = trim(text.substr(0, text.find(';')));
  if (first.find('=') == std::string::npos) {
    auto it = std::find_if(presets().begin(), presets().end(),
                           [&](const Preset& p) { return p.name == first; });
    if (it == presets().end()) {
      std::string names;
      for (auto& p : presets()) names += (names.empty() ? "" : ", ") + p.name;
      throw Error(fmt::format("net spec: unknown preset '{}' (presets: {}; or a custom spec "
                              "intra=BW,LAT;inter=BW,LAT;ranks_per_node=K)", first, names));
    }
    std::string rest = text.find(';') == std::string::npos ? "" : text.substr(text.find(';'));
    if (it->spec.empty() && rest.empty()) return s;
    s = parse(it->spec + rest);
    s.name = first;
    return s;
  }
  s.enabled = true;
  s.name = "custom";
  bool have_inter = false, have_intra = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    std::string item = trim(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    start = end == std::string::npos ? text.size() + 1 : end + 1;
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos)
      throw Error(fmt::format("net spec: '{}' is not key=value (keys: intra, inter, "
                              "ranks_per_node, nodes, time_scale)", item));
    std::string key = lower(trim(item.substr(0, eq))), value = trim(item.substr(eq + 1));
    if (key == "intra") {
      s.intra = parse_link(value, key);
      have_intra = true;
    } else if (key == "inter") {
      s.inter = parse_link(value, key);
      have_inter = true;
    } else if (key == "ranks_per_node") {
      s.ranks_per_node = parse_count(value, key);
      s.nodes = 0;
    } else if (key == "nodes") {
      s.nodes = parse_count(value, key);
      s.ranks_per_node = 0;
    } else if (key == "time_scale") {
      try {
        s.time_scale = std::stod(value);
      } catch (...) {
        s.time_scale = -1;
      }
      if (!(s.time_scale > 0))
        throw Error(fmt::format("net spec: time_scale={} must be a positive number", value));
    } else {
      throw Error(fmt::format("net spec: unknown field '{}' (keys: intra, inter, ranks_per_node, "
                              "nodes, time_scale)", key));
    }
  }
  if (!have_intra) throw Error("net spec: intra=BW,LAT is required (e.g. intra=200MB/s,1ms)");
  if (!have_inter) s.inter = s.intra;
  return s;
}

std::string Spec::describe() const {
  if (!enabled) return "none (no emulation)";
  std::string layout = nodes > 0 ? fmt::format("{} nodes", nodes)
                     : ranks_per_node > 0 ? fmt::format("{} ranks per node", ranks_per_node)
                                          : "one node";
  std::string out = fmt::format("{}: intra {} + {}", name, human_bw(intra.bandwidth),
                                human_lat(intra.latency));
  if (nodes != 1 && !(nodes == 0 && ranks_per_node == 0))
    out += fmt::format(", inter {} + {}", human_bw(inter.bandwidth), human_lat(inter.latency));
  out += ", " + layout;
  if (time_scale != 1) out += fmt::format(", time x{:g}", time_scale);
  return out;
}

int Spec::node_of(int world_rank, int world_size) const {
  int per_node = ranks_per_node;
  if (per_node <= 0 && nodes > 0) per_node = (world_size + nodes - 1) / nodes;
  if (per_node <= 0) return 0;
  return world_rank / per_node;
}

void set(const Spec& spec) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_spec = spec;
  g_world_rank = log_rank();
  g_world_size = log_world_size();
  g_link_free[0] = g_link_free[1] = 0;
}

const Spec& current() { return g_spec; }
bool enabled() { return g_spec.enabled; }

bool is_inter_node(int a, int b) {
  return g_spec.node_of(a, g_world_size) != g_spec.node_of(b, g_world_size);
}

bool spans_nodes(const std::vector<int>& members) {
  for (int m : members)
    if (is_inter_node(m, members.front())) return true;
  return false;
}

double collective_cost(const std::string& op, double bytes, const std::vector<int>& members) {
  const int n = static_cast<int>(members.size());
  if (!g_spec.enabled || n <= 1) return 0;
  const Link& link = spans_nodes(members) ? g_spec.inter : g_spec.intra;
  const double a = link.latency, b = link.bandwidth, frac = (n - 1.0) / n;
  double t = 0;
  if (op == "all_reduce")
    t = 2 * (n - 1) * a + 2 * frac * bytes / b;
  else if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all")
    t = (n - 1) * a + frac * bytes / b;
  else if (op == "broadcast" || op == "reduce")
    t = (n - 1) * a + bytes / b;
  else if (op == "barrier")
    t = std::ceil(std::log2(n)) * a;
  return t * g_spec.time_scale;
}

double p2p_cost(double bytes, int src, int dst) {
  if (!g_spec.enabled || src == dst) return 0;
  return (is_inter_node(src, dst) ? g_spec.inter : g_spec.intra).time(bytes) * g_spec.time_scale;
}

double book(double cost, bool inter_node, double earliest) {
  std::lock_guard<std::mutex> lock(g_mu);
  double& free_at = g_link_free[inter_node ? 1 : 0];
  const double start = std::max(earliest, free_at);
  free_at = start + std::max(cost, 0.0);
  return free_at;
}

void sleep_until(double t) {
  const double wait = t - now_seconds();
  if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
}

}  // namespace dtl::net
