// labs/18_debugging/tests/debug_test_util.hpp — shared by the public tests (debug_test.cpp) and
// the grading tests (grading/18_debugging/): named Comms, fake op records, dumps written by
// hand in the format of debug.hpp, and the child job that runs a debugged training with a fault
// (the fault tests' new processes).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "debug.hpp"
#include "dtl/harness/checks.hpp"   // defines: device, expect_error_mentions
#include "dtl/harness/jobs.hpp"     // defines: run_job, DTL_JOB, job_arg
#include "dtl/harness/scratch.hpp"  // defines: ScratchDir
#include "dtl/runtime.hpp"
#include "dtl/split.hpp"
#include "dtl/timer.hpp"

namespace lab18_test {

namespace fs = std::filesystem;
using dtl::Comm;
using dtl::OpRecord;
using dtl::OpType;
using dtl::testing::device;
using nlohmann::json;
using namespace dtl::lab18;

// A Comm of every rank with a name of its own: the recorder and the analyzer know Comms by name.
inline std::shared_ptr<Comm> named_comm(const std::string& name) {
  return dtl::world().split(0, dtl::world().rank(), name);
}

inline dtl::testing::ScratchDir scratch(Comm& comm) { return dtl::testing::ScratchDir(comm, "dtl-lab18"); }

// An op record as a Comm would hand it to an observer.
inline OpRecord op_record(uint64_t seq, OpType op, OpRecord::State state, double issued,
                          std::vector<int64_t> shape = {8}, const std::string& dtype = "float") {
  OpRecord r;
  r.seq = seq;
  r.op = op;
  r.dtype = dtype;
  r.shape = std::move(shape);
  int64_t numel = 1;
  for (int64_t d : r.shape) numel *= d;
  r.bytes = numel * 4;
  r.state = state;
  r.issued = issued;
  if (state != OpRecord::State::Issued) r.started = issued + 0.001;
  if (state == OpRecord::State::Completed || state == OpRecord::State::Failed) r.finished = issued + 0.002;
  return r;
}
// Issued, then (if so) started, completed: what a recorder sees of one op.
inline void feed(FlightRecorder& fr, const Comm& comm, uint64_t seq, OpRecord::State last, double issued,
                 std::vector<int64_t> shape = {8}) {
  fr.record(comm, op_record(seq, OpType::AllReduce, OpRecord::State::Issued, issued, shape));
  if (last == OpRecord::State::Issued) return;
  fr.record(comm, op_record(seq, OpType::AllReduce, OpRecord::State::Started, issued, shape));
  if (last != OpRecord::State::Started) fr.record(comm, op_record(seq, OpType::AllReduce, last, issued, shape));
}

inline json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in, nullptr, false);
}

// ---------------------------------------------------------------- observations
//
// In the autograder's split run (dtl/harness/observe.hpp) the driver checks what the student's
// run produced: results of the code under test are OBSERVEd, and so are the files it wrote (a
// dump, a report, the trigger: what the code left on disk is its result); what the runtime timed,
// the allocator's and Comms' figures and how child jobs ended are MEASURED (only that process
// saw them).

using dtl::testing::Source;

// A Finding as an observable value: (kind, comm, op, name, message), (ranks, (seq, step)).
using FindingValue =
    std::pair<std::vector<std::string>, std::pair<std::vector<int>, std::vector<int64_t>>>;
inline FindingValue finding_value(const Finding& f) {
  return {{f.kind, f.comm, f.op, f.name, f.message},
          {f.ranks, {static_cast<int64_t>(f.seq), f.step}}};
}
inline Finding finding_from(const FindingValue& v, const char* file, int line) {
  Finding f;
  if (v.first.size() != 5 || v.second.second.size() != 2) {
    ADD_FAILURE_AT(file, line) << "a Finding recorded in another form";
    return f;
  }
  f.kind = v.first[0], f.comm = v.first[1], f.op = v.first[2];
  f.name = v.first[3], f.message = v.first[4];
  f.ranks = v.second.first;
  f.seq = static_cast<uint64_t>(v.second.second[0]), f.step = v.second.second[1];
  return f;
}
inline Finding observed(const Finding& f, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  return finding_from(
      dtl::testing::observe(finding_value(f), "a Finding", Source::kComputed, file, line), file,
      line);
}

