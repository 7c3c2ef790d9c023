// Compile check, never linked: memory.cpp as a CUDA LibTorch build compiles it
// (DTL_TORCH_HAS_CUDA=1: current_bytes/peak_bytes/reset_peak of a CUDA device read the CUDA
// caching allocator's statistics), here against the installed LibTorch's c10/cuda headers.
#if !DTL_TORCH_HAS_CUDA
#error "build this file with DTL_TORCH_HAS_CUDA=1 (common/tests_gpu/gpu_targets.cmake does)"
#endif
#include "../src/memory.cpp"
