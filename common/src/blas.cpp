// blas_info(): which BLAS provides sgemm_ in this process, looked up with dlsym/dladdr.
#include "dtl/blas.hpp"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>

namespace dtl {

namespace {

template <typename Fn>
Fn lookup(const char* symbol) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, symbol));
}

std::string library_of(const char* symbol) {
  void* addr = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (!addr || !dladdr(addr, &info) || !info.dli_fname) return "";
  char resolved[PATH_MAX];
  // libblas.so.3 is a chain of alternatives symlinks; the real file names the implementation.
  return realpath(info.dli_fname, resolved) ? std::string(resolved) : std::string(info.dli_fname);
}

}  // namespace

BlasInfo blas_info() {
  BlasInfo b;
  b.library = library_of("sgemm_");
  if (auto get_config = lookup<char* (*)()>("openblas_get_config")) {
    b.name = "OpenBLAS";
    b.optimized = true;
    b.config = get_config();
    if (auto get_threads = lookup<int (*)()>("openblas_get_num_threads")) b.threads = get_threads();
  } else if (auto mkl_threads = lookup<int (*)()>("MKL_Get_Max_Threads")) {
    b.name = "MKL";
    b.optimized = true;
    b.threads = mkl_threads();
  } else if (b.library.find("/blas/") != std::string::npos ||
             b.library.find("libblas.so") != std::string::npos) {
    b.name = "reference BLAS";  // Debian's netlib build lives in .../blas/libblas.so.3
  } else {
    b.name = b.library.empty() ? "none loaded" : "unknown";
    b.optimized = !b.library.empty();  // a BLAS we do not recognise: do not cry wolf
  }
  return b;
}

void set_blas_threads(int threads) {
  if (threads < 1) threads = 1;
  if (auto set = lookup<void (*)(int)>("openblas_set_num_threads")) set(threads);
  if (auto set = lookup<void (*)(int)>("MKL_Set_Num_Threads")) set(threads);
}

}  // namespace dtl
