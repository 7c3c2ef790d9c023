// Performance timed by the grader (perf.hpp).
#include "perf.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace dtl::grade {

namespace {

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !(x > 0); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// max / min of the valid values (1 when fewer than two).
double spread(const std::vector<double>& v) {
  double lo = INFINITY, hi = 0;
  int n = 0;
  for (double x : v)
    if (x > 0) lo = std::min(lo, x), hi = std::max(hi, x), ++n;
  return n < 2 ? 1.0 : hi / lo;
}

}  // namespace

PerfRunner::Sample PerfRunner::once(const PerfCheck& c, const std::string& exe, int repetitions,
                                    bool untrusted, std::string& log) {
  Sample s;
  const std::string dir = untrusted ? jobs_.job_dir() : jobs_.reports();
  const std::string out =
      fmt::format("{}/bench-{}-{}.json", dir, fs::path(exe).filename().string(), repetitions);
  std::vector<std::string> cmd = jobs_.mpirun(c.ranks);
  if (untrusted)
    for (auto& a : jobs_.sandbox_prefix(dir, false)) cmd.push_back(a);
  for (std::string a : {exe, "--benchmark_filter=^" + c.benchmark, "--benchmark_out=" + out,
                        std::string("--benchmark_out_format=json"),
                        fmt::format("--benchmark_repetitions={}", repetitions)})
    cmd.push_back(a);
  auto env = jobs_.mpi_env();
  if (untrusted)
    for (const char* var : {"TMPDIR=", "HOME=", "OMPI_MCA_btl_vader_backing_directory="})
      env.push_back(var + dir);
  const RunResult res = untrusted ? run_command(cmd, opt_.timeout, env, dir,
                                                jobs_.student_limits(dir), jobs_.student_launch())
                                  : run_command(cmd, opt_.timeout, env, dir);
  std::ifstream in(out);
  json j = json::parse(in, nullptr, false);
  std::error_code ec;
  fs::remove(out, ec);
  if (untrusted) fs::remove_all(dir, ec);
  const std::string name = fs::path(exe).filename().string();
  if (res.timed_out || res.exit_code != 0 || j.is_discarded()) {
    log += fmt::format(
        "{}: {}\n", name,
        res.timed_out ? "timed out" : "failed (exit " + std::to_string(res.exit_code) + ")");
    log += tail(res.output, 15);
    return s;
  }
  for (auto& b : j.value("benchmarks", json::array())) {
    if (b.value("name", "").rfind(c.benchmark, 0) != 0 ||
        b.value("run_type", "iteration") != "iteration")
      continue;
    if (b.value("error_occurred", false)) {
      log +=
          fmt::format("{}: {}: {}\n", name, b.value("name", ""), b.value("error_message", "error"));
      return s;
    }
    if (std::isnan(s.figure))
      s.figure = c.counter == "real_time" ? b.value("real_time", NAN) : b.value(c.counter, NAN);
  }
  if (std::isnan(s.figure)) {
    log += fmt::format("{}: no benchmark '{}' with counter '{}'\n", name, c.benchmark, c.counter);
    return s;
  }
  s.seconds = res.seconds;
  return s;
}

PerfResult PerfRunner::run(const PerfCheck& c, const std::string& mine, const std::string& ref,
                           bool untrusted) {
  PerfResult p;
  p.check = &c;
  if (!fs::exists(mine) || !fs::exists(ref)) {
    p.reason = "benchmark binary missing";
    return p;
  }
  const int lo = std::max(1, c.repetitions_low), hi = std::max(lo + 1, c.repetitions_high);
  // Seconds per extra repetition of one side, from a (low, high) pair of runs; NaN if either
  // failed or noise made the difference meaningless.
  std::vector<double> a, b, fig_a, fig_b;
  auto measure = [&](const std::string& exe, bool mine_side) {
    const Sample s_lo = once(c, exe, lo, mine_side && untrusted, p.output);
    const Sample s_hi = once(c, exe, hi, mine_side && untrusted, p.output);
    const double per =
        s_lo.seconds > 0 && s_hi.seconds > 0 ? (s_hi.seconds - s_lo.seconds) / (hi - lo) : NAN;
    (mine_side ? a : b).push_back(per > 0 ? per : NAN);
    (mine_side ? fig_a : fig_b).push_back(s_hi.figure);
    return s_lo.seconds > 0 && s_hi.seconds > 0;
  };
  auto ratio_now = [&] {
    const double s = median(a), r = median(b);
    return s > 0 && r > 0 ? r / s : NAN;  // time per repetition: the reference's over yours
  };
  const int max_rounds = std::max(opt_.perf_rounds, opt_.perf_max_rounds);
  bool failed = false;
  for (int i = 0; i < max_rounds && !failed; ++i) {
    if (i >= opt_.perf_rounds) {
      const double q = ratio_now();
      const bool noisy = spread(b) > 1.5;
      // Settled: clearly above the bar, or clearly under it on a quiet machine.
      if (std::isnan(q) || q >= c.min_ratio || (q < 0.5 * c.min_ratio && !noisy)) break;
    }
    const bool mine_first = i % 2 == 0;
    failed = !measure(mine_first ? mine : ref, mine_first) ||
             !measure(mine_first ? ref : mine, !mine_first);
  }
  p.student = median(fig_a);
  p.reference = median(fig_b);
  if (failed || a.empty()) {
    p.reason = "benchmark failed: " + first_line(p.output);
    return p;
  }
  p.ratio = ratio_now();
  const double noise = spread(b);
  p.output += fmt::format(
      "timed by the grader: {:.3f} s per repetition yours, {:.3f} s the reference's (median of {} "
      "interleaved rounds, {} vs {} repetitions; the reference's rounds spread {:.2f}x): {:.2f} x "
      "the reference's speed, needs {:.2f}\nthe benchmark's own {} (measured in-process, not "
      "scored): yours {:.4g}, reference {:.4g}\n",
      median(a), median(b), a.size(), hi, lo, noise, p.ratio, c.min_ratio, c.counter, p.student,
      p.reference);
  if (std::isnan(p.ratio)) {
    p.unstable = true;
  } else if (p.ratio >= c.min_ratio) {
    p.score = c.points;
    return p;
  } else if (noise > 1.5) {
    p.unstable = true;
  }
  if (p.unstable) {
    p.score = c.points;
    p.reason = fmt::format(
        "{}: unstable (the machine was too busy to time it: the reference's own "
        "rounds varied {:.1f}x); points given, an instructor may re-grade",
        c.name, noise);
    return p;
  }
  p.reason = fmt::format("{}: {:.2f} x the reference, needs {:.2f}", c.name, p.ratio, c.min_ratio);
  return p;
}

}  // namespace dtl::grade
