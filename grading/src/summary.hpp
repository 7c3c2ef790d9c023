// summary.hpp — defines: summarize (dtl-grade --summarize, the end of `./lab test NN`).
//
// What a student reads after running a lab's public tests: one row per test, one column per
// world size, then each failing test's first failure with its own message (the property, the
// world size, the batch), once: the same failure raised on several ranks (the harness re-raises
// every rank's failures on rank 0 as "[rank r/n] ...") is one entry naming those ranks. The full
// output of every run stays in the log file the summary names.
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

// `names` are ctest entries "labNN.side.nK"; their gtest reports are DIR/<name>.json (a hang
// leaves the report of the tests finished before it and of the hung one, written by the
// harness's watchdog). `log`: the file holding ctest's full output, named in the summary and
// read for the last lines of a run that left no report (a crash). Returns 0 when every test
// passes at every world size.
int summarize(const std::string& dir, const std::vector<std::string>& names,
              const std::string& log);

}  // namespace dtl::grade
