// gradebook.hpp — defines: write_gradebook (dtl-grade --gradebook, the end of
// `./lab grade-class`).
//
// A class graded one submission at a time (locally or one Slurm job each) leaves, per student,
// CLASS/<student>/results.json (what Gradescope would get) and CLASS/<student>/state (how the
// grading ended: "status=graded", or "status=not-graded" with "why=..." when the job was killed,
// timed out or never ran). The gradebook is one CSV row per student and lab, for an LMS to
// import, and a summary for the instructor: a score histogram and the commonest first failures
// per lab. A grading that did not finish is never a 0: its row has no score and says why, and the
// next `./lab grade-class` grades it again.
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

// Writes CSV (student,lab,score,max,status,reason) and a Markdown summary; prints the summary.
// `labs`: the lab numbers graded ("03"); every student gets a row per lab. Returns the number
// of students not graded (0: the gradebook is complete).
int write_gradebook(const std::string& class_dir, const std::vector<std::string>& labs,
                    const std::string& csv_path, const std::string& summary_path);

}  // namespace dtl::grade
