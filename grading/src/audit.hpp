// audit.hpp — defines: AuditPolicy, audit_objects, audit_sources, qualified_name.
//
// The grader runs student code inside the test process, so a submission could attack the
// process instead of solving the lab: rewrite the test filter, install a fake gtest reporter,
// edit the JSON report at exit, compute the result with MPI or through files, spawn a daemon.
// Each of those needs something the lab's code never needs: a symbol from outside the lab's
// allowed libraries (MPI_*, fopen, fork, kill, atexit, testing::*), a definition that replaces
// someone else's function, or a compiler escape hatch (asm, attributes, pragmas, includes of
// the hidden tests). The audit rejects a submission before any of its code runs:
//   * undefined symbols of the student's objects (what it calls) must match the allow-list
//     and no deny pattern (the default policy plus the rubric's "audit" entries);
//   * defined global symbols (what it provides) must live in the lab's namespace dtl::labNN,
//     or be template instantiations of the allowed libraries;
//   * the sources may not use asm, GNU attributes, pragmas, token pasting, extern "C", or
//     include anything but system headers, dtl/ headers and the lab's own headers.
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

struct AuditPolicy {
  std::string lab;                     // "03": student definitions must be in dtl::lab03
  std::vector<std::string> allow;      // extra allowed patterns (ECMAScript regex, on the name);
                                       // a name they match is exempt from the default deny list
  std::vector<std::string> deny;       // extra denied patterns (e.g. the collectives lab 03 builds)
  std::vector<std::string> headers;    // the lab's own headers students may include
  std::vector<std::string> libraries;  // shared libraries the tests link (weak definitions may
                                       // not replace theirs); empty: skip that check
};

// Problems found in the student's object files (empty: clean). Runs `nm`.
std::vector<std::string> audit_objects(const std::vector<std::string>& objects,
                                       const AuditPolicy& p);

// Problems found in the student's source files (empty: clean).
std::vector<std::string> audit_sources(const std::vector<std::string>& files, const AuditPolicy& p);

// "bool at::Tensor::item<bool>() const" -> "at::Tensor::item<bool>"; "vtable for std::X" ->
// "std::X".
std::string qualified_name(const std::string& demangled);

}  // namespace dtl::grade
