// Performance timed by the grader (perf.hpp).
#include "perf.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtl/harness/untrusted_file.hpp"

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

}  // namespace

PerfRunner::Sample PerfRunner::once(const PerfCheck& c, const std::string& exe, int repetitions,
                                    bool untrusted, bool as_student, std::string& log) {
  Sample s;
  const std::string dir = untrusted ? jobs_.job_dir() : jobs_.reports();
  const std::string out =
      fmt::format("{}/bench-{}-{}.json", dir, fs::path(exe).filename().string(), repetitions);
  std::vector<std::string> cmd;
  if (untrusted) cmd = jobs_.launcher_prefix(dir, exe);
  for (auto& a : jobs_.mpirun(c.ranks, untrusted)) cmd.push_back(a);
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
  // Both sides of a sandboxed grading run in the same sandbox (launchers, namespaces, limits), so
  // its start-up costs the same on both: the reference as the grader's user (the student's
  // user may not execute it), the student's code as the student's.
  Launch launch = jobs_.student_launch();
  if (!as_student) launch.as = Identity{};
  const RunResult res = untrusted ? run_command(cmd, opt_.timeout, env, dir,
                                                jobs_.student_limits(dir), launch)
                                  : run_command(cmd, opt_.timeout, env, dir);
  std::string text, why;  // written by the benchmark: no link, a regular file, at most 16 MiB
  json j = read_untrusted_file(out, size_t{16} << 20, text, why) ? json::parse(text, nullptr, false)
                                                                  : json(json::value_t::discarded);
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
  // The reference (the course's code, honest) runs at both counts: the difference is its time per
  // repetition, and what is left at the low count is the start-up both binaries share (MPI,
  // LibTorch, the harness). The student's binary runs at the high count only, with the very same
  // arguments every time: nothing it can read tells one timed run from another, so it cannot make
  // one run slower to shrink a difference. Its time per repetition is its run's time less that
  // start-up.
  //
  // Each side's time is its fastest run, not a median: interference only ever adds time, and it
  // comes in spells. On a 2-core virtual machine, quiet, a run of lab 03's 16 repetitions took
  // 2.3 s or 4.1 s by chance (the ranks copy through shared memory, which a descheduled core
  // stalls), for the reference as for the student, a spell lasting several runs; medians then let
  // whichever side had the slow spell lose: an honest copy of the reference read 0.53x. A run can
  // be slowed but never sped up, so the fastest is the code's own time, and a submission that is
  // slow is slow in every run.
  std::vector<double> ref_lo, ref_hi, mine_total, fig_a, fig_b;
  auto reference_round = [&] {
    const Sample s_lo = once(c, ref, lo, untrusted, false, p.output);
    const Sample s_hi = once(c, ref, hi, untrusted, false, p.output);
    if (!(s_lo.seconds > 0 && s_hi.seconds > 0)) return false;
    ref_lo.push_back(s_lo.seconds);
    ref_hi.push_back(s_hi.seconds);
    fig_b.push_back(s_hi.figure);
    return true;
  };
  auto student_round = [&] {
    const Sample s = once(c, mine, hi, untrusted, true, p.output);
    if (!(s.seconds > 0)) return false;
    mine_total.push_back(s.seconds);
    fig_a.push_back(s.figure);
    return true;
  };
  auto fastest = [](const std::vector<double>& v) -> double {
    return v.empty() ? NAN : *std::min_element(v.begin(), v.end());  // NAN: no round yet
  };
  auto ref_per = [&] { return (fastest(ref_hi) - fastest(ref_lo)) / (hi - lo); };
  auto startup = [&] { return std::max(0.0, fastest(ref_lo) - lo * ref_per()); };
  auto mine_per = [&] { return (fastest(mine_total) - startup()) / hi; };
  // Time per repetition, the reference's over yours, from each side's fastest runs.
  auto fastest_ratio = [&]() -> double {
    const double s = mine_per(), r = ref_per();
    return s > 0 && r > 0 ? r / s : NAN;
  };
  // The same round by round (median over rounds): a round's runs follow one another, so a slow
  // spell that covers the whole round slows both sides alike. It rescues an honest submission
  // whose fastest run still fell in a spell (the fastest-run ratio read 0.76x in one grading);
  // fastest runs rescue the rounds a spell split. Neither can exceed your code's real speed by
  // anything you do: a run can be made slower, not faster.
  auto paired_ratio = [&] {
    std::vector<double> r;
    const double s0 = startup();
    for (size_t k = 0; k < std::min(ref_hi.size(), mine_total.size()); ++k) {
      const double ref_k = (ref_hi[k] - ref_lo[k]) / (hi - lo), mine_k = (mine_total[k] - s0) / hi;
      if (ref_k > 0 && mine_k > 0) r.push_back(ref_k / mine_k);
    }
    return median(r);
  };
  auto ratio_now = [&]() -> double {
    const double f = fastest_ratio(), q = paired_ratio();
    if (std::isnan(f)) return NAN;  // your fastest run no longer than the start-up alone
    return std::isnan(q) ? f : std::max(f, q);
  };
  // Whether a side's fastest time was seen twice: its two fastest runs at the high count, less
  // the start-up, differ by this factor (1 with a single run). Over 1.5, its fastest could be a
  // fluke of the clock, or its other runs all fell in a slow spell.
  auto disagreement = [&](std::vector<double> totals) {
    if (totals.size() < 2) return 1.0;
    std::sort(totals.begin(), totals.end());
    const double a = totals[0] - startup(), b = totals[1] - startup();
    return a > 0 ? b / a : INFINITY;
  };
  const int max_rounds = std::max(opt_.perf_rounds, opt_.perf_max_rounds);
  bool failed = false;
  for (int i = 0; i < max_rounds && !failed; ++i) {
    if (i >= opt_.perf_rounds) {
      const double q = ratio_now();
      // Settled: the reference's fastest time was seen twice, and then over the bar (points are
      // never given on one reference round: a busy moment during the only round of the
      // reference once made a 3x slower submission read 2.1x faster), or clearly under it (by
      // more than a third) with the student's fastest seen twice as well (an honest submission
      // whose runs fell in a slow spell gets more rounds; a slow one gains nothing from them).
      // A close call under the bar takes every round there is. Otherwise (a busy machine)
      // another interleaved round.
      const bool ref_settled = disagreement(ref_hi) <= 1.5;
      const bool clearly_under = q < c.min_ratio / 1.5 && disagreement(mine_total) <= 1.5;
      if (!std::isnan(q) && ref_settled &&
          (q >= c.min_ratio ? ref_hi.size() >= 2 : clearly_under))
        break;
    }
    const bool mine_first = i % 2 == 0;  // the order flips every round
    failed = mine_first ? !(student_round() && reference_round())
                        : !(reference_round() && student_round());
  }
  p.student = median(fig_a);
  p.reference = median(fig_b);
  if (failed || mine_total.empty() || ref_hi.empty()) {
    p.reason = "benchmark failed: " + first_line(p.output);
    return p;
  }
  const double noise = disagreement(ref_hi);
  if (!(ref_per() > 0) || noise > 1.5) {
    // The machine was too busy to time even the reference: nothing is decided, either way.
    p.unmeasured = true;
    p.output += fmt::format(
        "not measured: the reference's two fastest runs differed {:.1f}x over {} rounds (the "
        "grading machine was busy); this check neither gives nor takes points (its maximum is 0 "
        "in this result), and an instructor may re-grade\n",
        noise, ref_hi.size());
    p.reason = fmt::format("{}: not measured (the machine was too busy to time it)", c.name);
    return p;
  }
  p.ratio = ratio_now();
  p.output += fmt::format(
      "timed by the grader: {:.3f} s per repetition yours (the fastest of {} runs of {} "
      "repetitions, less the {:.2f} s of start-up the reference's runs show), {:.3f} s the "
      "reference's (its fastest runs of {} and {} repetitions; {}): {:.2f} x the reference's "
      "speed; round by round (median of {}): {:.2f} x; the better counts: {:.2f} x, needs "
      "{:.2f}\nthe benchmark's own {} (measured in-process, not scored, medians): yours {:.4g}, "
      "reference {:.4g}\n",
      mine_per(), mine_total.size(), hi, startup(), ref_per(), hi, lo,
      ref_hi.size() < 2 ? std::string("one round")
                        : fmt::format("its two fastest agree within {:.2f}x", noise),
      fastest_ratio(), mine_total.size(), paired_ratio(), p.ratio, c.min_ratio, c.counter,
      p.student, p.reference);
  if (std::isnan(p.ratio)) {
    // Your run took no longer than the start-up alone: not a time any honest run shows.
    p.reason = fmt::format(
        "{}: your benchmark's fastest run took {:.3f} s, no longer than the {:.3f} s the runtime "
        "needs to start: not a valid time (0 points)",
        c.name, fastest(mine_total), startup());
    return p;
  }
  if (p.ratio >= c.min_ratio) {
    p.score = c.points;
    return p;
  }
  p.reason = fmt::format("{}: {:.2f} x the reference, needs {:.2f}", c.name, p.ratio, c.min_ratio);
  return p;
}

}  // namespace dtl::grade
