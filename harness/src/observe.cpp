// The split run's streams (dtl/harness/observe.hpp): the worker appends what its tests
// observed, the driver reads it back test by test. The stream is untrusted input to the driver:
// every length is checked against what is left, a malformed record ends the stream there (the
// tests after it then fail as "did not reach"), and nothing in it is ever executed.
//
// Stream format (one file per rank, records back to back):
//   'B' str test                                    a test begins
//   'V' u8 source, str what, str file, u64 line, str payload     an observed value
//   'F' str file, u64 line, str message              a failure the worker raised
//   'E' str test                                    the test ended (its records are complete)
#include "dtl/harness/observe.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "dtl/error.hpp"
#include "dtl/harness/untrusted_file.hpp"
#include "observe_session.hpp"

namespace dtl::testing {

namespace od = observe_detail;

namespace {

struct ValueRecord {
  Source source;
  std::string what, file, payload;
  uint64_t line;
};
struct FailureRecord {
  std::string file, message;
  uint64_t line;
};
// One test's records as the worker wrote them.
struct TestRecords {
  std::vector<ValueRecord> values;
  std::vector<FailureRecord> failures;
  bool ended = false;  // its 'E' record was there: the worker finished the test
};

struct Counts {
  int computed = 0, measured = 0, missing = 0, skipped = 0;
};

struct Session {
  SplitMode mode = SplitMode::kLocal;
  // record
  std::FILE* out = nullptr;
  // check
  std::map<std::string, TestRecords> tests;
  std::string stream_problem;  // why the stream stopped early, if it did
  // the current test (check)
  std::string test;
  const TestRecords* current = nullptr;
  size_t next = 0;
  bool diverged = false;
  std::vector<std::string> problems;  // raised at test_end
  std::map<std::string, Counts> counts;
};

Session& session() {
  static Session s;
  return s;
}

void put_str(std::string& out, const std::string& s) {
  od::Writer w;
  w.str(s);
  out += w.bytes();
}

std::string site_text(const std::string& what, const std::string& file, uint64_t line) {
  const size_t slash = file.find_last_of('/');
  return "'" + what + "' (" + (slash == std::string::npos ? file : file.substr(slash + 1)) + ":" +
         std::to_string(line) + ")";
}

}  // namespace

SplitMode split_mode() { return session().mode; }

// ------------------------------------------------------------------ encoding

namespace observe_detail {

void Writer::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void Writer::f64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  u64(bits);
}
void Writer::str(const std::string& s) {
  u64(s.size());
  bytes_ += s;
}

const char* Reader::raw(size_t n) {
  if (n > bytes_.size() - pos_) throw std::runtime_error("truncated value");
  const char* p = bytes_.data() + pos_;
  pos_ += n;
  return p;
}
uint8_t Reader::u8() { return static_cast<uint8_t>(*raw(1)); }
uint64_t Reader::u64() {
  const char* p = raw(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
double Reader::f64() {
  uint64_t bits = u64();
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}
std::string Reader::str() {
  const uint64_t n = u64();
  if (n > bytes_.size() - pos_) throw std::runtime_error("truncated string");
  return std::string(raw(n), n);
}
void Reader::expect_tag(char tag, const char* what) {
  const char got = static_cast<char>(u8());
  if (got != tag)
    throw std::runtime_error(std::string("expected ") + what + ", the worker recorded type '" +
                             std::string(1, got) + "'");
}

namespace {
// The dtypes an observation may carry (anything else is a malformed stream).
const std::vector<torch::ScalarType>& tensor_dtypes() {
  static const std::vector<torch::ScalarType> all = {
      torch::kUInt8, torch::kInt8,    torch::kInt16,   torch::kInt32, torch::kInt64,
      torch::kHalf,  torch::kFloat32, torch::kFloat64, torch::kBool,  torch::kBFloat16};
  return all;
}
void put_shape(Writer& w, torch::ScalarType dtype, c10::IntArrayRef sizes) {
  const auto& all = tensor_dtypes();
  const auto it = std::find(all.begin(), all.end(), dtype);
  if (it == all.end())
    throw dtl::Error(std::string("observe: unsupported dtype ") + c10::toString(dtype));
  w.u8(static_cast<uint8_t>(it - all.begin()));
  w.u64(sizes.size());
  for (int64_t s : sizes) w.u64(static_cast<uint64_t>(s));
}
std::pair<torch::ScalarType, std::vector<int64_t>> get_shape(Reader& r) {
  const uint8_t code = r.u8();
  if (code >= tensor_dtypes().size()) throw std::runtime_error("unknown dtype code");
  const uint64_t dims = r.u64();
  if (dims > 16) throw std::runtime_error("too many dimensions");
  std::vector<int64_t> sizes;
  for (uint64_t d = 0; d < dims; ++d) {
    const uint64_t s = r.u64();
    if (s > (uint64_t{1} << 40)) throw std::runtime_error("implausible size");
    sizes.push_back(static_cast<int64_t>(s));
  }
  return {tensor_dtypes()[code], sizes};
}
// A 64-bit digest for equality of large tensors, not a cryptographic one: a worker that wants
// the driver's digest must produce the right bytes first (it could write any digest it likes),
// so what matters is that different bytes almost never agree, and speed: the driver digests
// every large tensor its tests observe, and byte-at-a-time FNV-1a was the hottest function in
// a grading's profile. XXH64's round over four independent lanes of 8-byte words (the multiplies
// overlap; the rotation feeds every bit back into the low ones, so two sign flips cannot cancel
// as they would in a word-wide FNV), a byte loop for the tail, splitmix64's finalizer at the end.
uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t digest(const void* data, size_t n) {
  constexpr uint64_t kP1 = 0x9e3779b185ebca87ull, kP2 = 0xc2b2ae3d27d4eb4full;
  const auto round = [](uint64_t acc, uint64_t word) {
    acc += word * kP2;
    acc = (acc << 31) | (acc >> 33);
    return acc * kP1;
  };
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, p + i + 8 * k, 8);
      lane[k] = round(lane[k], word);
    }
  }
  uint64_t h = n;
  for (int k = 0; k < 4; ++k) h = mix64(h ^ lane[k]);
  for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;  // the tail, FNV-1a
  return mix64(h);
}
}  // namespace

