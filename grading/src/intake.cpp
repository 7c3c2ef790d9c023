// Taking a submission's files (intake.hpp). The child that reads the submission talks to the
// grader over a pipe in records: u8 kind ('F' file, 'I' ignored, 'R' refused), u32 path length,
// path, u64 data length, data. The grader trusts none of it beyond its size limits.
#include "intake.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

namespace fs = std::filesystem;

namespace dtl::grade {

namespace {

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void send(int fd, char kind, const std::string& path, const std::string& data = "") {
  const uint32_t plen = static_cast<uint32_t>(path.size());
  const uint64_t dlen = data.size();
  write_all(fd, &kind, 1);
  write_all(fd, &plen, sizeof plen);
  write_all(fd, path.data(), path.size());
  write_all(fd, &dlen, sizeof dlen);
  write_all(fd, data.data(), data.size());
}

// Opens `rel` (slash-separated) beneath the directory `root`, never following a link; returns
// the descriptor or -1 with errno (ELOOP: a link on the way).
int open_beneath(int root, const std::string& rel, int flags) {
  int dir = dup(root);
  size_t start = 0;
  for (;;) {
    const size_t slash = rel.find('/', start);
    const std::string part =
        rel.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") {
      close(dir);
      errno = EINVAL;
      return -1;
    }
    if (slash == std::string::npos) {
      const int fd = openat(dir, part.c_str(), flags | O_NOFOLLOW | O_CLOEXEC);
      const int err = errno;
      close(dir);
      errno = err;
      return fd;
    }
    const int next = openat(dir, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = errno;
    close(dir);
    if (next < 0) {
      errno = err;
      return -1;
    }
    dir = next;
    start = slash + 1;
  }
}

// Every entry beneath `dir` (relative paths), links and other non-regular files marked.
void walk(int dir, const std::string& prefix, int depth,
          std::vector<std::pair<std::string, char>>& out) {
  if (depth > 8 || out.size() > 10000) return;
  const int fd = dup(dir);
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const std::string rel = prefix.empty() ? name : prefix + "/" + name;
    if (S_ISDIR(st.st_mode)) {
      const int sub = openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        walk(sub, rel, depth + 1, out);
        close(sub);
      }
    } else {
      out.emplace_back(rel, S_ISREG(st.st_mode) ? 'f' : S_ISLNK(st.st_mode) ? 'l' : 'o');
    }
  }
  closedir(d);
}

// The reading side (in the child, as the student's user when set). Never returns.
[[noreturn]] void read_submission(int out, const std::string& submission,
                                  const std::vector<StudentFile>& files, long long max_bytes) {
  const int root = open(submission.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) {
    send(out, 'E', submission, std::strerror(errno));
    _exit(0);
  }
  std::set<std::string> taken;
  for (const auto& f : files) {
    for (const std::string& rel : {"labs/" + f.slug + "/" + f.name, f.name}) {
      const int fd = open_beneath(root, rel, O_RDONLY | O_NONBLOCK);
      if (fd < 0) {
        if (errno == ELOOP) send(out, 'R', rel, "a symbolic link (only regular files are taken)");
        if (errno == ELOOP || errno == ENOTDIR) taken.insert(rel);
        continue;
      }
      struct stat st {};
      fstat(fd, &st);
      if (!S_ISREG(st.st_mode)) {
        send(out, 'R', rel, "not a regular file");
      } else if (st.st_size > max_bytes) {
        send(out, 'R', rel, "larger than " + std::to_string(max_bytes) + " bytes");
      } else {
        std::string data(static_cast<size_t>(st.st_size), '\0');
        size_t got = 0;
        while (got < data.size()) {
          const ssize_t n = read(fd, data.data() + got, data.size() - got);
          if (n <= 0) break;
          got += static_cast<size_t>(n);
        }
        data.resize(got);
        send(out, 'F', f.lab + " " + rel, data);
      }
      taken.insert(rel);
      close(fd);
      break;  // labs/NN_slug/ first, then the flat name
    }
  }
  std::vector<std::pair<std::string, char>> all;
  walk(root, "", 0, all);
  for (const auto& [rel, kind] : all) {
    if (taken.count(rel)) continue;
    if (kind == 'f')
      send(out, 'I', rel);
    else
      send(out, 'R', rel,
           kind == 'l' ? "a symbolic link (only regular files are taken)" : "not a regular file");
  }
  _exit(0);
}

}  // namespace

IntakeResult intake_submission(const std::string& submission, const std::vector<StudentFile>& files,
                               const std::string& scratch, const Identity& as,
                               long long max_file_bytes) {
  IntakeResult result;
  std::set<std::string> names;
  for (const auto& f : files)
    if (names.insert(f.name).second) result.expected.push_back(f.name);
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("intake: pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("intake: fork failed");
  if (pid == 0) {
    close(fds[0]);
    if (as.dropped() && (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(as.gid)) != 0 ||
                         setuid(static_cast<uid_t>(as.uid)) != 0))
      _exit(126);
    read_submission(fds[1], submission, files, max_file_bytes);
  }
  close(fds[1]);
  std::map<std::string, const StudentFile*> by_lab_name;
  for (const auto& f : files) by_lab_name[f.lab + " " + f.name] = &f;
  std::string error;
  auto read_exact = [&](void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = read(fds[0], c, n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  };
  for (;;) {
    char kind = 0;
    uint32_t plen = 0;
    uint64_t dlen = 0;
    if (!read_exact(&kind, 1)) break;
    if (!read_exact(&plen, sizeof plen) || plen > 4096) break;
    std::string path(plen, '\0');
    if (!read_exact(path.data(), plen) || !read_exact(&dlen, sizeof dlen) ||
        dlen > static_cast<uint64_t>(max_file_bytes) + 4096)
      break;
    std::string data(dlen, '\0');
    if (!read_exact(data.data(), dlen)) break;
    if (kind == 'E') {
      error = "cannot read the submission " + path + ": " + data;
    } else if (kind == 'I') {
      result.ignored.push_back(path);
    } else if (kind == 'R') {
      result.refused.push_back(path + ": " + data);
    } else if (kind == 'F') {
      // "NN labs/slug/name" or "NN name": the lab, and the file name it must be.
      const std::string lab = path.substr(0, path.find(' ')), rel = path.substr(path.find(' ') + 1);
      const std::string name = fs::path(rel).filename().string();
      const auto it = by_lab_name.find(lab + " " + name);
      if (it == by_lab_name.end()) continue;
      const fs::path dest = fs::path(scratch) / "labs" / it->second->slug / name;
      const int fd =
          open(dest.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd < 0)
        throw std::runtime_error("intake: cannot write " + dest.string() + ": " +
                                 std::strerror(errno));
      size_t off = 0;
      while (off < data.size()) {
        const ssize_t w = write(fd, data.data() + off, data.size() - off);
        if (w <= 0) break;
        off += static_cast<size_t>(w);
      }
      close(fd);
      result.used.emplace_back(lab, rel);
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::sort(result.ignored.begin(), result.ignored.end());
  std::sort(result.refused.begin(), result.refused.end());
  if (!error.empty()) throw std::runtime_error(error);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("intake: the reader failed (exit " +
                             std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                             "): is the submission readable by the student's user?");
  return result;
}

}  // namespace dtl::grade
