// Lab 17 benchmark: how fast a checkpoint goes to disk and comes back, against what the disk
// itself does, and how long an asynchronous save blocks training.
//
//   ./lab bench 17                  2 ranks; add --solutions for the reference
//   ./lab bench 17 -n 4 -- --benchmark_filter=Save
//
// BM_Disk      every rank writes its shard's bytes with one write() and an fsync (what
//              `dd bs=... conv=fsync` measures): the disk's own figure, in the same run
// BM_Save      save(): every rank its shard, rank 0 the manifest and the commit
// BM_Load      load() of that checkpoint with its checksums verified (every byte read twice
//              in the job), and BM_Load/0 without (each rank reads only its own bytes)
// BM_AsyncSave the time AsyncSaver::save blocks the caller, and blocked_fraction = that time /
//              a synchronous save's, measured alternately in the same iterations
// MB_per_s counts every rank's bytes (the checkpoint's size) over the slowest rank's time.
// Every timed call is checked: a save must commit (latest names it, its manifest lists every
// rank's file with the right size), a load must return every element it was given.
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "dtl/error.hpp"
#include "dtl/perf.hpp"  // defines: max_over_ranks
#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"

namespace {

namespace fs = std::filesystem;
using namespace dtl::lab17;

// 48 MiB of float32 state in all (three tensors of 4M elements: a parameter and its two
// moments), split over the ranks as the trainer splits it.
constexpr int64_t kNumel = 4 << 20;

struct Fixture {
  std::shared_ptr<dtl::Comm> comm = dtl::world().dup();
  std::string root;
  Snapshot snapshot;
  int64_t total_bytes = 0;  // over all ranks

  Fixture() {
    std::string mine;
    if (comm->rank() == 0) {
      const char* base = std::getenv("TMPDIR");
      std::string pattern = (fs::path(base && *base ? base : "/tmp") / "dtl-lab17-bench-XXXXXX").string();
      DTL_CHECK(mkdtemp(pattern.data()) != nullptr, "bench: mkdtemp failed");
      mine = pattern;
    }
    root = all_gather_strings(*comm, mine)[0];
    const dtl::Range r = dtl::split_range(kNumel, comm->size(), comm->rank());
    for (const char* name : {"param/w", "exp_avg/w", "exp_avg_sq/w"}) {
      torch::Tensor full = torch::arange(kNumel, torch::kFloat32) * (name[0] == 'p' ? 1 : 2);
      snapshot.sharded.push_back({name, {kNumel}, r.begin, full.narrow(0, r.begin, r.size()).clone().to(comm->device())});
    }
    total_bytes = 3 * kNumel * 4;
  }
  ~Fixture() {
    if (comm->rank() == 0) fs::remove_all(root);
  }
  int64_t my_bytes() const {
    int64_t b = 0;
    for (const auto& t : snapshot.sharded) b += static_cast<int64_t>(t.local.nbytes());
    return b;
  }
  // A committed save: latest names it and its manifest lists every rank's file at its size.
  bool committed(const std::string& dir) const {
    if (latest(root) != dir) return false;
    std::ifstream in(dir + "/manifest.json");
    const auto m = nlohmann::json::parse(in, nullptr, false);
    if (m.is_discarded() || m.value("world_size", 0) != comm->size()) return false;
    for (auto& [file, info] : m["files"].items())
      if (static_cast<int64_t>(fs::file_size(dir + "/" + file)) != info["bytes"].get<int64_t>()) return false;
    return true;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void set_rate(benchmark::State& state, double bytes) {
  state.counters["MB_per_s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e6,
                                                  benchmark::Counter::kIsRate);
}

void BM_Disk(benchmark::State& state) {
  Fixture& f = fixture();
  const std::string path = fmt::format("{}/dd-{}.bin", f.root, f.comm->rank());
  torch::Tensor bytes = f.snapshot.sharded[0].local.cpu();
  std::vector<torch::Tensor> host;
  for (const auto& t : f.snapshot.sharded) host.push_back(t.local.cpu());
  for (auto _ : state) {
    dtl::bench::Iteration it(state);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0;
    for (const auto& t : host) ok = ok && ::write(fd, t.data_ptr(), t.nbytes()) == static_cast<ssize_t>(t.nbytes());
    ok = ok && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok) {
      state.SkipWithError("wrong result: the disk write failed");
      break;
    }
  }
  set_rate(state, static_cast<double>(f.total_bytes));
}

void BM_Save(benchmark::State& state) {
  Fixture& f = fixture();
  int64_t step = 1000;
  try {
    for (auto _ : state) {
      f.snapshot.step = ++step;
      std::string dir;
      {
        dtl::bench::Iteration it(state);
        dir = save(f.root, f.snapshot, *f.comm);
      }
      if (!f.committed(dir)) {
        state.SkipWithError("wrong result: the save did not commit a complete checkpoint");
        break;
      }
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
  set_rate(state, static_cast<double>(f.total_bytes));
}

void BM_Load(benchmark::State& state) {
  Fixture& f = fixture();
  LoadOptions opts;
  opts.verify_checksums = state.range(0) != 0;
  try {
    f.snapshot.step = 900 + state.range(0);  // one checkpoint per variant
    save(f.root, f.snapshot, *f.comm);
    Snapshot into = f.snapshot;
    for (auto& t : into.sharded) t.local = torch::zeros_like(t.local);
    for (auto _ : state) {
      for (auto& t : into.sharded) t.local.zero_();
      LoadResult res;
      {
        dtl::bench::Iteration it(state);
        res = load(f.root, into, *f.comm, opts);
      }
      bool ok = res.payload_bytes_read == f.my_bytes();
      for (size_t i = 0; i < into.sharded.size(); ++i)
        ok = ok && torch::equal(into.sharded[i].local, f.snapshot.sharded[i].local);
      if (!ok) {
        state.SkipWithError("wrong result: the load did not return the saved elements");
        break;
      }
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
  set_rate(state, static_cast<double>(f.total_bytes));
}

void BM_AsyncSave(benchmark::State& state) {
  Fixture& f = fixture();
  int64_t step = 2000;
  double sync = 0;
  try {
    AsyncSaver saver(*f.comm);
    for (auto _ : state) {
      f.snapshot.step = ++step;
      {
        dtl::bench::Iteration it(state);
        saver.save(f.root, f.snapshot);
      }
      const std::string dir = saver.wait();
      state.PauseTiming();
      dtl::Timer t;
      f.snapshot.step = ++step;
      save(f.root, f.snapshot, *f.comm);
      sync += dtl::max_over_ranks(t.seconds());
      state.ResumeTiming();
      if (dir != f.root + fmt::format("/step-{:08d}", step - 1) ||
          !f.committed(f.root + fmt::format("/step-{:08d}", step))) {
        state.SkipWithError("wrong result: an asynchronous save did not commit");
        break;
      }
    }
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
  const double mean_blocked = dtl::bench::mean_iteration_seconds(state);
  if (sync > 0) state.counters["blocked_fraction"] = mean_blocked / (sync / state.iterations());
  state.counters["sync_save_ms"] = sync / std::max<int64_t>(1, state.iterations()) * 1e3;
}

BENCHMARK(BM_Disk)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Save)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->Arg(1)->Arg(0)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AsyncSave)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