// An Analysis, observed (world_size, dumped, the findings). report() is the given code's text
// of these fields.
inline Analysis observed(const Analysis& a, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  Analysis o;
  o.world_size =
      dtl::testing::observe(a.world_size, "Analysis.world_size", Source::kComputed, file, line);
  o.dumped = dtl::testing::observe(a.dumped, "Analysis.dumped", Source::kComputed, file, line);
  std::vector<FindingValue> findings;
  for (const Finding& f : a.findings) findings.push_back(finding_value(f));
  for (const auto& v : dtl::testing::observe(std::move(findings), "Analysis.findings",
                                             Source::kComputed, file, line))
    o.findings.push_back(finding_from(v, file, line));
  return o;
}

// A recorder's entries, observed: what it kept of each op (comm, op, dtype, state, id, seq,
// bytes, peer, shape) is the code's result; the times are observed apart, with `times`:
// kMeasured where they are the runtime's (ops of real Comms), kComputed where the test fed them.
inline std::vector<FrEntry> observed(const std::vector<FrEntry>& entries, Source times,
                                     const char* file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
  using Strings = std::vector<std::string>;
  using Ints = std::vector<int64_t>;  // id, seq, bytes, peer, then the shape
  std::vector<std::pair<Strings, Ints>> kept;
  std::vector<std::vector<double>> when;  // issued, started, finished
  for (const FrEntry& e : entries) {
    Ints ints = {static_cast<int64_t>(e.id), static_cast<int64_t>(e.seq), e.bytes, e.peer};
    ints.insert(ints.end(), e.shape.begin(), e.shape.end());
    kept.push_back({{e.comm, e.op, e.dtype, e.state}, ints});
    when.push_back({e.issued, e.started, e.finished});
  }
  kept = dtl::testing::observe(std::move(kept), "the recorder's entries", Source::kComputed, file,
                               line);
  when = dtl::testing::observe(std::move(when), "the entries' times", times, file, line);
  if (when.size() != kept.size()) {
    ADD_FAILURE_AT(file, line) << kept.size() << " entries recorded with " << when.size()
                               << " times";
    return {};
  }
  std::vector<FrEntry> out;
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto& [strings, ints] = kept[i];
    if (strings.size() != 4 || ints.size() < 4 || when[i].size() != 3) {
      ADD_FAILURE_AT(file, line) << "an entry recorded in another form";
      continue;
    }
    FrEntry e;
    e.comm = strings[0], e.op = strings[1], e.dtype = strings[2], e.state = strings[3];
    e.id = static_cast<uint64_t>(ints[0]), e.seq = static_cast<uint64_t>(ints[1]);
    e.bytes = ints[2], e.peer = static_cast<int>(ints[3]);
    e.shape.assign(ints.begin() + 4, ints.end());
    e.issued = when[i][0], e.started = when[i][1], e.finished = when[i][2];
    out.push_back(std::move(e));
  }
  return out;
}

// An OomReport, observed as one value (its finding() is the code's too: observe that apart).
inline OomReport observed(const OomReport& r, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
  std::vector<int64_t> ints = {r.rank,
                               r.step,
                               static_cast<int64_t>(r.requested),
                               static_cast<int64_t>(r.current),
                               static_cast<int64_t>(r.limit),
                               r.parameters,
                               r.gradients,
                               r.optimizer_state,
                               r.activations};
  auto v = dtl::testing::observe(
      std::make_pair(std::make_pair(r.phase, ints), std::make_pair(r.largest, r.by_tag)),
      "an OomReport", Source::kComputed, file, line);
  OomReport o;
  o.phase = v.first.first;
  o.largest = v.second.first;
  o.by_tag = v.second.second;
  ints = v.first.second;
  if (ints.size() != 9) {
    ADD_FAILURE_AT(file, line) << "an OomReport recorded in another form";
    return o;
  }
  o.rank = static_cast<int>(ints[0]), o.step = ints[1];
  o.requested = static_cast<size_t>(ints[2]), o.current = static_cast<size_t>(ints[3]);
  o.limit = static_cast<size_t>(ints[4]);
  o.parameters = ints[5], o.gradients = ints[6];
  o.optimizer_state = ints[7], o.activations = ints[8];
  return o;
}

