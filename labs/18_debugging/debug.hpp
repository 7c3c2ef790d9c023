// labs/18_debugging/debug.hpp — the interface of lab 18 (the seam the tests call; do not edit).
//
// defines: (given) NamedTensors, Finding, Analysis, format_ranks, describe_op, to_json/from_json
// of a Finding, PeriodicThread, end_job, TrainConfig, Fault, Trainer, JobConfig, debug_job;
// (yours) FrEntry, FlightRecorder, WatchdogOptions, Watchdog, analyze, Fingerprint, DesyncError,
// CheckedComm, first_non_finite, NonFiniteError, check_finite, OomReport, oom_report,
// content_hash, DivergenceError, check_replicas.
//
// Debugging a distributed job means answering, from outside the stuck processes, "which rank,
// which collective, why". The tools, built here on the runtime's op records (dtl::OpRecord,
// Comm::add_op_observer) and its memory tracker (dtl/memory.hpp), are:
//
//   FlightRecorder  every rank keeps its last N ops (a ring buffer) and dumps them as JSON
//   Watchdog        an op unfinished past a timeout makes every rank dump, over a side channel
//                   (a directory) that needs no communicator; one rank analyses, the job ends
//   analyze         reads every rank's dump and names the culprit
//   CheckedComm     desync check mode: fingerprints each collective across ranks before it runs
//   check_finite    the first non-finite gradient or activation, its parameter, rank and step
//   oom_report      on dtl::OutOfMemory: live bytes by owner and the largest tensors
//   check_replicas  data-parallel replicas whose parameters silently drifted apart: the first
//                   parameter that differs and the ranks that hold the odd copy
//
// The dump directory DIR, one per job (a fresh directory: the tests and the demo make one):
//   DIR/rank-<r>.json   world rank r's dump (FlightRecorder::dump)
//   DIR/trigger         created once, by the first rank that timed out or failed: the signal
//                       every other rank's watchdog looks for; its creator is the reporter
//   DIR/report.json     written by the reporter: what analyze(DIR) found
//   DIR/fault.json      written by the given trainer when it injects a fault (tests, demo)
//
// Ranks are always world ranks (Comm::world_ranks() maps a sub-Comm's ranks to them; this
// process's world rank and the world size are dtl::log_rank() and dtl::log_world_size() of
// dtl/log.hpp: debug.cpp needs no dtl/runtime.hpp, whose command-line parser the grader's audit
// rejects in student code). Times are dtl::now_seconds() (a steady clock shared by the
// processes of one machine). Words the tests look for in messages are given with each function
// ("...").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dtl/comm.hpp"    // defines: Comm, OpRecord, OpType, ReduceOp
#include "dtl/error.hpp"   // defines: Error, OutOfMemory
#include "dtl/model.hpp"   // defines: model::GPT, GPTConfig
#include "dtl/optim.hpp"   // defines: OptimConfig

