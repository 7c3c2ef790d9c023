// Lab 17 demo: a supervisor, a job killed in the middle of a save, and an exact resume.
//
//   ./lab run 17                               2 ranks: rank 1 killed in the save of step 6
//   ./lab run 17 -n 3 -- --kill-at 4 --at commit --kill-rank 0
//   ./lab run 17 -n 4 -- --restart-ranks 2     killed on 4 ranks, resumed (resharded) on 2
//   ./lab run 17 -- --async                    the same with asynchronous saves
//   ./lab run 17 -- --help                     every flag
//
// Rank 0 of this job is the supervisor (the other ranks wait): it launches the training as
// jobs of their own (mpirun -n RANKS, new processes, this program with --worker), first one
// that runs uninterrupted, then one in which DTL_LAB17_FAULT kills a rank with SIGKILL at a
// fault point of your save(); mpirun ends that job, the supervisor restarts it, the restarted
// job resumes from `latest`, and the final parameters are compared with the uninterrupted run's.
#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/jobs.hpp"  // defines: run_mpi_job, self_exe
#include "dtl/log.hpp"
#include "dtl/timer.hpp"  // defines: now_seconds
#include "dtl/runtime.hpp"

namespace {

namespace fs = std::filesystem;
using namespace dtl::lab17;

struct Flags {
  int64_t steps = 12, save_every = 3, kill_at = 6;
  int kill_rank = 1, restart_ranks = 0;
  std::string at = "shard", dir;
  bool async = false, worker = false;
  double dropout = 0.1;
};

TrainConfig train_config(const Flags& f) {
  TrainConfig c;
  c.model.n_layer = 2;
  c.model.d_model = 64;
  c.model.n_head = 4;
  c.model.vocab_size = 128;
  c.model.seq_len = 32;
  c.model.dropout = f.dropout;
  c.optim.weight_decay = 0.1;
  c.optim.warmup_steps = 2;
  c.total_steps = f.steps;
  c.global_batch = 8;
  return c;
}

// One training job (every rank): resume if there is a checkpoint, train, save; rank 0 writes
// the final parameters for the supervisor to compare.
int worker(const Flags& f) {
  dtl::Comm& world = dtl::world();
  RunConfig rc;
  rc.train = train_config(f);
  rc.dir = f.dir;
  rc.save_every = f.save_every;
  rc.async = f.async;
  const RunResult r = train_with_checkpoints(rc, world);
  if (world.rank() == 0) {
    torch::Tensor p = r.final_params.cpu().contiguous();
    std::ofstream(f.dir + "/final.bin", std::ios::binary)
        .write(static_cast<const char*>(p.data_ptr()), static_cast<std::streamsize>(p.nbytes()));
    std::printf("  [job, %d ranks] %s; %zu steps, last loss %.4f; %.2f s training, %.2f s blocked by saves\n",
                world.size(),
                r.resumed_from < 0 ? std::string("fresh start").c_str()
                                   : fmt::format("resumed from step {}{}", r.resumed_from,
                                                 r.resharded ? " (resharded)" : "").c_str(),
                r.losses.size(), r.losses.empty() ? 0.0 : r.losses.back(), r.step_seconds,
                r.save_seconds);
  }
  return 0;
}

std::vector<std::string> worker_args(const Flags& f, const std::string& dir) {
  return {"--worker", "--dir", dir, "--steps", std::to_string(f.steps), "--save-every",
          std::to_string(f.save_every), "--dropout", std::to_string(f.dropout),
          f.async ? "--async" : "--sync"};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Only the lines the jobs printed themselves (mpirun's own banner about the killed rank is
// summarised by the supervisor).
void show(const dtl::testing::JobResult& r) {
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  [job", 0) == 0 || line.find("fault injection") != std::string::npos)
      std::printf("%s\n", line.c_str());
}

int supervise(const Flags& f, int ranks) {
  const char* base = std::getenv("TMPDIR");
  std::string root = f.dir;
  if (root.empty()) {
    root = (fs::path(base && *base ? base : "/tmp") / "dtl-lab17-demo-XXXXXX").string();
    DTL_CHECK(mkdtemp(root.data()) != nullptr, "mkdtemp failed");
  }
  const std::string straight = root + "/uninterrupted", killed = root + "/supervised";
  fs::create_directories(straight);
  fs::create_directories(killed);
  const std::string exe = dtl::testing::self_exe();
  std::printf("lab 17: %lld steps on %d ranks, a %s checkpoint every %lld steps, in %s\n\n",
              static_cast<long long>(f.steps), ranks, f.async ? "asynchronous" : "synchronous",
              static_cast<long long>(f.save_every), root.c_str());

  std::printf("1. the uninterrupted run\n");
  auto clean = dtl::testing::run_mpi_job(ranks, exe, worker_args(f, straight), 300);
  show(clean);
  if (!clean.ok()) {
    std::printf("the uninterrupted run failed: %s\n", clean.describe().c_str());
    return 1;
  }
  std::printf("   %s\n\n", clean.describe().substr(0, clean.describe().find(';')).c_str());

  std::printf("2. the supervised run: rank %d killed with SIGKILL at '%s' in the save of step %lld\n",
              f.kill_rank, f.at.c_str(), static_cast<long long>(f.kill_at));
  double killed_at = 0;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    std::vector<std::string> env;
    if (attempt == 1)
      env.push_back(fmt::format("DTL_LAB17_FAULT=rank={},step={},at={}", f.kill_rank, f.kill_at, f.at));
    const int n = attempt > 1 && f.restart_ranks > 0 ? f.restart_ranks : ranks;
    const double start = dtl::now_seconds();
    auto r = dtl::testing::run_mpi_job(n, exe, worker_args(f, killed), 300, env);
    show(r);
    const std::string how = r.describe().substr(0, r.describe().find(';'));
    std::printf("   attempt %d on %d ranks: %s; latest = %s\n", attempt, n, how.c_str(),
                fs::path(latest(killed)).filename().string().c_str());
    if (attempt > 1 && killed_at > 0)
      std::printf("   from the kill to the restarted job's end: %.2f s (the job's start-up and "
                  "load included)\n", dtl::now_seconds() - killed_at);
    if (r.ok()) break;
    killed_at = start + r.seconds;
    if (attempt == 3) {
      std::printf("gave up after 3 attempts\n");
      return 1;
    }
    std::printf("   supervisor: the job died; restarting it from `latest`\n");
  }
  const std::string a = slurp(straight + "/final.bin"), b = slurp(killed + "/final.bin");
  if (f.restart_ranks > 0 && f.restart_ranks != ranks) {
    float worst = 0;
    for (size_t i = 0; i + 4 <= a.size() && a.size() == b.size(); i += 4) {
      float x, y;
      std::memcpy(&x, a.data() + i, 4);
      std::memcpy(&y, b.data() + i, 4);
      worst = std::max(worst, std::abs(x - y));
    }
    std::printf("\nfinal parameters (%zu floats): largest difference %.3g from the uninterrupted "
                "run (resharded: the all-reduce sums in another order, other ranks draw other "
                "dropout masks)\n", a.size() / 4, worst);
  } else {
    std::printf("\nfinal parameters (%zu floats): %s\n", a.size() / 4,
                !a.empty() && a == b ? "bitwise equal to the uninterrupted run's"
                                     : "DIFFERENT from the uninterrupted run's");
  }
  if (f.dir.empty()) fs::remove_all(root);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 17: a supervisor, a job killed during a save, an exact resume"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  Flags f;
  app.add_option("--steps", f.steps, "training steps")->capture_default_str();
  app.add_option("--save-every", f.save_every, "steps between checkpoints")->capture_default_str();
  app.add_option("--kill-at", f.kill_at, "the step whose save is killed")->capture_default_str();
  app.add_option("--kill-rank", f.kill_rank, "the rank killed")->capture_default_str();
  app.add_option("--at", f.at, "the fault point: shard (after the shard is written) or commit "
                               "(rank 0, before the rename)")->capture_default_str();
  app.add_option("--restart-ranks", f.restart_ranks, "restart on this many ranks (resharding)");
  app.add_option("--dropout", f.dropout, "dropout (0: resharded runs follow the same trajectory)")
      ->capture_default_str();
  app.add_option("--dir", f.dir, "keep the checkpoints here (default: a temporary directory)");
  app.add_flag("--async,!--sync", f.async, "asynchronous saves");
  app.add_flag("--worker", f.worker, "(internal) run as one of the supervised training jobs");
  CLI11_PARSE(app, argc, argv);
  try {
    dtl::Runtime rt(opts, argc, argv);
    if (f.worker) return worker(f);
    int rc = 0;
    if (rt.rank() == 0) rc = supervise(f, rt.world_size());
    // The other ranks wait without spinning a core the jobs need.
    MPI_Request req;
    MPI_Ibarrier(rt.control_comm(), &req);
    for (int done = 0; !done;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return rc;
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
