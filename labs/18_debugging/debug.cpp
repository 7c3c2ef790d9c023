// Lab 18: debugging distributed training.
// Your code goes here; the contract is debug.hpp (the given pieces are in trainer.cpp).
//
// This lab's code reads and writes files (the dumps, the trigger, the report): the grader's
// audit allows std::filesystem, std::ifstream / std::ofstream, nlohmann::json, and the POSIX
// calls open, close, write, read, link, unlink and rename here. Threads stay forbidden: the
// watchdog's thread is the given PeriodicThread.
#include "debug.hpp"

#include <fmt/format.h>

#include "dtl/error.hpp"   // defines: Error, DTL_CHECK, rank_prefix
#include "dtl/log.hpp"     // defines: log_rank, log_world_size (this process's world rank, the world size)
#include "dtl/memory.hpp"  // defines: memory::current_bytes, format_bytes
#include "dtl/timer.hpp"   // defines: now_seconds

namespace dtl::lab18 {

// ================================================================ Task 1: the flight recorder

// TODO(lab18): Task 1. Your state: the ring of entries, the next record id, the Comms you have
// seen (name -> rank, size, world ranks), the observer's id, and a mutex for all of it.
struct FlightRecorder::State {};

FlightRecorder::FlightRecorder(size_t capacity) : s_(std::make_unique<State>()) {
  // TODO(lab18): Task 1.
  (void)capacity;
  DTL_UNIMPLEMENTED("lab 18: FlightRecorder (Task 1)");
}

FlightRecorder::~FlightRecorder() = default;

void FlightRecorder::attach() {
  // TODO(lab18): Task 1. Comm::add_op_observer calls you from several threads at once.
  DTL_UNIMPLEMENTED("lab 18: FlightRecorder::attach (Task 1)");
}

void FlightRecorder::detach() { DTL_UNIMPLEMENTED("lab 18: FlightRecorder::detach (Task 1)"); }

void FlightRecorder::record(const Comm& comm, const OpRecord& record) {
  // TODO(lab18): Task 1. Issued: a new entry, overwriting the oldest when the ring is full.
  // Otherwise: update the newest entry of (comm name, seq).
  //  - Where does the entry with record id k live in a ring of capacity c, so that no entry
  //    ever moves?
  //  - An update is for an op issued a moment ago: where in the ring do you start looking?
  (void)comm, (void)record;
  DTL_UNIMPLEMENTED("lab 18: FlightRecorder::record (Task 1)");
}

std::vector<FrEntry> FlightRecorder::entries() const {
  DTL_UNIMPLEMENTED("lab 18: FlightRecorder::entries (Task 1)");
}

size_t FlightRecorder::capacity() const { DTL_UNIMPLEMENTED("lab 18: FlightRecorder::capacity (Task 1)"); }

uint64_t FlightRecorder::dropped() const { DTL_UNIMPLEMENTED("lab 18: FlightRecorder::dropped (Task 1)"); }

nlohmann::json FlightRecorder::to_json(const std::string& reason, const Finding* failure) const {
  // TODO(lab18): Task 1. The format is in debug.hpp; a Finding converts with nlohmann::json(f).
  (void)reason, (void)failure;
  DTL_UNIMPLEMENTED("lab 18: FlightRecorder::to_json (Task 1)");
}

std::string FlightRecorder::dump(const std::string& dir, const std::string& reason,
                                 const Finding* failure) const {
  // TODO(lab18): Task 1. Another process may read the file while you write it: how does it never
  // see half of one?
  (void)dir, (void)reason, (void)failure;
  DTL_UNIMPLEMENTED("lab 18: FlightRecorder::dump (Task 1)");
}

// ================================================================ Task 2: the watchdog

// TODO(lab18): Task 2. Your state: the recorder, the options, this rank and the world size,
// what has happened (dumped, reporter, reported, ended, when it dumped), a mutex, and the
// PeriodicThread (declare it last: members are destroyed in reverse order, and the thread must
// stop before the rest goes).
struct Watchdog::State {};

Watchdog::Watchdog(FlightRecorder& recorder, WatchdogOptions options) : s_(std::make_unique<State>()) {
  // TODO(lab18): Task 2. Check the options; start the thread when poll_s > 0.
  (void)recorder, (void)options;
  DTL_UNIMPLEMENTED("lab 18: Watchdog (Task 2)");
}

Watchdog::~Watchdog() = default;

void Watchdog::poll(double now) {
  // TODO(lab18): Task 2. The four steps of the protocol in debug.hpp.
  //  - The stuck rank's main thread is inside MPI: what can this thread still do, and through
  //    what, if not through a communicator?
  //  - Two ranks time out in the same millisecond: how do exactly one of them become the
  //    reporter?
  //  - Why must end_job be called without holding your mutex?
  (void)now;
  DTL_UNIMPLEMENTED("lab 18: Watchdog::poll (Task 2)");
}

void Watchdog::fail(const Finding& why) {
  // TODO(lab18): Task 2.
  (void)why;
  DTL_UNIMPLEMENTED("lab 18: Watchdog::fail (Task 2)");
}

bool Watchdog::dumped() const { DTL_UNIMPLEMENTED("lab 18: Watchdog::dumped (Task 2)"); }
bool Watchdog::reporter() const { DTL_UNIMPLEMENTED("lab 18: Watchdog::reporter (Task 2)"); }
bool Watchdog::ended() const { DTL_UNIMPLEMENTED("lab 18: Watchdog::ended (Task 2)"); }

// ================================================================ Task 3: the analyzer

Analysis analyze(const std::string& dir) {
  // TODO(lab18): Task 3. Read the dumps; then the rules of debug.hpp, in their order.
  //  - A rank that never issued op #k and waits in another op, and one that waits in no op at
  //    all: which one took another path through the program, and which one is slow?
  //  - With two ranks, each waiting in an op the other never issued: who is to blame?
  (void)dir;
  DTL_UNIMPLEMENTED("lab 18: analyze (Task 3)");
}

// ================================================================ Task 4: desync check

bool Fingerprint::operator==(const Fingerprint& o) const {
  (void)o;
  DTL_UNIMPLEMENTED("lab 18: Fingerprint::operator== (Task 4)");
}

std::string Fingerprint::describe() const { DTL_UNIMPLEMENTED("lab 18: Fingerprint::describe (Task 4)"); }

// TODO(lab18): Task 4. Your state: the checked Comm and the check's own Comm.
struct CheckedComm::State {};

CheckedComm::CheckedComm(Comm& comm, bool checking) : s_(std::make_unique<State>()) {
  // TODO(lab18): Task 4.
  (void)comm, (void)checking;
  DTL_UNIMPLEMENTED("lab 18: CheckedComm (Task 4)");
}

CheckedComm::~CheckedComm() = default;

Comm& CheckedComm::comm() const { DTL_UNIMPLEMENTED("lab 18: CheckedComm::comm (Task 4)"); }
bool CheckedComm::checking() const { DTL_UNIMPLEMENTED("lab 18: CheckedComm::checking (Task 4)"); }

void CheckedComm::check(const Fingerprint& mine) {
  // TODO(lab18): Task 4.
  //  - Shapes differ between ranks exactly when something is wrong: what size must the
  //    message that carries them have?
  //  - Which ranks must raise, so that none is left waiting in the real op?
  (void)mine;
  DTL_UNIMPLEMENTED("lab 18: CheckedComm::check (Task 4)");
}

void CheckedComm::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  // TODO(lab18): Task 4. Which seq will the real op get on comm()?
  (void)tensor, (void)op;
  DTL_UNIMPLEMENTED("lab 18: CheckedComm::all_reduce (Task 4)");
}

