// gradebook.cpp — implements gradebook.hpp.
#include "gradebook.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtl/harness/untrusted_file.hpp"
#include "results.hpp"  // first_line

namespace dtl::grade {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Row {
  std::string student, lab, status, reason;
  std::string group;  // the rubric group of the first test that lost points (the summary counts them)
  double score = 0, max = 0;
  bool graded = false;
};

// "key=value" lines; later keys win.
std::map<std::string, std::string> read_state(const fs::path& file) {
  std::map<std::string, std::string> kv;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

// RFC 4180: quote every field that needs it, double the quotes inside.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// One student's rows from their results.json: per lab, the sum of its tests (numbered "NN.k",
// "NN.pK") and the first test that lost points as the reason.
std::vector<Row> rows_of(const std::string& student, const fs::path& dir,
                         const std::vector<std::string>& labs) {
  const auto state = read_state(dir / "state");
  const std::string status = state.count("status") ? state.at("status") : "not-graded";
  std::vector<Row> rows;
  json doc;
  bool have = false;
  std::string text, why;
  // The grader wrote results.json from a job's untrusted output: read it bounded, not through a
  // link, and never let one student's file stop the gradebook.
  if (status == "graded" &&
      dtl::read_untrusted_file((dir / "results.json").string(), 64 << 20, text, why)) {
    doc = json::parse(text, nullptr, false);
    have = doc.is_object();
  }
  for (auto& lab : labs) {
    Row r;
    r.student = student;
    r.lab = lab;
    if (!have) {
      r.status = "not graded";
      if (status == "graded")
        r.reason = "results.json missing or unreadable";
      else if (state.count("why"))
        r.reason = state.at("why");
      else if (status == "running")  // the grading (or the whole command) was stopped mid-way
        r.reason = "the grading was interrupted (started " +
                   (state.count("started") ? state.at("started") : std::string("?")) + ")";
      else
        r.reason = "not graded yet";
      rows.push_back(r);
      continue;
    }
    r.graded = true;
    r.status = "graded";
    bool any = false;
    for (auto& t : doc.value("tests", json::array())) {
      const std::string number = t.value("number", "");
      if (number.rfind(lab + ".", 0) != 0) continue;
      any = true;
      const double s = t.value("score", 0.0), m = t.value("max_score", 0.0);
      r.score += s;
      r.max += m;
      if (r.reason.empty() && s + 1e-9 < m) {
        const std::string name = t.value("name", "");
        r.reason = name + ": " + first_line(t.value("output", ""));
        // "lab 03 | Task 4: ring all-reduce (n=2)": the group, at any world size.
        r.group = name.substr(0, name.rfind(" (n="));
      }
    }
    // Nothing of this lab in the upload (the grader grades the labs whose files it finds): a 0,
    // out of the maximum the class's other gradings of the lab had (write_gradebook).
    if (!any) r.reason = r.group = "nothing of lab " + lab + " in the submission";
    r.score = std::round(r.score * 100) / 100;
    r.max = std::round(r.max * 100) / 100;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

int write_gradebook(const std::string& class_dir, const std::vector<std::string>& labs,
                    const std::string& csv_path, const std::string& summary_path) {
  std::vector<std::string> students;
  for (auto& e : fs::directory_iterator(class_dir))
    if (e.is_directory() && !e.is_symlink() && e.path().filename().string()[0] != '.')
      students.push_back(e.path().filename().string());
  std::sort(students.begin(), students.end());

  std::vector<Row> rows;
  for (auto& s : students) {
    auto r = rows_of(s, fs::path(class_dir) / s, labs);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  // A lab missing from a submission counts out of the maximum the same lab had elsewhere in the
  // class (every grading of one class runs with the same options, so with the same maximum).
  std::map<std::string, double> lab_max;
  for (auto& r : rows)
    if (r.graded) lab_max[r.lab] = std::max(lab_max[r.lab], r.max);
  for (auto& r : rows)
    if (r.graded && r.max == 0 && r.reason.rfind("nothing of lab", 0) == 0) r.max = lab_max[r.lab];
  std::ofstream csv(csv_path);
  csv << "student,lab,score,max,status,reason\n";
  for (auto& r : rows)
    csv << fmt::format("{},{},{},{},{},{}\n", csv_field(r.student), r.lab,
                       r.graded ? fmt::format("{:g}", r.score) : "",
                       r.graded ? fmt::format("{:g}", r.max) : "", csv_field(r.status),
                       csv_field(r.reason));

  std::ostringstream md;
  int not_graded = 0;
  std::vector<std::string> missing;
  for (auto& s : students) {
    const bool bad = std::any_of(rows.begin(), rows.end(),
                                 [&](const Row& r) { return r.student == s && !r.graded; });
    if (bad) {
      ++not_graded;
      missing.push_back(s);
    }
  }
  md << fmt::format("# Gradebook: {} students, lab(s) {}\n\n", students.size(),
                    fmt::format("{}", fmt::join(labs, ", ")));
  for (auto& lab : labs) {
    std::vector<double> pct;
    std::map<std::string, int> failures;
    for (auto& r : rows) {
      if (r.lab != lab || !r.graded) continue;
      pct.push_back(r.max > 0 ? 100 * r.score / r.max : 0);
      // The test's group, not its message: a failure at n=2 counts with the same group's at
      // n=3 and with other values.
      if (!r.group.empty()) ++failures[r.group];
    }
    md << fmt::format("## Lab {}: {} graded\n\n", lab, pct.size());
    if (!pct.empty()) {
      double sum = 0;
      for (double p : pct) sum += p;
      std::vector<double> sorted = pct;
      std::sort(sorted.begin(), sorted.end());
      md << fmt::format("Mean {:.1f}%, median {:.1f}%.\n\n```\n", sum / pct.size(),
                        sorted[sorted.size() / 2]);
      int bins[11] = {};
      for (double p : pct) ++bins[std::clamp(static_cast<int>(p / 10), 0, 10)];
      for (int b = 10; b >= 0; --b)
        md << fmt::format("{:>8} {:>4} {}\n",
                          b == 10 ? std::string("100%") : fmt::format("{}-{}%", b * 10, b * 10 + 9),
                          bins[b], std::string(bins[b], '#'));
      md << "```\n\n";
    }
    std::vector<std::pair<int, std::string>> common;
    for (auto& [k, n] : failures) common.emplace_back(-n, k);
    std::sort(common.begin(), common.end());
    if (!common.empty()) md << "Commonest first failures:\n\n";
    for (size_t i = 0; i < common.size() && i < 5; ++i)
      md << fmt::format("- {} x {}\n", -common[i].first, common[i].second);
    md << "\n";
  }
  if (not_graded > 0) {
    md << fmt::format(
        "## Not graded: {}\n\nNo score is recorded for these (never a 0); run `./lab "
        "grade-class` again to grade them:\n\n",
        not_graded);
    for (auto& s : missing)
      for (auto& r : rows)
        if (r.student == s && !r.graded) {
          md << fmt::format("- {}: {}\n", s, r.reason);
          break;
        }
  }
  std::ofstream(summary_path) << md.str();
  std::cout << md.str() << fmt::format("gradebook: {} ({} rows); summary: {}\n", csv_path,
                                       rows.size(), summary_path);
  return not_graded;
}

}  // namespace dtl::grade
