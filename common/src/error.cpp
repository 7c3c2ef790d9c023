// Error types and the failure paths of DTL_CHECK / DTL_UNIMPLEMENTED.
#include "dtl/error.hpp"

#include <fmt/format.h>

#include <cstring>

#include "dtl/log.hpp"

namespace dtl {

Error::Error(const std::string& what) : std::runtime_error(what) {}
NotImplemented::NotImplemented(const std::string& what) : Error(what) {}
OutOfMemory::OutOfMemory(const std::string& what, size_t requested, size_t current, size_t limit)
    : Error(what), requested_bytes(requested), current_bytes(current), limit_bytes(limit) {}

std::string rank_prefix() {
  if (log_world_size() <= 1 && log_rank() == 0) return "";
  return fmt::format("[rank {}/{}] ", log_rank(), log_world_size());
}

namespace detail {

static const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

void check_failed(const char* cond, const std::string& msg, const char* file, int line) {
  throw Error(fmt::format("{}{} (check `{}` failed at {}:{})", rank_prefix(), msg, cond,
                          basename_of(file), line));
}

void unimplemented(const std::string& what, const char* file, int line) {
  throw NotImplemented(fmt::format("{}not implemented: {} ({}:{})", rank_prefix(), what,
                                   basename_of(file), line));
}

}  // namespace detail
}  // namespace dtl
