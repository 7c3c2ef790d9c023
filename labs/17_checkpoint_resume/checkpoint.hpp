// labs/17_checkpoint_resume/checkpoint.hpp — the interface of lab 17 (the seam the tests call;
// do not edit).
//
// defines: (given) TrainConfig, Trainer, crc32, safetensors_dtype, dtype_from_safetensors,
// all_gather_strings, BackgroundWorker, fault_point, RunConfig, RunResult,
// train_with_checkpoints; (yours) ShardEntry, FileInfo, HeaderEntry, ShardHeader, write_shard,
// read_shard_header, read_bytes, ShardedTensor, RankTensor, Snapshot, SaveOptions, save,
// latest, LoadOptions, LoadResult, load, state_of, restore, AsyncSaver.
//
// A checkpoint is a directory ROOT/step-00000012/ holding one shard file per rank and a
// manifest, and a file ROOT/latest naming the newest committed one:
//
//   ROOT/latest                                   "step-00000012\n"
//   ROOT/step-00000012/manifest.json              written by rank 0 (format below)
//   ROOT/step-00000012/shard-00000-of-00004.safetensors   written by rank 0
//   ...                   shard-00003-of-00004.safetensors   written by rank 3
//
// A shard file is in the safetensors layout (https://github.com/huggingface/safetensors), so
// `safetensors.torch.load_file` or a 20-line reader opens it: 8 bytes, the header's length N as
// a little-endian uint64; N bytes of JSON, padded with spaces (0x20, never NUL: the real reader
// and Python's json refuse a NUL) to a multiple of 8; then the tensors' raw little-endian bytes
// back to back. The header maps each tensor's name to {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]} (byte offsets from the start of the data), plus an optional
// "__metadata__" object of string values. What the real reader checks (safetensors'
// Metadata::validate and read_metadata) a valid file satisfies: the tensors' byte ranges, in
// order of begin, tile the data section from byte 0 with no hole and no overlap; each range is
// exactly numel(shape) x the dtype's size bytes (begin <= end); the data section ends where the
// last range ends (no trailing bytes).
//
// Words the tests look for in error messages are listed with each function ("...").
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtl/comm.hpp"   // defines: Comm
#include "dtl/data.hpp"   // defines: SyntheticCorpus, GlobalBatchSampler
#include "dtl/model.hpp"  // defines: model::GPT, GPTConfig
#include "dtl/optim.hpp"  // defines: OptimConfig, warmup_cosine_lr
#include "dtl/split.hpp"  // defines: Range, split_range

namespace dtl::lab17 {

// ================================================================ given (trainer.cpp)

struct TrainConfig {
  model::GPTConfig model;     // dropout > 0 makes the run depend on every rank's RNG
  OptimConfig optim;          // AdamW (weight decay on every parameter), warmup_cosine_lr
  int64_t total_steps = 8;    // the LR schedule's length
  int64_t global_batch = 8;   // sequences per step, split over the ranks with split_range
  uint64_t data_seed = 17;    // the SyntheticCorpus
};

// Data-parallel training of the course GPT with the optimizer state sharded as ZeRO stage 1
// does (lab 14): every rank holds the full parameters; rank r of n owns the slice
// split_range(numel, n, r) of each flattened parameter and keeps AdamW's two moments for that
// slice only. A step: this rank's rows of the global batch (split_range(global_batch, n, r) of
// the sequences [data_position, data_position + global_batch)), forward (dropout draws from
// torch's default generator of this rank's device), backward, one all-reduce of the gradients
// (summed; each rank's loss is weighted by its share of the rows), AdamW on the owned slices
// at lr = warmup_cosine_lr(optim, schedule_step, total_steps), an all-gather of every
// parameter. The same state on n ranks gives the same next state bit for bit.
class Trainer {
 public:
  Trainer(const TrainConfig& config, Comm& comm);  // collective; the same model on every rank
  float train_step();                              // collective; the global mean loss
  torch::Tensor flat_params() const;               // every parameter, flattened, concatenated
  // Collective: each parameter all-gathered from the owned slices (after loading only those).
  void gather_params();
  const TrainConfig& config() const { return config_; }
  Comm& comm() const { return *comm_; }

