// labs/17_checkpoint_resume/tests/checkpoint_test_util.hpp — shared by the public tests
// (checkpoint_test.cpp) and the grading tests (grading/17_checkpoint_resume/): small models,
// scratch directories every rank agrees on, test snapshots, and the child job that trains
// with checkpoints (the supervisor tests' new processes).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "dtl/harness/checks.hpp"  // defines: fresh_comm, device, DTL_EXPECT_EQUAL, expect_error_mentions
#include "dtl/harness/jobs.hpp"    // defines: run_job, DTL_JOB, job_arg
#include "dtl/harness/scratch.hpp" // defines: ScratchDir
#include "dtl/runtime.hpp"

namespace lab17_test {

namespace fs = std::filesystem;
using dtl::Comm;
using dtl::testing::device;
using dtl::testing::fresh_comm;
using namespace dtl::lab17;

// The tiny GPT (2 layers, d 32, vocab 64, 16 tokens), AdamW with warm-up and weight decay, a
// global batch of 6 (uneven over 4 ranks). dropout > 0: the run then depends on every rank's RNG.
inline TrainConfig train_config(double dropout = 0.1, int64_t total_steps = 6) {
  TrainConfig c;
  c.model = dtl::testing::gpt_config(2, 32, 2, 64, 16, dropout);
  c.optim.lr = 3e-3;
  c.optim.eps = 1e-6;
  c.optim.weight_decay = 0.1;
  c.optim.warmup_steps = 2;
  c.total_steps = total_steps;
  c.global_batch = 6;
  return c;
}

// A fresh, empty directory that every rank of comm names alike, removed after the test.
class ScratchDir : public dtl::testing::ScratchDir {
 public:
  explicit ScratchDir(Comm& comm) : dtl::testing::ScratchDir(comm, "dtl-lab17") {}
};

// A test snapshot of `n` ranks: tensors "a" [5, 7] float32 and "b" [11] int64 with values that
// name their global index, this rank's split_range slice of each; a per-rank tensor "rank_id".
inline Snapshot test_snapshot(int rank, int n, int64_t step = 3) {
  Snapshot s;
  s.step = step;
  s.layout = "test";
  s.counters = {{"answer", 42}};
  auto slice = [&](const std::string& name, std::vector<int64_t> shape, torch::ScalarType dt) {
    int64_t numel = 1;
    for (auto d : shape) numel *= d;
    const dtl::Range r = dtl::split_range(numel, n, rank);
    torch::Tensor full = (torch::arange(numel, torch::kFloat64) * 1.5 + 0.25).to(dt);
    if (dt == torch::kInt64) full = torch::arange(numel, torch::kInt64) * 1000 + 7;
    s.sharded.push_back({name, shape, r.begin, full.narrow(0, r.begin, r.size()).clone().to(device())});
  };
  slice("a", {5, 7}, torch::kFloat32);
  slice("b", {11}, torch::kInt64);
  s.per_rank.push_back({"rank_id", torch::full({3}, rank, torch::kInt32)});
  return s;
}

// A snapshot with the same tensors, zeros, wanting this rank's slices at world size n.
inline Snapshot empty_like(const Snapshot& full_layout, int rank, int n) {
  Snapshot s = test_snapshot(rank, n, 0);
  for (auto& t : s.sharded) t.local.zero_();
  for (auto& t : s.per_rank) t.value.fill_(-1);
  s.counters.clear();
  (void)full_layout;
  return s;
}

// ---------------------------------------------------------------- pieces: flat ranges and boxes

// A global tensor every rank builds alike from a seed: random values, so an element loaded into
// the wrong place is a wrong value.
inline torch::Tensor seeded(const std::vector<int64_t>& shape, uint64_t seed,
                            torch::ScalarType dtype = torch::kFloat32) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, gen, torch::kFloat64).mul(100).to(dtype);
}

// The box of `full` that is cut out by `cuts` (dimension, range), whole in the other
// dimensions: a ShardedTensor in the box form holding a copy on the test device.
inline ShardedTensor box_piece(const std::string& name, const torch::Tensor& full,
                               const std::vector<std::pair<int64_t, dtl::Range>>& cuts) {
  std::vector<int64_t> at(static_cast<size_t>(full.dim()), 0);
  torch::Tensor t = full;
  for (const auto& [dim, r] : cuts) {
    at[static_cast<size_t>(dim)] = r.begin;
    t = t.narrow(dim, r.begin, r.size());
  }
  return {name, full.sizes().vec(), 0, t.clone().to(device()), at};
}