void CheckedComm::reduce_scatter(const torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  (void)output, (void)input, (void)op;
  DTL_UNIMPLEMENTED("lab 18: CheckedComm::reduce_scatter (Task 4)");
}

void CheckedComm::all_gather(const torch::Tensor& output, const torch::Tensor& input) {
  (void)output, (void)input;
  DTL_UNIMPLEMENTED("lab 18: CheckedComm::all_gather (Task 4)");
}

void CheckedComm::broadcast(const torch::Tensor& tensor, int root) {
  (void)tensor, (void)root;
  DTL_UNIMPLEMENTED("lab 18: CheckedComm::broadcast (Task 4)");
}

void CheckedComm::barrier() { DTL_UNIMPLEMENTED("lab 18: CheckedComm::barrier (Task 4)"); }

// ================================================================ Task 5: NaN / Inf detector

std::pair<int64_t, int64_t> first_non_finite(const NamedTensors& tensors) {
  // TODO(lab18): Task 5. torch::isfinite; one copy to the host for all tensors.
  (void)tensors;
  DTL_UNIMPLEMENTED("lab 18: first_non_finite (Task 5)");
}

void check_finite(Comm& comm, const NamedTensors& tensors, int64_t step, const std::string& what) {
  // TODO(lab18): Task 5. One collective that tells every rank what every rank found.
  (void)comm, (void)tensors, (void)step, (void)what;
  DTL_UNIMPLEMENTED("lab 18: check_finite (Task 5)");
}

// ================================================================ Task 6: OOM report

OomReport oom_report(const OutOfMemory& e, const NamedTensors& parameters,
                     const NamedTensors& optimizer_state, int64_t step, const std::string& phase,
                     size_t k) {
  // TODO(lab18): Task 6.
  //  - When your handler runs, which of the bytes live at the failure are still alive, and
  //    where do you find the number for the rest?
  //  - Two names, one storage (tied weights): how do you count it once?
  (void)e, (void)parameters, (void)optimizer_state, (void)step, (void)phase, (void)k;
  DTL_UNIMPLEMENTED("lab 18: oom_report (Task 6)");
}

Finding OomReport::finding() const { DTL_UNIMPLEMENTED("lab 18: OomReport::finding (Task 6)"); }

// ================================================================ Task 7: replica divergence

uint64_t content_hash(const torch::Tensor& t) {
  // TODO(lab18): Task 7. FNV-1a over the tensor's bytes, as debug.hpp specifies.
  //  - Which bytes are "the elements in row-major order" for a transposed view, or a tensor on
  //    a GPU?
  //  - Why not hash the sum of the values: which two corruptions would it miss?
  (void)t;
  DTL_UNIMPLEMENTED("lab 18: content_hash (Task 7)");
}

void check_replicas(Comm& comm, const NamedTensors& tensors, int64_t step) {
  // TODO(lab18): Task 7. One collective for all the tensors; then the first tensor whose hashes
  // differ, and the ranks outside its majority (your desync check decides the same way).
  //  - Two ranks, two different hashes: which one is "the odd one", and how sure can you be?
  (void)comm, (void)tensors, (void)step;
  DTL_UNIMPLEMENTED("lab 18: check_replicas (Task 7)");
}

}  // namespace dtl::lab18
