// Tests of dtl/memory.hpp: counting, peak, tags, the limit, and safety around install().
#include "dtl/memory.hpp"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "dtl/error.hpp"

namespace dtl {
namespace memory {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A float tensor of exactly `bytes` bytes.
torch::Tensor tensor_of_bytes(size_t bytes) {
  return torch::empty({static_cast<int64_t>(bytes / sizeof(float))}, torch::kFloat32);
}

// Allocated during static initialisation, i.e. before any test can call install(): its
// storage belongs to the original CPU allocator.
bool g_installed_before_main = installed();
torch::Tensor* g_made_before_install = new torch::Tensor(torch::ones({1 << 18}));

TEST(Memory, InstallIsIdempotent) {
  install();
  ASSERT_TRUE(installed());
  c10::Allocator* first = c10::GetCPUAllocator();
  install();
  EXPECT_EQ(c10::GetCPUAllocator(), first);
  EXPECT_TRUE(installed());
}

TEST(Memory, TensorsAllocatedBeforeInstallAreFreedSafely) {
  ASSERT_FALSE(g_installed_before_main);
  install();
  const size_t before = current_bytes();
  torch::Tensor still_alive = *g_made_before_install;  // shares the pre-install storage
  delete g_made_before_install;
  g_made_before_install = nullptr;
  EXPECT_EQ(still_alive.sum().item<float>(), static_cast<float>(1 << 18));
  still_alive.reset();  // the last reference: freed by the original allocator's deleter
  EXPECT_EQ(current_bytes(), before);
}

TEST(Memory, OneMiBTensorIsCountedAndReturned) {
  install();
  const size_t before = current_bytes();
  torch::Tensor t = tensor_of_bytes(kMiB);
  EXPECT_GE(current_bytes(), before + kMiB);
  EXPECT_GE(peak_bytes(), before + kMiB);
  t.reset();
  EXPECT_EQ(current_bytes(), before);
}

TEST(Memory, TimelineRecordsEveryChangeAndTheMarksInOrder) {
  install();
  record_timeline(true);
  const size_t before = current_bytes();
  torch::Tensor t = tensor_of_bytes(kMiB);
  timeline_mark("between");
  t.reset();
  record_timeline(false);
  torch::Tensor after_recording = tensor_of_bytes(kMiB);  // not recorded
  const std::vector<Sample> samples = timeline();
  ASSERT_GE(samples.size(), 4u);  // start, the allocation, the mark, the free
  EXPECT_EQ(samples.front().label, "start");
  size_t mark = 0;
  while (mark < samples.size() && samples[mark].label != "between") ++mark;
  ASSERT_LT(mark, samples.size());
  EXPECT_EQ(samples[mark].bytes, before + kMiB);  // the mark sees the tensor alive
  EXPECT_EQ(samples.back().bytes, before);        // and the last sample its free
  for (size_t i = 1; i < samples.size(); ++i) EXPECT_GE(samples[i].seconds, samples[i - 1].seconds);
  record_timeline(true);  // a new recording starts empty
  EXPECT_EQ(timeline().size(), 1u);
  record_timeline(false);
}

TEST(Memory, PeakTracksForwardAndBackward) {
  install();
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(256, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 256));
  torch::Tensor x = torch::randn({64, 256});
  const size_t base = current_bytes();
  reset_peak();
  EXPECT_EQ(peak_bytes(), base);
  {
    torch::Tensor loss = net->forward(x).pow(2).sum();
    const size_t after_forward = current_bytes();
    // Saved activations: at least the two [64, 256] float outputs.
    EXPECT_GE(after_forward, base + 2 * 64 * 256 * sizeof(float));
    loss.backward();
  }
  // Backward allocated both [256, 256] weight gradients on top of what forward kept alive.
  EXPECT_GE(peak_bytes(), base + 2 * 256 * 256 * sizeof(float));
  EXPECT_GE(peak_bytes(), current_bytes());
  reset_peak();
  EXPECT_EQ(peak_bytes(), current_bytes());
}

TEST(Memory, ScopesTagAllocationsAndNest) {
  install();
  torch::Tensor params, acts, inner, acts2;
  {
    Scope tag("test.params");
    params = tensor_of_bytes(kMiB);
  }
  {
    Scope tag("test.acts");
    acts = tensor_of_bytes(2 * kMiB);
    {
      Scope nested("test.inner");
      inner = tensor_of_bytes(kMiB / 2);
    }
    acts2 = tensor_of_bytes(kMiB);  // the outer tag is back
  }
  auto tags = bytes_by_tag();
  EXPECT_EQ(tags["test.params"], kMiB);
  EXPECT_EQ(tags["test.acts"], 3 * kMiB);
  EXPECT_EQ(tags["test.inner"], kMiB / 2);
  const std::string table = breakdown();
  EXPECT_NE(table.find("test.acts"), std::string::npos) << table;
  EXPECT_NE(table.find("3.00 MiB"), std::string::npos) << table;

  // The tag is per thread: another thread's allocation is not charged to this Scope.
  {
    Scope tag("test.main");
    torch::Tensor from_thread;
    std::thread worker([&] { from_thread = tensor_of_bytes(kMiB); });
    worker.join();
    EXPECT_EQ(bytes_by_tag().count("test.main"), 0u);
  }

  params.reset();
  acts.reset();
  inner.reset();
  acts2.reset();
  tags = bytes_by_tag();
  EXPECT_EQ(tags.count("test.params"), 0u);
  EXPECT_EQ(tags.count("test.acts"), 0u);
}

TEST(Memory, LimitThrowsOutOfMemoryAndTheProcessGoesOn) {
  install();
  const size_t before = current_bytes();
  const size_t cap = before + 2 * kMiB;
  set_limit(cap);
  EXPECT_EQ(limit(), cap);
  torch::Tensor fits = tensor_of_bytes(kMiB);
  try {
    Scope tag("test.oom");
    torch::Tensor too_big = tensor_of_bytes(4 * kMiB);
    ADD_FAILURE() << "allocating 4 MiB under a limit of current + 1 MiB did not throw";
  } catch (const dtl::OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.requested_bytes, 4 * kMiB);
    EXPECT_EQ(e.limit_bytes, cap);
    EXPECT_NE(msg.find(format_bytes(static_cast<double>(cap))), std::string::npos) << msg;
    EXPECT_NE(msg.find("4.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test.oom"), std::string::npos) << msg;
    EXPECT_NE(msg.find("largest live"), std::string::npos) << msg;
    // The snapshot at the throw, for handlers that run after the stack has unwound.
    EXPECT_EQ(e.current_bytes, before + kMiB);
    EXPECT_GE(e.bytes_by_tag.count("untagged") ? e.bytes_by_tag.at("untagged") : 0, kMiB);
    ASSERT_FALSE(e.largest.empty());
    EXPECT_GE(e.largest.front().first, kMiB);
  }
  EXPECT_EQ(current_bytes(), before + kMiB);  // the refused allocation left no trace

