// Lab 18 reference: a flight recorder, a watchdog with a file-system side channel, an analyzer
// that names the culprit, desync check mode, a NaN/Inf detector, an OOM report and a check that
// data-parallel replicas still hold the same parameters.
#include "debug.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt >= 11 declares it here only)
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>

#include "dtl/log.hpp"     // defines: log_rank, log_world_size (this process's world rank, the world size)
#include "dtl/memory.hpp"
#include "dtl/timer.hpp"

namespace dtl::lab18 {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int world_rank() { return log_rank(); }
int world_size() { return log_world_size(); }

// Writes `text` to `path` so that a reader sees the old file or the whole new one, never half:
// a temporary name in the same directory, then rename (atomic on POSIX).
void write_atomically(const std::string& path, const std::string& text) {
  const fs::path p(path);
  const std::string tmp = (p.parent_path() / ("." + p.filename().string() + ".tmp")).string();
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.good()) throw Error(fmt::format("{}cannot write {}", rank_prefix(), tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("{}cannot rename {} to {}: {}", rank_prefix(), tmp, path, ec.message()));
}

std::string dump_path(const std::string& dir, int rank) {
  return (fs::path(dir) / fmt::format("rank-{}.json", rank)).string();
}

bool unfinished(const std::string& state) { return state == "issued" || state == "started"; }

// "rank 2 waits" / "ranks [0,1] wait": a verb that agrees with format_ranks.
std::string ranks_verb(const std::vector<int>& ranks, const char* one, const char* many) {
  return format_ranks(ranks) + " " + (ranks.size() == 1 ? one : many);
}

std::string shape_text(const std::string& dtype, const std::vector<int64_t>& shape) {
  return fmt::format("{}[{}]", dtype.empty() ? "-" : dtype, fmt::join(shape, ","));
}

// The ranks of a Comm grouped by the value each holds (a fingerprint, a parameter's hash): the
// groups in order of their lowest rank, and the majority, the largest group, ties going to the
// group of the lowest rank (the first). The desync check and the replica check both decide
// with it, from the same all-gathered words on every rank, so every rank reaches the same
// verdict and raises together.
template <typename T>
struct Vote {
  std::vector<std::pair<T, std::vector<int>>> groups;  // a value, the world ranks holding it
  size_t majority = 0;
  bool unanimous() const { return groups.size() <= 1; }
  const std::vector<int>& majority_ranks() const { return groups[majority].second; }
  std::vector<int> dissenters() const {  // every rank outside the majority, ascending
    std::vector<int> out;
    for (size_t i = 0; i < groups.size(); ++i)
      if (i != majority) out.insert(out.end(), groups[i].second.begin(), groups[i].second.end());
    std::sort(out.begin(), out.end());
    return out;
  }
};

// values[r]: what member r of a Comm holds; world_ranks: Comm::world_ranks().
template <typename T>
Vote<T> vote(const std::vector<T>& values, const std::vector<int>& world_ranks) {
  Vote<T> v;
  for (size_t r = 0; r < values.size(); ++r) {
    auto it = std::find_if(v.groups.begin(), v.groups.end(),
                           [&](const auto& g) { return g.first == values[r]; });
    if (it == v.groups.end())
      v.groups.push_back({values[r], {world_ranks[r]}});
    else
      it->second.push_back(world_ranks[r]);
  }
  for (size_t i = 1; i < v.groups.size(); ++i)
    if (v.groups[i].second.size() > v.groups[v.majority].second.size()) v.majority = i;
  return v;
}

}  // namespace

// ================================================================ Task 1: the flight recorder

namespace {
struct CommInfo {
  int rank = 0, size = 1;
  std::vector<int> world_ranks;
};
}  // namespace

// The ring: entry `id` lives in slot id % capacity, so a new entry overwrites exactly the
// oldest one, with no allocation once the ring is full. One mutex guards everything: record()
// runs on the issuing threads and the Comms' workers, to_json() on the watchdog's thread.
struct FlightRecorder::State {
  mutable std::mutex mu;
  size_t capacity = 0;
  std::vector<FrEntry> ring;
  uint64_t next_id = 0;
  std::map<std::string, CommInfo> comms;
  int observer = 0;  // Comm::add_op_observer's id; 0 while detached
};

FlightRecorder::FlightRecorder(size_t capacity) : s_(std::make_unique<State>()) {
  DTL_CHECK(capacity > 0, "FlightRecorder: capacity must be at least 1");
  s_->capacity = capacity;
  s_->ring.resize(capacity);
}

FlightRecorder::~FlightRecorder() { detach(); }

void FlightRecorder::attach() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->observer != 0) return;
  s_->observer = Comm::add_op_observer([this](const Comm& c, const OpRecord& r) { record(c, r); });
}