// Part `part` of `parts` of dimension `dim` (split_range): a tensor-parallel shard. A linear
// layer's weight is [out, in]: column-parallel splits dim 0 (its output features), row-parallel
// dim 1 (its input features: a few columns of every row, no contiguous range).
inline ShardedTensor tp_piece(const std::string& name, const torch::Tensor& full, int64_t dim,
                              int parts, int part) {
  return box_piece(name, full, {{dim, dtl::split_range(full.size(dim), parts, part)}});
}

// Rank `rank` of `n` in a dp x tp layout: tp = min(2, n) splits dimension tp_dim, and the ranks
// of each tp part (rank % tp == part) split that part again on dp_dim. Uneven at n = 3: tp part
// 0 is split in two, part 1 stays whole.
inline ShardedTensor dp_tp_piece(const std::string& name, const torch::Tensor& full,
                                 int64_t tp_dim, int64_t dp_dim, int rank, int n) {
  const int tp = std::min(2, n), part = rank % tp, dp = (n - part + tp - 1) / tp;
  return box_piece(name, full, {{tp_dim, dtl::split_range(full.size(tp_dim), tp, part)},
                                {dp_dim, dtl::split_range(full.size(dp_dim), dp, rank / tp)}});
}

// The flat form: the range split_range(numel, n, rank) of the flattened tensor (ZeRO's slice).
inline ShardedTensor flat_piece(const std::string& name, const torch::Tensor& full, int rank, int n) {
  const dtl::Range r = dtl::split_range(full.numel(), n, rank);
  return {name, full.sizes().vec(), r.begin,
          full.reshape({-1}).narrow(0, r.begin, r.size()).clone().to(device())};
}

// A snapshot to load into: `want`'s pieces, zeros, 2-D boxes transposed in memory (a load
// writes into any strides).
inline Snapshot zeros_like_pieces(const Snapshot& want) {
  Snapshot s = want;
  s.counters.clear();
  for (auto& t : s.sharded) {
    const torch::Tensor& w = t.local;
    t.local = t.box_offset.size() == 2 ? torch::zeros({w.size(1), w.size(0)}, w.options()).t()
                                       : torch::zeros_like(w);
  }
  return s;
}

// Runs fn(sub) on the ranks of `sub` (the others have none and skip it), then every rank of
// comm learns whether any rank raised, and all raise alike: a rank that left a test body early
// would leave the others waiting in the next collective (a hang instead of a failure).
template <typename Fn>
void on_sub(Comm& comm, const std::shared_ptr<Comm>& sub, Fn&& fn) {
  std::exception_ptr err;
  std::string msg;
  if (sub) {
    try {
      fn(*sub);
    } catch (const std::exception& e) {
      err = std::current_exception();
      msg = e.what();
    }
  }
  const std::vector<std::string> all = all_gather_strings(comm, msg);
  if (err) std::rethrow_exception(err);
  for (const auto& m : all) {
    if (m.empty()) continue;
    if (m.find("not implemented") != std::string::npos) throw dtl::NotImplemented(m);
    throw dtl::Error("another rank raised: " + m);
  }
}

// load() with allow_reshard.
inline LoadResult load_resharding(const std::string& root, Snapshot& into, Comm& comm) {
  LoadOptions opts;
  opts.allow_reshard = true;
  return load(root, into, comm, opts);
}

// into's sharded locals equal want's, element for element; returns their bytes (what a rank
// that reads only its own ranges reads).
inline int64_t expect_same_slices(const Snapshot& into, const Snapshot& want, const std::string& what) {
  int64_t bytes = 0;
  for (size_t i = 0; i < want.sharded.size(); ++i) {
    DTL_EXPECT_EQUAL(into.sharded[i].local.cpu(), want.sharded[i].local.cpu())
        << want.sharded[i].name << ", " << what;
    bytes += static_cast<int64_t>(want.sharded[i].local.nbytes());
  }
  return bytes;
}

// The file bytes, for byte-level checks and corruption.
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// ---------------------------------------------------------------- observations
//
// In the autograder's split run (dtl/harness/observe.hpp) the driver checks what the student's
// run produced: its results are OBSERVEd, the files it wrote too (their bytes, which exist, a
// directory's names: what the code left on disk is its result); what only that process could
// see is MEASURED: a file's inode, how child jobs ended (exit code, signal, time, output).

