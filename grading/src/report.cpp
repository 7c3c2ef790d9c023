// The report stage (report.hpp).
#include "report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

using nlohmann::json;

namespace dtl::grade {

namespace {

std::string status_of(double score, double max) {
  return score >= max - 1e-9 ? "passed" : "failed";
}

bool visible(const GroupRun& run) { return run.group->visibility == "visible"; }

// A lab's reason as students may see it before the due date.
std::string visible_reason(const LabResult& lab) {
  if (lab.not_started) return lab.reason;
  // The lab's reason when it is this visible run's, with what the grader adds about the lab as a
  // whole ("grading stopped at the smallest world size"); otherwise the run's own.
  for (const auto& run : lab.runs)
    if (!run.reason.empty() && visible(run))
      return lab.reason.rfind(run.reason, 0) == 0 ? lab.reason : run.reason;
  for (const auto& run : lab.runs)
    if (!run.reason.empty()) return "a hidden test fails (its results appear after the due date)";
  return lab.reason;
}

}  // namespace

std::string table(const std::vector<LabResult>& labs, const Options& opt,
                  const std::string& isolation, bool for_students) {
  std::string out = fmt::format("{:<5} {:<44} {:>9} {:>13} {:>11} {:>13}  {}\n", "lab", "title",
                                "tests", "correctness", "perf", "total", "reason");
  double got = 0, max = 0;
  for (auto& lab : labs) {
    const Rubric& r = *lab.rubric;
    std::string title = r.title.size() > 44 ? r.title.substr(0, 41) + "..." : r.title;
    double t = lab.correctness + lab.performance, m = lab.correctness_max + lab.performance_max;
    got += t;
    max += m;
    const std::string reason = for_students ? visible_reason(lab) : lab.reason;
    out += fmt::format(
        "{:<5} {:<44} {:>9} {:>13} {:>11} {:>13}  {}\n", r.lab, title,
        lab.not_started ? "-" : fmt::format("{}/{}", lab.pairs_passed, lab.pairs_total),
        fmt::format("{:.1f}/{:g}", lab.correctness, lab.correctness_max),
        fmt::format("{:.0f}/{:g}", lab.performance, lab.performance_max),
        fmt::format("{:.1f}/{:g}", t, m), reason.empty() ? "ok" : first_line(reason, 160));
    for (auto& p : lab.perf)
      if (p.unmeasured)
        out += fmt::format("      performance {}: not measured (the machine was too busy): no "
                           "points given or taken\n", p.check->name);
      else if (!std::isnan(p.ratio))
        out += fmt::format("      performance {}: {:.2f} x the reference (needs {:.2f})\n",
                           p.check->name, p.ratio, p.check->min_ratio);
    // How the verdict was reached and how student code was isolated are for the instructor:
    // on Gradescope they go to a hidden entry (to_gradescope).
    if (!for_students && !lab.verdict.empty() && !lab.not_started)
      out += fmt::format("      verdict: {}\n", lab.verdict);
    if (!for_students && !lab.integrity.empty()) {
      out += "      integrity report (for the instructor; no points lost):\n";
      for (auto& note : lab.integrity) out += "        " + note + "\n";
    }
  }
  out += fmt::format("{:<5} {:<44} {:>9} {:>13} {:>11} {:>13}\n", "", "total", "", "", "",
                     fmt::format("{:.1f}/{:g}", got, max));
  if (!for_students) out += isolation + "\n";
  const auto untouched =
      std::count_if(labs.begin(), labs.end(), [](const LabResult& l) { return l.not_started; });
  if (untouched > 0)
    out += fmt::format(
        "not started: {} lab(s) whose files are the untouched skeleton (nothing was built "
        "or run). Start with a lab's handout, labs/NN_slug/README.md; `./lab test NN` "
        "runs its public tests; `./lab grade --all` grades untouched labs too.\n",
        untouched);
  for (auto& lab : labs)
    if (lab.rubric->autograder_only_points > 0)
      out += fmt::format(
          "lab {}: these are the public tests only; the hidden tests and performance "
          "checks ({:.0f} of 100 points) are graded by the course's autograder\n",
          lab.rubric->lab, lab.rubric->autograder_only_points);
  for (auto& n : opt.notes) out += n + "\n";
  return out;
}

json to_gradescope(const std::vector<LabResult>& labs, double seconds, const std::string& output,
                   const std::string& isolation) {
  json tests = json::array();
  json leaderboard = json::array();
  double total = 0;
  for (auto& lab : labs) {
    const Rubric& r = *lab.rubric;
    int k = 0;
    for (auto& run : lab.runs) {
      json t = {{"name", fmt::format("lab {} | {} (n={})", r.lab, run.group->name, run.world)},
                {"number", fmt::format("{}.{}", r.lab, ++k)},
                // Unrounded, like max_score: a group's points split over world sizes are not
                // round (10 / 3), and full marks must add up to exactly the maximum.
                {"score", run.score},
                {"max_score", run.max_score},
                {"status", status_of(run.score, run.max_score)},
                {"visibility", run.group->visibility},
                {"output",
                 plain(run.reason.empty() ? fmt::format("{}/{} tests pass", run.passed, run.total)
                                          : run.reason + "\n\n" + run.output)}};
      tests.push_back(t);
    }
    int q = 0;
    for (auto& p : lab.perf) {
      tests.push_back(
          {{"name", fmt::format("lab {} | performance: {}", r.lab, p.check->name)},
           {"number", fmt::format("{}.p{}", r.lab, ++q)},
           {"score", p.score},
           {"max_score", p.unmeasured ? 0.0 : p.check->points},
           {"status", p.unmeasured ? std::string("passed") : status_of(p.score, p.check->points)},
           {"visibility", "visible"},
           {"output", plain((p.reason.empty() ? std::string("meets the target") : p.reason) + "\n" +
                            p.output)}});
      if (!std::isnan(p.ratio))
        leaderboard.push_back(
            {{"name", fmt::format("lab {} {} (x reference)", r.lab, p.check->name)},
             {"value", std::round(p.ratio * 100) / 100},
             {"order", "desc"}});
    }
    if (!lab.integrity.empty()) {
      std::string text =
          "What the code audit noticed but the sandbox or the driver made harmless "
          "(no points were taken; for the instructor to judge):\n";
      for (auto& note : lab.integrity) text += "  " + note + "\n";
      tests.push_back({{"name", fmt::format("lab {} | integrity report (instructors only)", r.lab)},
                       {"number", fmt::format("{}.i", r.lab)},
                       {"score", 0},
                       {"max_score", 0},
                       {"visibility", "hidden"},
                       {"output", text}});
    }
    total += lab.correctness + lab.performance;
  }
  // The sandbox and each lab's verdict (driver or in-process), for the instructor only.
  std::string notes = isolation.empty() ? "" : isolation + "\n";
  for (auto& lab : labs)
    if (!lab.verdict.empty() && !lab.not_started)
      notes += fmt::format("lab {} verdict: {}\n", lab.rubric->lab, lab.verdict);
  if (!notes.empty())
    tests.push_back({{"name", "grading notes (instructors only)"},
                     {"number", "0.n"},
                     {"score", 0},
                     {"max_score", 0},
                     {"visibility", "hidden"},
                     {"output", notes}});
  return {{"score", std::round(total * 100) / 100},
          {"execution_time", static_cast<int>(seconds)},
          {"output", plain(output)},
          {"visibility", "visible"},
          {"stdout_visibility", "hidden"},
          {"tests", tests},
          {"leaderboard", leaderboard}};
}

// What of a results.json's non-visible tests (their group names, the gtest names and the files of
// their failures) appears in what students see at once: the top-level output and the visible
// tests. Each leak as "NAME (in WHERE)".
std::vector<std::string> hidden_leaks(const json& doc) {
  static const std::regex failed_test(R"(FAILED (\S+) \(n=)");
  static const std::regex course_path(R"(grading/\d\d_\w+/[^\s:]*)");
  std::set<std::string> secrets;
  std::vector<std::pair<std::string, std::string>> seen = {
      {"the top-level output", doc.value("output", "")}};
  for (auto& t : doc.value("tests", json::array())) {
    const std::string name = t.value("name", ""), out = t.value("output", "");
    if (t.value("visibility", "visible") == "visible") {
      seen.emplace_back("test '" + name + "'", name + "\n" + out);
      continue;
    }
    const auto bar = name.find("| "), paren = name.rfind(" (n=");
    if (bar != std::string::npos) secrets.insert(name.substr(bar + 2, paren - bar - 2));
    for (auto& re : {failed_test, course_path})
      for (std::sregex_iterator m(out.begin(), out.end(), re), end; m != end; ++m)
        secrets.insert((*m)[m->size() > 1 ? 1 : 0].str());
  }
  for (auto& l : doc.value("leaderboard", json::array()))
    seen.emplace_back("the leaderboard", l.value("name", ""));
  std::vector<std::string> leaks;
  for (auto& secret : secrets)
    for (auto& [where, text] : seen)
      if (!secret.empty() && text.find(secret) != std::string::npos)
        leaks.push_back(secret + " (in " + where + ")");
  return leaks;
}

// The grader's self-test reads back a results.json: totals by kind, and text searches.
int check_results(const std::string& file, const std::vector<std::string>& conditions) {
  std::ifstream in(file);
  json doc = json::parse(in, nullptr, false);
  if (doc.is_discarded()) {
    std::cerr << file << ": missing or not JSON\n";
    return 1;
  }
  std::map<std::string, double> v = {{"score", doc.value("score", 0.0)}};
  for (auto& t : doc["tests"]) {
    const bool perf = t.value("number", "").find(".p") != std::string::npos;
    v[perf ? "performance" : "correctness"] += t.value("score", 0.0);
    v[perf ? "performance_max" : "correctness_max"] += t.value("max_score", 0.0);
    v["max"] += t.value("max_score", 0.0);
  }
  const std::string output = doc.value("output", ""), all = doc.dump();
  int bad = 0;
  for (auto& c : conditions) {
    bool ok = false;
    auto q = c.find(" contains '"), l = c.find(" lacks '");
    if (c == "hidden stays hidden") {
      const auto leaks = hidden_leaks(doc);
      for (auto& leak : leaks) std::cerr << "visible before the due date: " << leak << "\n";
      ok = leaks.empty();
    } else if (q != std::string::npos) {
      std::string what = c.substr(0, q), text = c.substr(q + 11, c.size() - q - 12);
      ok = (what == "reason" ? output : all).find(text) != std::string::npos;
    } else if (l != std::string::npos) {
      // JSON escapes control characters: "\u001b[" finds a raw escape code too.
      std::string what = c.substr(0, l), text = c.substr(l + 8, c.size() - l - 9);
      ok = (what == "reason" ? output : all).find(text) == std::string::npos;
    } else {
      std::istringstream ss(c);
      std::string lhs, op, rhs;
      ss >> lhs >> op >> rhs;
      double a = v[lhs], b = v.count(rhs) ? v[rhs] : std::atof(rhs.c_str());
      // results.json's total is rounded to hundredths, its tests' scores are not (a group's
      // points split over weighted world sizes are not round): compare to that precision.
      const double eps = 0.005;
      ok = op == "=="   ? std::fabs(a - b) <= eps
           : op == ">"  ? a > b + eps
           : op == "<"  ? a < b - eps
           : op == ">=" ? a >= b - eps
                        : false;
      if (!ok) std::cerr << fmt::format("{} = {:g}, {} = {:g}\n", lhs, a, rhs, b);
    }
    std::cerr << (ok ? "ok: " : "FAILED: ") << c << "\n";
    bad += !ok;
  }
  if (bad) std::cerr << output;
  return bad ? 1 : 0;
}

// A student release's rubric: the public groups (binary "test") only; the points of the rest
// are recorded so `./lab grade` can say what the course's autograder adds.
int print_public_rubric(const std::string& file) {
  std::ifstream in(file);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << file << ": not valid JSON\n";
    return 2;
  }
  double hidden = 0;
  json tests = json::array();
  for (auto& t : j.value("tests", json::array())) {
    if (t.value("binary", "") == "test")
      tests.push_back(t);
    else
      hidden += t.value("points", 0.0);
  }
  for (auto& p : j.value("performance", json::array())) hidden += p.value("points", 0.0);
  j["tests"] = tests;
  j.erase("performance");
  j["autograder_only_points"] = hidden;
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace dtl::grade