void FlightRecorder::detach() {
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    std::swap(id, s_->observer);
  }
  // Outside our lock: removal waits for observer calls in flight, which take our lock.
  if (id != 0) Comm::remove_op_observer(id);
}

void FlightRecorder::record(const Comm& comm, const OpRecord& r) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (r.state == OpRecord::State::Issued) {
    FrEntry e;
    e.id = s.next_id++;
    e.comm = comm.name();
    e.seq = r.seq;
    e.op = to_string(r.op);
    e.dtype = r.dtype;
    e.shape = r.shape;
    e.bytes = r.bytes;
    e.peer = r.peer;
    e.state = to_string(r.state);
    e.issued = r.issued;
    s.ring[e.id % s.capacity] = std::move(e);
    if (!s.comms.count(comm.name())) s.comms[comm.name()] = {comm.rank(), comm.size(), comm.world_ranks()};
    return;
  }
  // An update: the op is almost always among the newest entries, so search backwards.
  const uint64_t held = std::min<uint64_t>(s.next_id, s.capacity);
  for (uint64_t back = 1; back <= held; ++back) {
    FrEntry& e = s.ring[(s.next_id - back) % s.capacity];
    if (e.seq != r.seq || e.comm != comm.name()) continue;
    e.state = to_string(r.state);
    if (r.started > 0) e.started = r.started;
    if (r.finished > 0) e.finished = r.finished;
    return;
  }
}

std::vector<FrEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  std::vector<FrEntry> out;
  const uint64_t first = s_->next_id > s_->capacity ? s_->next_id - s_->capacity : 0;
  for (uint64_t id = first; id < s_->next_id; ++id) out.push_back(s_->ring[id % s_->capacity]);
  return out;
}

size_t FlightRecorder::capacity() const { return s_->capacity; }

uint64_t FlightRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->next_id > s_->capacity ? s_->next_id - s_->capacity : 0;
}

json FlightRecorder::to_json(const std::string& reason, const Finding* failure) const {
  json j = {{"format", "dtl-fr-1"}, {"rank", world_rank()},     {"world_size", world_size()},
            {"time", now_seconds()}, {"reason", reason},        {"capacity", s_->capacity},
            {"dropped", dropped()},  {"comms", json::object()}, {"entries", json::array()}};
  j["failure"] = failure ? json(*failure) : json(nullptr);
  for (const FrEntry& e : entries())
    j["entries"].push_back({{"id", e.id},         {"comm", e.comm},         {"seq", e.seq},
                            {"op", e.op},         {"dtype", e.dtype},       {"shape", e.shape},
                            {"bytes", e.bytes},   {"peer", e.peer},         {"state", e.state},
                            {"issued", e.issued}, {"started", e.started},   {"finished", e.finished}});
  std::lock_guard<std::mutex> lock(s_->mu);
  for (const auto& [name, c] : s_->comms)
    j["comms"][name] = {{"rank", c.rank}, {"size", c.size}, {"world_ranks", c.world_ranks}};
  return j;
}

std::string FlightRecorder::dump(const std::string& dir, const std::string& reason,
                                 const Finding* failure) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = dump_path(dir, world_rank());
  write_atomically(path, to_json(reason, failure).dump(1));
  return path;
}

// ================================================================ Task 2: the watchdog

struct Watchdog::State {
  FlightRecorder* recorder = nullptr;
  WatchdogOptions opt;
  int rank = 0, world = 1;
  std::mutex mu;
  bool dumped = false, reporter = false, reported = false, ended = false;
  double dumped_at = 0;
  // Last member: destroyed first, so no tick runs on a half-destroyed State.
  std::unique_ptr<PeriodicThread> thread;

  std::string path(const char* name) const { return (fs::path(opt.dir) / name).string(); }

  // Exactly one rank creates the trigger. link() of a complete temporary file onto the name
  // fails if the name exists (like O_CREAT | O_EXCL), and no reader ever sees it half-written.
  bool create_trigger(const std::string& reason) {
    const std::string tmp = path(fmt::format(".trigger.{}.tmp", rank).c_str());
    std::ofstream(tmp, std::ios::trunc)
        << json({{"rank", rank}, {"reason", reason}, {"time", now_seconds()}}).dump();
    const bool won = ::link(tmp.c_str(), path("trigger").c_str()) == 0;
    ::unlink(tmp.c_str());
    return won;
  }

  void dump(const std::string& reason, double now, const Finding* failure = nullptr) {
    recorder->dump(opt.dir, reason, failure);
    dumped = true;
    dumped_at = now;
  }

  int dumps_present() const {
    int n = 0;
    for (int r = 0; r < world; ++r) n += fs::exists(dump_path(opt.dir, r)) ? 1 : 0;
    return n;
  }

