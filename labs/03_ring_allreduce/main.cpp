// Lab 03 demo: an nccl-tests style table of your ring and recursive doubling all-reduce next to
// the built-in Comm::all_reduce, from 1 KiB to 64 MiB, then what the alpha-beta model makes of
// the measurements.
//
//   ./lab run 03 -n 4                      your code on 4 processes
//   ./lab run 03 -n 4 --solutions          the reference
//   ./lab run 03 -n 4 -- --dtype float64 --op max --max-bytes 16M --iters 20
//   ./lab run 03 -n 4 -- --json busbw.json  also the table as data (./lab figures)
//
// Columns (nccl-tests, doc/PERFORMANCE.md): time = median over iterations of the slowest rank;
// algbw = S / time; busbw = algbw x 2(n-1)/n, the bandwidth each rank's link actually sustains
// under a bandwidth-optimal all-reduce (so it is comparable across rank counts and with the
// hardware's link speed); #wrong = elements, summed over ranks, that differ from
// Comm::all_reduce's result on the same random input.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"
#include "dtl/perf.hpp"
#include "dtl/log.hpp"
#include "dtl/runtime.hpp"
#include "ring_allreduce.hpp"

namespace {

using dtl::ReduceOp;
using AllReduceFn = std::function<void(dtl::Comm&, const torch::Tensor&, ReduceOp)>;

struct Algo {
  Algo(std::string title, std::string short_name, AllReduceFn run)
      : title(std::move(title)), short_name(std::move(short_name)), run(std::move(run)) {}
  std::string title;  // column group heading
  std::string short_name;
  AllReduceFn run;
  bool implemented = true;
  std::vector<std::pair<double, double>> points;  // (bytes, seconds) measured
  double busbw_sum = 0;
  int64_t wrong_total = 0;
};

// Elements of `got` that differ from `expected`: bitwise for integers and for max/min; within
// a float tolerance for sums and averages (the algorithms add in different orders).
int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected, ReduceOp op) {
  const bool order_dependent =
      got.is_floating_point() && (op == ReduceOp::Sum || op == ReduceOp::Avg);
  if (!order_dependent) return got.ne(expected).sum().item<int64_t>();
  auto g = got.to(torch::kFloat64), e = expected.to(torch::kFloat64);
  const double rtol = got.element_size() >= 4 ? 1e-5 : 1e-2;
  return (g - e).abs().gt(rtol * (e.abs() + 1.0)).sum().item<int64_t>();
}

// Drawn on the CPU (the same numbers whatever the device), then moved to the Runtime's device.
torch::Tensor random_input(int64_t numel, torch::ScalarType dtype) {
  const torch::Device device = dtl::Runtime::get().device();
  if (c10::isIntegralType(dtype, /*includeBool=*/false))
    return torch::randint(-1000, 1000, {numel}, torch::TensorOptions().dtype(dtype)).to(device);
  return torch::randn({numel}).to(dtype).to(device);
}