namespace dtl::lab18 {

// ================================================================ given (trainer.cpp)

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// One diagnosis: what the analyzer names, and what a rank that failed records in its dump.
//   kind        analyzer: "dead", "mismatch", "missing", "straggler", "none";
//               failures: "desync" (CheckedComm), "nan" (check_finite), "oom" (oom_report),
//               "divergence" (check_replicas), "error" (any other exception)
//   ranks       the ranks at fault, ascending (empty for "none")
//   comm, seq, op   the collective concerned: "grads", 9, "all_reduce" ("", 0, "" if none)
//   name        nan, divergence: the parameter or activation; oom: the phase ("forward", ...)
//   step        nan, oom, divergence: the training step (-1 if none)
//   message     one paragraph for a human: names the ranks (format_ranks), the collective
//               (describe_op) or the parameter and step, and what happened
struct Finding {
  std::string kind;
  std::vector<int> ranks;
  std::string comm;
  uint64_t seq = 0;
  std::string op;
  std::string name;
  int64_t step = -1;
  std::string message;
};
void to_json(nlohmann::json& j, const Finding& f);    // {"kind", "ranks", "comm", "seq", "op",
void from_json(const nlohmann::json& j, Finding& f);  //  "name", "step", "message"}

// "rank 2" for one rank, "ranks [0,2,3]" for several, "no rank" for none.
std::string format_ranks(const std::vector<int>& ranks);
// "all_reduce #9 on comm 'grads'".
std::string describe_op(const std::string& op, uint64_t seq, const std::string& comm);

// What analyze() returns.
struct Analysis {
  int world_size = 0;
  std::vector<int> dumped;         // the ranks that left a dump, ascending
  std::vector<Finding> findings;   // the most likely cause first; one {kind "none"} if nothing
  std::string report() const;      // "[dtl-fr] ...": every finding's message, numbered
};

// A thread that calls tick() every period_s seconds until destroyed (the destructor waits for a
// tick in progress). An exception thrown by tick() is printed and stops the ticking.
class PeriodicThread {
 public:
  PeriodicThread(double period_s, std::function<void()> tick);
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Ends this process now, from any thread: flushes stdout and stderr and exits with `code`
// (std::_Exit: no destructors, no MPI_Finalize, which would wait for ranks that never come). A
// rank stuck inside a collective cannot be woken up, so exiting is the way out (on NCCL,
// PyTorch's watchdog aborts the communicator and tears the process down for the same reason).
// The launcher ends the job once its ranks have exited: a plain mpirun kills the others as soon
// as one rank exits like this; launched to let ranks outlive a dead one (the fault tests and the
// demo), when every rank has. The exit code of a rank the watchdog ended:
constexpr int kWatchdogExitCode = 86;
[[noreturn]] void end_job(int code);

// ================================================================ yours (debug.cpp)

// ---------------------------------------------------------------- Task 1: the flight recorder

// One op in the recorder.
struct FrEntry {
  uint64_t id = 0;            // this rank's record id: 0, 1, 2, ... in the order ops were issued
  std::string comm;           // the Comm's name (name your Comms: Comm::split's name argument)
  uint64_t seq = 0;           // OpRecord::seq: the op's number on that Comm
  std::string op;             // to_string(OpType): "all_reduce"
  std::string dtype;          // OpRecord::dtype: "float", "long", ... ("" for barrier and split)
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  int peer = -1;
  std::string state;          // "issued", "started", "completed" or "failed"
  double issued = 0, started = 0, finished = 0;  // 0 until it happened
};

// A ring buffer of the last `capacity` ops of this process (every Comm), as PyTorch's NCCL
// flight recorder keeps (TORCH_NCCL_TRACE_BUFFER_SIZE). Thread-safe: ops are recorded from the
// issuing threads and the Comms' workers while a watchdog thread dumps.
class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 256);  // capacity 0: dtl::Error ("capacity")
  ~FlightRecorder();                               // detaches
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Start / stop recording every op of every Comm of this process (Comm::add_op_observer).
  // attach() twice is one attachment.
  void attach();
  void detach();

  // One event of one op (what the observer calls; the tests call it too). State Issued: a new
  // entry with the next id (when the ring is full the oldest entry is dropped); remember the
  // Comm (its name, this rank's rank in it, its size and world_ranks()). Started, Completed,
  // Failed: update the state and times of the newest entry with the same Comm name and seq;
  // nothing if there is none (it was dropped, or issued before attach()).
  void record(const Comm& comm, const OpRecord& record);

  std::vector<FrEntry> entries() const;  // oldest first, at most capacity()
  size_t capacity() const;
  uint64_t dropped() const;              // entries pushed out of the ring so far

  // This rank's dump:
  //   {"format": "dtl-fr-1", "rank": <world rank>, "world_size": <n>, "time": <now>,
  //    "reason": reason, "capacity": <c>, "dropped": <d>,
  //    "comms": {"<name>": {"rank": <rank in it>, "size": <size>, "world_ranks": [...]}, ...},
  //    "entries": [{"id", "comm", "seq", "op", "dtype", "shape", "bytes", "peer", "state",
  //                 "issued", "started", "finished"}, ...],      // oldest first
  //    "failure": null, or the Finding (to_json) this rank failed with}
  nlohmann::json to_json(const std::string& reason, const Finding* failure = nullptr) const;
  // Writes to_json(reason, failure) to DIR/rank-<world rank>.json so that a reader never sees
  // half a file (write DIR/.rank-<r>.json.tmp, then rename); creates DIR if needed. Returns the
  // path. Raises dtl::Error naming the path when it cannot write.
  std::string dump(const std::string& dir, const std::string& reason,
                   const Finding* failure = nullptr) const;

