// audit.hpp — defines: AuditPolicy, Finding, AuditResult, audit_objects, audit_sources,
// qualified_name.
//
// Stage 2 of grading (after intake, before the build of the tests): what a submission's sources
// use and its objects call and define. Since the verdict comes from a driver process the student's
// code never runs in, and that code runs in a sandbox (sandbox.hpp), most of what once had to be
// forbidden is now harmless. The audit keeps two lists:
//   * rejections (the lab scores 0): what neither the sandbox nor the driver can stop, because it
//     happens inside the student's own process: doing the lab's work some other way (the Comm's
//     built-in collectives a lab asks you to write, MPI directly, dlopen/dlsym), tampering with
//     what the runtime measures in that process (Comm statistics, memory peaks, the trace),
//     replacing someone else's code (definitions outside the lab's namespace, interposing a
//     library's symbol, ATen kernels, allocators), reaching private members (the Comm's own
//     launch of an op, past its counters), the test framework's internals, escapes from the
//     language that hide any of this from the audit (asm and asm labels, GNU attributes,
//     pragmas, includes of files outside the allowed set, symbol names that are not names);
//   * integrity notes (no points lost): what the audit noticed but the sandbox or the driver made
//     harmless (starting processes, file I/O beyond the rubric's allowance, exiting early, reading
//     the environment, raw system calls, naming /proc), and what nothing stops automatically but a
//     human should read (walking the ELF tables or libc's internals).
//     Each note names what neutralises it; if that mechanism is missing on this machine (no
//     seccomp, no Landlock, an in-process verdict), the note becomes a rejection instead.
// Honest code written with the C++ standard library (threads, shared mutexes, timed waits,
// fstreams where the lab does file I/O) is never rejected; CI grades such variants of the
// references at full marks (grading/selftest).
#pragma once

#include <string>
#include <vector>

#include "tools.hpp"

namespace dtl::grade {

struct AuditPolicy {
  std::string lab;                     // "03": student definitions must be in dtl::lab03
  std::vector<std::string> allow;      // extra allowed patterns (ECMAScript regex, on the name);
                                       // a name they match is exempt from every default rule
  std::vector<std::string> deny;       // extra denied patterns (e.g. the collectives lab 03 builds)
  std::vector<std::string> headers;    // the lab's own headers students may include
  std::vector<std::string> libraries;  // shared libraries the tests link (weak definitions may
                                       // not replace theirs); empty: skip that check
  Identity as;                         // run nm as this user (the student's, when grading as root)
};

struct Finding {
  std::string text;            // "calls fork", "checkpoint.cpp:12: #define private public"
  std::string neutralized_by;  // "" (a rejection), or "seccomp", "landlock", "driver"
};

struct AuditResult {
  std::vector<Finding> findings;
  // The findings that cost the lab its points, given what this grading run has: a note whose
  // mechanism is missing counts as a rejection.
  std::vector<std::string> rejections(bool seccomp, bool landlock, bool driver) const;
  std::vector<std::string> notes(bool seccomp, bool landlock, bool driver) const;
  void add(const AuditResult& other) {
    findings.insert(findings.end(), other.findings.begin(), other.findings.end());
  }
};

// What the student's object files call and define (runs nm; demangles in-process).
AuditResult audit_objects(const std::vector<std::string>& objects, const AuditPolicy& p);

// What the student's source files use (before anything is compiled).
AuditResult audit_sources(const std::vector<std::string>& files, const AuditPolicy& p);

// "bool at::Tensor::item<bool>() const" -> "at::Tensor::item<bool>"; "vtable for std::X" ->
// "std::X".
std::string qualified_name(const std::string& demangled);

}  // namespace dtl::grade
