// dtl/harness/observe.hpp — defines: observe, OBSERVE, MEASURED, Source, split_mode,
// TensorBits.
//
// The autograder's split run. A test binary that links your code can report anything about
// itself: code running in a process can reach everything in that process, the test report
// included. So the autograder never takes the verdict from it. It runs each test twice:
//
//   worker  (your code, in a sandbox)    --dtl_record=DIR   writes what your code produced
//   driver  (the reference, trusted)     --dtl_check=DIR    runs the same test, and wherever the
//                                                           test takes a value from the code
//                                                           under test it uses *your* value,
//                                                           read from DIR, instead of its own
//
// and scores the driver's report. Both runs draw the same inputs (the grader gives both the same
// DTL_SEED), so the driver computes the expected values itself, in a process your code never
// ran in, and every assertion about your values is evaluated there.
//
// What marks "a value from the code under test": the harness's checks observe their `actual`
// argument themselves (tensors_close, tensors_equal, params_close, same_on_all_ranks,
// expect_modules_close, error_of), and a test wraps anything else it asserts on:
//
//   EXPECT_EQ(OBSERVE(plan.tp), 2);                       // a result your code computed
//   EXPECT_EQ(MEASURED(comm->stats().bytes_sent), 96);    // a figure measured in your process
//
// OBSERVE is for results: the driver checks them, and forging one means computing it. MEASURED is
// for what only your process can see (bytes a Comm moved, a memory peak, trace times): the
// driver checks it too, but its value comes from a process your code ran in, so the grader
// lists such checks as in-process. Observe what you assert on, not what you compute with: in
// the driver, OBSERVE(x) returns the worker's x (detached from autograd).
//
// Locally (no flag) observe() returns its argument: tests read and behave exactly as before.
// Failures your code's run raised itself (an exception, "not implemented", an assertion on a
// value nobody observed) are carried to the driver and count there too: they can only cost
// points, never earn them. Observations are matched in order within a test; a run whose
// observations stop early, diverge or are missing fails that test with a message that says so.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtl/comm.hpp"