  // The reporter's last act: analyse every dump, leave the verdict on disk and on stdout.
  void report(double now) {
    std::string text;
    json j = {{"reporter", rank}, {"reported_at", now_seconds()}, {"world_size", world}};
    try {
      const Analysis a = analyze(opt.dir);
      text = a.report();
      j["findings"] = a.findings;
      j["dumped"] = a.dumped;
    } catch (const std::exception& e) {  // a report that cannot analyse still ends the job
      text = fmt::format("[dtl-fr] analysis failed: {}\n", e.what());
      j["findings"] = json::array();
    }
    j["report"] = text;
    write_atomically(path("report.json"), j.dump(1));
    std::printf("\n[dtl watchdog, rank %d] %.1f s after its dump:\n%s", rank, now - dumped_at, text.c_str());
    std::fflush(stdout);
    reported = true;
  }
};

Watchdog::Watchdog(FlightRecorder& recorder, WatchdogOptions options) : s_(std::make_unique<State>()) {
  DTL_CHECK(!options.dir.empty(), "Watchdog: options.dir (the dump directory) is empty");
  DTL_CHECK(options.timeout_s > 0, fmt::format("Watchdog: timeout_s={} must be > 0", options.timeout_s));
  s_->recorder = &recorder;
  s_->opt = std::move(options);
  s_->rank = world_rank();
  s_->world = world_size();
  std::error_code ec;
  fs::create_directories(s_->opt.dir, ec);
  if (s_->opt.poll_s > 0)
    s_->thread = std::make_unique<PeriodicThread>(s_->opt.poll_s, [this] { poll(now_seconds()); });
}

Watchdog::~Watchdog() { s_->thread.reset(); }

void Watchdog::poll(double now) {
  State& s = *s_;
  bool end = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.ended) return;
    if (!s.dumped) {
      // 1. Detect: the oldest op still unfinished past the timeout (a queued op behind a stuck
      // one counts from its issue too: it cannot finish either).
      std::optional<FrEntry> hung;
      for (const FrEntry& e : s.recorder->entries())
        if (unfinished(e.state) && now - e.issued > s.opt.timeout_s && (!hung || e.issued < hung->issued))
          hung = e;
      if (hung) {
        const std::string reason = fmt::format("timeout: {} not completed after {:.1f} s",
                                               describe_op(hung->op, hung->seq, hung->comm),
                                               now - hung->issued);
        s.reporter = s.create_trigger(reason);
        s.dump(reason, now);
      } else if (fs::exists(s.path("trigger"))) {
        // 2. Follow another rank's signal (skip a trigger still being written: next poll).
        std::ifstream in(s.path("trigger"));
        const json t = json::parse(in, nullptr, false);
        if (!t.is_discarded())
          s.dump(fmt::format("signal: rank {}: {}", t.value("rank", -1), t.value("reason", "")), now);
      }
    }
    if (s.dumped && s.reporter && !s.reported &&
        (s.dumps_present() == s.world || now - s.dumped_at >= s.opt.grace_s)) {
      s.report(now);  // 3.
      end = true;
    }
    if (s.dumped && !s.reporter) {  // 4.
      if (fs::exists(s.path("report.json"))) {
        end = true;
      } else if (now - s.dumped_at > 3 * s.opt.grace_s) {
        std::fprintf(stderr, "[dtl watchdog, rank %d] no report from the reporter: ending\n", s.rank);
        end = true;
      }
    }
    if (end) s.ended = true;
  }
  // Outside the lock: the real end_job never returns.
  if (end) {
    if (s.opt.end_job)
      s.opt.end_job(kWatchdogExitCode);
    else
      end_job(kWatchdogExitCode);
  }
}

void Watchdog::fail(const Finding& why) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.ended) return;
  const std::string reason = "failure: " + why.message;
  if (s.create_trigger(reason)) s.reporter = true;
  if (!s.dumped) s.dump(reason, now_seconds(), &why);
}

bool Watchdog::dumped() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->dumped;
}
bool Watchdog::reporter() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->reporter;
}
bool Watchdog::ended() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->ended;
}

// ================================================================ Task 3: the analyzer

namespace {

struct RankDump {
  int rank = 0;
  double time = 0;
  std::vector<FrEntry> entries;
  std::optional<Finding> failure;
};

FrEntry entry_from(const json& j) {
  FrEntry e;
  e.id = j.value("id", uint64_t{0});
  e.comm = j.value("comm", "");
  e.seq = j.value("seq", uint64_t{0});
  e.op = j.value("op", "");
  e.dtype = j.value("dtype", "");
  e.shape = j.value("shape", std::vector<int64_t>{});
  e.bytes = j.value("bytes", int64_t{0});
  e.peer = j.value("peer", -1);
  e.state = j.value("state", "");
  e.issued = j.value("issued", 0.0);
  e.started = j.value("started", 0.0);
  e.finished = j.value("finished", 0.0);
  return e;
}

// The stuck op of one Comm: its seq, op name, the members waiting in it and since when.
struct Stuck {
  uint64_t seq = 0;
  std::string op;
  std::vector<int> waiting;
  double issued = 0;  // the earliest issue among the waiting members
};

// A Finding plus what orders it among its kind.
struct Ranked {
  int kind_order = 0;
  double issued = 0;
  Finding f;
};

}  // namespace