// A path the code under test returned. Every run has a scratch directory of its own, so the
// path is observed relative to `root` and put back under this run's root: a path outside root
// stays as it was (and compares unequal to any path under root).
inline std::string observed_path(const std::string& path, const std::string& root,
                                 const char* what = "a path under the scratch directory",
                                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const std::string mark = "<scratch>";
  std::string rel = path;
  if (path == root)
    rel = mark;
  else if (path.rfind(root + "/", 0) == 0)
    rel = mark + path.substr(root.size());
  rel = dtl::testing::observe(std::move(rel), what, dtl::testing::Source::kComputed, file, line);
  return rel.rfind(mark, 0) == 0 ? root + rel.substr(mark.size()) : rel;
}

// A LoadResult, observed: its directory (observed_path under `root`), then its numbers as one list.
inline LoadResult observed(LoadResult r, const std::string& root,
                           const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  r.directory = observed_path(r.directory, root, "LoadResult.directory", file, line);
  auto v = dtl::testing::observe(
      std::vector<int64_t>{r.step, r.saved_world_size, r.resharded ? 1 : 0, r.payload_bytes_read},
      "LoadResult (step, saved_world_size, resharded, payload_bytes_read)",
      dtl::testing::Source::kComputed, file, line);
  if (v.size() != 4) {
    ADD_FAILURE_AT(file, line) << "a LoadResult recorded with " << v.size() << " numbers";
    return r;
  }
  r.step = v[0], r.saved_world_size = static_cast<int>(v[1]), r.resharded = v[2] != 0;
  r.payload_bytes_read = v[3];
  return r;
}

// A FileInfo, observed: (file, (bytes, crc32)).
inline FileInfo observed(FileInfo f, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  auto v = dtl::testing::observe(std::make_pair(f.file, std::vector<int64_t>{f.bytes, f.crc32}),
                                 "FileInfo (file, bytes, crc32)", dtl::testing::Source::kComputed,
                                 file, line);
  f.file = v.first;
  if (v.second.size() == 2)
    f.bytes = v.second[0], f.crc32 = static_cast<uint32_t>(v.second[1]);
  else
    ADD_FAILURE_AT(file, line) << "a FileInfo recorded with " << v.second.size() << " numbers";
  return f;
}

// A header as read_shard_header returned it: data_start, every entry (dtype, shape, begin,
// end) and the metadata, observed as one value.
inline ShardHeader observed(const ShardHeader& h, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  using Entry = std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>;
  std::map<std::string, Entry> tensors;
  for (const auto& [name, e] : h.tensors) tensors[name] = {e.dtype, {e.shape, {e.begin, e.end}}};
  auto all = dtl::testing::observe(
      std::make_pair(h.data_start, std::make_pair(tensors, h.metadata)),
      "the header (data_start, tensors, metadata)", dtl::testing::Source::kComputed, file, line);
  ShardHeader o;
  o.data_start = all.first;
  o.metadata = all.second.second;
  for (const auto& [name, e] : all.second.first) {
    HeaderEntry he;
    he.dtype = e.first;
    he.shape = e.second.first;
    if (e.second.second.size() == 2) he.begin = e.second.second[0], he.end = e.second.second[1];
    o.tensors[name] = he;
  }
  return o;
}

// The bytes of a file the code under test wrote, read back by the test (observed).
inline std::string observed_file(const std::string& path, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(std::istreambuf_iterator<char>(in), {});
  return dtl::testing::observe(std::move(bytes), "the bytes of a file the code wrote",
                               dtl::testing::Source::kComputed, file, line);
}
// Whether a path exists (observed: what the code left in the scratch directory).
inline bool observed_exists(const std::string& path, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return dtl::testing::observe(fs::exists(path), "whether a path exists",
                               dtl::testing::Source::kComputed, file, line);
}
// The names in a directory the code wrote into, sorted (observed).
inline std::vector<std::string> observed_listing(const std::string& dir,
                                                 const char* file = __builtin_FILE(),
                                                 int line = __builtin_LINE()) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return dtl::testing::observe(std::move(names), "the names in a directory",
                               dtl::testing::Source::kComputed, file, line);
}