 private:
  struct State;  // yours: define it in debug.cpp
  std::unique_ptr<State> s_;
};

// ---------------------------------------------------------------- Task 2: the watchdog

struct WatchdogOptions {
  std::string dir;         // the dump directory: the side channel every rank reads and writes
  double timeout_s = 3;    // an op not completed this long after it was issued is a hang
  double poll_s = 0.05;    // the thread's period; <= 0: no thread (call poll() yourself)
  double grace_s = 2;      // how long the reporter waits for every rank's dump
  std::function<void(int code)> end_job;  // empty: lab18::end_job (the tests pass their own)
};

// Every rank runs one. The protocol (DIR = options.dir, n = world size):
//  poll(now), called every poll_s by the watchdog's PeriodicThread:
//   1. Detect: an entry of the recorder that is neither completed nor failed and was issued more
//      than timeout_s before `now` is a hang. The first time, this rank tries to create
//      DIR/trigger exclusively (O_CREAT | O_EXCL) holding {"rank", "reason", "time"}; if it
//      did, it is the reporter. It dumps with reason "timeout: <describe_op> not completed
//      after <t> s" (the oldest such entry).
//   2. Follow: a rank that has not dumped and finds DIR/trigger dumps with reason
//      "signal: rank <r>: <the trigger's reason>".
//   3. Report (the reporter only, once): when all n dumps exist, or grace_s after its own dump,
//      it runs analyze(DIR), writes DIR/report.json {"reporter": <rank>, "reported_at": <now>,
//      "report": Analysis::report(), "findings": [...], "dumped": [...], "world_size": n},
//      prints the report on stdout, then calls end_job(kWatchdogExitCode) (options.end_job).
//   4. Finish (a rank that dumped but is not the reporter): when DIR/report.json appears, it
//      calls end_job(kWatchdogExitCode); so does it when no report has appeared 3 x grace_s
//      after its dump (the reporter may be dead).
//   Every rank dumps at most once; end_job is called at most once per rank; after it was
//   called poll does nothing.
//  fail(why), from the thread that caught an exception: dumps with reason "failure: <message>"
//   and the Finding, creates DIR/trigger if no rank has (then this rank is the reporter), and
//   returns; the rest happens in poll. A rank that already dumped does not dump again.
class Watchdog {
 public:
  // Starts the thread when options.poll_s > 0. options.dir empty, timeout_s <= 0: dtl::Error.
  Watchdog(FlightRecorder& recorder, WatchdogOptions options);
  ~Watchdog();  // stops the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void poll(double now);
  void fail(const Finding& why);

  bool dumped() const;    // this rank has dumped
  bool reporter() const;  // this rank created DIR/trigger
  bool ended() const;     // this rank has called end_job

 private:
  struct State;  // yours
  std::unique_ptr<State> s_;
};

// ---------------------------------------------------------------- Task 3: the analyzer

// Reads every DIR/rank-*.json and names the culprits. Raises dtl::Error naming DIR when there is
// no dump ("no dump") or the dumps disagree on the world size ("world size").
// The members of a Comm are the world_ranks its "comms" entry lists (in any dump). For each
// Comm, its stuck op #k is the lowest seq that a dumped member has issued but not completed
// (state issued or started); a member whose highest seq on that Comm is below k never issued
// it. Findings, in this order:
//   1. failures: the "failure" of every dump, once per distinct Finding (kind, ranks, comm,
//      seq, op, name, step): desync, nan, oom, error
//   2. "dead": a rank in [0, n) without a dump: one Finding per rank, with the first stuck op
//      (lowest seq, then comm name) of a Comm it is a member of ("", 0, "" if none); message
//      "died" and which ranks wait for it
//   3. "mismatch": per Comm, the lowest seq that two dumped members both hold with a different
//      op, dtype or shape; ranks = those whose (op, dtype, shape) differs from the one most
//      members hold (ties: the one the lowest rank holds); message "disagree", both sides'
//      dtype and shape as OpRecord names them: "float[8,4]"
//   4, 5. "missing", "straggler": per Comm with a stuck op #k, every dumped member that never
//      issued #k and did not fail. If it has an op of its own not completed (on any Comm), it
//      is "missing" (message "never issued" and the op it waits in); otherwise "straggler"
//      (message "straggler": it is busy outside communication). One Finding per Comm and kind,
//      its ranks ascending.
//   Kinds come in this order; within a kind, a Finding naming fewer ranks comes first, then the
//   one whose stuck op was issued earlier (the smallest "issued" among the members waiting in
//   it), then the lower seq.
//   No finding at all: one {kind "none", message "no culprit"}.
Analysis analyze(const std::string& dir);