Analysis analyze(const std::string& dir) {
  // ---- read every dump, and the members of every Comm a dump knows
  std::map<int, RankDump> dumps;
  std::map<std::string, std::vector<int>> members;
  int n = -1;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank-", 0) != 0 || it->path().extension() != ".json") continue;
    std::ifstream in(it->path());
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded()) throw Error(fmt::format("analyze: {} is not valid JSON", it->path().string()));
    const int ws = j.value("world_size", 0);
    DTL_CHECK(n < 0 || ws == n, fmt::format("analyze: the dumps in {} disagree on the world size "
                                            "({} and {})", dir, n, ws));
    n = ws;
    RankDump d;
    d.rank = j.value("rank", -1);
    d.time = j.value("time", 0.0);
    for (const json& e : j.value("entries", json::array())) d.entries.push_back(entry_from(e));
    if (j.contains("failure") && j["failure"].is_object()) d.failure = j["failure"].get<Finding>();
    const json comms = j.value("comms", json::object());  // items() must not outlive it
    for (const auto& [c, info] : comms.items()) members[c] = info.value("world_ranks", std::vector<int>{});
    dumps[d.rank] = std::move(d);
  }
  DTL_CHECK(!dumps.empty(), fmt::format("analyze: no dump (rank-*.json) in {}", dir));

  Analysis a;
  a.world_size = n;
  for (const auto& [r, d] : dumps) a.dumped.push_back(r);

  std::vector<Ranked> found;

  // ---- 1. failures, each distinct one once
  std::vector<std::string> seen;
  for (const auto& [r, d] : dumps) {
    if (!d.failure) continue;
    const Finding& f = *d.failure;
    const std::string key = json({f.kind, f.ranks, f.comm, f.seq, f.op, f.name, f.step}).dump();
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    found.push_back({0, 0, f});
  }

  // ---- the stuck op of each Comm
  std::map<std::string, Stuck> stuck;
  for (const auto& [c, ranks] : members) {
    Stuck st;
    for (int m : ranks) {
      auto it = dumps.find(m);
      if (it == dumps.end()) continue;
      for (const FrEntry& e : it->second.entries)
        if (e.comm == c && unfinished(e.state) && (st.seq == 0 || e.seq < st.seq)) st.seq = e.seq, st.op = e.op;
    }
    if (st.seq == 0) continue;
    st.issued = 1e300;
    for (int m : ranks) {
      auto it = dumps.find(m);
      if (it == dumps.end()) continue;
      for (const FrEntry& e : it->second.entries)
        if (e.comm == c && e.seq == st.seq && unfinished(e.state)) {
          st.waiting.push_back(m);
          st.issued = std::min(st.issued, e.issued);
        }
    }
    stuck[c] = st;
  }

  // ---- 2. dead: a rank without a dump, and what waits for it
  for (int r = 0; r < n; ++r) {
    if (dumps.count(r)) continue;
    Finding f;
    f.kind = "dead";
    f.ranks = {r};
    const Stuck* first = nullptr;
    for (const auto& [c, st] : stuck) {
      const auto& m = members[c];
      if (std::find(m.begin(), m.end(), r) == m.end()) continue;
      if (!first || st.seq < first->seq) first = &st, f.comm = c;
    }
    double issued = 0;
    if (first) {
      f.seq = first->seq;
      f.op = first->op;
      issued = first->issued;
      f.message = fmt::format("rank {} died (or hangs where its watchdog cannot run): it left no dump; "
                              "{} for it in {}", r, ranks_verb(first->waiting, "waits", "wait"),
                              describe_op(f.op, f.seq, f.comm));
    } else {
      f.message = fmt::format("rank {} died (or hangs where its watchdog cannot run): it left no dump; "
                              "no collective waits for it", r);
    }
    found.push_back({1, issued, f});
  }

  // ---- 3. mismatch: the first seq two members hold with different (op, dtype, shape)
  for (const auto& [c, ranks] : members) {
    struct Held {
      int rank;
      std::string op, signature;
    };
    std::map<uint64_t, std::vector<Held>> by_seq;
    std::map<uint64_t, double> issued_of;
    for (int m : ranks) {
      auto it = dumps.find(m);
      if (it == dumps.end()) continue;
      for (const FrEntry& e : it->second.entries) {
        if (e.comm != c) continue;
        by_seq[e.seq].push_back({m, e.op, e.op + " " + shape_text(e.dtype, e.shape)});
        issued_of[e.seq] = issued_of.count(e.seq) ? std::min(issued_of[e.seq], e.issued) : e.issued;
      }
    }
    for (auto& [seq, held] : by_seq) {
      std::sort(held.begin(), held.end(), [](const Held& x, const Held& y) { return x.rank < y.rank; });
      std::vector<std::string> signatures;
      std::vector<int> holders;
      std::map<std::string, std::string> op_of;
      for (const Held& h : held) {
        signatures.push_back(h.signature);
        holders.push_back(h.rank);
        op_of[h.signature] = h.op;
      }
      const Vote<std::string> v = vote(signatures, holders);
      if (v.unanimous()) continue;
      const std::string& major = v.groups[v.majority].first;
      Finding f;
      f.kind = "mismatch";
      f.comm = c;
      f.seq = seq;
      f.op = op_of[major];
      f.ranks = v.dissenters();
      std::string sides;
      for (size_t i = 0; i < v.groups.size(); ++i)
        if (i != v.majority)
          sides += fmt::format("{} {}; ", ranks_verb(v.groups[i].second, "holds", "hold"), v.groups[i].first);
      f.message = fmt::format("ranks disagree on {}: {}{} {}", describe_op(f.op, seq, c), sides,
                              ranks_verb(v.majority_ranks(), "holds", "hold"), major);
      found.push_back({2, issued_of[seq], f});
      break;
    }
  }

  // ---- 4, 5. missing and straggler: members that never issued the stuck op
  for (const auto& [c, st] : stuck) {
    std::vector<int> missing, stragglers;
    std::string elsewhere;
    double waited = 0;
    for (int m : st.waiting) waited = std::max(waited, dumps[m].time - st.issued);
    for (int m : members[c]) {
      auto it = dumps.find(m);
      if (it == dumps.end() || it->second.failure) continue;
      uint64_t highest = 0;
      const FrEntry* own = nullptr;  // an op of its own not completed, on any Comm
      for (const FrEntry& e : it->second.entries) {
        if (e.comm == c) highest = std::max(highest, e.seq);
        if (unfinished(e.state) && (!own || e.issued < own->issued)) own = &e;
      }
      if (highest >= st.seq) continue;
      if (own) {
        missing.push_back(m);
        elsewhere += fmt::format("; rank {} waits in {}", m, describe_op(own->op, own->seq, own->comm));
      } else {
        stragglers.push_back(m);
      }
    }
    const std::string what = describe_op(st.op, st.seq, c);
    if (!missing.empty()) {
      Finding f{"missing", missing, c, st.seq, st.op, "", -1, ""};
      f.message = fmt::format("{} never issued {}, which {} in{}", format_ranks(missing), what,
                              ranks_verb(st.waiting, "waits", "wait"), elsewhere);
      found.push_back({3, st.issued, f});
    }
    if (!stragglers.empty()) {
      Finding f{"straggler", stragglers, c, st.seq, st.op, "", -1, ""};
      const bool one = stragglers.size() == 1;
      f.message = fmt::format("{}: {} not issued {} and {} in no collective, so {} busy "
                              "outside communication (computing, loading data, or stuck); {} {:.1f} s",
                              ranks_verb(stragglers, "is a straggler", "are stragglers"), one ? "it has" : "they have", what,
                              one ? "waits" : "wait", one ? "it is" : "they are",
                              ranks_verb(st.waiting, "has waited", "have waited"), waited);
      found.push_back({4, st.issued, f});
    }
  }

  std::stable_sort(found.begin(), found.end(), [](const Ranked& x, const Ranked& y) {
    if (x.kind_order != y.kind_order) return x.kind_order < y.kind_order;
    if (x.kind_order == 0) return false;  // failures keep their order
    if (x.f.ranks.size() != y.f.ranks.size()) return x.f.ranks.size() < y.f.ranks.size();
    if (x.issued != y.issued) return x.issued < y.issued;
    return x.f.seq < y.f.seq;
  });
  for (auto& r : found) a.findings.push_back(std::move(r.f));
  if (a.findings.empty()) {
    Finding none;
    none.kind = "none";
    none.message = fmt::format("no culprit: no rank failed, none is missing, and no collective is "
                               "stuck in the dumps of {}", format_ranks(a.dumped));
    a.findings.push_back(none);
  }
  return a;
}

