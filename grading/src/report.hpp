// report.hpp — defines: table, to_gradescope, check_results, print_public_rubric.
//
// The last stage: what the grader observed, for people. The terminal table (everything, for the
// person who ran the grader), Gradescope's results.json (each group's visibility from the rubric;
// nothing of a hidden group appears in anything visible), and the integrity report (what the audit
// noticed but the sandbox made harmless: in the table, and in results.json as a test only
// instructors see).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "options.hpp"
#include "results.hpp"

namespace dtl::grade {

// The score table. `for_students`: reasons come from visible groups only (the top-level output
// Gradescope shows before the due date).
std::string table(const std::vector<LabResult>& labs, const Options& opt,
                  const std::string& isolation, bool for_students);

// `output`: the students' table; `isolation`: how student code ran (the sandbox line), which
// goes with each lab's verdict to an entry only instructors see.
nlohmann::json to_gradescope(const std::vector<LabResult>& labs, double seconds,
                             const std::string& output, const std::string& isolation = "");

// The grader's self-test reads back a results.json: totals by kind, text searches, and "hidden
// stays hidden" (hidden_leaks finds nothing).
int check_results(const std::string& file, const std::vector<std::string>& conditions);

// What of the non-visible tests (group names, failing gtest names, files under grading/) appears
// in the top-level output, a visible test or the leaderboard, each as "NAME (in WHERE)".
std::vector<std::string> hidden_leaks(const nlohmann::json& results);

// A student release's rubric: the public groups only (and the points the course's grader adds).
int print_public_rubric(const std::string& file);

}  // namespace dtl::grade
