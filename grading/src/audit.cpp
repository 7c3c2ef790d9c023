// The static audit of a submission: what its objects call and define, what its sources use.
#include "audit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "run.hpp"

namespace dtl::grade {

namespace {

// What lab code may call. C++ names are matched on their qualified name (no return type or
// parameters), C names as they are. ska:: is the hash map inside c10's headers (IValue dicts,
// an autograd Function's ctx->saved_data).
//
// Namespaces, not functions: LibTorch 1.13 and 2.x emit different symbols for the same source
// (at::_ops::<op>::call, SymInt overloads), so a function-level list would reject honest code on
// one of them. What inside these namespaces is not tensor API is named in kDenyDefault below,
// and CI checks that every reference solution passes its lab's audit (dtl-grade --validate).
const char* const kAllowCpp = R"(^(std|__gnu_cxx|__cxxabiv1|at|c10|caffe2|torch|fmt|dtl|ska)::.*)";
const char* const kAllowC =
    R"(^(operator (new|delete)(\[\])?\(.*|_Unwind_Resume|__gxx_personality_v0|__dso_handle|)"
    R"(_GLOBAL_OFFSET_TABLE_|__libc_single_threaded|__tls_get_addr|__stack_chk_fail|)"
    R"(__cxa_(allocate_exception|free_exception|throw|rethrow|begin_catch|end_catch|guard_acquire|)"
    R"(guard_release|guard_abort|pure_virtual|atexit|bad_cast|bad_typeid|call_unexpected|)"
    R"(throw_bad_array_new_length|get_exception_ptr|current_exception_type)|__dynamic_cast|)"
    R"(mem(cpy|move|set|cmp|chr)|str(len|nlen|cmp|ncmp|chr|rchr|str|cpy|ncpy|cat|error|tol|toul|tod|tof|toll|toull)|)"
    R"(__(memcpy|memmove|memset|strcpy|strncpy|strcat|sprintf|snprintf|vsnprintf|vsprintf|printf|fprintf)_chk|)"
    R"(v?s?n?printf|fprintf|vfprintf|puts|putchar|fputs|fputc|fwrite|fflush|stdout|stderr|)"
    R"(__assert_fail|abort|rand|srand|qsort|bsearch|abs|labs|llabs|__errno_location|free|)"
    R"(pthread_mutex_(lock|unlock|trylock)|pthread_once|pthread_self|pthread_equal|__pthread_key_create|)"
    R"(sched_yield|nanosleep|usleep|sleep|clock_gettime|clock|time|)"
    R"((sqrt|cbrt|exp|exp2|expm1|log|log2|log10|log1p|pow|fabs|floor|ceil|round|lround|llround|)"
    R"(trunc|fmod|remainder|sin|cos|tan|sinh|cosh|tanh|asin|acos|atan|atan2|erf|erfc|fmin|fmax|)"
    R"(hypot|ldexp|frexp|nearbyint|rint|lrint|modf|tgamma|lgamma)f?)$)";
// Never, whatever the namespace: files, processes, threads, the environment, exiting, the test
// framework and the harness, torch's (de)serialisation.
const char* const kDenyDefault =
    R"(^std::(filesystem|__cxx11::basic_[io]?fstream|basic_[io]?fstream|basic_filebuf|__basic_file|)"
    R"(thread|jthread|system|getenv|exit|_Exit|quick_exit|atexit|at_quick_exit)\b|)"
    R"(^std::(__cxx11::)?basic_[io]?fstream|^(testing|dtl::testing|dtl::bench)::|)"
    R"(^torch::(jit|serialize|pickle_save|pickle_load|save|load)\b|from_file|^caffe2::serialize|)"
    R"(^c10::(Set|set)[A-Za-z]*(Handler|Fetcher)|^dtl::(net|watchdog)::|)"
    // Escape hatches inside the allowed libraries: fmt's file I/O, dlopen/dlsym (all of libc and
    // libmpi), mapping any file, replacing ATen kernels or the allocator the memory tracker owns.
    R"(^fmt::(v[0-9]+::)?(file|buffered_file|output_file|ostream|detail::file)\b|)"
    R"(^at::(DynamicLibrary|MapAllocator|RefcountedMapAllocator)\b|)"
    R"(^c10::(Dispatcher|RegisterOperators|impl::OperatorEntry|Set[A-Za-z]*Allocator)\b|)"
    R"(^torch::(Library|detail::TorchLibraryInit)\b)";
// Never called, though their inline definitions may appear (a header emits them into every TU
// that includes it; what they call is checked like any call): the machinery around the tensor
// API. c10::impl (dispatch keys, thread-local state) but the two guards an autograd Function
// needs, LibTorch's thread pools and data loader (threads), profiler callbacks (code run inside
// every op), the CUDA caching allocator's setters (its peak is what GPU memory tests read) ...
const char* const kDenyCalls =
    R"(^c10::impl::(?!(Exclude|Include)DispatchKeyGuard::)|^c10::(ThreadPool|TaskThreadPool)|)"
    R"(^at::(launch|intraop_launch|set_num_threads|set_num_interop_threads|add[A-Za-z]*Callback|)"
    R"(remove[A-Za-z]*Callback|clear[A-Za-z]*Callbacks)\b|^torch::(data|set_num_threads)\b|)"
    R"(^c10::cuda::CUDACachingAllocator::(reset|set|emptyCache|raw)|)"
    // What the tests measure with: the op counters, the memory tracker's peak and limit, the
    // trace's clock and event list (lab 06's rubric allows reset_peak: measuring is its task).
    R"(^dtl::Comm::reset_stats\b|^dtl::memory::(reset_peak|set_limit|install)\b|)"
    R"(^dtl::trace::(clear|enable|set_origin)\b)";

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::vector<std::string> run_lines(const std::string& cmd) {
  std::vector<std::string> lines;
  std::istringstream in(capture(cmd));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> run_nm(const std::string& args, const std::string& object) {
  return run_lines(fmt::format("nm -C {} '{}' 2>&1", args, object));
}
std::vector<std::string> run_nm_raw(const std::string& args, const std::string& object) {
  return run_lines(fmt::format("nm {} '{}' 2>&1", args, object));
}
std::string demangle(const std::string& mangled) {
  auto out = run_lines(fmt::format("echo '{}' | c++filt", mangled));
  return out.empty() ? mangled : out[0];
}

std::regex compile(const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& e) {
    throw std::runtime_error(fmt::format("audit: bad pattern '{}': {}", pattern, e.what()));
  }
}

bool any_match(const std::vector<std::regex>& patterns, const std::string& s) {
  for (auto& r : patterns)
    if (std::regex_search(s, r)) return true;
  return false;
}

// Source text with comments and the contents of string and character literals removed, so
// "asm" in a comment or a message does not count, and nothing can hide in one either.
std::string strip_comments_and_strings(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size();) {
    char c = src[i];
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      while (i < src.size() && src[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      size_t end = src.find("*/", i + 2);
      for (size_t k = i; k < std::min(end == std::string::npos ? src.size() : end + 2, src.size());
           ++k)
        if (src[k] == '\n') out += '\n';
      i = end == std::string::npos ? src.size() : end + 2;
    } else if (c == 'R' && i + 1 < src.size() && src[i + 1] == '"') {  // raw string R"d(...)d"
      size_t open = src.find('(', i + 2);
      if (open == std::string::npos) break;
      std::string close = ")" + src.substr(i + 2, open - i - 2) + "\"";
      size_t end = src.find(close, open);
      out += "R\"\"";
      i = end == std::string::npos ? src.size() : end + close.size();
    } else if (c == '"' || c == '\'') {
      out += c;
      ++i;
      while (i < src.size() && src[i] != c && src[i] != '\n') i += src[i] == '\\' ? 2 : 1;
      out += c;
      ++i;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

}  // namespace

std::string qualified_name(const std::string& demangled) {
  std::string s = demangled;
  for (const char* prefix :
       {"typeinfo name for ", "typeinfo for ", "vtable for ", "VTT for ",
        "construction vtable for ", "guard variable for ", "non-virtual thunk to ",
        "virtual thunk to ", "covariant return thunk to ", "TLS init function for ",
        "TLS wrapper function for "})
    if (starts_with(s, prefix)) s = s.substr(std::string(prefix).size());
  if (starts_with(s, "reference temporary #")) s = s.substr(s.find(" for ") + 5);
  if (starts_with(s, "operator ")) return s;
  // A return type "decltype (...)" has parentheses of its own: skip it.
  while (starts_with(s, "decltype (")) {
    int parens = 0;
    size_t i = 9;
    for (; i < s.size(); ++i) {
      if (s[i] == '(') ++parens;
      if (s[i] == ')' && --parens == 0) break;
    }
    s = i + 2 <= s.size() ? s.substr(i + 2) : "";
  }
  int depth = 0;
  size_t end = s.size(), last_space = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<')
      ++depth;
    else if (c == '>')
      --depth;
    else if (depth == 0 && c == '(') {
      end = i;
      break;
    } else if (depth == 0 && c == ' ') {
      last_space = i;
    }
  }
  std::string head = s.substr(0, end);
  if (last_space != std::string::npos && last_space < end) head = head.substr(last_space + 1);
  return head;
}

std::vector<std::string> audit_objects(const std::vector<std::string>& objects,
                                       const AuditPolicy& p) {
  std::vector<std::regex> allow = {compile(kAllowCpp)}, allow_c = {compile(kAllowC)};
  std::vector<std::regex> rubric_allow, deny_default = {compile(kDenyDefault)}, rubric_deny;
  const std::vector<std::regex> deny_calls = {compile(kDenyCalls)};
  for (auto& a : p.allow) rubric_allow.push_back(compile(a));
  for (auto& d : p.deny) rubric_deny.push_back(compile(d));
  allow.insert(allow.end(), rubric_allow.begin(), rubric_allow.end());
  // A rubric's "allow" widens the default policy: a name it matches is exempt from the default
  // deny list too (lab 17's file I/O: std::filesystem, fstream). The rubric's own "deny" always
  // holds.
  auto denied = [&](const std::string& q) {
    return any_match(rubric_deny, q) || (any_match(deny_default, q) && !any_match(rubric_allow, q));
  };
  const std::string own = fmt::format("dtl::lab{}::", p.lab);
  std::set<std::string> problems, weak_mangled;
  for (auto& obj : objects) {
    for (auto& line : run_nm("-u", obj)) {
      auto pos = line.find(" U ");
      if (pos == std::string::npos) continue;
      const std::string name = line.substr(pos + 3), q = qualified_name(name);
      const bool denied_call = any_match(deny_calls, q) && !any_match(rubric_allow, q);
      if (denied(q) || denied_call || !(any_match(allow, q) || any_match(allow_c, name)))
        problems.insert(fmt::format("calls {}", q == name ? name : q));
    }
    for (auto& line : run_nm("-g --defined-only", obj)) {
      // "0000000000000520 T dtl::lab03::alpha_beta_time(...)"
      auto sp = line.find(' ');
      if (sp == std::string::npos || sp + 3 > line.size()) continue;
      const char type = line[sp + 1];
      const std::string name = line.substr(sp + 3), q = qualified_name(name);
      if (starts_with(q, own)) continue;
      // Weak definitions are what every TU emits for the inline functions and templates of the
      // headers it uses (at::Tensor::~Tensor, std::vector<Foo>::push_back): allowed when they
      // belong to an allowed library and replace nothing that library defines (checked below).
      const bool weak = type == 'W' || type == 'V' || type == 'u';
      if (weak && any_match(allow, q) && !denied(q)) continue;
      if (weak && starts_with(name, "guard variable for ")) continue;
      // RTTI of a compound type (typeinfo of "void (*)(torch::autograd::Node*)", which an autograd
      // Function's header code emits) has no qualified name; it is data, and harmless.
      if (weak && q.empty() && starts_with(name, "typeinfo")) continue;
      if (weak && starts_with(name, "DW.ref.") && any_match(allow_c, name.substr(7))) continue;
      // The unwinder's reference to the typeinfo a catch clause names (catch (const
      // std::exception&)): allowed when that type's library is.
      if (weak && starts_with(name, "DW.ref._ZTI")) {
        const std::string type = qualified_name(demangle(name.substr(7)));
        if (any_match(allow, type) && !denied(type)) continue;
      }
      problems.insert(
          fmt::format("defines {} outside namespace dtl::lab{} (keep helpers in the "
                      "lab's namespace or an anonymous one)",
                      q, p.lab));
    }
    // A weak definition still wins over a shared library's own at run time (the executable comes
    // first in symbol lookup): an `inline` redefinition of, say, dtl::Comm::all_reduce would
    // replace the built-in the tests compare against. Reject weak symbols the libraries define.
    if (!p.libraries.empty()) {
      for (auto& line : run_nm_raw("-g --defined-only", obj)) {
        auto sp = line.find(' ');
        if (sp == std::string::npos || sp + 3 > line.size()) continue;
        const char type = line[sp + 1];
        if (type == 'W' || type == 'V' || type == 'u') weak_mangled.insert(line.substr(sp + 3));
      }
    }
  }
  if (!weak_mangled.empty()) {
    for (auto& lib : p.libraries)
      for (auto& line : run_nm_raw("-D --defined-only", lib)) {
        auto sp = line.find(' ');
        if (sp == std::string::npos || sp + 3 > line.size()) continue;
        const char type = line[sp + 1];
        const std::string name = line.substr(sp + 3);
        if ((type == 'T' || type == 'D' || type == 'B' || type == 'R') && weak_mangled.count(name))
          problems.insert(fmt::format("replaces {} of {}", demangle(name),
                                      lib.substr(lib.find_last_of('/') + 1)));
      }
  }
  return {problems.begin(), problems.end()};
}

std::vector<std::string> audit_sources(const std::vector<std::string>& files,
                                       const AuditPolicy& p) {
  static const std::regex include_line(R"(^\s*#\s*include\s*(.*)$)");
  static const std::regex system_include(R"(^<([^>]+)>)"), local_include(R"re(^"([^"]+)")re");
  static const std::vector<std::pair<std::regex, std::string>> banned = {
      {std::regex(R"(\b(asm|__asm__|__asm)\b)"), "inline assembly"},
      {std::regex(R"(__attribute__|__declspec|\[\[\s*(gnu|clang)\s*::)"), "compiler attributes"},
      {std::regex(R"(^\s*#\s*pragma\b|\b_Pragma\b)"), "#pragma"},
      {std::regex(R"(##)"), "token pasting (##)"},
      {std::regex(R"re(\bextern\s*"")re"), "extern \"C\""},
      {std::regex(R"(__has_include|^\s*#\s*(embed|include_next|import)\b)"),
       "#embed/#include_next"},
  };
  // Code goes into namespace dtl (the lab's namespace, nested ones, anonymous ones), never into
  // someone else's: that is how a definition would replace a library's.
  static const std::regex namespace_or_brace(R"(\bnamespace\s+([A-Za-z_][\w:]*)\s*\{|[{}])");
  std::set<std::string> problems;
  for (auto& file : files) {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string base = file.substr(file.find_last_of('/') + 1);
    std::istringstream raw(ss.str());
    std::string line;
    std::smatch m;
    for (int n = 1; std::getline(raw, line); ++n) {
      if (!std::regex_search(line, m, include_line)) continue;
      const std::string arg = m[1].str();
      std::smatch inc;
      std::string path;
      bool ok = false;
      if (std::regex_search(arg, inc, system_include)) {
        path = inc[1].str();
        ok = !starts_with(path, "gtest/") && !starts_with(path, "gmock/") &&
             !starts_with(path, "benchmark/") && !starts_with(path, "dtl/harness/");
      } else if (std::regex_search(arg, inc, local_include)) {
        path = inc[1].str();
        ok = (starts_with(path, "dtl/") && !starts_with(path, "dtl/harness/")) ||
             std::find(p.headers.begin(), p.headers.end(), path) != p.headers.end();
      }
      if (path.find("..") != std::string::npos || starts_with(path, "/")) ok = false;
      if (!ok)
        problems.insert(
            fmt::format("{}:{}: includes {} (allowed: system headers, dtl/..., the "
                        "lab's headers)",
                        base, n, arg));
    }
    const std::string stripped = strip_comments_and_strings(ss.str());
    std::istringstream code(stripped);
    for (int n = 1; std::getline(code, line); ++n) {
      for (auto& [re, what] : banned)
        if (std::regex_search(line, re))
          problems.insert(fmt::format("{}:{}: uses {}", base, n, what));
    }
    // Track nesting: "namespace detail {" inside dtl::lab03 is dtl::lab03::detail.
    std::vector<std::string> stack;  // one entry per open brace: a namespace path or ""
    for (std::sregex_iterator it(stripped.begin(), stripped.end(), namespace_or_brace), end;
         it != end; ++it) {
      const std::string tok = (*it)[0].str();
      if (tok == "}") {
        if (!stack.empty()) stack.pop_back();
        continue;
      }
      std::string enclosing;
      for (auto k = stack.rbegin(); k != stack.rend(); ++k)
        if (!k->empty()) {
          enclosing = *k;
          break;
        }
      if (tok == "{") {
        stack.push_back(enclosing);
        continue;
      }
      const std::string name = (*it)[1].str();
      const std::string path = enclosing.empty() ? name : enclosing + "::" + name;
      stack.push_back(path);
      const int n = 1 + static_cast<int>(
                            std::count(stripped.begin(), stripped.begin() + it->position(), '\n'));
      if (path != "dtl" && !starts_with(path, "dtl::"))
        problems.insert(fmt::format("{}:{}: opens namespace {} (lab code lives in dtl::lab{})",
                                    base, n, path, p.lab));
      else if (starts_with(path, "dtl::testing") || starts_with(path, "dtl::bench"))
        problems.insert(fmt::format("{}:{}: opens namespace {} (the harness's)", base, n, path));
    }
  }
  return {problems.begin(), problems.end()};
}

}  // namespace dtl::grade