void put_tensor(Writer& w, const torch::Tensor& t) {
  w.u8('t');
  w.u8(t.defined() ? 1 : 0);
  if (!t.defined()) return;
  auto host = t.detach().cpu().contiguous();
  put_shape(w, host.scalar_type(), host.sizes());
  w.raw(host.data_ptr(), host.nbytes());
}

torch::Tensor get_tensor(Reader& r, const torch::Tensor& like) {
  r.expect_tag('t', "tensor");
  if (!r.u8()) return torch::Tensor();
  auto [dtype, sizes] = get_shape(r);
  int64_t numel = 1;
  for (int64_t s : sizes) {
    if (s != 0 && numel > (int64_t{1} << 40) / s) throw std::runtime_error("implausible size");
    numel *= s;
  }
  // The bytes must be there before anything is allocated: the sizes are the worker's word.
  const char* bytes = r.raw(static_cast<size_t>(numel) * c10::elementSize(dtype));
  auto out = torch::empty(sizes, torch::TensorOptions().dtype(dtype));
  if (out.nbytes() > 0) std::memcpy(out.data_ptr(), bytes, out.nbytes());
  // On the driver's device, as the driver's own value was (a CUDA run compares on the GPU).
  return like.defined() ? out.to(like.device()) : out;
}

void Codec<TensorBits>::put(Writer& w, const TensorBits& v) {
  w.u8('h');
  w.u8(v.whole ? 1 : 0);
  if (v.whole) return put_tensor(w, v.tensor);
  put_shape(w, v.dtype, v.sizes);
  w.u64(v.digest);
}

