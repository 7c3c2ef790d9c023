// perf.hpp — defines: PerfRunner.
//
// Stage 5 of grading, performance, timed by the grader itself: a benchmark's in-process timer
// runs inside the student's process, so its figures are shown but not scored. The grader times
// whole benchmark processes with its own clock. The reference runs with the rubric's low and high
// repetition counts (--benchmark_repetitions): the difference is its time per repetition, the
// rest the start-up (MPI, LibTorch) every binary pays. The student's binary runs with the high
// count only, the same arguments every time (it cannot tell one timed run from another, so it
// cannot shape a difference); its time per repetition is its run less that start-up. Student and
// reference runs alternate, the order flipping every round; the score compares each side's
// fastest run per repetition (interference only adds time), or the median of the rounds' own
// ratios where that is better (a slow spell covering a round slows both of its sides). A student
// time no longer than the start-up alone is the student's failure. More rounds are taken until
// the reference's two fastest runs agree within half (a busy machine), and under the bar until
// the student's do too (a close call under the bar: every round); if the reference's never agree
// the check is "not measured": no points given or taken (its maximum is 0 in that result),
// flagged for the instructor. The benchmark's own check that every timed call computed the right
// result runs inside the student's process (an in-process check).
#pragma once

#include <string>

#include "jobs.hpp"
#include "options.hpp"
#include "results.hpp"
#include "rubric.hpp"

namespace dtl::grade {

class PerfRunner {
 public:
  PerfRunner(const Options& opt, JobRunner& jobs) : opt_(opt), jobs_(jobs) {}
  // `mine` runs the code being graded (in the sandbox when `untrusted`), `reference` the course's.
  PerfResult run(const PerfCheck& check, const std::string& mine, const std::string& reference,
                 bool untrusted);

 private:
  struct Sample {
    double seconds = -1;  // wall time of the whole process, by the grader's clock
    double figure = NAN;  // the benchmark's own counter (in-process: shown, not scored)
  };
  // `untrusted`: in the sandbox, as a student run is (the reference too, so that both pay the
  // same start-up); `as_student`: as the student's user.
  Sample once(const PerfCheck& check, const std::string& exe, int repetitions, bool untrusted,
              bool as_student, std::string& log);
  const Options& opt_;
  JobRunner& jobs_;
};

}  // namespace dtl::grade
