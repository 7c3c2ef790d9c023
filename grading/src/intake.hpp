// intake.hpp — defines: IntakeResult, intake_submission.
//
// Stage 1 of grading: a submission's files into a scratch copy of the course repository. Only
// the rubrics' student files are taken, only regular files, only from inside the submission:
// every path is opened component by component without following links (O_NOFOLLOW), so a
// "file" that is a symbolic link (to the reference solution, to anything the grader could read)
// is refused and named. The reading happens in a child process running as the student's user
// when the grader has one, so even a path the checks missed reads nothing that user could not.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tools.hpp"

namespace dtl::grade {

struct StudentFile {
  std::string lab, slug, name;  // "03", "03_ring_allreduce", "ring_allreduce.cpp"
};

struct IntakeResult {
  std::vector<std::pair<std::string, std::string>> used;  // (lab, path in the submission)
  std::vector<std::string> ignored;                       // files outside the allow-list
  std::vector<std::string> refused;                       // "path: why" (links, not regular)
  std::vector<std::string> expected;                      // every file name a lab takes
};

// Copies the allow-listed files of `submission` (flat, or labs/NN_slug/...) into
// `scratch`/labs/<slug>/<name>. Throws std::runtime_error if the submission cannot be read.
IntakeResult intake_submission(const std::string& submission, const std::vector<StudentFile>& files,
                               const std::string& scratch, const Identity& as,
                               long long max_file_bytes = 1 << 20);

}  // namespace dtl::grade