// ================================================================ Task 4: desync check

namespace {
constexpr int kMaxDims = 8;
// A fingerprint on the wire: a fixed number of int64 words whatever the shape, so that the
// check's own all_gather has the same size on every rank (else the check would itself be the
// mismatched collective it is looking for).
constexpr int64_t kWords = 5 + kMaxDims;

std::string dtype_text(torch::ScalarType t) {
  std::string s = c10::toString(t);
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

std::vector<int64_t> encode(const Fingerprint& f) {
  std::vector<int64_t> w(kWords, 0);
  w[0] = static_cast<int64_t>(f.op);
  w[1] = static_cast<int64_t>(f.seq);
  w[2] = static_cast<int64_t>(f.dtype);
  w[3] = f.detail;
  w[4] = static_cast<int64_t>(f.shape.size());
  for (size_t i = 0; i < f.shape.size(); ++i) w[5 + i] = f.shape[i];
  return w;
}

Fingerprint decode(const int64_t* w) {
  Fingerprint f;
  f.op = static_cast<OpType>(w[0]);
  f.seq = static_cast<uint64_t>(w[1]);
  f.dtype = static_cast<torch::ScalarType>(w[2]);
  f.detail = w[3];
  f.shape.assign(w + 5, w + 5 + w[4]);
  return f;
}
}  // namespace

bool Fingerprint::operator==(const Fingerprint& o) const {
  return op == o.op && seq == o.seq && dtype == o.dtype && shape == o.shape && detail == o.detail;
}

std::string Fingerprint::describe() const {
  std::string out = fmt::format("{} #{} {}", to_string(op), seq, shape_text(dtype_text(dtype), shape));
  if (op == OpType::Broadcast || op == OpType::Reduce) return out + fmt::format(" (root {})", detail);
  if (detail >= 0) return out + fmt::format(" ({})", to_string(static_cast<ReduceOp>(detail)));
  return out;
}

struct CheckedComm::State {
  Comm* comm = nullptr;
  std::shared_ptr<Comm> check;  // the check's own Comm; null when not checking

