// dtl/blas.hpp — defines: BlasInfo, blas_info, set_blas_threads.
//
// Every CPU matmul of LibTorch ends in the BLAS library the process loaded (sgemm_). Debian's
// LibTorch links the generic libblas.so.3, which is whatever the alternatives system points
// at: the reference (netlib) BLAS, a plain triple loop at 2-4 GFLOP/s per core, or OpenBLAS,
// hand-tuned kernels at 50-100 GFLOP/s per core on AVX-512. A 20x difference in every lab's
// compute, so the Runtime reports which one it got.
#pragma once

#include <string>

namespace dtl {

struct BlasInfo {
  std::string name;     // "OpenBLAS", "MKL", "reference BLAS", "unknown"
  std::string library;  // the file that provides sgemm_, e.g. /usr/lib/.../libblas.so.3
  std::string config;   // OpenBLAS's own description (version, kernel, threading), if any
  bool optimized = false;  // false for the reference BLAS: the Runtime warns
  int threads = 1;         // BLAS threads per process (1 for a serial build)
};

// What this process uses, found by looking up the BLAS symbols actually loaded.
BlasInfo blas_info();

// Caps the BLAS library's own threads (OpenBLAS pthreads/OpenMP builds, MKL); no-op for serial
// builds. The Runtime sets it to its intra-op thread count so ranks x threads <= cores.
void set_blas_threads(int threads);

}  // namespace dtl
