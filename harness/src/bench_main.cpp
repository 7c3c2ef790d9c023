// dtl_bench_main: the Google Benchmark main of every benchmark executable under MPI.
// Every rank runs every benchmark (see dtl/harness/bench.hpp for keeping iteration counts in
// agreement); only rank 0 reports to the console and to --benchmark_out.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtl/runtime.hpp"

namespace {
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};
}  // namespace

// This process's rank as the launcher tells it, before MPI is up (OpenMPI, Slurm, PMI).
static int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

int main(int argc, char** argv) {
  // Only rank 0 may open --benchmark_out: Google Benchmark truncates the file when it starts,
  // so other ranks drop the flag before it is parsed.
  if (launcher_rank() != 0) {
    int out = 1;
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]).rfind("--benchmark_out", 0) != 0) argv[out++] = argv[i];
    argc = out;
  }
  benchmark::Initialize(&argc, argv);
  try {
    dtl::Runtime rt(argc, argv);
    if (rt.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      SilentReporter display;
      benchmark::RunSpecifiedBenchmarks(&display);
    }
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  }
  // The results are written and MPI is finalised: no static destructor (a submission's
  // included) runs after them.
  std::fflush(nullptr);
  std::_Exit(0);
}
