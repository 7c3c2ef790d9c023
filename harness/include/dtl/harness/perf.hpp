// dtl/harness/perf.hpp — defines: Measurement, measure.
//
// Timing a distributed step: all ranks start together (barrier on the harness's control
// channel), each iteration's time is the slowest rank's (a step is done when every rank is),
// and the summary is the median over iterations (robust to a noisy shared machine).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace dtl::testing {

struct Measurement {
  std::vector<double> seconds;  // per iteration, max over ranks
  double median = 0, min = 0, max = 0, mean = 0;
  std::string to_string() const;  // "median 1.23 ms (min 1.10, max 1.50, 20 iters)"
};

// Runs fn `warmup` times untimed, then `iters` times timed. Collective: every rank calls it
// with the same counts. Works in tests, benchmarks and lab demos alike.
Measurement measure(const std::function<void()>& fn, int warmup = 2, int iters = 10);

// Max over ranks of a local value, over the control channel (not counted in Comm stats).
double max_over_ranks(double local);
double sum_over_ranks(double local);
// Barrier over the control channel.
void control_barrier();

}  // namespace dtl::testing