std::string format_bytes(double b) {
  if (b >= (1 << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (b >= (1 << 10)) return fmt::format("{:.0f} KiB", b / (1 << 10));
  return fmt::format("{:.0f} B", b);
}

// "64M", "16K", "4096" -> bytes.
int64_t parse_bytes(const std::string& s) {
  DTL_CHECK(!s.empty(), "empty size");
  int64_t mult = 1;
  std::string digits = s;
  const char last = static_cast<char>(std::toupper(s.back()));
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? 1 << 10 : last == 'M' ? 1 << 20 : int64_t{1} << 30;
    digits = s.substr(0, s.size() - 1);
  }
  return std::stoll(digits) * mult;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 03: ring and recursive doubling all-reduce vs the built-in, nccl-tests style"};
  dtl::RuntimeOptions options = dtl::RuntimeOptions::from_env();
  options.add_to(app);
  std::string min_bytes = "1K", max_bytes = "64M", dtype_name = "float32", op_name = "sum";
  int iters = 0, warmup = 2;
  app.add_option("--min-bytes", min_bytes, "smallest message, e.g. 1K (default 1K)");
  app.add_option("--max-bytes", max_bytes, "largest message, e.g. 64M (default 64M); x4 steps");
  app.add_option("--dtype", dtype_name, "float32 | float64 | bfloat16 | int64")
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "int64"}));
  app.add_option("--op", op_name, "sum | max | min | avg")
      ->check(CLI::IsMember({"sum", "max", "min", "avg"}));
  app.add_option("--iters", iters,
                 "timed iterations per size (default: 20 up to 1 MiB, fewer above)");
  app.add_option("--warmup", warmup, "untimed iterations per size");
  std::string json_path;
  app.add_option("--json", json_path, "also write the measured times to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(options, argc, argv);
    auto comm = rt.world().dup();  // the demo's own Comm
    const int n = comm->size();
    const std::map<std::string, torch::ScalarType> dtypes = {{"float32", torch::kFloat32},
                                                             {"float64", torch::kFloat64},
                                                             {"bfloat16", torch::kBFloat16},
                                                             {"int64", torch::kInt64}};
    const std::map<std::string, ReduceOp> ops = {{"sum", ReduceOp::Sum},
                                                 {"max", ReduceOp::Max},
                                                 {"min", ReduceOp::Min},
                                                 {"avg", ReduceOp::Avg}};
    const torch::ScalarType dtype = dtypes.at(dtype_name);
    const ReduceOp op = ops.at(op_name);
    const int64_t elem = torch::elementSize(dtype);
    const double factor = dtl::bus_factor(dtl::OpType::AllReduce, n);

    std::vector<Algo> algos;
    algos.emplace_back("ring (lab 03)", "ring", dtl::lab03::ring_all_reduce);
    algos.emplace_back("recursive doubling (lab 03)", "recursive doubling",
                       dtl::lab03::recursive_doubling_all_reduce);
    algos.emplace_back(
        "built-in Comm::all_reduce", "built-in",
        [](dtl::Comm& c, const torch::Tensor& t, ReduceOp o) { c.all_reduce(t, o); });

    // ---- header, nccl-tests style
    dtl::print0("# lab 03 all-reduce: {} ranks, {} backend, {} {}, in place, intra-op threads {}",
                n, comm->backend(), dtype_name, op_name, rt.intra_op_threads());
    dtl::print0(
        "# time: median over iterations of the slowest rank; busbw = algbw x 2(n-1)/n = "
        "algbw x {:.3f}; #wrong: elements differing from Comm::all_reduce, all ranks",
        factor);
    dtl::print0("#");
    std::string groups = fmt::format("# {:>10} {:>10} {:>8} {:>5} ", "", "", "", "");
    std::string names =
        fmt::format("# {:>10} {:>10} {:>8} {:>5} ", "size", "count", "type", "redop");
    std::string units = fmt::format("# {:>10} {:>10} {:>8} {:>5} ", "(B)", "(elements)", "", "");
    for (const auto& a : algos) {
      groups += fmt::format(" {:^33}", a.title);
      names += fmt::format(" {:>9} {:>7} {:>7} {:>7}", "time", "algbw", "busbw", "#wrong");
      units += fmt::format(" {:>9} {:>7} {:>7} {:>7}", "(us)", "(GB/s)", "(GB/s)", "");
    }
    dtl::print0("{}", groups);
    dtl::print0("{}", names);
    dtl::print0("{}", units);

    const int64_t lo = parse_bytes(min_bytes), hi = parse_bytes(max_bytes);
    DTL_CHECK(
        lo >= elem && lo <= hi,
        fmt::format("--min-bytes {} must be at least one element and <= --max-bytes {}", lo, hi));
    int sizes = 0;
    for (int64_t bytes = lo; bytes <= hi; bytes *= 4, ++sizes) {
      const int64_t count = bytes / elem;
      const int timed = iters > 0 ? iters : bytes <= (1 << 20) ? 20 : bytes <= (16 << 20) ? 10 : 5;
      const torch::Tensor input = random_input(count, dtype);  // differs per rank (seed + rank)
      torch::Tensor expected = input.clone();
      comm->all_reduce(expected, op);
      std::string row = fmt::format("  {:>10} {:>10} {:>8} {:>5} ", count * elem, count,
                                    dtype_name == "float32" ? "float" : dtype_name, op_name);
      for (auto& a : algos) {
        if (!a.implemented) {
          row += fmt::format(" {:>33}", "not implemented");
          continue;
        }
        try {
          // Correctness on random data, then timing on zeros (values stay finite while the same
          // tensor is reduced again and again).
          torch::Tensor got = input.clone();
          a.run(*comm, got, op);
          const auto wrong = static_cast<int64_t>(
              dtl::sum_over_ranks(static_cast<double>(count_wrong(got, expected, op))));
          torch::Tensor work = torch::zeros({count}, input.options());
          const auto m = dtl::measure([&] { a.run(*comm, work, op); }, warmup, timed);
          const double algbw = bytes / m.median / 1e9, busbw = algbw * factor;
          a.points.emplace_back(static_cast<double>(bytes), m.median);
          a.busbw_sum += busbw;
          a.wrong_total += wrong;
          row +=
              fmt::format(" {:>9.1f} {:>7.3f} {:>7.3f} {:>7}", m.median * 1e6, algbw, busbw, wrong);
        } catch (const dtl::NotImplemented&) {
          a.implemented = false;  // every rank throws alike: nobody is left waiting
          row += fmt::format(" {:>33}", "not implemented");
        }
      }
      dtl::print0("{}", row);
    }

    // ---- footer: average busbw and wrong elements, as nccl-tests prints them
    int64_t wrong = 0;
    std::string avg = "# Avg bus bandwidth (GB/s):";
    for (const auto& a : algos) {
      if (!a.implemented) continue;
      avg += fmt::format("  {} {:.3f}", a.short_name, a.busbw_sum / sizes);
      wrong += a.wrong_total;
    }
    dtl::print0("# Wrong elements: {} {}", wrong, wrong == 0 ? "OK" : "FAILED");
    dtl::print0("{}", avg);
    if (!json_path.empty() && comm->rank() == 0) {
      nlohmann::json doc = {{"ranks", n},
                            {"backend", comm->backend()},
                            {"dtype", dtype_name},
                            {"op", op_name},
                            {"bus_factor", factor},
                            {"wrong", wrong},
                            {"algorithms", nlohmann::json::array()}};
      for (const auto& a : algos) {
        nlohmann::json points = nlohmann::json::array();
        for (const auto& [bytes, seconds] : a.points) points.push_back({bytes, seconds});
        doc["algorithms"].push_back({{"name", a.short_name},
                                     {"title", a.title},
                                     {"points", points}});  // (bytes, seconds) per size
      }
      std::ofstream(json_path) << doc.dump(1) << "\n";
    }

    // ---- what the alpha-beta model makes of it. A two-point fit of your ring's times:
    // t = 2(n-1) alpha + 2(n-1)/n S / beta through the smallest and the largest size.
    const Algo& ring = algos[0];
    const bool fit = ring.implemented && n > 1 && ring.points.size() >= 2 &&
                     ring.points.back().second > ring.points.front().second;
    if (fit) {
      const auto [s1, t1] = ring.points.front();
      const auto [s2, t2] = ring.points.back();
      const double slope = (t2 - t1) / (s2 - s1), intercept = t1 - slope * s1;
      const double alpha = std::max(intercept, 0.0) / (2.0 * (n - 1));
      const double beta = 2.0 * (n - 1) / n / slope;
      dtl::print0(
          "# alpha-beta fit of the ring (smallest and largest size): alpha = {:.1f} us "
          "per step, beta = {:.2f} GB/s",
          alpha * 1e6, beta / 1e9);
      try {
        // Where does recursive doubling stop winning? Scan the model (your alpha_beta_time).
        using dtl::lab03::Algorithm;
        double crossover = -1;
        for (double S = 64; S <= 1e10; S *= 1.05) {
          const double ring_t =
              dtl::lab03::alpha_beta_time(Algorithm::RingAllReduce, n, S, alpha, beta);
          const double rd_t =
              dtl::lab03::alpha_beta_time(Algorithm::RecursiveDoublingAllReduce, n, S, alpha, beta);
          if (ring_t < rd_t) {
            crossover = S;
            break;
          }
        }
        if (crossover > 0)
          dtl::print0("# model: recursive doubling is faster below ~{}, the ring above",
                      format_bytes(crossover));
        else
          dtl::print0(
              "# model: on {} ranks recursive doubling is never slower (same bytes on the "
              "wire, fewer messages)",
              n);
      } catch (const dtl::NotImplemented&) {
        dtl::print0("# (implement alpha_beta_time, Task 1, to see the model's crossover size)");
      } catch (const dtl::Error& e) {
        dtl::print0("# alpha_beta_time failed: {}", e.what());
      }
    }
  } catch (const dtl::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
