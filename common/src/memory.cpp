// The tracking CPU allocator behind dtl/memory.hpp.
//
// How it works: LibTorch asks c10::GetCPUAllocator() for every new CPU storage. install()
// puts a TrackingAllocator there that forwards to the allocator it replaced (the "base") and
// records each live block in a table keyed by its data pointer: the base's own DataPtr (which
// knows how to free the block), its size and its tag. The DataPtr we hand out carries our
// deleter, so when the last tensor using the block dies we update the counters and let the
// base DataPtr free it. Storages created before install() keep the base allocator's deleter
// and never touch our table, so freeing them later is safe and does not change the counts.
#include "dtl/memory.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "dtl/error.hpp"

// DTL_TORCH_HAS_CUDA=1 only with a CUDA LibTorch (cmake/DtlGpu.cmake): the CUDA caching
// allocator's statistics for the device overloads.
#if DTL_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

// LibTorch 2.3 changed c10::Allocator in two ways a custom allocator must follow:
//  - allocate() lost its `const` (pytorch/pytorch#120969, merged 2024-03: allocators have
//    state, so allocating is not a const operation);
//  - the pure virtual copy_data(dest, src, count) const appeared (copy-on-write storages,
//    pytorch/pytorch#113396 landed as #117053 in 2024-01, after the 2.2 branch cut): an
//    allocator must say how to copy bytes between two of its blocks; CPU memory uses the
//    provided default_copy_data (memcpy).
// Both landed between the 2.2 and 2.3 releases, so one guard covers them.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DTL_ALLOCATOR_2_3 1
#define DTL_ALLOCATE_CONST
#else
#define DTL_ALLOCATOR_2_3 0
#define DTL_ALLOCATE_CONST const
#endif

