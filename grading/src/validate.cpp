// dtl-grade --validate: what every rubric promises must exist (validate.hpp).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "audit.hpp"
#include "grader.hpp"
#include "options.hpp"
#include "rubric.hpp"
#include "run.hpp"

namespace fs = std::filesystem;

namespace dtl::grade {

// --validate: what a rubric promises must exist. Needs the reference build (./lab build).
int validate_rubrics(const Options& opt) {
  int bad = 0;
  auto problem = [&](const Rubric& r, const std::string& what) {
    std::cerr << fmt::format("lab {}: {}\n", r.lab, what);
    ++bad;
  };
  std::vector<Rubric> rubrics;
  try {
    rubrics = load_rubrics(opt.source, opt.labs);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  const fs::path bindir = fs::path(opt.build) / "bin";
  std::map<std::string, std::vector<std::string>> listings;  // binary -> "Suite.Test" names
  for (auto& r : rubrics) {
    const fs::path lab_dir = fs::path(opt.source) / "labs" / r.slug;
    const double total = r.max_points() + r.autograder_only_points;
    if (std::fabs(total - 100) > 1e-6) problem(r, fmt::format("points total {:g}, not 100", total));
    for (auto& f : r.student_files)
      if (!fs::exists(lab_dir / f)) problem(r, fmt::format("student file {} does not exist", f));
    const bool has_reference = fs::exists(fs::path(opt.source) / "solutions" / r.slug);
    const std::string side = has_reference ? "reference" : "student";
    for (auto& g : r.tests) {
      // Gradescope's four values (grading/README.md, "Gradescope"): a typo must not decide when
      // students see a hidden group's results.
      if (g.visibility != "visible" && g.visibility != "hidden" &&
          g.visibility != "after_due_date" && g.visibility != "after_published")
        problem(r, fmt::format("group '{}': visibility '{}' is not one of visible, hidden, "
                               "after_due_date, after_published",
                               g.name, g.visibility));
      const fs::path exe = bindir / fmt::format("lab{}_{}_{}", r.lab, g.binary, side);
      if (!fs::exists(exe)) {
        problem(r, fmt::format("group '{}': {} is not built", g.name, exe.filename().string()));
        continue;
      }
      // One listing per binary (each start costs a second or two), filters matched here.
      auto& names = listings[exe.string()];
      if (names.empty()) {
        names = gtest_names(run_command({exe.string(), "--gtest_list_tests"}, 120).output);
      }
      int tests = 0;
      for (auto& name : names) tests += filter_matches(g.filter, name);
      if (tests == 0)
        problem(r, fmt::format("group '{}': filter '{}' matches no test of {}", g.name, g.filter,
                               exe.filename().string()));
      if (g.world_sizes.empty()) problem(r, fmt::format("group '{}': no world sizes", g.name));
    }
    for (auto& c : r.performance) {
      const fs::path exe = bindir / fmt::format("lab{}_bench_reference", r.lab);
      if (!fs::exists(exe)) {
        problem(r,
                fmt::format("performance '{}': {} is not built (cmake --build build --target {})",
                            c.name, exe.filename().string(), exe.filename().string()));
        continue;
      }
      auto res = run_command(
          {exe.string(), "--benchmark_list_tests", "--benchmark_filter=^" + c.benchmark}, 120);
      if (res.output.find(c.benchmark) == std::string::npos)
        problem(r, fmt::format("performance '{}': no benchmark '{}' in {}", c.name, c.benchmark,
                               exe.filename().string()));
    }
    // The quoted includes of a test source, with their line numbers.
    auto quoted_includes = [](const fs::path& file) {
      std::vector<std::pair<int, std::string>> out;
      std::ifstream in(file);
      int n = 0;
      for (std::string line; std::getline(in, line);) {
        ++n;
        auto pos = line.find("#include \"");
        if (pos == std::string::npos) continue;
        std::string inc = line.substr(pos + 10);
        out.emplace_back(n, inc.substr(0, inc.find('"')));
      }
      return out;
    };
    auto is_source = [](const fs::path& p) {
      return p.extension() == ".cpp" || p.extension() == ".hpp";
    };
    // Hidden tests may check only what the header promises: they include the lab's headers,
    // the runtime and the harness, nothing of the solution.
    std::error_code ec;
    for (auto& e : fs::directory_iterator(fs::path(opt.source) / "grading" / r.slug, ec)) {
      if (!is_source(e.path())) continue;
      for (const auto& [n, inc] : quoted_includes(e.path())) {
        const bool ok = inc.rfind("dtl/", 0) == 0 || fs::exists(lab_dir / inc) ||
                        fs::exists(e.path().parent_path() / inc);
        if (!ok || inc.find("solutions") != std::string::npos)
          problem(r,
                  fmt::format("{}:{}: includes \"{}\" (grading tests see only the lab's headers, "
                              "dtl/ and their own directory)",
                              e.path().filename().string(), n, inc));
      }
    }
    // Tests that start jobs of their own (dtl/harness/jobs.hpp: a run of mpiexec) need the
    // sandbox to let student runs create processes; without it an honest submission fails them.
    if (!r.sandbox_processes)
      for (const fs::path& dir : {lab_dir / "tests", fs::path(opt.source) / "grading" / r.slug})
        for (auto& e : fs::directory_iterator(dir, ec)) {
          if (!is_source(e.path())) continue;
          for (const auto& [n, inc] : quoted_includes(e.path()))
            if (inc == "dtl/harness/jobs.hpp")
              problem(r, fmt::format("{}:{}: starts jobs (dtl/harness/jobs.hpp): the rubric needs "
                                     "\"sandbox\": {{\"processes\": true}}",
                                     e.path().filename().string(), n));
        }
    // The reference passes its own lab's audit: the policy rejects no honest code that the
    // course itself writes (a new deny pattern that catches a reference fails here, in CI).
    if (has_reference) {
      std::vector<std::string> sources;
      AuditPolicy policy = policy_for(r, opt.source, sources);
      const auto objects = lab_objects(opt.build, r, "reference");
      if (objects.empty()) problem(r, "the reference's objects were not found in the build");
      // Judged as if no sandbox contained it: a reference must not even need one.
      for (auto& finding : audit_objects(objects, policy).rejections(false, false, false))
        problem(r, "the reference fails the code audit: " + finding);
    }
    std::cerr << fmt::format("lab {}: rubric checked ({} groups, {} performance checks)\n", r.lab,
                             r.tests.size(), r.performance.size());
  }
  return bad ? 1 : 0;
}

}  // namespace dtl::grade