  Fingerprint next(OpType op, const torch::Tensor& t, int64_t detail) const {
    Fingerprint f;
    f.op = op;
    f.seq = comm->ops_issued() + 1;  // what the real op will get (one thread issues on comm)
    if (t.defined()) {
      f.dtype = t.scalar_type();
      f.shape = t.sizes().vec();
    }
    f.detail = detail;
    return f;
  }
};

CheckedComm::CheckedComm(Comm& comm, bool checking) : s_(std::make_unique<State>()) {
  s_->comm = &comm;
  if (checking) s_->check = comm.split(0, comm.rank(), comm.name() + "/check");
}
CheckedComm::~CheckedComm() = default;
Comm& CheckedComm::comm() const { return *s_->comm; }
bool CheckedComm::checking() const { return s_->check != nullptr; }

void CheckedComm::check(const Fingerprint& mine) {
  DTL_CHECK(s_->check != nullptr, "CheckedComm::check: this CheckedComm does not check");
  DTL_CHECK(mine.shape.size() <= static_cast<size_t>(kMaxDims),
            fmt::format("CheckedComm: a fingerprint holds shapes of up to {} dimensions, not {}",
                        kMaxDims, mine.shape.size()));
  Comm& check = *s_->check;
  const int n = check.size();
  const auto words = encode(mine);
  torch::Tensor send = torch::tensor(words, torch::kInt64).to(check.device());
  torch::Tensor all = torch::empty({n * kWords}, send.options());
  check.all_gather(all, send);
  torch::Tensor host = all.cpu();
  const int64_t* w = host.data_ptr<int64_t>();
  std::vector<Fingerprint> prints;
  for (int r = 0; r < n; ++r) prints.push_back(decode(w + r * kWords));
  // The majority is what the others should have issued.
  const Vote<Fingerprint> v = vote(prints, s_->comm->world_ranks());
  if (v.unanimous()) return;
  const Fingerprint& major = v.groups[v.majority].first;
  Finding f;
  f.kind = "desync";
  f.comm = s_->comm->name();
  f.seq = major.seq;
  f.op = to_string(major.op);
  f.ranks = v.dissenters();
  std::string sides;
  for (size_t i = 0; i < v.groups.size(); ++i) {
    if (i == v.majority) continue;
    const auto& [print, ranks] = v.groups[i];
    sides += fmt::format("{} {}; ", ranks_verb(ranks, "issues", "issue"), print.describe());
  }
  f.message = fmt::format("desync on comm '{}': {}{} {}", f.comm, sides,
                          ranks_verb(v.majority_ranks(), "issues", "issue"), major.describe());
  throw DesyncError(rank_prefix() + f.message, f);
}

void CheckedComm::all_reduce(const torch::Tensor& t, ReduceOp op) {
  if (checking()) check(s_->next(OpType::AllReduce, t, static_cast<int64_t>(op)));
  s_->comm->all_reduce(t, op);
}
void CheckedComm::reduce_scatter(const torch::Tensor& out, const torch::Tensor& in, ReduceOp op) {
  if (checking()) check(s_->next(OpType::ReduceScatter, in, static_cast<int64_t>(op)));
  s_->comm->reduce_scatter(out, in, op);
}
void CheckedComm::all_gather(const torch::Tensor& out, const torch::Tensor& in) {
  if (checking()) check(s_->next(OpType::AllGather, out, -1));
  s_->comm->all_gather(out, in);
}
void CheckedComm::broadcast(const torch::Tensor& t, int root) {
  if (checking()) check(s_->next(OpType::Broadcast, t, root));
  s_->comm->broadcast(t, root);
}
void CheckedComm::barrier() {
  if (checking()) check(s_->next(OpType::Barrier, torch::Tensor(), -1));
  s_->comm->barrier();
}

// ================================================================ Task 5: NaN / Inf detector

std::pair<int64_t, int64_t> first_non_finite(const NamedTensors& tensors) {
  // One count per tensor, stacked and copied to the host once: on a GPU each .item() is a
  // synchronisation, and a model has hundreds of parameters.
  std::vector<torch::Tensor> counts;
  std::vector<int64_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i].second;
    if (!t.defined()) continue;
    counts.push_back(torch::isfinite(t.detach()).logical_not().sum());
    index.push_back(static_cast<int64_t>(i));
  }
  if (counts.empty()) return {-1, 0};
  torch::Tensor host = torch::stack(counts).cpu();
  const int64_t* c = host.data_ptr<int64_t>();
  for (size_t k = 0; k < index.size(); ++k)
    if (c[k] > 0) return {index[k], c[k]};
  return {-1, 0};
}

