// The static audit of a submission (audit.hpp): what its sources use, what its objects call and
// define, split into rejections and integrity notes.
#include "audit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "tools.hpp"

namespace fs = std::filesystem;

namespace dtl::grade {

namespace {

// What lab code may call. C++ names are matched on their qualified name (no return type or
// parameters), C names as they are. ska:: is the hash map inside c10's headers (IValue dicts,
// an autograd Function's ctx->saved_data).
//
// Namespaces, not functions: LibTorch 1.13 and 2.x emit different symbols for the same source
// (at::_ops::<op>::call, SymInt overloads), so a function-level list would reject honest code on
// one of them. What inside these namespaces is not tensor API is named below, and CI checks that
// every reference solution passes its lab's audit (dtl-grade --validate). CLI:: is CLI11, the
// header-only command-line parser that dtl/runtime.hpp (where dtl::world() lives) includes: a
// lab file that includes that header gets CLI11's inline code.
const char* const kAllowCpp =
    R"(^(std|__gnu_cxx|__cxxabiv1|at|c10|caffe2|torch|fmt|dtl|ska|CLI)::.*)";
// What the C++ standard library and LibTorch's headers reach in libc, libm and libpthread: memory
// and strings, printing, math, clocks and sleeping, and every pthread primitive (std::thread,
// std::shared_mutex, timed waits on condition variables and mutexes are honest code).
const char* const kAllowC =
    R"(^(operator (new|delete)(\[\])?\(.*|_Unwind_Resume|__gxx_personality_v0|__dso_handle|)"
    R"(_GLOBAL_OFFSET_TABLE_|__libc_single_threaded|__tls_get_addr|__stack_chk_fail|)"
    R"(__cxa_(allocate_exception|free_exception|throw|rethrow|begin_catch|end_catch|guard_acquire|)"
    R"(guard_release|guard_abort|pure_virtual|atexit|thread_atexit|thread_atexit_impl|bad_cast|)"
    R"(init_primary_exception|)"
    R"(bad_typeid|call_unexpected|throw_bad_array_new_length|get_exception_ptr|)"
    R"(current_exception_type)|__dynamic_cast|)"
    // glibc 2.38+ (Debian 13) redirects strtol and its kin to __isoc23_strtol in C++ code.
    R"(mem(cpy|move|set|cmp|chr)|str(len|nlen|cmp|ncmp|chr|rchr|str|cpy|ncpy|cat|error|tod|tof|told)|)"
    R"((__isoc23_)?str(tol|toul|toll|toull)|)"
    R"(__(memcpy|memmove|memset|strcpy|strncpy|strcat|sprintf|snprintf|vsnprintf|vsprintf|printf|fprintf)_chk|)"
    R"(v?s?n?printf|fprintf|vfprintf|puts|putchar|fputs|fputc|fwrite|fflush|stdout|stderr|)"
    R"(__assert_fail|abort|rand|srand|qsort|bsearch|abs|labs|llabs|__errno_location|free|)"
    R"(_?_?pthread_[a-z_]+|sem_(init|destroy|wait|timedwait|clockwait|trywait|post|getvalue)|)"
    // std::call_once and std::async (libstdc++'s once machinery, extern "C").
    R"(__once_proxy|)"
    R"(sched_yield|nanosleep|clock_nanosleep|usleep|sleep|clock_gettime|clock|time|gettimeofday|)"
    R"(localtime_r|gmtime_r|strftime|)"
    R"((sqrt|cbrt|exp|exp2|expm1|log|log2|log10|log1p|pow|fabs|floor|ceil|round|lround|llround|)"
    R"(trunc|fmod|remainder|sin|cos|tan|sinh|cosh|tanh|asin|acos|atan|atan2|erf|erfc|fmin|fmax|)"
    R"(hypot|ldexp|frexp|nearbyint|rint|lrint|modf|tgamma|lgamma)f?)$)";

// Rejections, whatever the namespace (a rubric's `allow` lifts them for one lab): the test
// framework and the harness, the runtime's measuring and emulation internals, replacing kernels,
// allocators or handlers, and reaching functions without naming them (dlopen/dlsym: MPI, libc).
const char* const kRejectCpp =
    R"(^(testing|dtl::testing|dtl::bench)::|^dtl::(net|watchdog)::|)"
    R"(^c10::(Set|set)[A-Za-z]*(Handler|Fetcher)|^at::DynamicLibrary\b|)"
    R"(^c10::(Dispatcher|RegisterOperators|impl::OperatorEntry|Set[A-Za-z]*Allocator)\b|)"
    R"(^torch::(Library|detail::TorchLibraryInit)\b|)"
    // The Comm's private machinery: an op that bypasses issue() runs a built-in collective that
    // neither Comm::stats() nor this audit sees.
    R"(^dtl::Comm::(Op|launch|issue|input_buffer|output_buffer|notify_observers)\b)";
const char* const kRejectC =
    R"(^(dlopen|dlmopen|dlsym|dlvsym|dladdr|dladdr1|dlinfo|dl_iterate_phdr)$)";
// Rejections for calls only (headers emit weak copies of some of these into every TU that
// includes them; what matters is whether the student's code calls them): what the tests measure
// in the student's own process (the Comm's counters, the memory tracker's peak and limit, the
// trace's clock and events, the CUDA allocator's statistics), profiler callbacks (code inside
// every op) and the dispatcher's thread-local state.
const char* const kRejectCalls =
    R"(^dtl::Comm::reset_stats\b|^dtl::memory::(reset_peak|set_limit|install)\b|)"
    R"(^dtl::trace::(clear|enable|set_origin)\b|)"
    R"(^c10::cuda::CUDACachingAllocator::(reset|set|emptyCache|raw)|)"
    R"(^at::(add[A-Za-z]*Callback|remove[A-Za-z]*Callback|clear[A-Za-z]*Callbacks)\b|)"
    // What LibTorch 2.x's inline tensor code calls there is honest: copy-on-write storage
    // (data_ptr(), mutable_data_ptr()) and the TensorImpl's Python slot (its destructor).
    R"(^c10::impl::(?!(Exclude|Include)DispatchKeyGuard::|cow::|PyObjectSlot::))";

// Integrity notes: noticed, harmless under the named mechanism.
struct NoteRule {
  const char* pattern;  // on the qualified name (C++) or the plain name (C)
  const char* neutralized_by;
  const char* what;
};
const NoteRule kNotes[] = {
    {R"(^(fork|vfork|execv|execve|execvp|execvpe|execl|execlp|execle|fexecve|system|popen|pclose|)"
     R"(posix_spawnp?|daemon|clone|clone3|ptrace|process_vm_(readv|writev)|syscall|setsid|setpgid|)"
     R"(kill|killpg|tgkill|prctl)$|^std::system\b)",
     "seccomp", "starts or reaches processes"},
    {R"(^(open|open64|openat|openat64|creat|creat64|fopen|fopen64|freopen|fdopen|rename|renameat|)"
     R"(renameat2|unlink|unlinkat|remove|mkdir|mkdirat|rmdir|truncate|truncate64|link|linkat|symlink|)"
     R"(symlinkat|chmod|fchmod|chown|fchown|mmap|mmap64|opendir|fdopendir|scandir|stat|stat64|lstat|lstat64|)"
     R"(fstat|fstat64|fstatat|fstatat64|statx|access|faccessat|readlink|realpath|mkstemp|mkstemp64|tmpfile|)"
     R"(read|write|pread|pread64|pwrite|pwrite64|close|lseek|lseek64|fsync|fdatasync|fread|fclose|fseek|ftell|)"
     R"(fgets|fgetc|getc|fileno|readdir|readdir64|closedir|dup|dup2|dup3|pipe|pipe2|ioctl|fcntl|getdents64)$|)"
     R"(^std::(filesystem|__cxx11::basic_[io]?fstream|basic_[io]?fstream|basic_filebuf|__basic_file)\b|)"
     R"(^fmt::(v[0-9]+::)?(file|buffered_file|output_file|ostream|detail::file)\b|)"
     R"(^at::(MapAllocator|RefcountedMapAllocator)\b|)"
     R"(^torch::(jit|serialize|pickle_save|pickle_load|save|load)\b|^caffe2::serialize|from_file)",
     "landlock", "does file I/O"},
    {R"(^(exit|_exit|_Exit|quick_exit|atexit|at_quick_exit|on_exit|getenv|secure_getenv|setenv|)"
     R"(putenv|unsetenv|clearenv|signal|sigaction|raise)$|)"
     R"(^std::(exit|_Exit|quick_exit|atexit|at_quick_exit|getenv)\b)",
     "driver", "exits early, installs handlers or reads the environment"},
};

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

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

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// `nm` on a file derived from the submission: an argument vector, as the student's user when the
// grader has one (that user cannot read the build tree, so nm reads a private copy).
std::vector<std::string> nm_untrusted(const std::vector<std::string>& args,
                                      const std::string& object, const Identity& as) {
  if (!as.dropped()) {
    std::vector<std::string> argv = {"nm"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(object);
    return lines_of(run_tool(argv));
  }
  char tmpl[] = "/tmp/dtl-audit-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("audit: cannot create a temporary directory");
  const fs::path dir = tmpl, copy = dir / "object.o";
  std::error_code ec;
  fs::copy_file(object, copy, ec);
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  fs::permissions(copy, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  std::vector<std::string> argv = {"nm"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(copy.string());
  std::vector<std::string> out;
  try {
    out = lines_of(run_tool(argv, as));
  } catch (...) {
    fs::remove_all(dir, ec);
    throw;
  }
  fs::remove_all(dir, ec);
  return out;
}

// "0000000000000520 T name" or "                 U name" -> (type, name) (64-bit nm output).
bool parse_nm(const std::string& line, char& type, std::string& name) {
  if (line.size() < 20 || line[16] != ' ' || line[18] != ' ') return false;
  type = line[17];
  name = line.substr(19);
  return true;
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
      for (size_t k = i;
           k < std::min(end == std::string::npos ? src.size() : end + close.size(), src.size());
           ++k)
        if (src[k] == '\n') out += '\n';
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

std::vector<std::string> AuditResult::rejections(bool seccomp, bool landlock, bool driver) const {
  std::set<std::string> out;
  for (const auto& f : findings) {
    const auto& by = f.neutralized_by;
    const bool harmless = (by == "seccomp" && seccomp) || (by == "landlock" && landlock) ||
                          (by == "driver" && driver) || by == "review";
    if (!harmless) out.insert(f.text);
  }
  return {out.begin(), out.end()};
}

std::vector<std::string> AuditResult::notes(bool seccomp, bool landlock, bool driver) const {
  std::set<std::string> out;
  for (const auto& f : findings) {
    const auto& by = f.neutralized_by;
    if (by == "review")
      out.insert(f.text + " (nothing stops this automatically: for a human to read)");
    else if ((by == "seccomp" && seccomp) || (by == "landlock" && landlock) ||
             (by == "driver" && driver))
      out.insert(f.text + " (harmless here: " +
                 (by == "seccomp"    ? "the sandbox's system-call filter"
                  : by == "landlock" ? "the sandbox's file-system rules"
                                     : "the verdict comes from the driver") +
                 ")");
  }
  return {out.begin(), out.end()};
}

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

AuditResult audit_objects(const std::vector<std::string>& objects, const AuditPolicy& p) {
  const std::vector<std::regex> allow_cpp = {compile(kAllowCpp)}, allow_c = {compile(kAllowC)};
  const std::vector<std::regex> reject_cpp = {compile(kRejectCpp)}, reject_c = {compile(kRejectC)},
                                reject_calls = {compile(kRejectCalls)};
  std::vector<std::regex> rubric_allow, rubric_deny;
  for (auto& a : p.allow) rubric_allow.push_back(compile(a));
  for (auto& d : p.deny) rubric_deny.push_back(compile(d));
  std::vector<std::pair<std::regex, const NoteRule*>> notes;
  for (const auto& n : kNotes) notes.emplace_back(compile(n.pattern), &n);
  auto note_of = [&](const std::string& q, const std::string& name) -> const NoteRule* {
    for (auto& [re, rule] : notes)
      if (std::regex_search(q, re) || std::regex_search(name, re)) return rule;
    return nullptr;
  };
  // A rubric's "allow" lifts every default rule for the names it matches (lab 17's file I/O);
  // its "deny" always holds.
  auto lifted = [&](const std::string& q, const std::string& name) {
    return any_match(rubric_allow, q) || any_match(rubric_allow, name);
  };
  auto rejected = [&](const std::string& q, const std::string& name) {
    return any_match(rubric_deny, q) ||
           (!lifted(q, name) && (any_match(reject_cpp, q) || any_match(reject_c, name)));
  };
  const std::string own = fmt::format("dtl::lab{}::", p.lab);
  std::set<std::pair<std::string, std::string>> found;  // (text, neutralized_by)
  std::set<std::string> weak_mangled;
  auto reject = [&](const std::string& text) { found.insert({text, ""}); };
  for (auto& obj : objects) {
    for (auto& line : nm_untrusted({"-u"}, obj, p.as)) {
      char type = 0;
      std::string raw;
      if (!parse_nm(line, type, raw)) continue;
      if (!is_symbol_name(raw)) {
        reject(
            fmt::format("uses a symbol whose name is not a name ({:.60}...): an asm label", raw));
        continue;
      }
      if (type != 'U') continue;  // weak references (w, v) call nothing unless defined elsewhere
      const std::string name = demangle(raw), q = qualified_name(name);
      const std::string shown = q == name ? name : q;
      if (rejected(q, raw) || (!lifted(q, raw) && any_match(reject_calls, q))) {
        reject("calls " + shown);
        continue;
      }
      if (lifted(q, raw)) continue;
      if (const NoteRule* rule = note_of(q, raw)) {
        found.insert({fmt::format("calls {} ({})", shown, rule->what), rule->neutralized_by});
        continue;
      }
      if (!(any_match(allow_cpp, q) || any_match(allow_c, raw) || any_match(allow_c, name)))
        reject("calls " + shown);
    }
    for (auto& line : nm_untrusted({"-g", "--defined-only"}, obj, p.as)) {
      char type = 0;
      std::string raw;
      if (!parse_nm(line, type, raw)) continue;
      if (!is_symbol_name(raw)) {
        reject(fmt::format("defines a symbol whose name is not a name ({:.60}...): an asm label",
                           raw));
        continue;
      }
      const std::string name = demangle(raw), q = qualified_name(name);
      const bool weak = type == 'W' || type == 'V' || type == 'u';
      if (weak) weak_mangled.insert(raw);
      if (starts_with(q, own)) continue;
      // Weak definitions are what every TU emits for the inline functions and templates of the
      // headers it uses (at::Tensor::~Tensor, std::vector<Foo>::push_back): allowed when they
      // belong to an allowed library and replace nothing that library defines (checked below).
      if (weak && (any_match(allow_cpp, q) || lifted(q, raw)) && !rejected(q, raw)) continue;
      if (weak && starts_with(name, "guard variable for ")) continue;
      // RTTI of a compound type (typeinfo of "void (*)(torch::autograd::Node*)", which an autograd
      // Function's header code emits) has no qualified name; it is data, and harmless.
      if (weak && q.empty() && starts_with(name, "typeinfo")) continue;
      if (weak && starts_with(raw, "DW.ref.") && any_match(allow_c, raw.substr(7))) continue;
      // The unwinder's reference to the typeinfo a catch clause names (catch (const
      // std::exception&)): allowed when that type's library is.
      if (weak && starts_with(raw, "DW.ref._ZTI")) {
        const std::string caught = qualified_name(demangle(raw.substr(7)));
        if ((any_match(allow_cpp, caught) || lifted(caught, raw)) && !rejected(caught, raw)) continue;
      }
      reject(
          fmt::format("defines {} outside namespace dtl::lab{} (keep helpers in the lab's "
                      "namespace or an anonymous one)",
                      q, p.lab));
    }
  }
  // A weak definition still wins over a shared library's own at run time (the executable comes
  // first in symbol lookup): an `inline` redefinition of, say, dtl::Comm::all_reduce would
  // replace the built-in the tests compare against. Reject weak symbols the libraries define.
  if (!weak_mangled.empty()) {
    for (auto& lib : p.libraries)
      for (auto& line : lines_of(run_tool({"nm", "-D", "--defined-only", lib}))) {
        char type = 0;
        std::string name;
        if (!parse_nm(line, type, name)) continue;
        if ((type == 'T' || type == 'D' || type == 'B' || type == 'R') && weak_mangled.count(name))
          reject(
              fmt::format("replaces {} of {}", demangle(name), fs::path(lib).filename().string()));
      }
  }
  AuditResult result;
  for (auto& [text, by] : found) result.findings.push_back({text, by});
  return result;
}

AuditResult audit_sources(const std::vector<std::string>& files, const AuditPolicy& p) {
  static const std::regex include_line(R"(^\s*#\s*include\s*(.*)$)");
  static const std::regex system_include(R"(^<([^>]+)>)"), local_include(R"re(^"([^"]+)")re");
  // Escapes from the language that would hide what the objects do from this audit.
  static const std::vector<std::pair<std::regex, std::string>> banned = {
      {std::regex(R"(\b(asm|__asm__|__asm)\b)"), "inline assembly"},
      {std::regex(R"(\b__REDIRECT\w*|\b__ASMNAME\b)"), "an asm label (__REDIRECT)"},
      {std::regex(R"(__attribute__|__declspec|\[\[\s*(gnu|clang)\s*::)"), "compiler attributes"},
      // The pragmas that rename or weaken symbols (and _Pragma, whose string this scan cannot
      // read); #pragma once, omp, GCC diagnostic/optimize/unroll and the like are honest code.
      {std::regex(R"(^\s*#\s*pragma\s+(weak|redefine_extname|extern_prefix|GCC\s+visibility)\b|)"
                  R"(\b_Pragma\b)"),
       "a #pragma that renames or weakens symbols"},
      {std::regex(R"(##)"), "token pasting (##)"},
      {std::regex(R"re(\bextern\s*"")re"), "extern \"C\""},
      {std::regex(R"(__has_include|^\s*#\s*(embed|include_next|import)\b)"),
       "#embed/#include_next"},
      // Reaching private members: redefining the access specifiers, or the explicit
      // instantiation of a template on a member pointer (legal C++ that ignores access).
      {std::regex(R"(^\s*#\s*(define|undef)\s+(private|protected|public|class|struct)\b)"),
       "a redefined access specifier (#define private public)"},
      {std::regex(R"(\btemplate\s+(struct|class)\s+[\w:]+\s*<[^>]*&)"),
       "an explicit instantiation on a member pointer (access to private members)"},
      // A hand-made symbol lookup: walking the ELF tables or the dynamic linker's list of loaded
      // objects reaches any function (dlsym, MPI_Comm_spawn) without naming it where the object
      // audit can see. No lab needs it.
      {std::regex(R"(\b(Elf(32|64)_\w+|ElfW|link_map|_DYNAMIC|dl_iterate_phdr|__libc_\w+|_r_debug|)"
                  R"(r_debug|getauxval)\b)"),
       "a hand-made symbol lookup (ELF tables, the dynamic linker's link map, libc internals)"},
  };
  // Noticed, for the instructor: probing /proc, raw system calls, libc's process globals. Each
  // with what makes it harmless ("review": nothing does; a human reads it).
  struct SourceNote {
    std::regex re;
    const char* text;
    const char* by;
    bool in_strings;  // matched on the raw text (string literals included)
  };
  static const std::vector<SourceNote> noted = {
      {std::regex(R"(/proc/)"), "names a /proc path", "landlock", true},
      {std::regex(R"(\bsyscall\s*\()"), "makes raw system calls", "seccomp", false},
      {std::regex(R"(\b(__environ|program_invocation_\w*)\b)"),
       "reads libc's process globals", "review", false},
  };
  // Code goes into namespace dtl (the lab's namespace, nested ones, anonymous ones), never into
  // someone else's: that is how a definition would replace a library's.
  static const std::regex namespace_or_brace(R"(\bnamespace\s+([A-Za-z_][\w:]*)\s*\{|[{}])");
  std::set<std::pair<std::string, std::string>> found;
  for (auto& file : files) {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string base = fs::path(file).filename().string();
    std::istringstream raw(ss.str());
    std::string line;
    std::smatch m;
    for (int n = 1; std::getline(raw, line); ++n) {
      for (const auto& note : noted)
        if (note.in_strings && std::regex_search(line, note.re))
          found.insert({fmt::format("{}:{}: {}", base, n, note.text), note.by});
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
        found.insert({fmt::format("{}:{}: includes {} (allowed: system headers, dtl/..., the lab's "
                                  "headers)",
                                  base, n, arg),
                      ""});
    }
    const std::string stripped = strip_comments_and_strings(ss.str());
    std::istringstream code(stripped);
    for (int n = 1; std::getline(code, line); ++n) {
      for (auto& [re, what] : banned)
        if (std::regex_search(line, re))
          found.insert({fmt::format("{}:{}: uses {}", base, n, what), ""});
      for (const auto& note : noted)
        if (!note.in_strings && std::regex_search(line, note.re))
          found.insert({fmt::format("{}:{}: {}", base, n, note.text), note.by});
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
        found.insert({fmt::format("{}:{}: opens namespace {} (lab code lives in dtl::lab{})", base,
                                  n, path, p.lab),
                      ""});
      else if (starts_with(path, "dtl::testing") || starts_with(path, "dtl::bench"))
        found.insert({fmt::format("{}:{}: opens namespace {} (the harness's)", base, n, path), ""});
    }
  }
  AuditResult result;
  for (auto& [text, by] : found) result.findings.push_back({text, by});
  return result;
}

}  // namespace dtl::grade