namespace dtl {
namespace memory {
namespace {

constexpr int kUntagged = 0;  // tag id of allocations made outside any Scope

// The tag of the innermost Scope alive on this thread.
thread_local int t_current_tag = kUntagged;

struct LiveBlock {
  c10::DataPtr base;  // the base allocator's DataPtr: destroying it frees the block
  size_t bytes;
  int tag;
};

class TrackingAllocator;  // defined below; State only holds a pointer to it

// Everything the tracker knows, behind one mutex: allocations come from any thread (autograd,
// at::parallel_for workers, comm workers), and a mutex is cheap next to a malloc.
struct State {
  std::mutex mu;
  TrackingAllocator* tracker = nullptr;
  size_t current = 0;
  size_t peak = 0;
  size_t limit = 0;
  std::vector<std::string> tag_names{"untagged"};
  std::vector<size_t> tag_bytes{0};
  std::unordered_map<std::string, int> tag_ids{{"untagged", kUntagged}};
  std::unordered_map<void*, LiveBlock> live;
  // record_timeline(true) .. (false): every change of `current`, for figures of a step.
  bool recording = false;
  std::chrono::steady_clock::time_point t0;
  std::vector<Sample> samples;
};

// Caller holds state().mu.
void sample_locked(State& s, const char* label = "") {
  if (!s.recording) return;
  const std::chrono::duration<double> t = std::chrono::steady_clock::now() - s.t0;
  s.samples.push_back({t.count(), s.current, label});
}

// Never destroyed on purpose: tensors held by static objects are freed after main() returns,
// and their deleter must still find the table.
State& state() {
  static State* s = new State();
  return *s;
}

// Caller holds state().mu.
std::vector<Allocation> largest_locked(const State& s, size_t k) {
  std::vector<Allocation> all;
  all.reserve(s.live.size());
  for (const auto& entry : s.live) {
    all.push_back({entry.second.bytes, s.tag_names[static_cast<size_t>(entry.second.tag)]});
  }
  k = std::min(k, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end(),
                    [](const Allocation& a, const Allocation& b) { return a.bytes > b.bytes; });
  all.resize(k);
  return all;
}

// Caller holds state().mu.
std::string breakdown_locked(const State& s) {
  std::string out = fmt::format("memory: current {} | peak {} | limit {}\n",
                                format_bytes(static_cast<double>(s.current)),
                                format_bytes(static_cast<double>(s.peak)),
                                s.limit ? format_bytes(static_cast<double>(s.limit)) : "none");
  out += "  live bytes by tag:\n";
  for (size_t i = 0; i < s.tag_names.size(); ++i) {
    if (s.tag_bytes[i] == 0) continue;
    out += fmt::format("    {:<16} {:>12}\n", s.tag_names[i],
                       format_bytes(static_cast<double>(s.tag_bytes[i])));
  }
  out += "  largest live allocations:\n";
  for (const Allocation& a : largest_locked(s, 5)) {
    out += fmt::format("    {:>12}  {}\n", format_bytes(static_cast<double>(a.bytes)), a.tag);
  }
  return out;
}

// The deleter of every DataPtr the tracker hands out. Its argument is the block's data
// pointer (context == data, like the default CPU allocator, so raw_deleter() works too).
void free_tracked(void* data) {
  c10::DataPtr base;  // declared first: frees the block after the lock is released
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(data);
  if (it == s.live.end()) return;  // unreachable: every block we hand out is in the table
  s.current -= it->second.bytes;
  s.tag_bytes[static_cast<size_t>(it->second.tag)] -= it->second.bytes;
  sample_locked(s);
  base = std::move(it->second.base);
  s.live.erase(it);
}

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) DTL_ALLOCATE_CONST override {
    // Empty storages own no memory; nothing to count.
    if (n == 0) return base_->allocate(0);
    const int tag = t_current_tag;
    State& s = state();
    {
      // Reserve the bytes before allocating, so a limit stops the allocation from happening.
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.limit != 0 && s.current + n > s.limit) {
        OutOfMemory oom(
            fmt::format("{}out of memory: cannot allocate {} ({} bytes, tag \"{}\") with {} "
                        "live; the limit is {} (dtl::memory::set_limit)\n{}",
                        rank_prefix(), format_bytes(static_cast<double>(n)), n,
                        s.tag_names[static_cast<size_t>(tag)],
                        format_bytes(static_cast<double>(s.current)),
                        format_bytes(static_cast<double>(s.limit)), breakdown_locked(s)),
            n, s.current, s.limit);
        for (size_t i = 0; i < s.tag_names.size(); ++i)
          if (s.tag_bytes[i] != 0) oom.bytes_by_tag[s.tag_names[i]] = s.tag_bytes[i];
        for (const Allocation& a : largest_locked(s, 8)) oom.largest.emplace_back(a.bytes, a.tag);
        throw oom;
      }
      s.current += n;
      s.tag_bytes[static_cast<size_t>(tag)] += n;
      sample_locked(s);
    }
    c10::DataPtr base;
    try {
      base = base_->allocate(n);
    } catch (...) {  // a real out-of-memory: give the reservation back
      std::lock_guard<std::mutex> lock(s.mu);
      s.current -= n;
      s.tag_bytes[static_cast<size_t>(tag)] -= n;
      throw;
    }
    void* data = base.get();
    const c10::Device device = base.device();
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.peak = std::max(s.peak, s.current);
      s.live.emplace(data, LiveBlock{std::move(base), n, tag});
    }
    return c10::DataPtr(data, data, &free_tracked, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_tracked; }

#if DTL_ALLOCATOR_2_3
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  c10::Allocator* base_;
};

}  // namespace

void install() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  c10::Allocator* active = c10::GetCPUAllocator();
  if (s.tracker != nullptr && active == s.tracker) return;
  // The tracker lives forever (c10 keeps a raw pointer and storages remember their allocator).
  // If someone replaced the CPU allocator after us, wrap the new one: never lose allocations.
  s.tracker = new TrackingAllocator(active);
  // c10 keeps the allocator with the highest priority (the built-in one registers with 0), so
  // the maximum wins over everything registered at start-up. c10::SetCPUAllocator is not
  // synchronised with allocating threads: install early (the Runtime does it at start-up).
  c10::SetCPUAllocator(s.tracker, std::numeric_limits<uint8_t>::max());
  s.peak = s.current;
}

bool installed() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.tracker != nullptr && c10::GetCPUAllocator() == s.tracker;
}