void check_finite(Comm& comm, const NamedTensors& tensors, int64_t step, const std::string& what) {
  const auto [index, count] = first_non_finite(tensors);
  const int64_t numel = index >= 0 ? tensors[static_cast<size_t>(index)].second.numel() : 0;
  // Every rank learns every rank's verdict in one small collective, so every rank raises
  // together: a rank that raised alone would leave the others waiting in the next collective.
  const int n = comm.size();
  torch::Tensor mine = torch::tensor(std::vector<int64_t>{index, count, numel}, torch::kInt64).to(comm.device());
  torch::Tensor all = torch::empty({3 * n}, mine.options());
  comm.all_gather(all, mine);
  torch::Tensor host = all.cpu();
  const int64_t* v = host.data_ptr<int64_t>();
  int culprit = -1;
  std::vector<int> others;
  for (int r = 0; r < n; ++r) {
    if (v[3 * r] < 0) continue;
    if (culprit < 0)
      culprit = r;
    else
      others.push_back(comm.world_ranks()[r]);
  }
  if (culprit < 0) return;
  const int64_t* c = v + 3 * culprit;
  Finding f;
  f.kind = "nan";
  f.ranks = {comm.world_ranks()[culprit]};
  f.name = tensors[static_cast<size_t>(c[0])].first;  // the same names on every rank
  f.step = step;
  f.message = fmt::format("non-finite {} '{}': {} of {} elements are NaN or Inf on rank {} at step {}",
                          what, f.name, c[1], c[2], f.ranks[0], step);
  if (what == "gradient") f.message += " (found before the gradient all-reduce, which would have spread it to every rank)";
  if (!others.empty()) f.message += fmt::format("; {} hold non-finite values too", format_ranks(others));
  throw NonFiniteError(rank_prefix() + f.message, f);
}

// ================================================================ Task 6: OOM report

OomReport oom_report(const OutOfMemory& e, const NamedTensors& parameters,
                     const NamedTensors& optimizer_state, int64_t step, const std::string& phase,
                     size_t k) {
  OomReport r;
  r.rank = world_rank();
  r.step = step;
  r.phase = phase;
  // What the allocator saw at the throw. The handler runs after the stack unwound, so the
  // activations are gone by now: only the long-lived owners below can be measured again.
  r.requested = e.requested_bytes;
  r.current = e.current_bytes;
  r.limit = e.limit_bytes;
  r.by_tag = e.bytes_by_tag;
  std::set<const void*> counted;  // storages already attributed
  auto storage_bytes = [&](const torch::Tensor& t) -> int64_t {
    if (!t.defined()) return 0;
    const void* key = t.storage().unsafeGetStorageImpl();
    return counted.insert(key).second ? static_cast<int64_t>(t.storage().nbytes()) : 0;
  };
  std::vector<std::pair<std::string, int64_t>> named;
  for (const auto& [name, p] : parameters) {
    r.parameters += storage_bytes(p);
    named.emplace_back(name, static_cast<int64_t>(p.nbytes()));
  }
  for (const auto& [name, p] : parameters) {
    if (!p.grad().defined()) continue;
    r.gradients += storage_bytes(p.grad());
    named.emplace_back(name + ".grad", static_cast<int64_t>(p.grad().nbytes()));
  }
  for (const auto& [name, t] : optimizer_state) {
    r.optimizer_state += storage_bytes(t);
    if (t.defined()) named.emplace_back(name, static_cast<int64_t>(t.nbytes()));
  }
  r.activations = std::max<int64_t>(0, static_cast<int64_t>(r.current) - r.parameters - r.gradients - r.optimizer_state);
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  named.resize(std::min(named.size(), k));
  r.largest = std::move(named);
  return r;
}