// ---------------------------------------------------------------- Task 4: desync check

// What every rank must agree on before a collective runs. (PyTorch's
// TORCH_DISTRIBUTED_DEBUG=DETAIL checks the op, sequence number, dtypes, device types and
// shapes, not the reduce op or the root; this fingerprint adds those two.)
struct Fingerprint {
  OpType op = OpType::Barrier;
  uint64_t seq = 0;                             // the seq the op gets on its Comm
  torch::ScalarType dtype = torch::kFloat32;    // barrier: kFloat32
  std::vector<int64_t> shape;                   // as OpRecord: all_gather the output, else the input
  int64_t detail = -1;  // reductions: the ReduceOp as an integer; broadcast: the root; else -1
  bool operator==(const Fingerprint& o) const;
  // "all_reduce #9 float[8,4] (sum)", "broadcast #2 long[3] (root 0)", "barrier #4 float[]":
  // the dtype as OpRecord names it, the ReduceOp as to_string(ReduceOp) does.
  std::string describe() const;
};

// DesyncError: the fingerprints of one collective differ between ranks. finding: kind
// "desync", ranks = those whose fingerprint differs from the one most ranks hold (ties: the one
// the lowest rank holds), comm, seq and op of that majority fingerprint. Message:
//   "desync on comm 'grads': rank 1 issues all_reduce #9 float[1025] (sum); ranks [0,2] issue
//    all_reduce #9 float[1024] (sum)"   (one "<format_ranks> issue(s) <describe()>" per
//   distinct fingerprint, the majority's last)
struct DesyncError : Error {
  DesyncError(const std::string& what, Finding f) : Error(what), finding(std::move(f)) {}
  Finding finding;
};

// A Comm in desync check mode. With checking on, every collective first checks its fingerprint
// (check()), then runs on comm(). The check's own traffic goes over a Comm of its own,
// comm.split(0, comm.rank(), comm.name() + "/check"), so the checked Comm's seq numbers stay
// those of its real ops.
class CheckedComm {
 public:
  CheckedComm(Comm& comm, bool checking = true);  // collective over comm when checking
  ~CheckedComm();
  Comm& comm() const;
  bool checking() const;
  void all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  void reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                      ReduceOp op = ReduceOp::Sum);
  void all_gather(const torch::Tensor& output, const torch::Tensor& input);
  void broadcast(const torch::Tensor& tensor, int root);
  void barrier();
  // Collective over the check Comm: every rank's fingerprint reaches every rank, in a message
  // of the same size on every rank whatever the shapes (shapes of up to 8 dimensions; more:
  // dtl::Error "dimensions"). When any two differ, raises DesyncError on every rank.
  void check(const Fingerprint& mine);

 private:
  struct State;  // yours
  std::unique_ptr<State> s_;
};

// ---------------------------------------------------------------- Task 5: NaN / Inf detector

// Local: {index in `tensors` of the first tensor holding a NaN or an Inf, how many of its
// elements are}; {-1, 0} when all are finite. Undefined tensors are skipped. One device-to-host
// copy in all (not one per tensor).
std::pair<int64_t, int64_t> first_non_finite(const NamedTensors& tensors);

struct NonFiniteError : Error {
  NonFiniteError(const std::string& what, Finding f) : Error(what), finding(std::move(f)) {}
  Finding finding;
};

