// Trusted tools started by argument vector (tools.hpp).
#include "tools.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace dtl::grade {

std::string run_tool(const std::vector<std::string>& argv, const Identity& as, int timeout_s) {
  if (argv.empty()) throw std::runtime_error("run_tool: no program");
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("run_tool: pipe failed");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("run_tool: fork failed");
  if (pid == 0) {
    const int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(devnull, 2);
    close(out[0]);
    if (as.dropped() && (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(as.gid)) != 0 ||
                         setuid(static_cast<uid_t>(as.uid)) != 0))
      _exit(126);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  // Read everything (a tool's output can be megabytes: nm of LibTorch), bounded in time.
  std::string text;
  char buf[1 << 16];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  bool timed_out = false;
  for (;;) {
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;
    if (errno != EAGAIN && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) throw std::runtime_error(argv[0] + " timed out");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(argv[0] + " failed" +
                             (WIFEXITED(status)
                                  ? " (exit " + std::to_string(WEXITSTATUS(status)) + ")"
                                  : std::string(" (signal)")));
  return text;
}

std::string demangle(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : name;
}

bool is_symbol_name(const std::string& name) {
  if (name.empty() || name.size() > 8192) return false;
  // Identifiers, mangled names (letters, digits, '_', '.', '$' in clone suffixes), an optional
  // "@VERSION" or "@@VERSION".
  const size_t at = name.find('@');
  const std::string base = name.substr(0, at);
  if (base.empty()) return false;
  const char first = base[0];
  if (!(std::isalpha(static_cast<unsigned char>(first)) || first == '_' || first == '.'))
    return false;
  for (char c : base)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '$'))
      return false;
  if (at == std::string::npos) return true;
  std::string version = name.substr(at + 1);
  if (!version.empty() && version[0] == '@') version = version.substr(1);
  if (version.empty()) return false;
  for (char c : version)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return true;
}

std::vector<std::string> gtest_names(const std::string& listing) {
  std::vector<std::string> names;
  std::istringstream lines(listing);
  std::string line, suite;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    if (line[0] != ' ' && line.back() == '.') {
      suite = line;
    } else if (line.rfind("  ", 0) == 0 && !suite.empty()) {
      std::string test = line.substr(2);
      names.push_back(suite + test.substr(0, test.find(' ')));
    }
  }
  return names;
}

}  // namespace dtl::grade