// How child jobs ended (exit code, signal, timeout, wall time, output): MEASURED, the student's
// run launched them. A supervisor's attempts as one list, or one job.
inline std::vector<dtl::testing::JobResult> measured(
    const std::vector<dtl::testing::JobResult>& runs, const char* file = __builtin_FILE(),
    int line = __builtin_LINE()) {
  std::vector<std::pair<std::vector<int64_t>, std::pair<double, std::string>>> list;
  for (const auto& j : runs)
    list.push_back({{j.exit_code, j.signal, j.timed_out ? 1 : 0}, {j.seconds, j.output}});
  list = dtl::testing::observe(std::move(list), "child jobs' ends", dtl::testing::Source::kMeasured,
                               file, line);
  std::vector<dtl::testing::JobResult> out;
  for (const auto& [codes, rest] : list) {
    dtl::testing::JobResult o;
    if (codes.size() == 3)
      o.exit_code = static_cast<int>(codes[0]), o.signal = static_cast<int>(codes[1]);
    o.timed_out = codes.size() != 3 || codes[2] != 0;
    o.seconds = rest.first;
    o.output = rest.second;
    out.push_back(std::move(o));
  }
  return out;
}
inline dtl::testing::JobResult measured(const dtl::testing::JobResult& job,
                                        const char* file = __builtin_FILE(),
                                        int line = __builtin_LINE()) {
  const auto runs = measured(std::vector<dtl::testing::JobResult>{job}, file, line);
  if (runs.size() == 1) return runs[0];
  ADD_FAILURE_AT(file, line) << runs.size() << " job ends recorded for one job";
  return dtl::testing::JobResult{};
}

// ---------------------------------------------------------------- the child job

// DTL_JOB(lab17_train) (checkpoint_test.cpp) runs train_with_checkpoints on the child's world
// with these args, then rank 0 writes the final parameters' bytes to <dir>/final.bin.
inline RunConfig run_config(const std::vector<std::string>& args) {
  using dtl::testing::job_arg;
  RunConfig rc;
  rc.train = train_config(std::stod(job_arg(args, "dropout", "0.1")),
                          std::stoll(job_arg(args, "steps", "6")));
  rc.dir = job_arg(args, "dir");
  rc.save_every = std::stoll(job_arg(args, "save_every", "2"));
  rc.async = job_arg(args, "async", "0") == "1";
  return rc;
}

inline int train_job(const std::vector<std::string>& args) {
  dtl::Comm& world = dtl::world();
  const RunConfig rc = run_config(args);
  const RunResult r = train_with_checkpoints(rc, world);
  if (world.rank() == 0) {
    torch::Tensor p = r.final_params.cpu().contiguous();
    spit(rc.dir + "/final.bin", std::string(static_cast<const char*>(p.data_ptr()), p.nbytes()));
    std::printf("lab17_train: resumed_from=%lld resharded=%d steps=%zu\n",
                static_cast<long long>(r.resumed_from), r.resharded ? 1 : 0, r.losses.size());
  }
  return 0;
}

// The final parameters a job wrote.
inline torch::Tensor final_params(const std::string& dir) {
  const std::string bytes = slurp(dir + "/final.bin");
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size() / 4)}, torch::kFloat32);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Supervisor: run the job until it exits 0, at most `attempts` times; the fault (if any) only
// in the first attempt. Returns every attempt's result.
inline std::vector<dtl::testing::JobResult> supervise(int ranks, const std::vector<std::string>& args,
                                                      const std::string& fault, int attempts = 3,
                                                      int restart_ranks = 0) {
  std::vector<dtl::testing::JobResult> runs;
  for (int a = 0; a < attempts; ++a) {
    std::vector<std::string> env;
    if (a == 0 && !fault.empty()) env.push_back("DTL_LAB17_FAULT=" + fault);
    const int n = a > 0 && restart_ranks > 0 ? restart_ranks : ranks;
    runs.push_back(dtl::testing::run_job("lab17_train", n, args, 90, env));
    if (runs.back().ok()) break;
  }
  return runs;
}

// The supervisor tests launch their own jobs; they run once, in the 1-rank test job.
#define LAB17_ONLY_AT_WORLD_SIZE_1()                                                   \
  if (dtl::world().size() != 1)                                                         \
  GTEST_SKIP() << "launches its own jobs; runs in the 1-rank test job"

}  // namespace lab17_test

namespace lab17_test {
// The child job every supervisor test launches (one registration per test binary).
DTL_JOB(lab17_train) { return train_job(args); }
}  // namespace lab17_test