TensorBits Codec<TensorBits>::get(Reader& r, const TensorBits& like) {
  r.expect_tag('h', "tensor bits");
  TensorBits out;
  out.whole = r.u8() != 0;
  if (out.whole) {
    out.tensor = get_tensor(r, like.tensor);
    if (out.tensor.defined()) {
      out.sizes = out.tensor.sizes().vec();
      out.dtype = out.tensor.scalar_type();
    }
    return out;
  }
  auto [dtype, sizes] = get_shape(r);
  out.dtype = dtype;
  out.sizes = sizes;
  out.digest = r.u64();
  return out;
}

}  // namespace observe_detail

TensorBits TensorBits::of(const torch::Tensor& t) {
  TensorBits b;
  b.tensor = t;
  if (!t.defined()) return b;
  b.sizes = t.sizes().vec();
  b.dtype = t.scalar_type();
  if (static_cast<int64_t>(t.nbytes()) <= kWholeBytes) return b;
  auto host = t.detach().cpu().contiguous();
  b.digest = observe_detail::digest(host.data_ptr(), host.nbytes());
  b.whole = false;
  return b;
}

// ------------------------------------------------------------------ record / check

namespace observe_detail {

void record(const Site& site, Source source, std::string&& payload) {
  Session& s = session();
  if (!s.out) return;
  std::string rec = "V";
  rec.push_back(static_cast<char>(source == Source::kMeasured ? 1 : 0));
  put_str(rec, site.what);
  put_str(rec, site.file);
  Writer line;
  line.u64(static_cast<uint64_t>(site.line));
  rec += line.bytes();
  put_str(rec, payload);
  std::fwrite(rec.data(), 1, rec.size(), s.out);
}

std::optional<std::string> take(const Site& site, Source source) {
  Session& s = session();
  Counts& c = s.counts[s.test];
  if (!s.current || s.diverged) {
    ++c.missing;
    return std::nullopt;  // test_end explains why
  }
  if (s.next >= s.current->values.size()) {
    ++c.missing;
    if (s.current->failures.empty() && s.current->ended)
      s.problems.push_back("your code's run of this test recorded no value for " +
                           site_text(site.what, site.file, static_cast<uint64_t>(site.line)) +
                           " (it recorded " + std::to_string(s.current->values.size()) +
                           " values; the runs diverged)");
    return std::nullopt;
  }
  const ValueRecord& v = s.current->values[s.next++];
  // Both runs link the same compiled tests: the same observation has the same file and line.
  if (v.line != static_cast<uint64_t>(site.line) || v.file != site.file) {
    s.diverged = true;
    ++c.missing;
    s.problems.push_back("the runs diverged: your code's run recorded " +
                         site_text(v.what, v.file, v.line) + " where the driver observes " +
                         site_text(site.what, site.file, static_cast<uint64_t>(site.line)));
    return std::nullopt;
  }
  (source == Source::kMeasured || v.source == Source::kMeasured ? c.measured : c.computed)++;
  return v.payload;
}

void malformed(const Site& site, const std::string& why) {
  Session& s = session();
  ++s.counts[s.test].missing;
  s.problems.push_back("your code's run recorded " +
                       site_text(site.what, site.file, static_cast<uint64_t>(site.line)) +
                       " in a form the driver cannot read: " + why);
}

}  // namespace observe_detail

