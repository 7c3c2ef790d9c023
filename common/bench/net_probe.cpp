// net_probe: measures what the network emulator actually delivers and fits alpha and beta.
//
//   ./lab bench net -n 4 -- --net ib-2node
//
// Ranks exchange messages of 4 KiB..4 MiB with sendrecv, first within a node (ranks 0 and 1),
// then across nodes (rank 0 and the last rank, when the spec has several nodes); a least-
// squares fit of t = alpha + S / beta over the medians is printed next to the configured link.
// Then a ring all-reduce over all ranks, measured against 2(n-1) alpha + 2(n-1)/n S / beta.
#include <fmt/format.h>

#include <cstdio>

#include "dtl/perf.hpp"
#include "dtl/log.hpp"
#include "dtl/net.hpp"
#include "dtl/runtime.hpp"

namespace {

struct Fit {
  double alpha, beta;
};

// Least squares of t = a + b S; beta = 1 / b.
Fit fit(const std::vector<double>& sizes, const std::vector<double>& times) {
  const double n = static_cast<double>(sizes.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sx += sizes[i];
    sy += times[i];
    sxx += sizes[i] * sizes[i];
    sxy += sizes[i] * times[i];
  }
  const double b = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  return {(sy - b * sx) / n, 1.0 / b};
}

void probe_pair(dtl::Comm& world, int a, int b, const char* what, const dtl::net::Link& link,
                double scale) {
  auto pair = world.split(world.rank() == a || world.rank() == b ? 0 : -1, world.rank());
  std::vector<double> sizes, times;
  dtl::print0("\n{} (ranks {} and {}): configured alpha {:.3f} ms, beta {:.3f} MB/s in emulated "
              "time (the link's {:g} us and {:g} GB/s, time x{:g})",
              what, a, b, link.latency * scale * 1e3, link.bandwidth / scale / 1e6,
              link.latency * 1e6, link.bandwidth / 1e9, scale);
  dtl::print0("{:>10} {:>12} {:>12} {:>8}", "bytes", "measured ms", "model ms", "ratio");
  for (int64_t bytes = 4096; bytes <= (4 << 20); bytes *= 4) {
    auto out = torch::ones({bytes / 4}), in = torch::empty({bytes / 4});
    auto m = dtl::measure([&] {
      if (pair) pair->sendrecv(out, 1 - pair->rank(), in, 1 - pair->rank());
    }, 1, 5);
    const double model = link.time(static_cast<double>(bytes)) * scale;
    sizes.push_back(static_cast<double>(bytes));
    times.push_back(m.median);
    dtl::print0("{:>10} {:>12.3f} {:>12.3f} {:>8.3f}", bytes, m.median * 1e3, model * 1e3,
                m.median / model);
  }
  Fit f = fit(sizes, times);
  dtl::print0("fit: alpha {:.3f} ms ({:+.1f}%), beta {:.3f} MB/s ({:+.1f}%)  [in emulated time]",
              f.alpha * 1e3, 100 * (f.alpha / (link.latency * scale) - 1), f.beta / 1e6,
              100 * (f.beta / (link.bandwidth / scale) - 1));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    dtl::Runtime rt(argc, argv);
    auto& world = rt.world();
    const auto& spec = dtl::net::current();
    if (!spec.enabled) {
      dtl::print0("net_probe: the emulator is off; pass --net PRESET (e.g. -- --net ib-2node)");
      return 0;
    }
    if (world.size() < 2) {
      dtl::print0("net_probe: needs at least 2 ranks (-n 2)");
      return 0;
    }
    dtl::print0("network emulator {}", spec.describe());
    const int last = world.size() - 1;
    if (!dtl::net::is_inter_node(0, 1))
      probe_pair(world, 0, 1, "intra-node", spec.intra, spec.time_scale);
    if (dtl::net::is_inter_node(0, last))
      probe_pair(world, 0, last, "inter-node", spec.inter, spec.time_scale);
    std::vector<int> all(world.size());
    for (int i = 0; i < world.size(); ++i) all[i] = i;
    dtl::print0("\nring all-reduce over {} ranks{}", world.size(),
                dtl::net::spans_nodes(all) ? " (bottleneck: inter-node link)" : "");
    dtl::print0("{:>10} {:>12} {:>12} {:>8}", "bytes", "measured ms", "model ms", "ratio");
    for (int64_t bytes = 4096; bytes <= (4 << 20); bytes *= 16) {
      auto t = torch::ones({bytes / 4});
      auto m = dtl::measure([&] { world.all_reduce(t); }, 1, 5);
      double model = dtl::net::collective_cost("all_reduce", static_cast<double>(bytes), all);
      dtl::print0("{:>10} {:>12.3f} {:>12.3f} {:>8.3f}", bytes, m.median * 1e3, model * 1e3,
                  m.median / model);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