// What fn raised on this rank: whether it raised E, its finding and its message, observed.
struct Raised {
  bool raised = false;
  Finding finding;
  std::string message;
};
template <typename E, typename Fn>
Raised raised_by(Fn&& fn, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  Raised r;
  try {
    fn();
  } catch (const E& e) {
    r.raised = true, r.finding = e.finding, r.message = e.what();
  }
  r.raised = dtl::testing::observe(r.raised, "whether it raised", Source::kComputed, file, line);
  r.finding = observed(r.finding, file, line);
  r.message = dtl::testing::observe(std::move(r.message), "the error message", Source::kComputed,
                                    file, line);
  return r;
}

// A JSON file the code under test (or a job running it) wrote, read back: its text observed
// (kMeasured for a file of the given code's figures), then parsed as read_json parses (a missing
// or broken file is not an object).
inline json observed_json(const std::string& path, Source source = Source::kComputed,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text = dtl::testing::observe(std::move(text), "a JSON file the code wrote", source, file, line);
  return json::parse(text, nullptr, false);
}
// Whether a path exists (observed: what the code left in the scratch directory).
inline bool observed_exists(const std::string& path, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return dtl::testing::observe(fs::exists(path), "whether a path exists", Source::kComputed, file,
                               line);
}
// A path the code returned, relative to `dir` (every run has a scratch directory of its own);
// a path outside dir stays whole.
inline std::string observed_relative(const std::string& path, const std::string& dir,
                                     const char* file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
  const std::string rel = path.rfind(dir + "/", 0) == 0 ? path.substr(dir.size() + 1) : path;
  return dtl::testing::observe(rel, "a path under the scratch directory", Source::kComputed, file,
                               line);
}

// ---------------------------------------------------------------- dumps written by hand

// One entry of a dump, in the format of debug.hpp.
inline json dump_entry(const std::string& comm, uint64_t seq, const std::string& state, double issued,
                       std::vector<int64_t> shape = {8}, const std::string& op = "all_reduce",
                       const std::string& dtype = "float") {
  static uint64_t id = 0;
  const bool done = state == "completed" || state == "failed";
  return {{"id", id++},         {"comm", comm},       {"seq", seq},
          {"op", op},           {"dtype", dtype},     {"shape", shape},
          {"bytes", 32},        {"peer", -1},         {"state", state},
          {"issued", issued},   {"started", issued + 0.001}, {"finished", done ? issued + 0.002 : 0.0}};
}

// A dump of world rank `rank` of `n`, every Comm listed spanning all n ranks.
struct DumpSpec {
  int rank = 0, n = 1;
  std::vector<std::string> comms;
  std::vector<json> entries;
  json failure = nullptr;
  std::string reason = "timeout: test";
  double time = 100;
};
inline void write_dump(const std::string& dir, const DumpSpec& d) {
  json comms = json::object();
  std::vector<int> all(d.n);
  for (int r = 0; r < d.n; ++r) all[r] = r;
  for (const auto& c : d.comms) comms[c] = {{"rank", d.rank}, {"size", d.n}, {"world_ranks", all}};
  const json j = {{"format", "dtl-fr-1"}, {"rank", d.rank},  {"world_size", d.n}, {"time", d.time},
                  {"reason", d.reason},   {"capacity", 64},  {"dropped", 0},     {"comms", comms},
                  {"entries", d.entries}, {"failure", d.failure}};
  std::ofstream(dir + "/rank-" + std::to_string(d.rank) + ".json") << j.dump(1);
}

