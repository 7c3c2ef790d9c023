// dtl/harness/checks.hpp — defines: expect_close, assert_close, expect_same_on_all_ranks,
// flat_params, flat_grads, params_close, expect_modules_close, serial (ground-truth helper),
// my_rows, equality_adamw.
//
// The oracles of the labs: a parallel result must equal serial single-process training from the
// same seed and global batch, and every rank must agree. These checks say *where* they
// disagree (worst element, its index, both values), because "tensors differ" teaches nothing.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtl/comm.hpp"
#include "dtl/data.hpp"
#include "dtl/harness/observe.hpp"
#include "dtl/error.hpp"
#include "dtl/model.hpp"
#include "dtl/optim.hpp"
#include "dtl/runtime.hpp"

namespace dtl::testing {

// A fresh Comm per test (a dup of the world): its stats and op records hold this test's traffic
// only, and a buggy algorithm that leaves a message unreceived cannot break the tests after it.
inline std::shared_ptr<Comm> fresh_comm() { return dtl::world().dup(); }

// The device every test tensor and model lives on: the Runtime's (--device cpu|cuda). Draw
// random data and build seeded models on the CPU, then move them here, so a CUDA run checks
// the same numbers as a CPU run.
inline torch::Device device() { return dtl::Runtime::get().device(); }
// A course GPT with the given layers, width, heads, vocabulary, context and dropout (the rest
// GPTConfig's defaults): the test configurations of the memory labs (06, 13).
inline model::GPTConfig gpt_config(int64_t layers, int64_t d, int64_t heads, int64_t vocab,
                                   int64_t seq_len, double dropout = 0.0) {
  model::GPTConfig c;
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = heads;
  c.vocab_size = vocab;
  c.seq_len = seq_len;
  c.dropout = dropout;
  return c;
}

// This rank's rows of step `step`'s global batch, every rank the same number (the trainers of
// labs 14 and 15 take their own rows, the serial oracle the whole batch).
inline torch::Tensor my_rows(const data::GlobalBatchSampler& sampler, int64_t step, const Comm& comm) {
  const int64_t per = sampler.global_batch() / comm.size();
  return sampler.rows(step, comm.rank() * per, (comm.rank() + 1) * per).to(device());
}

// AdamW for equality tests against a serial or DDP oracle. eps 1e-6: Adam divides by
// sqrt(v) + eps, which amplifies the last-bit differences between sums in different orders for
// gradients near eps. eps >= 1 (far above sqrt(v)) makes the update proportional to the
// gradient: a gradient summed instead of averaged over the ranks then shows (lr 0.5 makes those
// steps large enough to see).
inline OptimConfig equality_adamw(double eps = 1e-6, double weight_decay = 0.0) {
  OptimConfig oc;
  oc.eps = eps;
  oc.weight_decay = weight_decay;
  if (eps >= 1) oc.lr = 0.5;
  return oc;
}

inline torch::TensorOptions device_options(torch::ScalarType dtype = torch::kFloat32) {
  return torch::TensorOptions().dtype(dtype).device(device());
}

// Default tolerances: float32 accumulations of the tiny test models in different orders.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// On CUDA every tolerance (default or explicit) is multiplied by this before comparing: cuBLAS
// picks different kernels (tiling, split-K) for a full and a sharded matrix, so the serial
// oracle and the parallel run sum in more different orders than on the CPU, and some backward
// kernels (embedding, index_add) accumulate with atomics in a nondeterministic order. Exact
// comparisons (tensors_equal) are never widened.
constexpr double kCudaToleranceScale = 10.0;

// Every check below observes its `actual` argument (dtl/harness/observe.hpp): in the
// autograder's split run, the driver compares the value your code's run produced with the
// expected value it computed itself. So `actual` is always the value under test, `expected`
// the oracle; never the other way round. The trailing file/line default to the caller's.
//
// gtest predicate-style comparison: shapes and dtypes must match, then
// |actual - expected| <= atol + rtol * |expected| elementwise (x kCudaToleranceScale on CUDA). The failure message names the
// worst element (flat index and multi-index), both values, and how many elements fail.
::testing::AssertionResult tensors_close(const torch::Tensor& actual, const torch::Tensor& expected,
                                         double rtol = kRtol, double atol = kAtol,
                                         const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE());
// Exact equality (bitwise for floats), e.g. for integer results and bitwise-resume oracles.
::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const torch::Tensor& expected,
                                         const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE());