namespace dtl::testing {

enum class Source {
  kComputed,  // a result of the code under test: checked in the driver, cannot be forged
  kMeasured,  // measured inside the code's process: checked in the driver, can be forged there
};

enum class SplitMode { kLocal, kRecord, kCheck };
SplitMode split_mode();

namespace observe_detail {

// The bytes of one observed value. Untrusted on the way in: every read is bounds-checked and
// throws std::runtime_error on a malformed stream.
class Writer {
 public:
  void u8(uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
  void u64(uint64_t v);
  void f64(double v);
  void str(const std::string& s);
  void raw(const void* data, size_t n) { bytes_.append(static_cast<const char*>(data), n); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  uint8_t u8();
  uint64_t u64();
  double f64();
  std::string str();
  const char* raw(size_t n);
  void expect_tag(char tag, const char* what);
  bool done() const { return pos_ == bytes_.size(); }

 private:
  const std::string& bytes_;
  size_t pos_ = 0;
};

void put_tensor(Writer& w, const torch::Tensor& t);
torch::Tensor get_tensor(Reader& r, const torch::Tensor& like);

template <typename T, typename Enable = void>
struct Codec {
  static_assert(sizeof(T) == 0,
                "observe(): no encoding for this type; observe its fields (numbers, strings, "
                "tensors, vectors of those) one by one");
};
template <>
struct Codec<bool> {
  static void put(Writer& w, bool v) { w.u8('b'), w.u8(v ? 1 : 0); }
  static bool get(Reader& r, bool) { return r.expect_tag('b', "bool"), r.u8() != 0; }
};
template <typename T>
struct Codec<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static void put(Writer& w, T v) { w.u8('i'), w.u64(static_cast<uint64_t>(v)); }
  static T get(Reader& r, T) { return r.expect_tag('i', "integer"), static_cast<T>(r.u64()); }
};
template <typename T>
struct Codec<T, std::enable_if_t<std::is_enum_v<T>>> {
  static void put(Writer& w, T v) { w.u8('i'), w.u64(static_cast<uint64_t>(v)); }
  static T get(Reader& r, T) { return r.expect_tag('i', "enum"), static_cast<T>(r.u64()); }
};
template <typename T>
struct Codec<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static void put(Writer& w, T v) { w.u8('d'), w.f64(static_cast<double>(v)); }
  static T get(Reader& r, T) { return r.expect_tag('d', "number"), static_cast<T>(r.f64()); }
};
template <>
struct Codec<std::string> {
  static void put(Writer& w, const std::string& v) { w.u8('s'), w.str(v); }
  static std::string get(Reader& r, const std::string&) {
    return r.expect_tag('s', "string"), r.str();
  }
};
template <>
struct Codec<torch::Tensor> {
  static void put(Writer& w, const torch::Tensor& v) { put_tensor(w, v); }
  static torch::Tensor get(Reader& r, const torch::Tensor& like) { return get_tensor(r, like); }
};
template <typename T>
struct Codec<std::vector<T>> {
  static void put(Writer& w, const std::vector<T>& v) {
    w.u8('v'), w.u64(v.size());
    for (const auto& x : v) Codec<T>::put(w, x);
  }
  static std::vector<T> get(Reader& r, const std::vector<T>& like) {
    r.expect_tag('v', "list");
    const uint64_t n = r.u64();
    std::vector<T> out;
    for (uint64_t i = 0; i < n; ++i) {
      // The driver's own element of the same index shapes the decoding (a tensor's device).
      out.push_back(Codec<T>::get(r, i < like.size() ? like[i] : T{}));
    }
    return out;
  }
};
template <typename T>
struct Codec<std::set<T>> {
  static void put(Writer& w, const std::set<T>& v) {
    w.u8('v'), w.u64(v.size());
    for (const auto& x : v) Codec<T>::put(w, x);
  }
  static std::set<T> get(Reader& r, const std::set<T>&) {
    r.expect_tag('v', "set");
    const uint64_t n = r.u64();
    std::set<T> out;
    for (uint64_t i = 0; i < n; ++i) out.insert(Codec<T>::get(r, T{}));
    return out;
  }
};
template <typename K, typename V>
struct Codec<std::map<K, V>> {
  static void put(Writer& w, const std::map<K, V>& v) {
    w.u8('m'), w.u64(v.size());
    for (const auto& [k, x] : v) Codec<K>::put(w, k), Codec<V>::put(w, x);
  }
  static std::map<K, V> get(Reader& r, const std::map<K, V>& like) {
    r.expect_tag('m', "map");
    const uint64_t n = r.u64();
    std::map<K, V> out;
    for (uint64_t i = 0; i < n; ++i) {
      K k = Codec<K>::get(r, K{});
      auto it = like.find(k);
      out[k] = Codec<V>::get(r, it == like.end() ? V{} : it->second);
    }
    return out;
  }
};
// A Comm's counters (MEASURED(comm->stats())): what it moved, as its own process counted.
template <>
struct Codec<dtl::OpStats> {
  static void put(Writer& w, const dtl::OpStats& v) {
    w.u8('c'), w.u64(static_cast<uint64_t>(v.count)), w.u64(static_cast<uint64_t>(v.bytes)),
        w.f64(v.wire_bytes);
  }
  static dtl::OpStats get(Reader& r, const dtl::OpStats&) {
    r.expect_tag('c', "op counters");
    dtl::OpStats s;
    s.count = static_cast<int64_t>(r.u64());
    s.bytes = static_cast<int64_t>(r.u64());
    s.wire_bytes = r.f64();
    return s;
  }
};
template <>
struct Codec<dtl::CommStats> {
  static void put(Writer& w, const dtl::CommStats& v) {
    Codec<std::map<dtl::OpType, dtl::OpStats>>::put(w, v.ops);
  }
  static dtl::CommStats get(Reader& r, const dtl::CommStats& like) {
    dtl::CommStats s;
    s.ops = Codec<std::map<dtl::OpType, dtl::OpStats>>::get(r, like.ops);
    return s;
  }
};
// One op as the Comm recorded it (MEASURED(comm->recent_ops())).
template <>
struct Codec<dtl::OpRecord> {
  static void put(Writer& w, const dtl::OpRecord& r) {
    w.u8('r'), w.u64(r.seq), w.u64(static_cast<uint64_t>(r.op)), w.str(r.dtype);
    w.u64(r.shape.size());
    for (int64_t d : r.shape) w.u64(static_cast<uint64_t>(d));
    w.u64(static_cast<uint64_t>(r.bytes)), w.u64(static_cast<uint64_t>(static_cast<int64_t>(r.peer)));
    w.u64(static_cast<uint64_t>(r.state)), w.f64(r.issued), w.f64(r.started), w.f64(r.finished);
  }
  static dtl::OpRecord get(Reader& r, const dtl::OpRecord&) {
    r.expect_tag('r', "op record");
    dtl::OpRecord o;
    o.seq = r.u64();
    o.op = static_cast<dtl::OpType>(r.u64());
    o.dtype = r.str();
    const uint64_t dims = r.u64();
    if (dims > 16) throw std::runtime_error("op record: too many dimensions");
    for (uint64_t i = 0; i < dims; ++i) o.shape.push_back(static_cast<int64_t>(r.u64()));
    o.bytes = static_cast<int64_t>(r.u64());
    o.peer = static_cast<int>(static_cast<int64_t>(r.u64()));
    const uint64_t state = r.u64();
    if (state > static_cast<uint64_t>(dtl::OpRecord::State::Failed)) throw std::runtime_error("op record: bad state");
    o.state = static_cast<dtl::OpRecord::State>(state);
    o.issued = r.f64(), o.started = r.f64(), o.finished = r.f64();
    return o;
  }
};
template <typename A, typename B>
struct Codec<std::pair<A, B>> {
  static void put(Writer& w, const std::pair<A, B>& v) {
    Codec<A>::put(w, v.first), Codec<B>::put(w, v.second);
  }
  static std::pair<A, B> get(Reader& r, const std::pair<A, B>& like) {
    A a = Codec<A>::get(r, like.first);
    return {std::move(a), Codec<B>::get(r, like.second)};
  }
};
template <typename T>
struct Codec<std::optional<T>> {
  static void put(Writer& w, const std::optional<T>& v) {
    w.u8('o'), w.u8(v ? 1 : 0);
    if (v) Codec<T>::put(w, *v);
  }
  static std::optional<T> get(Reader& r, const std::optional<T>& like) {
    r.expect_tag('o', "optional");
    if (!r.u8()) return std::nullopt;
    return Codec<T>::get(r, like ? *like : T{});
  }
};

}  // namespace observe_detail

// A tensor as a bitwise comparison needs it: whole when small; above kWholeBytes only its
// shape, dtype and a 64-bit digest of its bytes, so the split run does not ship megabytes that
// one equality decides. tensors_equal and same_on_all_ranks observe this.
struct TensorBits {
  static constexpr int64_t kWholeBytes = 1 << 20;
  torch::Tensor tensor;  // always set locally; in the driver only when `whole`
  std::vector<int64_t> sizes;
  torch::ScalarType dtype = torch::kFloat32;
  uint64_t digest = 0;
  bool whole = true;
  static TensorBits of(const torch::Tensor& t);  // undefined tensors: sizes empty, whole
};

namespace observe_detail {
template <>
struct Codec<TensorBits> {
  static void put(Writer& w, const TensorBits& v);
  static TensorBits get(Reader& r, const TensorBits& like);
};

struct Site {
  const char* what;
  const char* file;
  int line;
};
// Record mode: appends one value to this rank's stream.
void record(const Site& site, Source source, std::string&& payload);
// Check mode: the worker's payload for this observation, or nothing (the test is then failed
// with the reason; the caller carries on with its own value so the test can finish).
std::optional<std::string> take(const Site& site, Source source);
// Check mode: the worker's payload could not be decoded as the driver's type.
void malformed(const Site& site, const std::string& why);

}  // namespace observe_detail

// See the top of this file. `what` names the value in messages (OBSERVE passes its expression).
template <typename T>
std::decay_t<T> observe(T&& value, const char* what = "value", Source source = Source::kComputed,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using V = std::decay_t<T>;
  namespace od = observe_detail;
  const SplitMode mode = split_mode();
  if (mode == SplitMode::kLocal) return std::forward<T>(value);
  const od::Site site{what, file, line};
  if (mode == SplitMode::kRecord) {
    od::Writer w;
    od::Codec<V>::put(w, value);
    od::record(site, source, std::move(w.bytes()));
    return std::forward<T>(value);
  }
  std::optional<std::string> payload = od::take(site, source);
  if (!payload) return std::forward<T>(value);
  try {
    od::Reader r(*payload);
    V theirs = od::Codec<V>::get(r, value);
    if (!r.done()) throw std::runtime_error("trailing bytes");
    return theirs;
  } catch (const std::exception& e) {
    od::malformed(site, e.what());
    return std::forward<T>(value);
  }
}

// Observes a result's numeric fields as one list, in place: for a struct without a codec of its
// own, e.g. observe_fields("Summary (wall, comm)", {&s.wall, &s.comm}, Source::kComputed, f, l).
// A recorded list of another length fails the test as unreadable and keeps the local values.
template <typename T>
void observe_fields(const char* what, std::initializer_list<T*> fields, Source source,
                    const char* file, int line) {
  std::vector<T> v;
  for (const T* f : fields) v.push_back(*f);
  v = observe(std::move(v), what, source, file, line);
  if (v.size() != fields.size()) {
    observe_detail::malformed({what, file, line}, std::to_string(v.size()) + " fields, expected " +
                                                      std::to_string(fields.size()));
    return;
  }
  size_t i = 0;
  for (T* f : fields) *f = v[i++];
}

}  // namespace dtl::testing

#define OBSERVE(expr) ::dtl::testing::observe((expr), #expr)
#define MEASURED(expr) ::dtl::testing::observe((expr), #expr, ::dtl::testing::Source::kMeasured)
