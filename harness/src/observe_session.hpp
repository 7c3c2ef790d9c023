// observe_session.hpp (private to the harness) — the test main's side of the split run
// (dtl/harness/observe.hpp): it opens the stream, marks where each test begins and ends, and
// carries the worker's own failures to the driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtl::testing::split {

// Worker: this rank writes DIR/rank-R.obs. Driver: this rank reads it. Throws dtl::Error if
// the directory or file cannot be used.
void start_record(const std::string& dir, int rank);
void start_check(const std::string& dir, int rank);

// Every test, in both modes. `seed` is the run's base seed (the Runtime's): each test draws
// from its own stream, seed + hash(test) + rank, so the worker and the driver draw the same
// inputs whatever the code under test consumed from the generator in earlier tests.
void test_start(const std::string& name, uint64_t seed, int rank);
// A failure the running test raised on this rank (record mode: appended to the stream).
void test_failed(const char* file, int line, const std::string& message);
// Record: closes the test's records and flushes. Check: raises the worker's failures, and
// those of a run that stopped early, diverged or is missing, as failures of this test.
void test_end();

// Check mode: this rank's observation counts as JSON, and (rank 0, given every rank's JSON)
// {"tests": {name: {"computed": n, "measured": n, "missing": n}}} summed over the ranks for the
// grader (which tests rest on in-process checks only; a rank that sits out of a sub-group still
// counts through the others).
std::string counts_json();
void write_summary(const std::string& path, const std::vector<std::string>& every_rank);

}  // namespace dtl::testing::split