// Collective over comm, one collective in all: when any rank's `tensors` hold a non-finite
// value, raises NonFiniteError on every rank, naming the lowest such rank (world rank) and its
// first such tensor. Every rank passes tensors of the same names in the same order. `what`:
// "gradient" or "activation". finding: kind "nan", ranks {that rank}, name the tensor's name,
// step; message "non-finite <what> '<name>'", "<count> of <numel>", "rank <r>", "step <s>",
// and the other ranks that hold non-finite values, if any. Call it on gradients before the
// gradient all-reduce: after it, every rank holds the NaN and no rank is to blame.
void check_finite(Comm& comm, const NamedTensors& tensors, int64_t step, const std::string& what);

// ---------------------------------------------------------------- Task 6: OOM report

struct OomReport {
  int rank = 0;                 // world rank
  int64_t step = -1;
  std::string phase;            // where it happened: "forward", "backward", "optimizer", ...
  size_t requested = 0, current = 0, limit = 0;  // the exception's: at the moment of failure
  // Live bytes at the moment of failure, by owner. A storage shared by several tensors (tied
  // weights, views) counts once, in the first category that holds it.
  int64_t parameters = 0;       // the parameters' storages
  int64_t gradients = 0;        // their .grad() storages (where defined)
  int64_t optimizer_state = 0;  // the optimizer state's storages
  int64_t activations = 0;      // the rest: current - the three above (0 if negative)
  // The k largest tensors among the parameters ("<name>"), gradients ("<name>.grad") and
  // optimizer state ("<its name>"): {name, bytes}, largest first, ties by name.
  std::vector<std::pair<std::string, int64_t>> largest;
  std::map<std::string, size_t> by_tag;  // the exception's live bytes per memory::Scope tag
  // kind "oom", ranks {rank}, name phase, step; message "out of memory", "rank <r>",
  // "step <s>", the phase, the requested bytes, every category by name ("parameters",
  // "gradients", "optimizer state", "activations") and the largest tensors.
  Finding finding() const;
};
// After catching dtl::OutOfMemory in `phase` of `step`: who held the memory when it failed.
OomReport oom_report(const OutOfMemory& e, const NamedTensors& parameters,
                     const NamedTensors& optimizer_state, int64_t step, const std::string& phase,
                     size_t k = 5);

// ---------------------------------------------------------------- Task 7: replica divergence

// Data-parallel replicas start from the same weights and apply the same averaged gradient, so
// after every step they hold bit-identical parameters. When they do not (a rank that applied
// its own gradient instead of the average, a non-deterministic kernel, a flipped bit in memory),
// no collective notices: every all-reduce still has matching sizes, and the job trains on, each
// replica a slightly different model. The check compares the parameters' contents.

// A deterministic hash of a tensor's contents: 64-bit FNV-1a (offset basis 0xcbf29ce484222325,
// prime 0x100000001b3, one byte at a time: h = (h ^ byte) * prime) over the bytes of its
// elements in row-major order, i.e. of t.contiguous() copied to the host, whatever its strides,
// its device or its dtype. So equal on every rank and in every run for equal bytes; any one bit
// changed (one element one ULP away) or two elements swapped changes it. A uint8 tensor holding
// the bytes of "a" hashes to 0xaf63dc4c8601ec8c, an empty tensor to the offset basis.
uint64_t content_hash(const torch::Tensor& t);

// DivergenceError: the replicas' parameters differ. finding: kind "divergence", name the first
// tensor (in the order given) whose hash is not the same on every rank, ranks = the (world)
// ranks whose hash of it differs from the one most ranks hold (ties: the one the lowest rank
// holds, as for DesyncError), step; comm, seq, op left empty (no collective is at fault).
// Message: "replicas diverge at step <s>: parameter '<name>' differs on <format_ranks> from
// <format_ranks of the majority>", and "<k> of <P> parameters differ".
struct DivergenceError : Error {
  DivergenceError(const std::string& what, Finding f) : Error(what), finding(std::move(f)) {}
  Finding finding;
};

// Collective over comm (the data-parallel group): hashes every tensor locally (content_hash)
// and compares the hashes across ranks in ONE collective whatever the number of tensors (an
// all_gather of one 64-bit word per tensor, not a collective per tensor). When any tensor's hash
// differs between ranks, raises DivergenceError on every rank. Every rank passes tensors of the
// same names and sizes in the same order (the model's: named_parameters()); no tensors: nothing
// to compare, no collective. Call it between steps, every N steps: hashing reads every byte of
// the model (on a GPU, a copy of every parameter to the host).
void check_replicas(Comm& comm, const NamedTensors& tensors, int64_t step);