#define DTL_EXPECT_CLOSE(actual, expected, ...) \
  EXPECT_TRUE(::dtl::testing::tensors_close((actual), (expected), ##__VA_ARGS__))
#define DTL_ASSERT_CLOSE(actual, expected, ...) \
  ASSERT_TRUE(::dtl::testing::tensors_close((actual), (expected), ##__VA_ARGS__))
#define DTL_EXPECT_EQUAL(actual, expected) \
  EXPECT_TRUE(::dtl::testing::tensors_equal((actual), (expected)))

// Function forms (same semantics) for use in helpers.
void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol = kRtol,
                  double atol = kAtol, const std::string& what = "",
                  const char* file = __builtin_FILE(), int line = __builtin_LINE());

// Every rank holds the same tensor (bitwise): rank 0's copy is broadcast over the harness's
// control channel and compared on each rank; a mismatch reports the rank and the worst element.
// Must be called by all ranks.
::testing::AssertionResult same_on_all_ranks(const torch::Tensor& t,
                                             const char* file = __builtin_FILE(),
                                             int line = __builtin_LINE());
#define DTL_EXPECT_SAME_ON_ALL_RANKS(t) EXPECT_TRUE(::dtl::testing::same_on_all_ranks(t))
void expect_same_on_all_ranks(const torch::Tensor& t, const std::string& what = "",
                              const char* file = __builtin_FILE(), int line = __builtin_LINE());

// All parameters (or their grads) of a module, flattened and concatenated in registration
// order: one tensor to compare two models with.
torch::Tensor flat_params(const torch::nn::Module& m);
torch::Tensor flat_grads(const torch::nn::Module& m);  // missing grads count as zeros
// A module's flat parameters (or grads) against an expected flat vector (e.g. from serial()),
// with the failure naming the parameter and element that hold the worst difference:
// "... worst in blocks.1.mlp.fc.weight[3,7]: actual ..., expected ...".
::testing::AssertionResult params_close(const torch::nn::Module& m, const torch::Tensor& expected_flat,
                                        double rtol = kRtol, double atol = kAtol, bool grads = false,
                                        const char* file = __builtin_FILE(),
                                        int line = __builtin_LINE());
#define DTL_EXPECT_PARAMS_CLOSE(module, expected_flat, ...) \
  EXPECT_TRUE(::dtl::testing::params_close((module), (expected_flat), ##__VA_ARGS__))
#define DTL_EXPECT_GRADS_CLOSE(module, expected_flat, rtol, atol) \
  EXPECT_TRUE(::dtl::testing::params_close((module), (expected_flat), (rtol), (atol), true))
// Parameter by parameter, with the parameter's name in the failure message.
void expect_modules_close(const torch::nn::Module& actual, const torch::nn::Module& expected,
                          double rtol = kRtol, double atol = kAtol, bool grads = false,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE());

// The message of the dtl::Error that fn raises, or "(no dtl::Error)". A NotImplemented is
// rethrown: an unfinished skeleton must fail as "not implemented", not as a wrong message.
// The message is observed (the code under test wrote it).
template <typename Fn>
std::string error_of(Fn&& fn, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  std::string msg = "(no dtl::Error)";
  try {
    fn();
  } catch (const dtl::NotImplemented&) {
    throw;
  } catch (const dtl::Error& e) {
    msg = e.what();
  }
  return observe(std::move(msg), "the error message", Source::kComputed, file, line);
}

// Expects fn to raise a dtl::Error whose message contains `needle` (the broken constraint).
template <typename Fn>
void expect_error_mentions(Fn&& fn, const std::string& needle, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
  std::string msg = error_of(std::forward<Fn>(fn), file, line);
  EXPECT_NE(msg.find(needle), std::string::npos)
      << "message: " << msg << "\nexpected a dtl::Error mentioning: " << needle;
}

// Runs `fn` as the single-process ground truth: torch's global RNG is seeded with `seed` for
// the call and restored afterwards, and no communication may happen inside. Every rank
// computes the same reference locally, so no rank has to ship it to the others.
// torch::manual_seed seeds the CUDA generators too, so those are saved and restored as well
// (on a CPU-only LibTorch there are none).
template <typename Fn>
auto serial(uint64_t seed, Fn&& fn) {
  struct Restore {
    std::vector<std::pair<at::Generator, at::Generator>> saved;  // (generator, its state)
    Restore() {
      keep(at::detail::getDefaultCPUGenerator());
      for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i)
        keep(at::globalContext().defaultGenerator(
            c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(i))));
    }
    void keep(const at::Generator& g) { saved.emplace_back(g, g.clone()); }
    ~Restore() {
      for (auto& [g, state] : saved) {
        std::lock_guard<std::mutex> lock(g.mutex());
        g.set_state(state.get_state());
      }
    }
  } restore;
  torch::manual_seed(seed);
  return fn();
}

}  // namespace dtl::testing