namespace split {

namespace {

std::string stream_path(const std::string& dir, int rank) {
  return dir + "/rank-" + std::to_string(rank) + ".obs";
}

// Parses the whole stream into per-test records. A malformed record ends the stream there.
void load(Session& s, const std::string& data) {
  std::string current;
  TestRecords* t = nullptr;
  size_t pos = 0;
  try {
    while (pos < data.size()) {
      const char kind = data[pos];
      size_t p = pos + 1;
      auto get_u64 = [&]() {
        if (data.size() - p < 8) throw std::runtime_error("truncated record");
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i)
          v |= static_cast<uint64_t>(static_cast<uint8_t>(data[p + i])) << (8 * i);
        p += 8;
        return v;
      };
      auto get_str = [&]() {
        const uint64_t n = get_u64();
        if (n > data.size() - p) throw std::runtime_error("truncated record");
        std::string v = data.substr(p, n);
        p += n;
        return v;
      };
      if (kind == 'B') {
        current = get_str();
        t = &s.tests[current];
        *t = TestRecords{};
      } else if (kind == 'E') {
        const std::string name = get_str();
        if (!t || name != current) throw std::runtime_error("end of a test that did not begin");
        t->ended = true;
        t = nullptr;
      } else if (kind == 'V') {
        if (!t) throw std::runtime_error("a value outside any test");
        if (data.size() - p < 1) throw std::runtime_error("truncated record");
        ValueRecord v;
        v.source = data[p++] ? Source::kMeasured : Source::kComputed;
        v.what = get_str();
        v.file = get_str();
        v.line = get_u64();
        v.payload = get_str();
        t->values.push_back(std::move(v));
      } else if (kind == 'F') {
        if (!t) throw std::runtime_error("a failure outside any test");
        FailureRecord f;
        f.file = get_str();
        f.line = get_u64();
        f.message = get_str();
        t->failures.push_back(std::move(f));
      } else {
        throw std::runtime_error("unknown record kind");
      }
      pos = p;
    }
  } catch (const std::exception& e) {
    s.stream_problem = std::string("the stream of your code's run is damaged after byte ") +
                       std::to_string(pos) + " (" + e.what() + ")";
  }
}

}  // namespace

void start_record(const std::string& dir, int rank) {
  Session& s = session();
  const std::string path = stream_path(dir, rank);
  s.out = std::fopen(path.c_str(), "wb");
  if (!s.out) throw dtl::Error("--dtl_record: cannot write " + path + ": " + std::strerror(errno));
  s.mode = SplitMode::kRecord;
}

void start_check(const std::string& dir, int rank) {
  Session& s = session();
  const std::string path = stream_path(dir, rank);
  s.mode = SplitMode::kCheck;
  // The worker wrote it, and the worker's file-size limit (1 GiB) is its cap here: never through
  // a link (to /dev/zero, say), never a FIFO or a device (untrusted_file.hpp).
  std::string data, why;
  if (!read_untrusted_file(path, size_t{1} << 30, data, why)) {
    s.stream_problem =
        access(path.c_str(), F_OK) != 0 && errno == ENOENT
            ? "your code's run left no record for rank " + std::to_string(rank) +
                  " (it did not start, or crashed before its first test)"
            : "the record of your code's run for rank " + std::to_string(rank) + " " + why +
                  ": not read";
    return;
  }
  load(s, data);
}

void test_start(const std::string& name, uint64_t seed, int rank) {
  Session& s = session();
  if (s.mode == SplitMode::kLocal) return;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  torch::manual_seed(seed + (h % 1000003) * 64 + static_cast<uint64_t>(rank));
  s.test = name;
  if (s.mode == SplitMode::kRecord) {
    std::string rec = "B";
    put_str(rec, name);
    std::fwrite(rec.data(), 1, rec.size(), s.out);
    std::fflush(s.out);  // a crash inside the test then reads as "ended inside", not "not reached"
    return;
  }
  s.counts[name];
  auto it = s.tests.find(name);
  s.current = it == s.tests.end() ? nullptr : &it->second;
  s.next = 0;
  s.diverged = false;
  s.problems.clear();
}

void test_failed(const char* file, int line, const std::string& message) {
  Session& s = session();
  if (s.mode != SplitMode::kRecord || !s.out) return;
  std::string rec = "F";
  put_str(rec, file ? file : "");
  od::Writer l;
  l.u64(static_cast<uint64_t>(line));
  rec += l.bytes();
  put_str(rec, message.substr(0, 16 << 10));
  std::fwrite(rec.data(), 1, rec.size(), s.out);
}

