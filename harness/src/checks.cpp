// Tensor comparisons that explain themselves, and cross-rank agreement checks.
#include "dtl/harness/checks.hpp"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>

#include "dtl/harness/prefill.hpp"
#include "dtl/runtime.hpp"

namespace dtl::testing {

static std::string multi_index(const torch::Tensor& t, int64_t flat) {
  std::string out = "[";
  auto sizes = t.sizes();
  std::vector<int64_t> idx(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    idx[d] = sizes[d] ? flat % sizes[d] : 0;
    flat = sizes[d] ? flat / sizes[d] : 0;
  }
  for (size_t i = 0; i < idx.size(); ++i) out += (i ? "," : "") + std::to_string(idx[i]);
  return out + "]";
}

// The pre-fill values of the running test (prefill.hpp), by test: a value another test
// pre-filled says nothing about this one's elements.
static std::mutex g_prefill_mutex;
static std::vector<std::pair<std::string, double>> g_prefills;

static std::string running_test() {
  const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
  return t ? std::string(t->test_suite_name()) + "." + t->name() : std::string();
}

torch::Tensor prefilled(at::IntArrayRef sizes, double value, const torch::TensorOptions& options) {
  {
    std::lock_guard<std::mutex> lock(g_prefill_mutex);
    const auto entry = std::make_pair(running_test(), value);
    if (std::find(g_prefills.begin(), g_prefills.end(), entry) == g_prefills.end())
      g_prefills.push_back(entry);
  }
  return torch::full(sizes, value, options);
}

// "; k of them still hold the test's pre-fill V: never written", or nothing: `bad` marks the
// differing elements of the flattened float64 copies `a` (actual) and `e` (expected).
static std::string unwritten_note(const torch::Tensor& a, const torch::Tensor& e,
                                  const torch::Tensor& bad) {
  std::vector<double> values;
  {
    std::lock_guard<std::mutex> lock(g_prefill_mutex);
    const std::string test = running_test();
    for (auto& [t, v] : g_prefills)
      if (t == test) values.push_back(v);
  }
  std::string note;
  for (double v : values) {
    const int64_t k = bad.logical_and(a.eq(v)).logical_and(e.ne(v)).sum().item<int64_t>();
    if (k > 0)
      note += fmt::format("; {} of them still hold the test's pre-fill {:g}: never written", k, v);
  }
  return note;
}

static ::testing::AssertionResult same_layout(const torch::Tensor& a, const torch::Tensor& e) {
  if (!a.defined() || !e.defined())
    return ::testing::AssertionFailure() << "undefined tensor (actual defined: " << a.defined()
                                         << ", expected defined: " << e.defined() << ")";
  if (a.sizes() != e.sizes())
    return ::testing::AssertionFailure() << "shape " << a.sizes() << " != expected " << e.sizes();
  if (a.scalar_type() != e.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << a.scalar_type() << " != expected "
                                         << e.scalar_type();
  return ::testing::AssertionSuccess();
}

// kCudaToleranceScale when either side lives on a GPU.
static double device_scale(const torch::Tensor& a, const torch::Tensor& b) {
  return a.is_cuda() || b.is_cuda() ? kCudaToleranceScale : 1.0;
}

// The comparisons themselves, on values already observed.
static ::testing::AssertionResult close_impl(const torch::Tensor& actual, const torch::Tensor& expected,
                                             double rtol, double atol) {
  rtol *= device_scale(actual, expected);
  atol *= device_scale(actual, expected);
  auto layout = same_layout(actual, expected);
  if (!layout) return layout;
  if (actual.numel() == 0) return ::testing::AssertionSuccess();
  auto a = actual.detach().cpu().to(torch::kFloat64).flatten();
  auto e = expected.detach().cpu().to(torch::kFloat64).flatten();
  auto err = (a - e).abs();
  auto allowed = atol + rtol * e.abs();
  // NaN never compares close (unless both are NaN at the same place).
  auto both_nan = a.isnan().logical_and(e.isnan());
  auto bad = (err > allowed).logical_or(err.isnan()).logical_and(both_nan.logical_not());
  int64_t nbad = bad.sum().item<int64_t>();
  if (nbad == 0) return ::testing::AssertionSuccess();
  auto excess = torch::where(bad, err.nan_to_num(INFINITY) - allowed, torch::full_like(err, -1.0));
  int64_t worst = excess.argmax().item<int64_t>();
  return ::testing::AssertionFailure() << fmt::format(
             "{} of {} elements differ (rtol {:g}, atol {:g}); worst at flat index {} {}: "
             "actual {:.9g}, expected {:.9g}, |diff| {:.3g}{}",
             nbad, a.numel(), rtol, atol, worst, multi_index(actual, worst),
             a[worst].item<double>(), e[worst].item<double>(), err[worst].item<double>(),
             unwritten_note(a, e, bad));
}

static ::testing::AssertionResult equal_impl(const torch::Tensor& actual, const torch::Tensor& expected) {
  auto layout = same_layout(actual, expected);
  if (!layout) return layout;
  auto a = actual.detach().cpu().contiguous(), e = expected.detach().cpu().contiguous();
  if (a.numel() == 0 || std::memcmp(a.data_ptr(), e.data_ptr(), a.nbytes()) == 0)
    return ::testing::AssertionSuccess();
  auto r = close_impl(a, e, 0.0, 0.0);
  if (!r) return r;
  return ::testing::AssertionFailure() << "values compare equal but bits differ (e.g. -0.0 vs 0.0)";
}

::testing::AssertionResult tensors_close(const torch::Tensor& actual, const torch::Tensor& expected,
                                         double rtol, double atol, const char* file, int line) {
  return close_impl(observe(actual, "actual", Source::kComputed, file, line), expected, rtol, atol);
}

::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const torch::Tensor& expected,
                                         const char* file, int line) {
  const TensorBits bits = observe(TensorBits::of(actual), "actual", Source::kComputed, file, line);
  if (bits.whole) return equal_impl(bits.tensor, expected);
  // A large tensor travelled as its digest: compare it with the expected one's.
  const TensorBits mine = TensorBits::of(expected);
  if (bits.sizes != expected.sizes().vec())
    return ::testing::AssertionFailure() << "shape " << c10::IntArrayRef(bits.sizes)
                                         << " != expected " << expected.sizes();
  if (bits.dtype != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << bits.dtype << " != expected "
                                         << expected.scalar_type();
  if (mine.whole || bits.digest != mine.digest)
    return ::testing::AssertionFailure() << "the bits differ from the expected values (" << expected.numel()
                                         << " elements, compared by digest)";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult params_close(const torch::nn::Module& m, const torch::Tensor& expected_flat,
                                        double rtol, double atol, bool grads, const char* file, int line) {
  const torch::Tensor actual =
      observe(grads ? flat_grads(m) : flat_params(m), grads ? "the module's grads" : "the module's parameters",
              Source::kComputed, file, line);
  auto r = close_impl(actual, expected_flat, rtol, atol);
  if (r || actual.sizes() != expected_flat.sizes()) return r;
  // Locate the worst element again, in parameter coordinates.
  auto a = actual.detach().cpu().to(torch::kFloat64), e = expected_flat.detach().cpu().to(torch::kFloat64);
  const double scale = device_scale(actual, expected_flat);
  auto err = (a - e).abs().nan_to_num(INFINITY) - scale * (atol + rtol * e.abs());
  int64_t worst = err.argmax().item<int64_t>(), offset = 0;
  for (const auto& p : m.named_parameters()) {
    const int64_t numel = p.value().numel();
    if (worst < offset + numel)
      return r << fmt::format(" -> worst in {} {}{}", grads ? "the grad of" : "parameter", p.key(),
                              multi_index(p.value(), worst - offset));
    offset += numel;
  }
  return r;
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                  double atol, const std::string& what, const char* file, int line) {
  EXPECT_TRUE(tensors_close(actual, expected, rtol, atol, file, line)) << what;
}

::testing::AssertionResult same_on_all_ranks(const torch::Tensor& t, const char* file, int line) {
  MPI_Comm comm = Runtime::get().control_comm();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const TensorBits bits = observe(TensorBits::of(t), "the tensor", Source::kComputed, file, line);
  int whole = bits.whole ? 1 : 0, all_whole = 0;
  MPI_Allreduce(&whole, &all_whole, 1, MPI_INT, MPI_MIN, comm);
  if (!all_whole) {
    // Large tensors travelled as digests: every rank's (byte count, digest) against rank 0's.
    int64_t elem = static_cast<int64_t>(c10::elementSize(bits.dtype));
    for (int64_t s : bits.sizes) elem *= s;
    const uint64_t digest = bits.whole ? TensorBits::of(t).digest : bits.digest;
    int64_t mine[2] = {elem, static_cast<int64_t>(bits.whole ? 0 : digest)};
    std::vector<int64_t> all(2 * static_cast<size_t>(size));
    MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, comm);
    std::string bad;
    for (int r = 0; r < size; ++r)
      if (all[2 * r] != all[0] || all[2 * r + 1] != all[1] || all[2 * r + 1] == 0)
        bad += (bad.empty() ? "" : ", ") + std::to_string(r);
    if (bad.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "ranks [" << bad << "] differ from rank 0 (compared by digest)";
  }
  auto mine = bits.tensor.detach().cpu().contiguous();
  // First agree on the byte size, so a shape mismatch is reported instead of truncating.
  int64_t nbytes = static_cast<int64_t>(mine.nbytes());
  std::vector<int64_t> sizes(size);
  MPI_Allgather(&nbytes, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm);
  for (int r = 0; r < size; ++r)
    if (sizes[r] != sizes[0])
      return ::testing::AssertionFailure()
             << fmt::format("rank {} holds {} bytes but rank 0 holds {}", r, sizes[r], sizes[0]);
  auto root = mine.clone();
  MPI_Bcast(root.data_ptr(), static_cast<int>(nbytes), MPI_BYTE, 0, comm);
  int differs = std::memcmp(root.data_ptr(), mine.data_ptr(), nbytes) != 0;
  std::vector<int> all(size);
  MPI_Allgather(&differs, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  std::string bad;
  for (int r = 0; r < size; ++r)
    if (all[r]) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  if (bad.empty()) return ::testing::AssertionSuccess();
  auto result = ::testing::AssertionFailure() << "ranks [" << bad << "] differ from rank 0";
  if (differs) result << "; on this rank: " << close_impl(mine, root, 0, 0).message();
  return result;
}

void expect_same_on_all_ranks(const torch::Tensor& t, const std::string& what, const char* file,
                              int line) {
  EXPECT_TRUE(same_on_all_ranks(t, file, line)) << what;
}

torch::Tensor flat_params(const torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return parts.empty() ? torch::empty({0}) : torch::cat(parts);
}

torch::Tensor flat_grads(const torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (auto& p : m.parameters())
    parts.push_back(p.grad().defined() ? p.grad().detach().flatten() : torch::zeros_like(p).flatten());
  return parts.empty() ? torch::empty({0}) : torch::cat(parts);
}

void expect_modules_close(const torch::nn::Module& actual, const torch::nn::Module& expected,
                          double rtol, double atol, bool grads, const char* file, int line) {
  auto a = actual.named_parameters(), e = expected.named_parameters();
  std::vector<std::string> names;
  for (const auto& p : a) names.push_back(p.key());
  names = observe(std::move(names), "the parameter names", Source::kComputed, file, line);
  ASSERT_EQ(names.size(), e.size()) << "modules have different parameter counts";
  for (size_t i = 0; i < names.size() && i < a.size(); ++i) {
    const auto& name = names[i];
    ASSERT_EQ(name, e[i].key()) << "parameter " << i << " has a different name";
    if (grads) {
      // An undefined grad travels as such: "defined on one side only" is decided on the observed.
      auto ga = observe(a[i].value().grad(), "grad", Source::kComputed, file, line);
      auto ge = e[i].value().grad();
      ASSERT_EQ(ga.defined(), ge.defined()) << "grad of " << name << " defined on one side only";
      if (ga.defined()) {
        EXPECT_TRUE(close_impl(ga, ge, rtol, atol)) << "grad of " << name;
      }
    } else {
      EXPECT_TRUE(tensors_close(a[i].value(), e[i].value(), rtol, atol, file, line)) << "parameter " << name;
    }
  }
}

}  // namespace dtl::testing
