// Compile check, never linked: comm_nccl.cpp as a CUDA LibTorch build compiles it
// (DTL_TORCH_HAS_CUDA=1: current-stream ordering, the copy-back on the NCCL
// stream), here against the installed LibTorch's c10/cuda headers. CI has a CPU LibTorch and
// no GPU; this keeps that code path from rotting until a GPU build compiles it for real.
#if !DTL_TORCH_HAS_CUDA
#error "build this file with DTL_TORCH_HAS_CUDA=1 (common/tests_gpu/CMakeLists.txt does)"
#endif
#include "../src/comm_nccl.cpp"