  // Raised from inside an ATen op and from autograd backward, the type survives.
  torch::Tensor w = torch::randn({512, 512}, torch::requires_grad());  // 1 MiB
  EXPECT_THROW(torch::matmul(w, w), dtl::OutOfMemory);
  set_limit(0);
  torch::Tensor loss = torch::matmul(w, w).sum();
  set_limit(current_bytes() + 1024);
  EXPECT_THROW(loss.backward(), dtl::OutOfMemory);

  set_limit(0);
  EXPECT_EQ(limit(), 0u);
  torch::Tensor now_fine = tensor_of_bytes(4 * kMiB);
  EXPECT_GE(current_bytes(), before + 5 * kMiB);
}

TEST(Memory, LargestLiveListsTheBigTensorFirst) {
  install();
  Scope tag("test.big");
  torch::Tensor small = tensor_of_bytes(kMiB);
  torch::Tensor big = tensor_of_bytes(16 * kMiB);
  std::vector<Allocation> top = largest_live(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].bytes, 16 * kMiB);
  EXPECT_EQ(top[0].tag, "test.big");
  EXPECT_GE(top[0].bytes, top[1].bytes);
  EXPECT_LE(largest_live(1000).size(), 1000u);
}

TEST(Memory, CountsAllocationsFromOtherThreadsExactly) {
  install();
  const size_t before = current_bytes();
  // at::parallel_for workers allocating and freeing ...
  at::parallel_for(0, 64, 1, [](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      torch::Tensor t = torch::ones({1024 + i});
      (void)t;
    }
  });
  // ... and plain threads racing.
  std::vector<std::thread> threads;
  std::atomic<bool> ok{true};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&ok] {
      for (int i = 0; i < 200; ++i) {
        torch::Tensor t = torch::empty({256 + i});
        if (!t.defined()) ok = false;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(ok);
  EXPECT_EQ(current_bytes(), before);
}

// The device overloads: the CPU is the tracker itself; a GPU reads the CUDA caching allocator
// (checked where a GPU exists); without one, measuring a GPU is an error, never a crash.
TEST(Memory, DeviceOverloadsMeasureTheCpuAndCudaOrSayWhyNot) {
  install();
  const c10::Device cpu(c10::kCPU);
  const size_t before = current_bytes(cpu);
  torch::Tensor t = tensor_of_bytes(kMiB);
  EXPECT_GE(current_bytes(cpu), before + kMiB);
  reset_peak(cpu);  // the tracker's peak drops to its current bytes
  EXPECT_LT(peak_bytes(), before + 2 * kMiB);
  t.reset();
  EXPECT_LT(current_bytes(cpu), before + kMiB);

  const c10::Device gpu(c10::kCUDA, 0);
  if (!torch::cuda::is_available()) {
    EXPECT_THROW(current_bytes(gpu), dtl::Error);
    return;
  }
  torch::Tensor warm = torch::empty({1}, torch::TensorOptions().device(gpu));  // CUDA initialised
  const size_t gpu_before = current_bytes(gpu);
  reset_peak(gpu);
  torch::Tensor g = torch::empty({static_cast<int64_t>(kMiB / sizeof(float))},
                                 torch::TensorOptions().device(gpu));
  EXPECT_EQ(current_bytes(gpu), gpu_before + kMiB);  // 1 MiB is a multiple of 512 B: exact
  g.reset();
  EXPECT_EQ(current_bytes(gpu), gpu_before);
  EXPECT_EQ(peak_bytes(gpu), gpu_before + kMiB);
}

TEST(Memory, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024), "1.50 MiB");
  EXPECT_EQ(format_bytes(3.0 * 1024 * 1024 * 1024), "3.00 GiB");
}

}  // namespace
}  // namespace memory
}  // namespace dtl
