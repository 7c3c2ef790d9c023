// dtl_bench_main: the Google Benchmark main of every benchmark executable under MPI.
// Every rank runs every benchmark (see dtl/harness/bench.hpp for keeping iteration counts in
// agreement); only rank 0 reports to the console and to --benchmark_out.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "dtl/runtime.hpp"

namespace {
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};
}  // namespace

int main(int argc, char** argv) {
  bool has_out = false;  // --benchmark_out=FILE: only rank 0 may write it
  for (int i = 1; i < argc; ++i) has_out |= std::string(argv[i]).rfind("--benchmark_out=", 0) == 0;
  benchmark::Initialize(&argc, argv);
  try {
    dtl::Runtime rt(argc, argv);
    if (rt.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      SilentReporter display, file;
      if (has_out)
        benchmark::RunSpecifiedBenchmarks(&display, &file);
      else
        benchmark::RunSpecifiedBenchmarks(&display);
    }
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