// Runs `fn(dir)` on rank 0 to write a dump directory, then analyze() on every rank: its result
// observed (the tests assert on nothing else of it).
template <typename Fn>
Analysis analyze_written(Comm& comm, const std::string& dir, Fn&& fn,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const std::string sub = dir + "/case";
  if (comm.rank() == 0) {
    fs::remove_all(sub);
    fs::create_directories(sub);
    fn(sub);
  }
  comm.barrier();
  Analysis a = analyze(sub);
  comm.barrier();
  return observed(a, file, line);
}

// ---------------------------------------------------------------- the child job

// DTL_JOB(lab18_debug): debug_job on the child's world. args: dir=, fault=, fault_rank=,
// fault_step=, desync=0|1, replica=0|1, steps=, timeout=, grace=.
inline JobConfig job_config(const std::vector<std::string>& args) {
  using dtl::testing::job_arg;
  JobConfig c;
  c.train.steps = std::stoll(job_arg(args, "steps", "3"));
  c.train.fault.kind = job_arg(args, "fault", "");
  c.train.fault.rank = std::stoi(job_arg(args, "fault_rank", "1"));
  c.train.fault.step = std::stoll(job_arg(args, "fault_step", "1"));
  c.train.desync_check = job_arg(args, "desync", "0") == "1";
  c.train.replica_check = job_arg(args, "replica", "0") == "1";
  c.watchdog.dir = job_arg(args, "dir");
  c.watchdog.timeout_s = std::stod(job_arg(args, "timeout", "1.5"));
  c.watchdog.grace_s = std::stod(job_arg(args, "grace", "1"));
  c.watchdog.poll_s = 0.05;
  return c;
}

// The seq of the gradient all-reduce of `step` on "grads" (two checks before it, nan_check on;
// with desync_check, the CheckedComm's split came first).
inline uint64_t grads_allreduce_seq(int64_t step, bool desync = false) {
  return static_cast<uint64_t>(3 * step + 3 + (desync ? 1 : 0));
}
inline uint64_t activation_check_seq(int64_t step) { return static_cast<uint64_t>(3 * step + 1); }

struct FaultRun {
  dtl::testing::JobResult job;
  json report;       // DIR/report.json (null if the student's reporter wrote none)
  json fault;        // DIR/fault.json
  double latency = -1;  // report.reported_at - fault.time: from the fault to its report
  std::vector<int> dumps;  // ranks whose dump exists
  std::map<int, std::string> reasons;  // their dumps' reasons
  bool trigger = false;    // DIR/trigger exists
  Finding first;     // the report's first finding
};

// The student watchdog's timeout in the fault jobs, and the job's own limit: the harness's
// watchdog in the child (run_job gives it the limit - 5 s) must never beat the student's.
constexpr double kFaultTimeout = 1.5, kFaultGrace = 1.0, kJobLimit = 40;

