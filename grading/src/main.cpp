// dtl-grade: the autograder. Builds nothing itself (`./lab grade` builds first); grades each lab
// by its rubric, stage by stage (grader.hpp lists them), and writes a terminal table and a
// Gradescope results.json.
//
//   dtl-grade --source . --build build --labs 03 --json results.json
//   dtl-grade --intake SUBMISSION --into SCRATCH [--run-as USER]     (./lab grade --submission)
//
// Trust: the verdict on a student's code comes from a driver process the student's code never
// ran in (jobs.hpp); that code runs in a sandbox (sandbox.hpp); nothing derived from a
// submission reaches a shell (tools.hpp). results.json is written by the grader, last.
#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "audit.hpp"
#include "gradebook.hpp"
#include "grader.hpp"
#include "intake.hpp"
#include "options.hpp"
#include "report.hpp"
#include "rubric.hpp"
#include "skeleton.hpp"
#include "summary.hpp"

namespace fs = std::filesystem;
using namespace dtl::grade;

namespace dtl::grade {
int validate_rubrics(const Options& opt);
}

namespace {

// --intake: the submission's allow-listed files into the scratch copy; one line per file for
// ./lab ("used NN PATH", "ignored PATH", "refused PATH: WHY", "expected NAME").
int intake(const Options& opt, const std::string& submission, const std::string& into) {
  try {
    std::vector<StudentFile> files;
    for (auto& r : load_rubrics(opt.source, {}))
      for (auto& f : r.student_files) files.push_back({r.lab, r.slug, f});
    Identity as;
    if (!opt.run_as.empty()) {
      passwd* pw = getpwnam(opt.run_as.c_str());
      if (!pw) throw std::runtime_error("--run-as: no user '" + opt.run_as + "'");
      as.uid = static_cast<int>(pw->pw_uid);
      as.gid = static_cast<int>(pw->pw_gid);
    }
    const IntakeResult res = intake_submission(submission, files, into, as);
    for (auto& [lab, path] : res.used) std::cout << "used " << lab << " " << path << "\n";
    for (auto& path : res.ignored) std::cout << "ignored " << path << "\n";
    for (auto& what : res.refused) std::cout << "refused " << what << "\n";
    for (auto& name : res.expected) std::cout << "expected " << name << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "intake: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"dtl-grade: score labs by their rubrics (run through ./lab grade)"};
  app.add_option("--source", opt.source, "repository root (holds grading/NN_slug/rubric.json)");
  app.add_option("--build", opt.build, "build directory (holds bin/labNN_*)");
  app.add_option("--labs", opt.labs, "lab numbers to grade (default: every lab with a rubric)");
  app.add_option("--side", opt.side, "student or reference")
      ->check(CLI::IsMember({"student", "reference"}));
  app.add_option("--json", opt.json_path, "write Gradescope results.json here");
  app.add_option("--build-logs", opt.build_logs, "directory with labNN.log build logs");
  app.add_option("--run-as", opt.run_as, "run student code as this user (when grading as root)");
  app.add_option("--timeout", opt.timeout, "seconds per mpirun job");
  app.add_option(
      "--test-timeout", opt.test_timeout,
      "seconds per test (the harness watchdog; raised for tests the reference takes long "
      "on, and on a busy machine)");
  app.add_option("--perf-rounds", opt.perf_rounds, "interleaved benchmark rounds per side");
  app.add_option("--perf-max-rounds", opt.perf_max_rounds,
                 "rounds per side for a result just under the bar, or on a noisy machine");
  app.add_flag("!--no-perf", opt.perf, "skip performance checks");
  app.add_option("--max-world", opt.max_world, "grade world sizes up to N only (quick checks)");
  app.add_option("--only-groups", opt.only_groups, "grade test groups whose name contains TEXT");
  app.add_option("--note", opt.notes, "a line to add to the report (repeatable)");
  app.add_flag("!--no-audit", opt.audit, "skip the static audit of student code (audit.hpp)");
  app.add_flag("!--no-sandbox", opt.sandbox,
               "run student code outside dtl-sandbox (debugging the grader)");
  app.add_option(
         "--verdict", opt.verdict,
         "driver: a trusted driver checks what the student's code produced; in-process: the "
         "student's own test run decides (faster, trusts the process); auto: driver when the "
         "reference is built")
      ->check(CLI::IsMember({"auto", "driver", "in-process"}));
  app.add_option("--reference-times", opt.reference_times,
                 "JSON of each lab's (and test's) reference grading time: written by --side "
                 "reference, read by --side student for time budgets and watchdogs");
  app.add_option("--budget-min", opt.budget_min, "smallest time budget per lab (seconds)");
  app.add_option("--output-limit-mb", opt.output_limit_mb,
                 "largest output a student run may print");
  app.add_option("--disk-limit-mb", opt.disk_limit_mb,
                 "most a student run's job directory may hold");
  app.add_option("--memory-limit-mb", opt.memory_limit_mb, "heap per process of a student run");
  app.add_flag("--all", opt.all,
               "grade labs whose student files are the untouched skeleton too "
               "(default: report them \"not started\" without running anything)");
  bool untouched = false;
  app.add_flag("--untouched", untouched,
               "print the labs of --labs (default: all) whose student files are the untouched "
               "skeleton, and exit (for ./lab grade, which then builds nothing for them)");
  bool stamp = false, check_stamps = false;
  app.add_flag("--stamp-skeletons", stamp, "write grading/skeletons.sha256 from the student files");
  app.add_flag("--check-skeletons", check_stamps,
               "check grading/skeletons.sha256 against the student files and exit: 1 if stale");
  bool audit_sources_only = false;
  app.add_flag(
      "--audit-sources", audit_sources_only,
      "audit the student sources of --labs (before building them) and exit: 1 if rejected");
  std::vector<std::string> audit_objects_of;
  app.add_option("--audit-object", audit_objects_of,
                 "audit these object files as lab --labs NN's student code, print the findings and "
                 "exit: 1 if any is a rejection (with every sandbox mechanism available)");
  bool validate = false;
  app.add_flag(
      "--validate", validate,
      "check every rubric against the built binaries (filters match tests, points, "
      "student files, benchmarks, grading-test includes, references pass the audit) and exit");
  std::string public_rubric;
  app.add_option("--public-rubric", public_rubric,
                 "print the student-release version of this rubric.json (public groups only)");
  bool list = false;
  app.add_flag("--list", list, "print 'NN slug file...' for every rubric and exit (for ./lab)");
  std::string intake_dir, into;
  app.add_option("--intake", intake_dir,
                 "take a submission's allow-listed files (regular files only, "
                 "never through links, read as --run-as) ...");
  app.add_option("--into", into, "... into this scratch copy of the repository, and exit");
  std::string no_grade;
  app.add_option(
      "--no-grade", no_grade,
      "write a results.json (--json) that grades nothing and explains why (TEXT), and exit");
  std::string check_file;
  std::vector<std::string> expects;
  app.add_option("--check", check_file, "check a results.json against --expect conditions");
  app.add_option("--expect", expects,
                 "'score|correctness|performance OP VALUE|max|..._max', "
                 "'reason|output contains|lacks TEXT' or 'hidden stays hidden' (the grader's "
                 "self-test)");
  std::string reports;
  std::vector<std::string> summary_tests;
  app.add_option("--summarize", summary_tests,
                 "ctest entries to summarise as a table (./lab test NN)");
  app.add_option("--reports", reports, "with --summarize: directory of <entry>.json gtest reports");
  std::string summary_log;
  app.add_option("--log", summary_log,
                 "with --summarize: the file holding the runs' full output (named in the summary)");
  std::string gradebook_dir, gradebook_csv, gradebook_summary;
  app.add_option("--gradebook", gradebook_dir,
                 "a class's gradings (DIR/<student>/results.json and state): write --csv and "
                 "--summary for --labs (./lab grade-class)");
  app.add_option("--csv", gradebook_csv, "with --gradebook: the CSV to write");
  app.add_option("--summary", gradebook_summary, "with --gradebook: the Markdown summary to write");
  CLI11_PARSE(app, argc, argv);

  if (!gradebook_dir.empty()) {
    for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
    return write_gradebook(gradebook_dir, opt.labs, gradebook_csv, gradebook_summary) == 0 ? 0 : 3;
  }

  if (!check_file.empty()) return check_results(check_file, expects);
  if (!no_grade.empty()) {
    std::ofstream(opt.json_path) << to_gradescope({}, 0, no_grade).dump(2) << "\n";
    std::cout << no_grade << std::flush;
    return 0;
  }
  if (!intake_dir.empty()) return intake(opt, intake_dir, into);
  try {
    if (stamp) {
      const int files = stamp_skeletons(opt.source);
      std::cout << fmt::format("wrote {}: {} student files\n", kSkeletonManifest, files);
      return 0;
    }
    if (check_stamps) {
      auto stale = stale_skeletons(opt.source);
      for (auto& s : stale) std::cerr << s << "\n";
      if (!stale.empty())
        std::cerr << "A skeleton changed: run ./lab stamp-skeletons and commit "
                  << kSkeletonManifest
                  << " (./lab grade reports a lab \"not started\" when its files match it).\n";
      else
        std::cerr << kSkeletonManifest << " matches every lab's student files\n";
      return stale.empty() ? 0 : 1;
    }
    if (untouched) {
      for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
      for (auto& r : load_rubrics(opt.source, opt.labs))
        if (untouched_skeleton(r, opt.source)) std::cout << r.lab << "\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  if (!public_rubric.empty()) return print_public_rubric(public_rubric);
  if (validate) return validate_rubrics(opt);
  if (audit_sources_only) {
    try {
      for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
      int bad = 0;
      for (auto& r : load_rubrics(opt.source, opt.labs)) {
        std::vector<std::string> files;
        AuditPolicy policy = policy_for(r, opt.source, files);
        // Before the build, only what no mechanism makes harmless stops the compile.
        for (auto& problem : audit_sources(files, policy).rejections(true, true, true)) {
          std::cout << "lab " << r.lab << ": " << problem << "\n";
          ++bad;
        }
      }
      return bad ? 1 : 0;
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  if (!summary_tests.empty()) return summarize(reports, summary_tests, summary_log);
  if (!audit_objects_of.empty()) {
    try {
      for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
      auto rubrics = load_rubrics(opt.source, opt.labs);
      if (rubrics.size() != 1)
        throw std::runtime_error("--audit-object needs exactly one lab (--labs NN)");
      std::vector<std::string> files;
      AuditPolicy policy = policy_for(rubrics[0], opt.source, files);
      const AuditResult found = audit_objects(audit_objects_of, policy);
      const auto rejected = found.rejections(true, true, true);
      for (auto& f : rejected) std::cout << "rejected: " << f << "\n";
      for (auto& f : found.notes(true, true, true)) std::cout << "noted: " << f << "\n";
      return rejected.empty() ? 0 : 1;
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }

  if (list) {
    try {
      for (auto& r : load_rubrics(opt.source, {})) {
        std::cout << r.lab << " " << r.slug;
        for (auto& f : r.student_files) std::cout << " " << f;
        std::cout << "\n";
      }
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
    return 0;
  }

  auto start = std::chrono::steady_clock::now();
  std::vector<LabResult> results;
  std::vector<Rubric> rubrics;
  std::string fatal, isolation;
  try {
    for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
    rubrics = load_rubrics(opt.source, opt.labs);
    if (rubrics.empty()) fatal = "no rubric found for the requested labs";
    Grader grader(opt);
    isolation = grader.isolation();
    for (size_t k = 0; k < rubrics.size(); ++k) {
      const Rubric& r = rubrics[k];
      const auto lab_start = std::chrono::steady_clock::now();
      if (opt.side != "student" || opt.all || !untouched_skeleton(r, opt.source))
        std::cerr << fmt::format("[{}/{}] grading lab {} ({})...\n", k + 1, rubrics.size(), r.lab,
                                 r.title)
                  << std::flush;
      results.push_back(grader.grade(r));
      const auto& done = results.back();
      if (done.not_started) continue;  // the table says so; no progress to report
      std::cerr << fmt::format(
          "[{}/{}] lab {}: {:.1f}/{:g} in {:.0f} s{}\n", k + 1, rubrics.size(), r.lab,
          done.correctness + done.performance, done.correctness_max + done.performance_max,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - lab_start).count(),
          done.reason.empty() ? "" : ": " + first_line(done.reason, 100));
    }
    grader.save_reference_times();
  } catch (const std::exception& e) {
    fatal = e.what();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string tab = table(results, opt, isolation, false);
  std::string shown = table(results, opt, isolation, true);
  if (!fatal.empty()) {
    tab += "grader error: " + fatal + "\n";
    shown += "grader error: " + fatal + "\n";
  }
  std::cout << tab << std::flush;
  // Always write results.json, even when grading itself failed.
  std::ofstream(opt.json_path) << to_gradescope(results, seconds, shown, isolation).dump(2) << "\n";
  std::cerr << "results: " << opt.json_path << "\n";
  return fatal.empty() ? 0 : 2;
}
