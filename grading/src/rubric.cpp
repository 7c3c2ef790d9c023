// Reading and validating rubric.json files.
#include "rubric.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace dtl::grade {

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
      throw std::runtime_error(fmt::format("{}: test group '{}': binary must be test or grade",
                                           file.string(), g.name));
    g.filter = t.value("filter", "*");
    g.world_sizes = need(t, "world_sizes").get<std::vector<int>>();
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
  for (auto& p : j.value("performance", json::array())) {
    PerfCheck c;
    c.name = need(p, "name").get<std::string>();
    c.ranks = p.value("ranks", 2);
    c.benchmark = need(p, "benchmark").get<std::string>();
    c.counter = p.value("counter", "real_time");
    c.higher_is_better = p.value("higher_is_better", c.counter != "real_time");
    c.min_ratio = p.value("min_ratio", 0.8);
    c.points = need(p, "points").get<double>();
    r.performance.push_back(c);
  }
  return r;
}

std::vector<Rubric> load_rubrics(const std::string& source_dir, const std::vector<std::string>& only) {
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

}  // namespace dtl::grade
