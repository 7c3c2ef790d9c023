// Timing across ranks (measure, max_over_ranks) and the matmul peak.
#include "dtl/perf.hpp"

#include <fmt/format.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"

namespace dtl {

static MPI_Comm control() { return Runtime::get().control_comm(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

void synchronize_device() {
  if (Runtime::exists() && Runtime::get().device().is_cuda())
    torch::cuda::synchronize(Runtime::get().device().index());
}

std::string Measurement::to_string() const {
  auto ms = [](double s) { return s * 1e3; };
  return fmt::format("median {:.3f} ms (min {:.3f}, max {:.3f}, {} iters)", ms(median), ms(min),
                     ms(max), seconds.size());
}

Measurement measure(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  synchronize_device();
  Measurement m;
  for (int i = 0; i < iters; ++i) {
    control_barrier();  // start together, so one rank's lateness is not counted as its time
    Timer t;
    fn();
    synchronize_device();
    m.seconds.push_back(max_over_ranks(t.seconds()));  // the step ends when the slowest rank does
  }
  if (m.seconds.empty()) return m;
  m.median = dtl::median(m.seconds);
  m.min = *std::min_element(m.seconds.begin(), m.seconds.end());
  m.max = *std::max_element(m.seconds.begin(), m.seconds.end());
  m.mean = std::accumulate(m.seconds.begin(), m.seconds.end(), 0.0) / m.seconds.size();
  return m;
}

double measure_matmul_flops(const std::vector<int64_t>& sizes, int reps) {
  torch::NoGradGuard no_grad;
  const torch::Device device = Runtime::exists() ? Runtime::get().device() : torch::kCPU;
  double best = 0;
  for (const int64_t n : sizes) {
    const torch::Tensor a = torch::randn({n, n}).to(device), b = torch::randn({n, n}).to(device);
    torch::Tensor c = torch::mm(a, b);  // warm-up: thread pool start, page faults
    std::vector<double> seconds;
    for (int i = 0; i < reps; ++i) {
      synchronize_device();
      Timer t;
      torch::mm_out(c, a, b);
      synchronize_device();
      seconds.push_back(t.seconds());
    }
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n / median(seconds));
  }
  return best;
}

}  // namespace dtl