size_t current_bytes() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.current;
}

size_t peak_bytes() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.peak;
}

void reset_peak() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.peak = s.current;
}

void record_timeline(bool on) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (on) {
    s.samples.clear();
    s.t0 = std::chrono::steady_clock::now();
  }
  s.recording = on;
  sample_locked(s, on ? "start" : "");
}

void timeline_mark(const char* label) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  sample_locked(s, label);
}

std::vector<Sample> timeline() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.samples;
}

namespace {

#if DTL_TORCH_HAS_CUDA
// allocated_bytes is indexed by StatType; AGGREGATE (all pools) is 0 in every LibTorch since
// 1.8, whichever namespace the enum lives in (it moved to c10::CachingDeviceAllocator in 2.6).
constexpr size_t kAggregate = 0;

auto cuda_allocated(const c10::Device& device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[kAggregate];
}
#endif

// The device overloads accept the CPU and, with a CUDA LibTorch, a CUDA device with an index.
void check_measurable(const c10::Device& device) {
  if (device.is_cpu()) return;
  DTL_CHECK(device.is_cuda(), fmt::format("memory: cannot measure device {}: only cpu and cuda",
                                          device.str()));
#if DTL_TORCH_HAS_CUDA
  DTL_CHECK(device.has_index(),
            fmt::format("memory: measure a CUDA device with an index (cuda:0), got {}", device.str()));
  // The allocator keeps one statistics block per visible GPU: never index past them.
  const int visible = static_cast<int>(c10::cuda::device_count());
  DTL_CHECK(device.index() < visible,
            fmt::format("memory: cannot measure {}: {} GPU(s) visible", device.str(), visible));
#else
  throw Error(fmt::format("memory: cannot measure {}: this LibTorch was built without CUDA",
                          device.str()));
#endif
}

}  // namespace

size_t current_bytes(const c10::Device& device) {
  check_measurable(device);
#if DTL_TORCH_HAS_CUDA
  if (device.is_cuda()) return static_cast<size_t>(cuda_allocated(device).current);
#endif
  return current_bytes();
}

size_t peak_bytes(const c10::Device& device) {
  check_measurable(device);
#if DTL_TORCH_HAS_CUDA
  if (device.is_cuda()) return static_cast<size_t>(cuda_allocated(device).peak);
#endif
  return peak_bytes();
}

void reset_peak(const c10::Device& device) {
  check_measurable(device);
#if DTL_TORCH_HAS_CUDA
  // Resets every peak statistic of that GPU (there is no per-statistic reset).
  if (device.is_cuda()) return c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  reset_peak();
}

void set_limit(size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.limit = bytes;
}

size_t limit() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.limit;
}

Scope::Scope(const char* tag) : previous_(t_current_tag) {
  DTL_CHECK(tag != nullptr, "memory::Scope: tag must not be null");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.tag_ids.find(tag);
  if (it == s.tag_ids.end()) {
    // Tags are interned: a block stores a small id, and a tag outlives the string passed in.
    it = s.tag_ids.emplace(tag, static_cast<int>(s.tag_names.size())).first;
    s.tag_names.emplace_back(tag);
    s.tag_bytes.push_back(0);
  }
  t_current_tag = it->second;
}

Scope::~Scope() { t_current_tag = previous_; }

std::map<std::string, size_t> bytes_by_tag() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::map<std::string, size_t> out;
  for (size_t i = 0; i < s.tag_names.size(); ++i) {
    if (s.tag_bytes[i] != 0) out[s.tag_names[i]] = s.tag_bytes[i];
  }
  return out;
}

std::vector<Allocation> largest_live(size_t k) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return largest_locked(s, k);
}

std::string breakdown() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return breakdown_locked(s);
}

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const bool negative = bytes < 0;
  double value = negative ? -bytes : bytes;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    value /= 1024.0;
    ++unit;
  }
  const char* sign = negative ? "-" : "";
  if (unit == 0) return fmt::format("{}{:.0f} B", sign, value);
  return fmt::format("{}{:.2f} {}", sign, value, kUnits[unit]);
}

}  // namespace memory
}  // namespace dtl