// ================================================================ given: a job to debug

// A data-parallel trainer of the course GPT with two named Comms, split from the world:
// "grads" (the gradient traffic) and "metrics" (the loss). One step (0-based `step`):
//   forward by pieces (embed, each block, head), the activations named "embed", "blocks.<i>",
//   "logits"; check_finite(grads, activations, step, "activation") (when nan_check);
//   backward; check_finite(grads, gradients, step, "gradient") (when nan_check) with the
//   parameters' names; one all_reduce of every gradient flattened into one buffer, on the
//   CheckedComm over "grads" (checking when desync_check); AdamW; one all_reduce of the loss on
//   "metrics". So per step "grads" has ops 3 step + 1, 3 step + 2 (the checks) and 3 step + 3
//   (the gradients), or just step + 1 without nan_check, all one later with desync_check (the
//   CheckedComm's split is op 1 of "grads"); "metrics" has op step + 1, or with replica_check
//   ops 2 step + 1 (the loss) and 2 step + 2 (check_replicas(metrics, parameters, step) at the
//   end of the step).
struct Fault {
  std::string kind;   // "" (none), "skip", "shape", "sleep", "crash", "oom", "nan", "flip"
  int rank = 1;       // the world rank it happens on
  int64_t step = 1;   // the step it happens in
};
// The faults, on `rank` in `step`:
//   skip   does not issue the gradient all-reduce (goes on to the metrics all-reduce)
//   shape  its gradient buffer has one element more (needs desync_check: a collective with
//          different sizes on different ranks is undefined behaviour in MPI and NCCL)
//   sleep  sleeps an hour before the gradient all-reduce (a straggler past any timeout)
//   crash  kills itself (SIGKILL) before the gradient all-reduce
//   oom    sets a memory limit just above what is live before the forward (CPU only)
//   nan    writes a NaN into the gradient of parameter nan_param after the backward
//   flip   flips the lowest bit of the first element of parameter nan_param after the optimizer
//          step: one ULP, a silent corruption that no collective notices (replica_check finds
//          it; without it the job trains on, its replicas no longer the same model)
// Before injecting, rank `rank` writes DIR/fault.json {"kind", "rank", "step", "time"}.
struct TrainConfig {
  model::GPTConfig model;      // default: tiny (test sizes)
  OptimConfig optim;
  int64_t steps = 4;
  int64_t global_batch = 8;
  uint64_t data_seed = 18;
  bool desync_check = false;
  bool nan_check = true;
  bool replica_check = false;  // check_replicas at the end of every step
  std::string nan_param = "blocks.0.mlp.fc.weight";  // the parameter of the nan and flip faults
  Fault fault;
  std::string dump_dir;        // where fault.json goes
  TrainConfig();
};

class Trainer {
 public:
  Trainer(const TrainConfig& config, Comm& world);  // collective
  ~Trainer();
  float step(int64_t step);                         // collective; the global mean loss
  // The part of step() running (or that raised): "forward", "activation check", "backward",
  // "gradient check", "gradient all-reduce", "optimizer", "metrics", "replica check".
  const std::string& phase() const;
  NamedTensors named_parameters() const;
  NamedTensors named_optimizer_state() const;       // "<param>.exp_avg", "<param>.exp_avg_sq"
  Comm& grads() const;
  Comm& metrics() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// A whole debugged job, every rank: a FlightRecorder (attached) and a Watchdog on dump_dir;
// `steps` training steps; an exception of a step is turned into a Finding (oom_report for
// dtl::OutOfMemory, the finding of DesyncError, NonFiniteError and DivergenceError, kind "error"
// for any other dtl::Error) and handed to Watchdog::fail, after which the rank waits for the
// watchdog to end the job. Without a fault every rank dumps "on demand: end of run" and rank 0 prints
// analyze(dump_dir). Returns 0.
struct JobConfig {
  TrainConfig train;
  size_t capacity = 64;        // flight recorder entries
  WatchdogOptions watchdog;    // dir: where every dump goes (also train.dump_dir)
};
int debug_job(const JobConfig& config, Comm& world);

}  // namespace dtl::lab18
