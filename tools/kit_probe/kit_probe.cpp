// The kit's probe: one test per library dtl takes from the kit, run under mpirun. Each test uses
// the library the way the tree does (an MPI collective across ranks, GoogleTest and GoogleMock
// matchers, a registered benchmark, a JSON round trip, a CLI11 option, fmt's checked format
// strings and fmt::join, a seccomp filter), so a kit that links here but would fail in the tree is unlikely.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <seccomp.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <numeric>
#include <string>
#include <vector>

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

TEST(KitProbe, MpiAllReduceSumsEveryRank) {
  // Each rank contributes rank + 1 in every element: the sum is n(n+1)/2 on every rank.
  const int n = world_size();
  std::vector<long> values(1024, world_rank() + 1);
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_LONG, MPI_SUM,
                MPI_COMM_WORLD);
  EXPECT_THAT(values, ::testing::Each(static_cast<long>(n) * (n + 1) / 2));
}

TEST(KitProbe, FmtChecksFormatStringsAndJoins) {
  const std::vector<int> v{1, 2, 3};
  EXPECT_EQ(fmt::format("{} of {}: [{}]", world_rank(), world_size(), fmt::join(v, ", ")),
            std::to_string(world_rank()) + " of " + std::to_string(world_size()) + ": [1, 2, 3]");
}

TEST(KitProbe, JsonRoundTrips) {
  const nlohmann::json j = {{"lab", 2}, {"ranks", {1, 2, 4}}};
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
  EXPECT_EQ(j.at("ranks").get<std::vector<int>>(), (std::vector<int>{1, 2, 4}));
}

TEST(KitProbe, Cli11ParsesAndValidates) {
  CLI::App app{"probe"};
  int steps = 0;
  app.add_option("--steps", steps)->check(CLI::Range(1, 100));
  app.parse("--steps 7");
  EXPECT_EQ(steps, 7);
  CLI::App bad{"probe"};
  bad.add_option("--steps", steps)->check(CLI::Range(1, 100));
  EXPECT_THROW(bad.parse("--steps 0"), CLI::ValidationError);
}

TEST(KitProbe, SeccompBuildsAFilter) {
  // The grader's sandbox (grading/src/sandbox.cpp) filters system calls with libseccomp: a filter
  // is built and a rule resolved, not loaded (the probe must not sandbox itself).
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(1), seccomp_syscall_resolve_name("ptrace"), 0), 0);
  seccomp_release(ctx);
}

void BM_Accumulate(benchmark::State& state) {
  std::vector<double> v(static_cast<size_t>(state.range(0)), 1.0);
  for (auto _ : state) benchmark::DoNotOptimize(std::accumulate(v.begin(), v.end(), 0.0));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
// A short run: the probe checks that Benchmark works, not how fast this node is.
BENCHMARK(BM_Accumulate)->Arg(1 << 10)->MinTime(0.01);

TEST(KitProbe, BenchmarkRunsARegisteredBenchmark) {
  struct Count : benchmark::BenchmarkReporter {
    int runs = 0;
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>& r) override { runs += static_cast<int>(r.size()); }
  } reporter;
  EXPECT_GE(benchmark::RunSpecifiedBenchmarks(&reporter), 1u);
  EXPECT_GE(reporter.runs, 1);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (world_rank() != 0) {  // one rank's report is enough; every rank's verdict is reduced below
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank() == 0) {
    char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(library, &length);
    std::string mpi(library);
    mpi = mpi.substr(0, mpi.find_first_of(",\n"));  // "Open MPI v4.1.0"
    fmt::print("kit probe: {} (MPI {}) at {} ranks; {}; GoogleTest, Benchmark, JSON {}.{}.{}, CLI11 {}: {}\n",
               mpi, DTL_PROBE_MPI, world_size(), DTL_PROBE_FMT, NLOHMANN_JSON_VERSION_MAJOR,
               NLOHMANN_JSON_VERSION_MINOR, NLOHMANN_JSON_VERSION_PATCH, CLI11_VERSION,
               failed ? "FAILED" : "ok");
  }
  MPI_Finalize();
  return failed;
}
