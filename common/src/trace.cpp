// Event recording, time accounting, Chrome trace output and the terminal Gantt chart.
#include "dtl/trace.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/log.hpp"
#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"

namespace dtl::trace {

using nlohmann::json;

namespace {
std::mutex g_mu;
std::vector<Event> g_events;
double g_origin = 0;
constexpr size_t kMaxEvents = 2'000'000;  // a runaway loop must not eat the machine
bool g_overflow_warned = false;
}  // namespace

void enable(bool on) {
  if (on && g_origin == 0) g_origin = now_seconds();
  enabled_flag().store(on);
}
void set_origin(double t) { g_origin = t; }
double now() { return now_seconds() - g_origin; }

void clear() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.clear();
}

void record(Event e) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_events.size() >= kMaxEvents) {
    if (!g_overflow_warned) warn("trace buffer full ({} events); later events are dropped", kMaxEvents);
    g_overflow_warned = true;
    return;
  }
  e.rank = log_rank();
  g_events.push_back(std::move(e));
}

void record_comm(const OpRecord& r, const std::string& comm_name) {
  if (!enabled()) return;
  Event e;
  e.name = fmt::format("{} #{}", to_string(r.op), r.seq);
  e.track = "comm " + comm_name;
  e.cat = "comm";
  e.start = r.started - g_origin;
  e.end = r.finished - g_origin;
  json args = {{"seq", r.seq}, {"bytes", r.bytes}, {"dtype", r.dtype}, {"shape", r.shape},
               {"issued_ms_before_start", (r.started - r.issued) * 1e3},
               {"state", to_string(r.state)}};
  if (r.peer >= 0) args["peer"] = r.peer;
  e.args = args.dump();
  record(std::move(e));
}

std::vector<Event> events() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_events;
}

Scope::~Scope() {
  if (!name_) return;
  Event e;
  e.name = owned_.empty() ? name_ : owned_;
  e.track = "compute";
  e.cat = "compute";
  e.start = start_;
  e.end = now();
  record(std::move(e));
}

// ---------------------------------------------------------------- accounting

namespace {
using Interval = std::pair<double, double>;

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}
double length(const std::vector<Interval>& v) {
  double s = 0;
  for (auto& iv : v) s += iv.second - iv.first;
  return s;
}
// Total length of the intersection of two merged interval lists.
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double s = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return s;
}
}  // namespace

std::string Summary::to_string() const {
  return fmt::format("wall {:.2f} ms | compute {:.2f} ms | comm {:.2f} ms | exposed comm {:.2f} ms",
                     wall * 1e3, compute * 1e3, comm * 1e3, exposed_comm * 1e3);
}

Summary summary(const std::vector<Event>& evs, double from, double to) {
  std::vector<Interval> compute, comm;
  double lo = 1e300, hi = -1e300;
  for (auto& e : evs) {
    lo = std::min(lo, e.start);
    hi = std::max(hi, e.end);
  }
  if (from < 0) from = lo;
  if (to < 0) to = hi;
  for (auto& e : evs) {
    double s = std::max(e.start, from), t = std::min(e.end, to);
    if (t <= s) continue;
    (e.cat == "comm" ? comm : compute).push_back({s, t});
  }
  auto c = merged(compute), m = merged(comm);
  Summary out;
  out.wall = evs.empty() ? 0 : to - from;
  out.compute = length(c);
  out.comm = length(m);
  out.exposed_comm = out.comm - overlap(c, m);
  return out;
}

Summary summary() { return summary(events()); }

// ---------------------------------------------------------------- gathering and output

static json to_json(const Event& e) {
  return {{"n", e.name}, {"t", e.track}, {"c", e.cat}, {"s", e.start}, {"e", e.end},
          {"r", e.rank}, {"a", e.args}};
}

std::vector<Event> gather_to_rank0() {
  MPI_Comm comm = Runtime::get().control_comm();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  json mine = json::array();
  for (auto& e : events()) mine.push_back(to_json(e));
  std::string text = mine.dump();
  int len = static_cast<int>(text.size());
  std::vector<int> lens(size), displs(size, 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(rank == 0 ? static_cast<size_t>(total) : 0, '\0');
  MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, comm);
  std::vector<Event> out;
  if (rank != 0) return out;
  for (int r = 0; r < size; ++r)
    for (auto& j : json::parse(all.substr(displs[r], lens[r])))
      out.push_back(Event{j["n"], j["t"], j["c"], j["s"], j["e"], j["r"], j["a"]});
  return out;
}

