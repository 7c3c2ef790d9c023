// dtl-sandbox: the trusted launcher of every process that runs student code (sandbox.hpp).
//
//   mpirun -n 3 dtl-sandbox --write JOB --read /usr ... -- labNN_test_student --gtest_...
//   dtl-sandbox --probe            what this kernel offers, as JSON (for the grader's report)
//
// Each rank's launcher installs the sandbox and then becomes the test binary (execve), so the
// binary's static initializers, the student's included, already run inside it.
#include <elf.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sandbox.hpp"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: dtl-sandbox [--read PATH]... [--write DIR]... [--rw FILE]... [--exec FILE]... "
               "[--processes] -- PROGRAM [ARGS...]\n       dtl-sandbox --probe\n");
  return 2;
}

std::string absolute(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// The ELF interpreter (dynamic loader) a program names: the kernel executes it too, so it needs
// Landlock's execute right as well. Empty for a static or non-ELF program.
std::string interpreter(const std::string& program) {
  std::FILE* f = std::fopen(program.c_str(), "rb");
  if (!f) return "";
  std::string interp;
  Elf64_Ehdr eh{};
  if (std::fread(&eh, sizeof eh, 1, f) == 1 && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_ident[EI_CLASS] == ELFCLASS64) {
    for (int k = 0; k < eh.e_phnum && interp.empty(); ++k) {
      Elf64_Phdr ph{};
      if (std::fseek(f, static_cast<long>(eh.e_phoff + k * eh.e_phentsize), SEEK_SET) != 0 ||
          std::fread(&ph, sizeof ph, 1, f) != 1)
        break;
      if (ph.p_type != PT_INTERP || ph.p_filesz == 0 || ph.p_filesz > PATH_MAX) continue;
      std::string buf(ph.p_filesz, '\0');
      if (std::fseek(f, static_cast<long>(ph.p_offset), SEEK_SET) == 0 &&
          std::fread(buf.data(), 1, buf.size(), f) == buf.size())
        interp = buf.c_str();
    }
  }
  std::fclose(f);
  return interp.empty() ? "" : absolute(interp);
}

// This launcher's own dynamic loader: the mapping that starts at AT_BASE in /proc/self/maps. The
// test binaries are built by the same toolchain, so theirs is the same one; it is the fallback
// when a program cannot be read to learn its interpreter (the student's binaries are execute-only
// to the student's user, as grading on Gradescope makes them: ./lab's lock_down).
std::string own_loader() {
  const unsigned long base = getauxval(AT_BASE);
  std::FILE* f = base ? std::fopen("/proc/self/maps", "r") : nullptr;
  if (!f) return "";
  std::string path;
  char line[PATH_MAX + 256];
  while (path.empty() && std::fgets(line, sizeof line, f)) {
    if (std::strtoul(line, nullptr, 16) != base) continue;
    if (const char* slash = std::strchr(line, '/')) {
      path = slash;
      while (!path.empty() && path.back() == '\n') path.pop_back();
    }
  }
  std::fclose(f);
  return path.empty() ? "" : absolute(path);
}

}  // namespace

int main(int argc, char** argv) {
  dtl::grade::SandboxPolicy policy;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--probe") {
      const auto s = dtl::grade::probe_sandbox();
      std::printf("{\"seccomp\": %s, \"landlock_abi\": %d, \"describe\": \"%s\"}\n",
                  s.seccomp ? "true" : "false", s.landlock_abi, s.describe().c_str());
      return 0;
    }
    if (a == "--processes") {
      policy.processes = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    if (a == "--read")
      policy.read.push_back(argv[++i]);
    else if (a == "--write")
      policy.write.push_back(argv[++i]);
    else if (a == "--rw")
      policy.rw.push_back(argv[++i]);
    else if (a == "--exec")
      policy.exec.push_back(absolute(argv[++i]));
    else
      return usage();
  }
  if (i >= argc) return usage();
  // The hand-over's arguments live on the heap, untouched until execve (the filter knows them by
  // address).
  static std::string program = absolute(argv[i]);
  policy.exec.push_back(program);
  std::string loader = interpreter(program);
  if (loader.empty() && access(program.c_str(), R_OK) != 0) loader = own_loader();
  if (!loader.empty()) policy.exec.push_back(loader);
  static std::vector<char*> args;
  args.push_back(program.data());
  for (int k = i + 1; k < argc; ++k) args.push_back(argv[k]);
  args.push_back(nullptr);
  const std::string err = dtl::grade::enter_sandbox(policy, program.data(), args.data());
  std::fprintf(stderr, "dtl-sandbox: %s\n", err.c_str());
  return 126;
}