Finding OomReport::finding() const {
  using memory::format_bytes;
  auto b = [](double x) { return format_bytes(x); };
  Finding f;
  f.kind = "oom";
  f.ranks = {rank};
  f.name = phase;
  f.step = step;
  f.message = fmt::format(
      "rank {} ran out of memory in the {} of step {}: it asked for {} ({} bytes) with {} live "
      "and a limit of {}. Live at that moment: parameters {}, gradients {}, optimizer state {}, "
      "activations and temporaries {}.",
      rank, phase, step, b(requested), requested, b(current), b(limit), b(parameters), b(gradients),
      b(optimizer_state), b(activations));
  std::string big;
  for (const auto& [name, bytes] : largest) big += fmt::format("{}{} {}", big.empty() ? "" : ", ", name, b(bytes));
  if (!big.empty()) f.message += " Largest tensors: " + big + ".";
  std::string tags;
  for (const auto& [tag, bytes] : by_tag) tags += fmt::format("{}{} {}", tags.empty() ? "" : ", ", tag, b(bytes));
  if (!tags.empty()) f.message += " By allocation site (memory::Scope): " + tags + ".";
  return f;
}

// ================================================================ Task 7: replica divergence

uint64_t content_hash(const torch::Tensor& t) {
  DTL_CHECK(t.defined(), "content_hash: an undefined tensor has no contents");
  // contiguous() lays the elements out in row-major order whatever the strides, so a transposed
  // view hashes as its copy; the host copy is what Megatron's check pays too (it hashes on the
  // CPU), which is why it runs every N steps, not every step.
  const torch::Tensor host = t.detach().contiguous().cpu();
  const auto* bytes = static_cast<const unsigned char*>(host.data_ptr());
  const size_t n = static_cast<size_t>(host.numel()) * host.element_size();
  // FNV-1a: every byte goes through a xor and a multiplication by an odd prime, so the hash
  // depends on every bit and on the order of the bytes. A sum of the values would not: it
  // misses swapped elements and, in floating point, rounds away a one-ULP change.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  return h;
}

void check_replicas(Comm& comm, const NamedTensors& tensors, int64_t step) {
  const int64_t count = static_cast<int64_t>(tensors.size());
  if (count == 0) return;
  // One word per tensor, all of them in one all_gather: a model has hundreds of parameters,
  // and a collective per parameter would pay hundreds of latencies.
  std::vector<int64_t> mine;
  for (const auto& [name, t] : tensors) mine.push_back(static_cast<int64_t>(content_hash(t)));
  const int n = comm.size();
  torch::Tensor send = torch::tensor(mine, torch::kInt64).to(comm.device());
  torch::Tensor all = torch::empty({n * count}, send.options());
  comm.all_gather(all, send);
  torch::Tensor host = all.cpu();
  const int64_t* w = host.data_ptr<int64_t>();  // rank r's hash of tensor i: w[r * count + i]
  int64_t first = -1, differing = 0;
  Vote<int64_t> at_first;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> hashes;
    for (int r = 0; r < n; ++r) hashes.push_back(w[r * count + i]);
    Vote<int64_t> v = vote(hashes, comm.world_ranks());
    if (v.unanimous()) continue;
    ++differing;
    if (first < 0) first = i, at_first = std::move(v);
  }
  if (first < 0) return;
  // The first tensor in the model's order: where a corruption spreads from a rank's own update,
  // every later tensor it touched differs too, and the count says how far it went.
  Finding f;
  f.kind = "divergence";
  f.ranks = at_first.dissenters();
  f.name = tensors[static_cast<size_t>(first)].first;
  f.step = step;
  f.message = fmt::format("replicas diverge at step {}: parameter '{}' differs on {} from {}; {} of {} "
                          "parameters differ (no collective notices: the data-parallel ranks now "
                          "train different models)",
                          step, f.name, format_ranks(f.ranks), format_ranks(at_first.majority_ranks()),
                          differing, count);
  throw DivergenceError(rank_prefix() + f.message, f);
}

}  // namespace dtl::lab18
