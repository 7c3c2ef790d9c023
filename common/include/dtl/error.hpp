// dtl/error.hpp — defines: dtl::Error, dtl::NotImplemented, dtl::OutOfMemory, DTL_CHECK,
// DTL_UNIMPLEMENTED.
//
// Every failure the runtime reports is a dtl::Error whose message says where (rank, call) and
// what constraint was broken, so a student reads one line and knows what to fix.
#pragma once

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtl {

// Base of all errors raised by dtl. The message is complete: it already names the rank
// (when a runtime exists) and the call that failed.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what);
};

// Raised by DTL_UNIMPLEMENTED: a lab TODO the student has not written yet. The grader and
// the skeleton check recognise it by the phrase "not implemented" in the message.
class NotImplemented : public Error {
 public:
  explicit NotImplemented(const std::string& what);
};

// Raised by the tracking allocator when an optional memory limit is exceeded (lab 18).
// The message carries the breakdown; the numbers are also available as fields.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, size_t requested, size_t current, size_t limit);
  size_t requested_bytes;
  size_t current_bytes;
  size_t limit_bytes;
  // What was live at the moment the allocation failed. A handler runs after the stack has
  // unwound and freed the activations, so it must read these, not the allocator's counters.
  std::map<std::string, size_t> bytes_by_tag;          // live bytes per memory::Scope tag
  std::vector<std::pair<size_t, std::string>> largest;  // largest live allocations (bytes, tag)
};

// "[rank 2/4] " when a Runtime exists, "" before; used to prefix every error message.
std::string rank_prefix();

namespace detail {
[[noreturn]] void check_failed(const char* cond, const std::string& msg, const char* file, int line);
[[noreturn]] void unimplemented(const std::string& what, const char* file, int line);

// DTL_CHECK's message: a string as it is, or a fmt format string and its arguments.
inline std::string check_message(std::string msg) { return msg; }
template <typename T, typename... Args>
std::string check_message(fmt::format_string<T, Args...> format, T&& first, Args&&... rest) {
  return fmt::format(format, std::forward<T>(first), std::forward<Args>(rest)...);
}
}  // namespace detail

}  // namespace dtl

// DTL_CHECK(cond, msg) or DTL_CHECK(cond, "fmt {} string", args...): raise dtl::Error naming the
// broken constraint when cond is false. msg is anything convertible to std::string; with
// arguments, the message is fmt::format(msg, args...):
//   DTL_CHECK(heads % tp == 0, "tp={} does not divide n_heads={}", tp, heads);
// The message is built only when the check fails.
#define DTL_CHECK(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::dtl::detail::check_failed(#cond, ::dtl::detail::check_message(__VA_ARGS__), __FILE__, \
                                  __LINE__);                                                  \
  } while (0)

// DTL_UNIMPLEMENTED("lab 02: average_gradients"): ends every TODO(labNN) block of a skeleton,
// so an unfinished lab fails loudly with "not implemented" instead of computing garbage.
#define DTL_UNIMPLEMENTED(what) ::dtl::detail::unimplemented((what), __FILE__, __LINE__)
