// Lab 18 demo: inject a fault into a training job and watch your tools name it.
//
//   ./lab run 18                         3 ranks, no fault: training, dumps on demand, "no culprit"
//   ./lab run 18 -- --fault skip         rank 1 skips the gradient all-reduce of step 1
//   ./lab run 18 -- --fault shape        its gradient has one element more (desync check on)
//   ./lab run 18 -- --fault sleep        it sleeps past the watchdog's timeout
//   ./lab run 18 -- --fault crash        it is killed (SIGKILL)
//   ./lab run 18 -- --fault oom          it runs out of memory (a memory limit)
//   ./lab run 18 -- --fault nan          a NaN in its gradient of blocks.0.mlp.fc.weight
//   ./lab run 18 -- --fault flip         one bit of its blocks.0.mlp.fc.weight flips: nothing notices
//   ./lab run 18 -- --fault flip --replica-check    ... until the replicas' hashes are compared
//   ./lab run 18 -n 4 -- --fault skip --fault-rank 3 --timeout 3
//   ./lab debug DIR                      the analyzer alone, on the dumps in DIR
//
// Rank 0 of this job is the supervisor (the other ranks wait): it launches the training as a job
// of its own (mpirun, new processes, this program with --worker) so that a rank may die without
// taking the supervisor with it, lets the survivors of a dead rank live until their watchdog
// fires (as on a cluster, where the other nodes do not learn of a death at once), prints what
// the job printed, then the time from the fault to its report and the analyzer's verdict.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "debug.hpp"
#include "dtl/error.hpp"
#include "dtl/harness/jobs.hpp"  // defines: run_mpi_job, self_exe
#include "dtl/runtime.hpp"

namespace {

namespace fs = std::filesystem;
using namespace dtl::lab18;

struct Flags {
  std::string fault, dir, analyze;
  int fault_rank = 1;
  int64_t fault_step = 1, steps = 4;
  double timeout = 2, grace = 1;
  bool desync = false, replica = false, worker = false;
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, false);
}

int worker(const Flags& f) {
  JobConfig c;
  c.train.model.n_layer = 2;
  c.train.model.d_model = 64;
  c.train.model.n_head = 4;
  c.train.model.vocab_size = 128;
  c.train.model.seq_len = 32;
  c.train.steps = f.steps;
  c.train.fault = {f.fault, f.fault_rank, f.fault_step};
  c.train.desync_check = f.desync || f.fault == "shape";
  c.train.replica_check = f.replica;
  c.watchdog.dir = f.dir;
  c.watchdog.timeout_s = f.timeout;
  c.watchdog.grace_s = f.grace;
  return debug_job(c, dtl::world());
}

int supervise(const Flags& f, int ranks) {
  std::string dir = f.dir;
  if (dir.empty()) {
    const char* base = std::getenv("TMPDIR");
    dir = (fs::path(base && *base ? base : "/tmp") / "dtl-lab18-demo-XXXXXX").string();
    DTL_CHECK(mkdtemp(dir.data()) != nullptr, "mkdtemp failed");
  }
  std::printf("lab 18: %lld steps on %d ranks, fault: %s%s%s; watchdog timeout %.1f s; dumps in %s\n\n",
              static_cast<long long>(f.steps), ranks,
              f.fault.empty() ? "none" : fmt::format("{} on rank {} in step {}", f.fault, f.fault_rank, f.fault_step).c_str(),
              f.desync || f.fault == "shape" ? " (desync check on)" : "",
              f.replica ? " (replica check on)" : "", f.timeout, dir.c_str());
  std::fflush(stdout);
  std::vector<std::string> args = {"--worker", "--dir", dir, "--steps", std::to_string(f.steps),
                                   "--timeout", std::to_string(f.timeout), "--grace", std::to_string(f.grace),
                                   "--fault-rank", std::to_string(f.fault_rank), "--fault-step",
                                   std::to_string(f.fault_step)};
  if (!f.fault.empty()) args.insert(args.end(), {"--fault", f.fault});
  if (f.desync) args.push_back("--desync");
  if (f.replica) args.push_back("--replica-check");
  const double limit = f.timeout + 4 * f.grace + 60;
  const auto job = dtl::testing::run_mpi_job(ranks, dtl::testing::self_exe(), args, limit,
                                             dtl::testing::survivors_live_on_env());
  // The job's own lines, without mpirun's banners about the abort.
  std::istringstream in(job.output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("---", 0) != 0 && line.find("MPI_ABORT") == std::string::npos &&
        line.find("PMIX ERROR") == std::string::npos && line.find("NOTE: invoking") == std::string::npos &&
        line.find("You may or may not") == std::string::npos && line.find("exactly when Open MPI") == std::string::npos &&
        line.find("with errorcode") == std::string::npos)
      std::printf("  | %s\n", line.c_str());
  std::printf("\njob: %s\n", job.timed_out ? "timed out (nothing ended it)" : fmt::format("ended after {:.1f} s", job.seconds).c_str());
  const auto report = read_json(dir + "/report.json"), fault = read_json(dir + "/fault.json");
  if (report.is_object() && fault.is_object())
    std::printf("from the fault to the report: %.2f s (timeout %.1f s, grace %.1f s)\n",
                report.value("reported_at", 0.0) - fault.value("time", 0.0), f.timeout, f.grace);
  std::printf("\n./lab debug %s says:\n%s", dir.c_str(), analyze(dir).report().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Lab 18 demo: inject a fault, let the flight recorder, the watchdog and the analyzer name it"};
  dtl::RuntimeOptions ropts = dtl::RuntimeOptions::from_env();
  ropts.add_to(app);
  app.add_option("--fault", f.fault, "skip | shape | sleep | crash | oom | nan | flip (default: none)");
  app.add_option("--fault-rank", f.fault_rank, "the rank it happens on");
  app.add_option("--fault-step", f.fault_step, "the step it happens in");
  app.add_option("--steps", f.steps, "training steps");
  app.add_option("--timeout", f.timeout, "the watchdog's timeout, seconds");
  app.add_option("--grace", f.grace, "how long the reporter waits for every rank's dump, seconds");
  app.add_flag("--desync", f.desync, "desync check mode (fingerprint every gradient all-reduce)");
  app.add_flag("--replica-check", f.replica, "compare the replicas' parameter hashes after every step");
  app.add_option("--dir", f.dir, "the dump directory (default: a new one under $TMPDIR)");
  app.add_option("--analyze", f.analyze, "only analyse the dumps in this directory (./lab debug DIR)");
  app.add_flag("--worker", f.worker, "(internal) run as the training job");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!f.analyze.empty()) {  // files only: no MPI, no Runtime
      const Analysis a = analyze(f.analyze);
      std::printf("%s", a.report().c_str());
      return a.findings.size() == 1 && a.findings[0].kind == "none" ? 0 : 1;
    }
    dtl::Runtime rt(ropts);
    if (f.worker) return worker(f);
    int rc = 0;
    if (rt.rank() == 0) rc = supervise(f, rt.world_size());
    rt.world().barrier();
    return rc;
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
