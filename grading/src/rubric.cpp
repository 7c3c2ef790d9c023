// Reading and validating rubric.json files.
#include "rubric.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace dtl::grade {

double TestGroup::points_at(int n) const {
  double sum = 0, mine = 0;
  for (size_t k = 0; k < world_sizes.size(); ++k) {
    sum += weights[k];
    if (world_sizes[k] == n) mine = weights[k];
  }
  return sum > 0 ? points * mine / sum : 0.0;
}

namespace fs = std::filesystem;
using nlohmann::json;

double Rubric::max_points() const {
  double p = 0;
  for (auto& g : tests) p += g.points;
  for (auto& c : performance) p += c.points;
  return p;
}

static Rubric parse(const fs::path& file) {
  std::ifstream in(file);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) throw std::runtime_error(fmt::format("{}: not valid JSON", file.string()));
  auto need = [&](const json& obj, const char* key) -> const json& {
    if (!obj.contains(key))
      throw std::runtime_error(fmt::format("{}: missing field '{}'", file.string(), key));
    return obj.at(key);
  };
  Rubric r;
  r.slug = file.parent_path().filename().string();
  r.lab = need(j, "lab").get<std::string>();
  r.title = j.value("title", r.slug);
  r.student_files = need(j, "student_files").get<std::vector<std::string>>();
  for (auto& t : need(j, "tests")) {
    TestGroup g;
    g.name = need(t, "name").get<std::string>();
    g.binary = need(t, "binary").get<std::string>();
    if (g.binary != "test" && g.binary != "grade")
      throw std::runtime_error(
          fmt::format("{}: test group '{}': binary must be test or grade", file.string(), g.name));
    g.filter = t.value("filter", "*");
    g.world_sizes = need(t, "world_sizes").get<std::vector<int>>();
    g.weights = t.value("weights", std::vector<double>(g.world_sizes.size(), 1.0));
    double weight_sum = 0;
    for (double w : g.weights) weight_sum += w >= 0 ? w : -1e9;
    if (g.weights.size() != g.world_sizes.size() || !(weight_sum > 0))
      throw std::runtime_error(fmt::format(
          "{}: test group '{}': \"weights\" needs one non-negative number per world size "
          "({} sizes, {} weights), not all zero",
          file.string(), g.name, g.world_sizes.size(), g.weights.size()));
    g.points = need(t, "points").get<double>();
    g.visibility = t.value("visibility", "visible");
    g.timeout = t.value("timeout", 0);
    r.tests.push_back(g);
  }
  if (j.contains("audit")) {
    r.audit_allow = j["audit"].value("allow", std::vector<std::string>{});
    r.audit_deny = j["audit"].value("deny", std::vector<std::string>{});
  }
  r.autograder_only_points = j.value("autograder_only_points", 0.0);
  if (j.contains("sandbox")) r.sandbox_processes = j["sandbox"].value("processes", false);
  r.observed = j.value("observed", false);
  for (auto& p : j.value("performance", json::array())) {
    PerfCheck c;
    c.name = need(p, "name").get<std::string>();
    c.ranks = p.value("ranks", 2);
    c.benchmark = need(p, "benchmark").get<std::string>();
    c.counter = p.value("counter", "real_time");
    c.higher_is_better = p.value("higher_is_better", c.counter != "real_time");
    c.min_ratio = p.value("min_ratio", 0.8);
    if (p.contains("repetitions")) {
      const auto reps = p["repetitions"].get<std::vector<int>>();
      if (reps.size() != 2 || reps[0] < 1 || reps[1] <= reps[0])
        throw std::runtime_error(
            fmt::format("{}: performance '{}': repetitions must be [low, high], "
                        "1 <= low < high",
                        file.string(), c.name));
      c.repetitions_low = reps[0];
      c.repetitions_high = reps[1];
    }
    c.points = need(p, "points").get<double>();
    r.performance.push_back(c);
  }
  return r;
}

std::vector<Rubric> load_rubrics(const std::string& source_dir,
                                 const std::vector<std::string>& only) {
  std::vector<Rubric> out;
  fs::path root = fs::path(source_dir) / "grading";
  if (!fs::exists(root)) return out;
  for (auto& entry : fs::directory_iterator(root)) {
    fs::path file = entry.path() / "rubric.json";
    if (!entry.is_directory() || !fs::exists(file)) continue;
    Rubric r = parse(file);
    if (!only.empty() && std::find(only.begin(), only.end(), r.lab) == only.end()) continue;
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const Rubric& a, const Rubric& b) { return a.lab < b.lab; });
  return out;
}

// gtest's --gtest_filter: "POS1:POS2-NEG1:NEG2", each a glob with * and ?.
static bool glob_match(const char* p, const char* s) {
  if (*p == '\0') return *s == '\0';
  if (*p == '*') return glob_match(p + 1, s) || (*s != '\0' && glob_match(p, s + 1));
  return *s != '\0' && (*p == '?' || *p == *s) && glob_match(p + 1, s + 1);
}

bool filter_matches(const std::string& filter, const std::string& name) {
  const auto dash = filter.find('-');
  auto any = [&](const std::string& list) {
    std::istringstream in(list);
    for (std::string pat; std::getline(in, pat, ':');)
      if (!pat.empty() && glob_match(pat.c_str(), name.c_str())) return true;
    return false;
  };
  const std::string pos = filter.substr(0, dash);
  return (pos.empty() ? true : any(pos)) &&
         (dash == std::string::npos || !any(filter.substr(dash + 1)));
}

}  // namespace dtl::grade
