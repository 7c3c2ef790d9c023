// untrusted_file.hpp — defines: read_untrusted_file.
//
// Files that code under test wrote (a graded job's directory is the student's to fill), read by
// trusted code: the grader (gtest reports, watchdog reports, benchmark results) and the driver
// (the worker's observation streams). Such a file may be a symbolic link to /dev/zero or to
// another user's file, a FIFO that never ends, or a sparse file of gigabytes that costs a few
// KiB of disk. So: opened without following a link, only a regular file, never more than a
// cap, read in bounded chunks. Header-only (no torch): the grader includes it too.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace dtl {

// Reads `path` into `out`. False, with `why` (and `out` empty), when it does not exist ("no such
// file"), is a link, is not a regular file, or holds more than `max_bytes`.
inline bool read_untrusted_file(const std::string& path, size_t max_bytes, std::string& out,
                                std::string& why) {
  out.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    why = errno == ELOOP ? "is a symbolic link (not followed)" : std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    why = "is not a regular file";
    return false;
  }
  if (static_cast<unsigned long long>(st.st_size) > max_bytes) {
    ::close(fd);
    why = "holds " + std::to_string(st.st_size) + " bytes, more than the " +
          std::to_string(max_bytes) + " it may";
    return false;
  }
  // In chunks, up to one byte past the cap: a file that grew since fstat is refused too.
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      out.clear();
      why = "grew past the " + std::to_string(max_bytes) + " bytes it may hold";
      return false;
    }
  }
  ::close(fd);
  return true;
}

}  // namespace dtl