// Launches the debugged training on `ranks` new processes, in a scratch directory of its own,
// with `fault` on `fault_rank` in step 1, and reads what the job left there. The launch lets the
// survivors of a dead rank live on (dtl::testing::survivors_live_on_env), as ranks on other nodes of
// a cluster do until their own watchdog fires: mpirun would otherwise kill them the moment one
// rank dies, before any of them could dump. Then checks what every fault test checks first:
// the job ended by itself (not by run_job's limit), the student's watchdog reported (not the
// harness's); and prints the measured time from the fault to the report.
inline FaultRun fault_job(const std::string& what, int ranks, const std::string& fault, int fault_rank,
                          bool desync = false, bool replica = false) {
  auto comm = named_comm("faults");
  auto scratch_dir = scratch(*comm);
  const std::string& dir = scratch_dir.path();
  FaultRun r;
  const dtl::testing::JobResult job = dtl::testing::run_job(
      "lab18_debug", ranks,
      {"dir=" + dir, "fault=" + fault, "fault_rank=" + std::to_string(fault_rank), "fault_step=1",
       std::string("desync=") + (desync ? "1" : "0"), std::string("replica=") + (replica ? "1" : "0"),
       "timeout=" + std::to_string(kFaultTimeout),
       "grace=" + std::to_string(kFaultGrace)},
      kJobLimit, dtl::testing::survivors_live_on_env());
  // How the job ended is the student's run's (MEASURED); what it left (the report, the dumps)
  // is its result (observed). fault.json holds the given fault injector's time: MEASURED.
  const auto ends = dtl::testing::observe(
      std::make_pair(std::vector<int64_t>{job.exit_code, job.signal, job.timed_out ? 1 : 0},
                     std::make_pair(job.seconds, job.output)),
      "the job's end (exit code, signal, timed out; seconds, output)", Source::kMeasured);
  if (ends.first.size() == 3) {
    r.job.exit_code = static_cast<int>(ends.first[0]);
    r.job.signal = static_cast<int>(ends.first[1]);
    r.job.timed_out = ends.first[2] != 0;
  }
  r.job.seconds = ends.second.first;
  r.job.output = ends.second.second;
  const std::string& out = r.job.output;
  const size_t ni = out.find("not implemented");
  if (ni != std::string::npos) {  // an unfinished lab fails as such, with the child's words
    const size_t from = out.rfind('\n', ni), to = out.find('\n', ni);
    throw dtl::NotImplemented(out.substr(from == std::string::npos ? 0 : from + 1, to - from));
  }
  r.report = observed_json(dir + "/report.json");
  r.fault = observed_json(dir + "/fault.json", Source::kMeasured);
  r.trigger = observed_exists(dir + "/trigger");
  std::map<int, std::string> reasons;  // the dumps that exist, with their reasons
  for (int k = 0; k < ranks; ++k) {
    const json d = read_json(dir + "/rank-" + std::to_string(k) + ".json");
    if (d.is_object()) reasons[k] = d.value("reason", "");
  }
  r.reasons = dtl::testing::observe(std::move(reasons), "the dumps' reasons", Source::kComputed);
  for (const auto& [k, reason] : r.reasons) r.dumps.push_back(k);
  if (r.report.is_object() && r.report.contains("findings") && !r.report["findings"].empty())
    r.first = r.report["findings"][0].get<Finding>();
  if (r.report.is_object() && r.fault.is_object())
    r.latency = r.report.value("reported_at", 0.0) - r.fault.value("time", 0.0);
  // No fault, or a flipped bit that no replica check looks for: the job ends like a healthy one.
  if (fault.empty() || (fault == "flip" && !replica)) return r;
  EXPECT_FALSE(r.job.timed_out) << what << ": " << r.job.describe();
  EXPECT_EQ(r.job.output.find("exceeded its timeout"), std::string::npos)
      << what << ": the harness's watchdog ended the job before yours: " << r.job.describe();
  EXPECT_TRUE(r.report.is_object() && !r.report["findings"].empty())
      << what << ": no report.json with a finding from the reporter; " << r.job.describe();
  std::printf("[lab18 measure] %s: fault to report %.2f s (watchdog timeout %.1f s, grace %.1f s)\n",
              what.c_str(), r.latency, kFaultTimeout, kFaultGrace);
  return r;
}

// The report's first finding is of `kind` and names exactly `ranks`, and the collective when
// `comm` is given.
inline void expect_culprit(const FaultRun& r, const std::string& kind, const std::vector<int>& ranks,
                           const std::string& comm = "", uint64_t seq = 0, const std::string& op = "all_reduce") {
  EXPECT_EQ(r.first.kind, kind) << r.report.dump(1);
  EXPECT_EQ(r.first.ranks, ranks) << r.first.message;
  if (comm.empty()) return;
  EXPECT_EQ(r.first.comm, comm) << r.first.message;
  EXPECT_EQ(r.first.seq, seq) << r.first.message;
  EXPECT_EQ(r.first.op, op) << r.first.message;
}

// The fault tests launch their own jobs; they run once, in the 1-rank test job.
#define LAB18_ONLY_AT_WORLD_SIZE_1()                                                   \
  if (dtl::world().size() != 1)                                                         \
  GTEST_SKIP() << "launches its own jobs; runs in the 1-rank test job"

}  // namespace lab18_test

namespace lab18_test {
// The child job every fault test launches (one registration per test binary).
DTL_JOB(lab18_debug) { return debug_job(job_config(args), dtl::world()); }
}  // namespace lab18_test
