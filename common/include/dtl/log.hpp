// dtl/log.hpp — defines: print0, log, warn, Progress (a one-line progress display).
//
// Rank-aware output. print0 prints on rank 0 only (results, tables); log prefixes the rank
// so interleaved output of many processes stays readable.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <string>

namespace dtl {

int log_rank();        // this process's world rank (0 before the Runtime exists)
int log_world_size();  // world size (1 before the Runtime exists)

void print0_str(const std::string& s);
void log_str(const std::string& s);
void warn_str(const std::string& s);

// print0("loss {:.3f}", loss): rank 0 only, to stdout, newline added.
template <typename... Args>
void print0(fmt::format_string<Args...> f, Args&&... args) {
  print0_str(fmt::format(f, std::forward<Args>(args)...));
}
// log("sent {} bytes", n): every rank, "[rank r/n] " prefix, to stderr.
template <typename... Args>
void log(fmt::format_string<Args...> f, Args&&... args) {
  log_str(fmt::format(f, std::forward<Args>(args)...));
}
// warn(...): like log, with "warning: ".
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  warn_str(fmt::format(f, std::forward<Args>(args)...));
}

// A progress line for long runs on rank 0: "step 120/500 [=====>    ] loss 2.31 | 41k tok/s".
// Redraws in place on a terminal, prints every `every` steps otherwise (logs, CI).
class Progress {
 public:
  Progress(std::string label, int total, int every = 10);
  // Update to step `step` (1-based) with a free-form status (e.g. "loss 2.31 | 41k tok/s").
  void update(int step, const std::string& status = "");
  void done(const std::string& status = "");

 private:
  std::string label_;
  int total_;
  int every_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dtl
