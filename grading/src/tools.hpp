// tools.hpp — defines: Identity, run_tool, demangle, is_symbol_name, gtest_names.
//
// The grader starts outside programs (nm, ldd) on files derived from a submission. Nothing of a
// submission may reach a shell: every tool gets an argument vector, never a command line, and
// runs as the unprivileged user when the grader has one. Symbol names are demangled in-process.
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

// Who a child process runs as: the grader's own identity (uid < 0), or the student's.
struct Identity {
  int uid = -1, gid = -1;
  bool dropped() const { return uid >= 0; }
};

// Runs argv (argv[0] looked up in PATH) with stdin from /dev/null and returns its stdout; the
// child drops to `as` first when set. Throws std::runtime_error if it cannot run, exits
// non-zero, or runs longer than `timeout_s`.
std::string run_tool(const std::vector<std::string>& argv, const Identity& as = {},
                     int timeout_s = 120);

// "_ZN3dtl6lab0314ring_all_reduceE..." -> "dtl::lab03::ring_all_reduce(...)"; a name that is not
// a mangled C++ name comes back as it is.
std::string demangle(const std::string& name);

// A plain identifier (C name, optionally with a symbol version "@GLIBC_2.2.5" or a ".cold"
// style suffix) or a mangled C++ name: what a compiler emits for code. Anything else (spaces,
// quotes, shell syntax) can only come from an asm label and is rejected by the audit.
bool is_symbol_name(const std::string& name);

// The "Suite.Test" names in a test binary's --gtest_list_tests output: a suite line ends in '.',
// its tests follow indented by two spaces ("  Name  # GetParam() = ..." keeps "Name"); any other
// line (a runtime's warning) is skipped.
std::vector<std::string> gtest_names(const std::string& listing);

}  // namespace dtl::grade
