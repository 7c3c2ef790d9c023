// Rank-aware printing and the progress line.
#include "dtl/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>

namespace dtl {
namespace detail {
// Set by the Runtime once MPI knows who we are; plain globals before that.
std::atomic<int> g_log_rank{0};
std::atomic<int> g_log_world{1};
void set_log_identity(int rank, int world) {
  g_log_rank = rank;
  g_log_world = world;
}
}  // namespace detail

int log_rank() { return detail::g_log_rank; }
int log_world_size() { return detail::g_log_world; }

static std::mutex& out_mutex() {
  static std::mutex mu;
  return mu;
}

void print0_str(const std::string& s) {
  if (log_rank() != 0) return;
  std::lock_guard<std::mutex> lock(out_mutex());
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void log_str(const std::string& s) {
  std::string line = fmt::format("[rank {}/{}] {}\n", log_rank(), log_world_size(), s);
  std::lock_guard<std::mutex> lock(out_mutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void warn_str(const std::string& s) { log_str("warning: " + s); }

Progress::Progress(std::string label, int total, int every)
    : label_(std::move(label)),
      total_(total),
      every_(every > 0 ? every : 1),
      tty_(isatty(fileno(stdout)) != 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int step, const std::string& status) {
  if (log_rank() != 0) return;
  const bool last = step >= total_;
  if (!tty_ && !last && step % every_ != 0) return;
  const int width = 24;
  const int filled = total_ > 0 ? static_cast<int>(1.0 * width * step / total_) : width;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = fmt::format("{} {}/{} [{}] {:.1f}s {}", label_, step, total_, bar, secs, status);
  std::lock_guard<std::mutex> lock(out_mutex());
  if (tty_) {
    std::fprintf(stdout, "\r\033[K%s", line.c_str());
    if (last) std::fputc('\n', stdout);
  } else {
    std::fprintf(stdout, "%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void Progress::done(const std::string& status) { update(total_, status); }

}  // namespace dtl
