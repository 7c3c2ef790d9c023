// dtl/trace.hpp — defines: DTL_SCOPE, trace::enable, trace::Event, trace::summary,
// trace::write_chrome, trace::gantt.
//
// A timeline of what every rank did. Compute is marked by hand:
//
//   { DTL_SCOPE("forward mb=3"); y = stage->forward(x); }
//
// and every Comm op is recorded automatically (from the moment its worker starts it until it
// completes, with seq, bytes, peer). `--trace out.json` (or DTL_TRACE) writes one Chrome trace
// of all ranks at exit: open it in https://ui.perfetto.dev or chrome://tracing; each rank is a
// process with a "compute" track and one track per Comm. `--gantt` prints the same timeline
// in the terminal. When tracing is off, DTL_SCOPE costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace dtl {
struct OpRecord;
}

namespace dtl::trace {

struct Event {
  std::string name;   // "forward mb=3", "all_reduce #5"
  std::string track;  // "compute" or "comm world", ...
  std::string cat;    // "compute" | "comm"
  double start = 0, end = 0;  // seconds since the trace origin (aligned across ranks)
  int rank = 0;
  std::string args;   // JSON object text for comm ops (seq, bytes, peer, dtype, issued)
};

void enable(bool on = true);
inline std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline bool enabled() { return enabled_flag().load(std::memory_order_relaxed); }
void clear();                    // drop this rank's events (e.g. after warm-up)
// Seconds since the origin; the Runtime aligns the origin across ranks with a barrier.
double now();
void set_origin(double now_seconds_value);

void record(Event e);  // append to this rank's events (thread-safe)
void record_comm(const OpRecord& r, const std::string& comm_name);
std::vector<Event> events();     // this rank's events, in recording order

class Scope {
 public:
  explicit Scope(const char* name) : name_(enabled() ? name : nullptr), start_(name_ ? now() : 0) {}
  explicit Scope(const std::string& name) : Scope(name.c_str()) {
    if (name_) owned_ = name;
  }
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  std::string owned_;
  double start_;
};

// Time accounting of one rank over [from, to] (defaults: all recorded events).
//   compute       union of compute intervals
//   comm          union of comm-op intervals
//   exposed_comm  comm time not hidden under compute: what overlap tries to drive to zero
//   wall          to - from
struct Summary {
  double wall = 0, compute = 0, comm = 0, exposed_comm = 0;
  std::string to_string() const;
};
Summary summary(const std::vector<Event>& events, double from = -1, double to = -1);
Summary summary();  // this rank, all its events

// Collective: every rank's events, on rank 0 (other ranks get an empty vector).
std::vector<Event> gather_to_rank0();
// Collective: gathers and writes a Chrome trace JSON file from rank 0.
void write_chrome(const std::string& path);
// Chrome trace JSON text of the given events (all ranks).
std::string chrome_json(const std::vector<Event>& events);

// Terminal Gantt chart: one row per (rank, track), `width` columns spanning the events' time
// range; each event is drawn with its name's first character and labelled when it fits.
std::string gantt(const std::vector<Event>& events, int width = 100);

}  // namespace dtl::trace

#define DTL_TRACE_CONCAT2(a, b) a##b
#define DTL_TRACE_CONCAT(a, b) DTL_TRACE_CONCAT2(a, b)
// DTL_SCOPE("name"): record the enclosing block as a compute event when tracing is on.
#define DTL_SCOPE(name) ::dtl::trace::Scope DTL_TRACE_CONCAT(dtl_trace_scope_, __LINE__)(name)