void test_end() {
  Session& s = session();
  if (s.mode == SplitMode::kRecord) {
    std::string rec = "E";
    put_str(rec, s.test);
    std::fwrite(rec.data(), 1, rec.size(), s.out);
    std::fflush(s.out);
    return;
  }
  if (s.mode != SplitMode::kCheck) return;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  // What the driver itself already reported, by file:line: a failure of the worker at the same
  // place says the same thing once more.
  std::set<std::pair<std::string, int>> reported;
  if (info) {
    const auto* result = info->result();
    for (int i = 0; i < result->total_part_count(); ++i) {
      const auto& part = result->GetTestPartResult(i);
      const std::string file = part.file_name() ? part.file_name() : "";
      reported.insert({file.substr(file.find_last_of('/') + 1), part.line_number()});
    }
  }
  const bool skipped = info && info->result()->Skipped();
  if (skipped) s.counts[s.test].skipped = 1;
  if (!s.current) {
    if (!skipped)
      ADD_FAILURE() << "your code's run did not reach this test (it crashed, hung or exited "
                       "before it)"
                    << (s.stream_problem.empty() ? "" : "; " + s.stream_problem);
  } else {
    for (const auto& f : s.current->failures) {
      const std::string base = f.file.substr(f.file.find_last_of('/') + 1);
      if (reported.count({base, static_cast<int>(f.line)})) continue;
      ADD_FAILURE_AT(f.file.empty() ? "unknown" : f.file.c_str(), static_cast<int>(f.line))
          << f.message;
    }
    if (!s.current->ended)
      ADD_FAILURE() << "your code's run ended inside this test (a crash or an abort)"
                    << (s.stream_problem.empty() ? "" : "; " + s.stream_problem);
    else if (!s.diverged && s.next < s.current->values.size())
      s.problems.push_back("the runs diverged: your code's run recorded " +
                           std::to_string(s.current->values.size()) +
                           " values, the driver observed " + std::to_string(s.next));
  }
  for (const auto& p : s.problems) ADD_FAILURE() << p;
  // A value the driver had to take from its own run must never let the test pass.
  const Counts& c = s.counts[s.test];
  if (c.missing > 0 && s.current && s.current->failures.empty() && s.problems.empty() &&
      s.current->ended)
    ADD_FAILURE() << c.missing << " value(s) of your code's run are missing";
  s.current = nullptr;
}

std::string counts_json() {
  nlohmann::json tests = nlohmann::json::object();
  for (const auto& [name, c] : session().counts)
    tests[name] = {{"computed", c.computed},
                   {"measured", c.measured},
                   {"missing", c.missing},
                   {"skipped", c.skipped}};
  return tests.dump();
}

void write_summary(const std::string& path, const std::vector<std::string>& every_rank) {
  nlohmann::json tests = nlohmann::json::object();
  for (const auto& text : every_rank) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object()) continue;
    for (const auto& [name, c] : j.items()) {
      if (!c.is_object()) continue;
      auto& sum = tests[name];
      if (!sum.is_object())
        sum = {{"computed", 0}, {"measured", 0}, {"missing", 0}, {"skipped", 0}};
      for (const char* k : {"computed", "measured", "missing", "skipped"})
        sum[k] = sum[k].get<long long>() + c.value(k, 0LL);
    }
  }
  // The tests that ran (on some rank) and observed no result of the code under test: their
  // verdict rests on values measured inside its process alone (counters, peaks), which that
  // process can rewrite. CI keeps this list empty (harness/tests/split_run.sh).
  const auto ranks = static_cast<long long>(every_rank.size());
  nlohmann::json in_process_only = nlohmann::json::array();
  for (const auto& [name, c] : tests.items())
    if (c["computed"].get<long long>() == 0 && c["skipped"].get<long long>() < ranks)
      in_process_only.push_back(name);
  std::ofstream out(path);
  out << nlohmann::json{{"tests", tests}, {"in_process_only", in_process_only}}.dump(1) << "\n";
}

}  // namespace split

}  // namespace dtl::testing