std::string chrome_json(const std::vector<Event>& evs) {
  json out = json::array();
  // One process per rank; thread 0 is compute, then one thread per Comm track.
  std::map<std::pair<int, std::string>, int> tids;
  std::map<int, int> next_tid;
  for (auto& e : evs) {
    auto key = std::make_pair(e.rank, e.track);
    if (tids.count(key)) continue;
    if (!next_tid.count(e.rank)) {
      next_tid[e.rank] = 1;
      out.push_back({{"ph", "M"}, {"pid", e.rank}, {"name", "process_name"},
                     {"args", {{"name", fmt::format("rank {}", e.rank)}}}});
      out.push_back({{"ph", "M"}, {"pid", e.rank}, {"name", "process_sort_index"},
                     {"args", {{"sort_index", e.rank}}}});
    }
    int tid = e.track == "compute" ? 0 : next_tid[e.rank]++;
    tids[key] = tid;
    out.push_back({{"ph", "M"}, {"pid", e.rank}, {"tid", tid}, {"name", "thread_name"},
                   {"args", {{"name", e.track}}}});
  }
  for (auto& e : evs) {
    json ev = {{"ph", "X"}, {"pid", e.rank}, {"tid", tids[{e.rank, e.track}]}, {"name", e.name},
               {"cat", e.cat}, {"ts", e.start * 1e6}, {"dur", std::max(0.0, e.end - e.start) * 1e6}};
    if (!e.args.empty()) ev["args"] = json::parse(e.args, nullptr, false);
    out.push_back(std::move(ev));
  }
  json doc = {{"traceEvents", out}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

void write_chrome(const std::string& path) {
  auto all = gather_to_rank0();
  if (log_rank() != 0) return;
  std::ofstream f(path);
  DTL_CHECK(f.good(), fmt::format("cannot write trace file '{}'", path));
  f << chrome_json(all);
  print0("trace: {} events of {} ranks written to {} (open in https://ui.perfetto.dev)",
         all.size(), log_world_size(), path);
}

std::string gantt(const std::vector<Event>& evs, int width) {
  if (evs.empty()) return "(no trace events: run with --trace or trace::enable())\n";
  width = std::max(width, 10);
  double lo = 1e300, hi = -1e300;
  for (auto& e : evs) {
    lo = std::min(lo, e.start);
    hi = std::max(hi, e.end);
  }
  const double span = std::max(hi - lo, 1e-9), per_col = span / width;
  // Rows ordered by rank, compute first, then comm tracks.
  std::map<std::pair<int, std::string>, std::string> rows;
  for (auto& e : evs) {
    auto key = std::make_pair(e.rank, e.track == "compute" ? std::string(" compute") : e.track);
    auto& row = rows[key];
    if (row.empty()) row.assign(static_cast<size_t>(width), '.');
    int c0 = static_cast<int>((e.start - lo) / per_col);
    int c1 = std::max(c0 + 1, static_cast<int>((e.end - lo) / per_col + 0.5));
    c0 = std::clamp(c0, 0, width - 1);
    c1 = std::clamp(c1, c0 + 1, width);
    char fill = e.cat == "comm" ? '=' : (e.name.empty() ? '#' : e.name[0]);
    for (int c = c0; c < c1; ++c) row[static_cast<size_t>(c)] = fill;
    // Label the bar with the event's name (up to its first space) when it fits.
    std::string label = e.name.substr(0, e.name.find(' '));
    if (e.cat == "comm") label = e.name;
    if (static_cast<int>(label.size()) + 1 < c1 - c0)
      for (size_t i = 0; i < label.size(); ++i) row[static_cast<size_t>(c0) + 1 + i] = label[i];
  }
  std::string out;
  size_t name_w = 0;
  for (auto& [key, row] : rows)
    name_w = std::max(name_w, fmt::format("rank {} {}", key.first, key.second).size());
  for (auto& [key, row] : rows)
    out += fmt::format("{:<{}} |{}|\n", fmt::format("rank {} {}", key.first, key.second), name_w, row);
  out += fmt::format("{:<{}}  0{:>{}}\n", "", name_w, fmt::format("{:.2f} ms", span * 1e3), width);
  out += "  compute bars show their name's first letter; '=' is a comm op; '.' is idle\n";
  return out;
}

}  // namespace dtl::trace
