// measure(): cross-rank step timing over the harness's control channel.
#include "dtl/harness/perf.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <numeric>

#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"

namespace dtl::testing {

static MPI_Comm control() { return Runtime::get().control_comm(); }

double max_over_ranks(double local) {
  double out = local;
  MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_MAX, control());
  return out;
}
double sum_over_ranks(double local) {
  double out = local;
  MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_SUM, control());
  return out;
}
void control_barrier() { MPI_Barrier(control()); }

std::string Measurement::to_string() const {
  auto ms = [](double s) { return s * 1e3; };
  return fmt::format("median {:.3f} ms (min {:.3f}, max {:.3f}, {} iters)", ms(median), ms(min),
                     ms(max), seconds.size());
}

Measurement measure(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  Measurement m;
  for (int i = 0; i < iters; ++i) {
    control_barrier();  // start together, so one rank's lateness is not counted as its time
    Timer t;
    fn();
    m.seconds.push_back(max_over_ranks(t.seconds()));  // the step ends when the slowest rank does
  }
  if (m.seconds.empty()) return m;
  auto sorted = m.seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  m.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  m.min = sorted.front();
  m.max = sorted.back();
  m.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / n;
  return m;
}

}  // namespace dtl::testing