  // ---- the training state: what an exact resume must bring back ----
  model::GPT model{nullptr};
  std::vector<std::string> names;       // model->named_parameters() order
  std::vector<torch::Tensor> params;    // the same parameters, full on every rank
  std::vector<Range> owned;             // this rank's slice of each flattened parameter
  std::vector<torch::Tensor> exp_avg;   // AdamW's first moment of each owned slice (1-D)
  std::vector<torch::Tensor> exp_avg_sq;  // and its second moment
  int64_t optimizer_step = 0;           // AdamW's t (its bias correction)
  int64_t schedule_step = 0;            // position in the LR schedule
  int64_t data_position = 0;            // index of the next sequence of the data stream
  // The random state is torch's default generator of this rank's device (the CPU one; on a
  // GPU also the CUDA one): at::detail::getDefaultCPUGenerator(),
  // at::globalContext().defaultGenerator(device). Each rank's is its own.

 private:
  TrainConfig config_;
  Comm* comm_;
  data::SyntheticCorpus corpus_;
  data::GlobalBatchSampler sampler_;
};

// CRC-32 (the zlib/PNG polynomial; Python: zlib.crc32) of n bytes, continuing from `crc`
// (0 to start): crc32(b, nb, crc32(a, na)) == crc32 of a then b.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// safetensors' dtype names: F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL. Raises
// dtl::Error for other dtypes or names ("dtype").
std::string safetensors_dtype(torch::ScalarType t);
torch::ScalarType dtype_from_safetensors(const std::string& name);

// Collective: every rank's string, in rank order, on every rank (over comm).
std::vector<std::string> all_gather_strings(Comm& comm, const std::string& mine);

// One background thread that runs one job at a time. submit() waits for the previous job;
// wait() returns when the current job is done and rethrows what it threw.
class BackgroundWorker {
 public:
  BackgroundWorker();
  ~BackgroundWorker();  // waits for the job in flight (its error is dropped)
  void submit(std::function<void()> job);
  void wait();
  bool busy() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::exception_ptr error_;
  bool running_ = false, stop_ = false;
  std::thread thread_;
};

// Fault injection for the tests and the demo: when the environment variable DTL_LAB17_FAULT is
// "rank=R,step=S,at=WHERE" and this process is rank R (of the world) saving the checkpoint of
// step S, fault_point(WHERE, S) kills this process with SIGKILL. Otherwise it does nothing.
// save() must call it at two places (the tests kill ranks there):
//   fault_point("shard", step)   every rank, after its shard file is written and synced, before
//                                anything is committed
//   fault_point("commit", step)  rank 0, after the manifest is written and synced, before the
//                                directory is renamed into place
void fault_point(const char* where, int64_t step);

// ================================================================ yours (checkpoint.cpp)

// ---------------------------------------------------------------- Task 1: shard files

struct ShardEntry {
  std::string name;
  torch::Tensor data;  // any device, any dtype safetensors_dtype knows; written contiguous
};
struct FileInfo {
  std::string file;    // the file's name (no directory)
  int64_t bytes = 0;   // its size
  uint32_t crc32 = 0;  // crc32 of all its bytes
};
// Writes `entries` (in the given order, data back to back) and `metadata` to `path` in the
// safetensors layout above, syncs the file to the disk (fsync) and returns its size and CRC.
// Raises dtl::Error naming the path when the file cannot be written.
FileInfo write_shard(const std::string& path, const std::vector<ShardEntry>& entries,
                     const std::map<std::string, std::string>& metadata = {});

struct HeaderEntry {
  std::string dtype;            // "F32"
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;   // data_offsets: bytes from the start of the data section
};
struct ShardHeader {
  int64_t data_start = 0;       // 8 + N: where the data section starts in the file
  std::map<std::string, HeaderEntry> tensors;
  std::map<std::string, std::string> metadata;
};
// Reads only the header of a shard file. Raises dtl::Error naming the path when the file is
// missing ("missing"), shorter than its header says ("truncated") or its header is not valid
// ("header"): not a JSON object with only JSON whitespace around it (spaces, tabs, newlines:
// a NUL byte is none); an entry without "dtype", "shape" or "data_offsets", with a dtype
// safetensors_dtype does not know, a shape that is not a list of non-negative integers ([2.0]
// is not) or data_offsets that are not exactly two non-negative integers;
// begin > end or end - begin != numel(shape) x the dtype's size; ranges that, sorted by begin,
// leave a hole or overlap; a file longer than data_start + the last range's end (trailing
// bytes). Exactly what the real safetensors reader refuses.
ShardHeader read_shard_header(const std::string& path);

// Reads dst.nbytes() bytes at byte `offset` of the file into `dst` (a contiguous CPU tensor),
// and nothing else of the file. Raises dtl::Error naming the path when the file ends first
// ("truncated").
void read_bytes(const std::string& path, int64_t offset, const torch::Tensor& dst);

// ---------------------------------------------------------------- what a checkpoint holds

// A tensor split across the ranks: this rank's piece of the global tensor (shape global_shape)
// is one of two forms.
//   flat (box_offset empty): elements [offset, offset + local.numel()) of the row-major
//     flattened tensor; local is 1-D. What data parallelism and ZeRO split (lab 14).
//   box (box_offset not empty): the N-D box that starts at box_offset[d] and spans
//     local.size(d) in each dimension d of the N = global_shape.size(); local has the box's
//     shape (any strides, any device; written contiguous); offset is unused. What tensor
//     parallelism splits: a row-parallel weight [out, in] split on dim 1 gives each rank the
//     columns [c, c + k) of every row, which is no contiguous range of the flattened tensor.
// Every rank lists the same names in the same order; the ranks' pieces of a name (flat or box,
// mixed as they come) are disjoint and cover the tensor. A box whose box_offset does not have
// one entry per dimension, whose local has another number of dimensions, or that does not fit
// inside the tensor (an offset < 0, box_offset[d] + local.size(d) > global_shape[d]) raises
// dtl::Error in save and load, on every rank ("box"); so does a flat range outside the tensor.
struct ShardedTensor {
  std::string name;
  std::vector<int64_t> global_shape;
  int64_t offset = 0;                    // flat form only
  torch::Tensor local;                   // flat: 1-D; box: the box's shape
  std::vector<int64_t> box_offset = {};  // empty: the flat form. (The "= {}" lets the four-field
                                         // {name, global_shape, offset, local} stay warning-free.)
};
// A tensor that belongs to one rank (its random generator's state): saved in that rank's
// shard, restored only into the same rank of a job of the same world size.
struct RankTensor {
  std::string name;
  torch::Tensor value;
};
struct Snapshot {
  int64_t step = 0;                          // names the directory: step-%08d
  std::string layout = "dp";                 // the parallel layout, recorded in the manifest
  std::map<std::string, int64_t> counters;   // scalars every rank holds alike
  std::vector<ShardedTensor> sharded;
  std::vector<RankTensor> per_rank;
};

// ---------------------------------------------------------------- Task 2: save, atomically

struct SaveOptions {
  int keep_last = 2;  // committed checkpoints kept in ROOT (older ones are deleted after a commit)
};

// Collective over comm (every rank passes its own part of the same Snapshot). Writes
// ROOT/step-%08d (Snapshot::step) so that it is either whole or invisible:
//   1. into ROOT/.tmp-step-%08d (rank 0 creates it, removing a stale one), each rank its
//      shard shard-%05d-of-%05d.safetensors (rank, world size) holding its sharded tensors
//      (under their names: a flat piece 1-D, a box with the box's shape) and its per-rank
//      tensors (under "rank/" + name), synced;
//      fault_point("shard", step);
//   2. rank 0 writes manifest.json, syncs it and the directory; fault_point("commit", step);
//      renames the directory to ROOT/step-%08d and syncs ROOT; then replaces ROOT/latest
//      atomically (write a temporary file, sync, rename, sync ROOT); then deletes all but the
//      newest keep_last step-* directories and any .tmp-* leftovers;
//   3. returns the committed directory's path on every rank, after the commit.
// manifest.json:
//   {"format": "dtl-checkpoint-1", "step": 12, "world_size": 4, "layout": "dp",
//    "counters": {"optimizer_step": 12, ...},
//    "tensors": {"<name>": {"shape": [64, 32], "dtype": "F32",
//                           "chunks": [{"file": "shard-00000-of-00004.safetensors",
//                                       "offset": 0, "numel": 512}, ...]},    // flat pieces
//                "<tp name>": {"shape": [64, 32], "dtype": "F32",
//                              "chunks": [{"file": "shard-00001-of-00004.safetensors",
//                                          "box_offset": [0, 16], "box_shape": [64, 16]}, ...]}},
//    // one chunk per rank whose piece holds elements, in rank order; flat and box chunks may mix
//    "per_rank": ["rng/cpu", ...],
//    "files": {"shard-00000-of-00004.safetensors": {"rank": 0, "bytes": 4424,
//                                                   "crc32": 3735928559}, ...}}
// A failure on any rank raises dtl::Error on every rank (nothing is committed then); an
// existing ROOT/step-%08d that `latest` does not name is replaced; saving the step `latest`
// names raises dtl::Error ("latest").
std::string save(const std::string& root, const Snapshot& snapshot, Comm& comm,
                 const SaveOptions& options = {});

// The directory ROOT/latest names (ROOT/step-...), or "" when there is none.
std::string latest(const std::string& root);

// ---------------------------------------------------------------- Task 3: load, resharding

struct LoadOptions {
  std::string checkpoint;       // a checkpoint directory; "" = latest(root)
  bool allow_reshard = false;   // may a checkpoint of another world size load?
  bool verify_checksums = true; // compare every file's CRC with the manifest's
};
struct LoadResult {
  std::string directory;
  int64_t step = 0;
  int saved_world_size = 0;
  bool resharded = false;             // saved_world_size != comm.size()
  int64_t payload_bytes_read = 0;     // tensor bytes this rank read (headers and checksums not counted)
};

// Collective over comm. Fills `into` in place from a checkpoint: `into` says which tensors
// (names, global shapes, dtypes of the locals) and which piece of each (a flat range or a box)
// this rank wants; the local tensors receive exactly those elements (any device), whatever
// world size and whichever pieces (flat or box) saved them. step and counters are set from
// the manifest; the per-rank tensors are filled only when the world size is the same (else
// they are left as they are). Each rank reads, of the tensor data, only the bytes of its
// pieces: payload_bytes_read == the sum of its locals' nbytes() (plus the per-rank tensors at
// the same world size). With verify_checksums each file is read whole once, by one rank.
// Raises dtl::Error on every rank, naming the file, when:
//   there is no checkpoint ("no checkpoint")             a listed file is missing ("missing")
//   a file's size differs from the manifest ("truncated") a file's CRC differs ("checksum")
//   a shard's header is not valid ("header", as read_shard_header)
//   a tensor's name, shape or dtype differs from into's ("model")
//   a box of into, or of the manifest, is malformed ("box", as ShardedTensor says)
//   the world size differs and !allow_reshard ("world size")
//   manifest.json is missing, not JSON, or lacks a key or value this format has ("manifest",
//   and the key's name in quotes: 'tensors')
// (A damaged file can break more than one check; which of its words is raised then is yours to
// choose: a flipped header byte may be reported as "checksum" or as "header".)
LoadResult load(const std::string& root, Snapshot& into, Comm& comm,
                const LoadOptions& options = {});

// ---------------------------------------------------------------- Task 4: exact resume

// What a checkpoint of the trainer holds. Sharded (by this rank's owned ranges): every
// parameter ("param/<name>") and both AdamW moments ("exp_avg/<name>", "exp_avg_sq/<name>"),
// the locals being views of the trainer's own tensors (so load() writes them in place).
// Counters: everything else training depends on. Per rank: the random generators' states.
// step = the trainer's schedule_step.
Snapshot state_of(Trainer& trainer);
// After load(root, snapshot, ...) with snapshot = state_of(trainer): restores the counters,
// and the random generators when the world size was the same (when resharded they keep their
// state), and all-gathers the parameters (trainer.gather_params). Collective. Then the next
// train_step() is what it would have been without the interruption.
void restore(Trainer& trainer, const Snapshot& snapshot, const LoadResult& result);

// ---------------------------------------------------------------- Task 5: asynchronous save

// Save without stopping training (PyTorch DCP's async_save): save() copies the snapshot's
// tensors to host memory, hands the writing and the commit to a background thread, and returns;
// training may then change every tensor of the trainer. The background commit talks over its
// own Comm (a dup made by the constructor), so training's collectives and the commit's never
// interleave. One save at a time: save() first waits for the previous one.
class AsyncSaver {
 public:
  explicit AsyncSaver(Comm& comm);  // collective
  ~AsyncSaver();                    // waits for the save in flight
  void save(const std::string& root, const Snapshot& snapshot, const SaveOptions& options = {});
  // Waits for the save in flight; returns its directory ("" if none ran); rethrows its error.
  std::string wait();

 private:
  struct State;  // yours: define it in checkpoint.cpp
  std::unique_ptr<State> s_;
};

// ================================================================ given: a checkpointed run

// The loop a job runs, and a supervisor restarts: resume from latest(dir) if there is one
// (load + restore; a checkpoint of another world size reshards), then train to total_steps,
// saving every save_every steps and after the last step (async: with an AsyncSaver, waited for
// at the end).
struct RunConfig {
  TrainConfig train;
  std::string dir;
  int64_t save_every = 2;
  int keep_last = 2;
  bool async = false;
};
struct RunResult {
  int64_t resumed_from = -1;        // the step loaded, -1 for a fresh start
  bool resharded = false;
  std::vector<float> losses;        // of the steps this run made
  torch::Tensor final_params;       // flat_params() after the last step
  double step_seconds = 0;          // total time in train_step
  double save_seconds = 0;          // total time the loop was blocked by saving
};
RunResult train_with_checkpoints(const RunConfig& config, Comm& comm);

}  // namespace dtl::lab17
