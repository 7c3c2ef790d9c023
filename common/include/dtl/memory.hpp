// dtl/memory.hpp — defines: memory::install, current_bytes, peak_bytes, reset_peak, set_limit,
// limit, Scope (allocation tags), bytes_by_tag, Allocation, largest_live, breakdown,
// format_bytes, record_timeline, timeline_mark, timeline; current_bytes(device), peak_bytes(device), reset_peak(device) for any device.
//
// A tracking CPU allocator: the CPU analogue of torch.cuda.memory_allocated() and
// max_memory_allocated(). install() wraps LibTorch's CPU allocator, so every CPU tensor
// created afterwards (forward, autograd backward, intra-op worker threads, comm buffers) is
// counted while it is alive. An optional limit turns "this would not fit on my GPU" into a
// dtl::OutOfMemory with a breakdown of who holds the memory (the OOM lab).
//
//   dtl::memory::install();
//   dtl::memory::reset_peak();
//   { dtl::memory::Scope tag("activations"); loss = model->loss(batch); }
//   loss.backward();
//   print0("peak {}", dtl::memory::format_bytes(dtl::memory::peak_bytes()));
//
// Bytes are the sizes tensors asked for (storage nbytes), not what malloc rounds them up to,
// so the numbers match a hand calculation of parameters + activations + optimizer state.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace dtl {
namespace memory {

// Installs the tracker in front of the current c10 CPU allocator. Idempotent and thread-safe.
// Tensors allocated before install() are not counted, and freeing them later is safe.
void install();
bool installed();

size_t current_bytes();  // live bytes allocated through the tracker
size_t peak_bytes();     // max of current_bytes() since install() or the last reset_peak()
void reset_peak();       // peak = current

// The same three for the memory of one device, so that code measuring "the memory of the
// device I train on" runs unchanged on a GPU:
//   CPU   the tracker above (exactly current_bytes() / peak_bytes() / reset_peak());
//   CUDA  the CUDA caching allocator's allocated-bytes statistics for that GPU (what
//         torch.cuda.memory_allocated / max_memory_allocated / reset_peak_memory_stats read).
//         Those count each block rounded up to the allocator's 512-byte granularity, so small
//         tensors weigh a little more than their nbytes. Tags, limits and breakdowns are
//         CPU-only: on a GPU the device's own memory is the limit.
// A CUDA device with a LibTorch built without CUDA is a dtl::Error.
size_t current_bytes(const c10::Device& device);
size_t peak_bytes(const c10::Device& device);
void reset_peak(const c10::Device& device);

// A timeline of current_bytes() over a stretch of code, for figures of memory over a step
// (./lab figures draws labs 06 and 13 from it). While recording, every allocation and free
// through the tracker appends a Sample; timeline_mark adds a labelled one ("backward") at a
// point of the program's choosing. record_timeline(true) clears the last recording; off by
// default (recording costs one push_back per allocation, under the tracker's lock).
struct Sample {
  double seconds;     // since record_timeline(true), steady clock
  size_t bytes;       // current_bytes() after the allocation or free
  std::string label;  // "" for allocations and frees; the mark's label otherwise
};
void record_timeline(bool on);
void timeline_mark(const char* label);
std::vector<Sample> timeline();

// 0 = no limit. An allocation that would take current_bytes() above the limit throws
// dtl::OutOfMemory (requested, current, limit, per-tag bytes, largest live allocations);
// nothing is allocated then, so the program can catch it, free memory and go on.
void set_limit(size_t bytes);
size_t limit();

// Tags allocations made on this thread while alive ("params", "activations", "optimizer"),
// for breakdowns. Nestable: the innermost Scope wins and the outer tag comes back when it
// ends. The tag is per thread: allocations of other threads (intra-op workers, comm workers)
// count under their own thread's tag, "untagged" when they have none. The tracker counts
// every allocation whether or not it is tagged.
class Scope {
 public:
  explicit Scope(const char* tag);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int previous_;  // tag id active before this Scope, restored by the destructor
};

std::map<std::string, size_t> bytes_by_tag();  // live bytes per tag (tags with live bytes only)

struct Allocation {
  size_t bytes;
  std::string tag;
};
std::vector<Allocation> largest_live(size_t k);  // the k largest live allocations, largest first

// Human-readable table: current, peak, limit, live bytes per tag, the largest allocations.
std::string breakdown();

// 1536 -> "1.50 KiB", 1.5 * 2^20 -> "1.50 MiB", 100 -> "100 B".
std::string format_bytes(double bytes);

}  // namespace memory
}  // namespace dtl
