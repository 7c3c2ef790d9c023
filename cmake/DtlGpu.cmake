# DtlGpu: what a GPU build needs, checked at configure time, and the GPU test targets.
# Included by the top-level CMakeLists.txt right after the NCCL detection (which sets
# DTL_HAVE_NCCL when the CUDA toolkit and NCCL >= 2.10 are found).
#
# Sets DTL_TORCH_HAS_CUDA (the LibTorch found has CUDA) and DTL_TORCH_CUDA_MAJOR (the CUDA
# major version it was built with, when it can tell). dtl_common gets the compile definition
# DTL_TORCH_HAS_CUDA=1 only then: comm_nccl.cpp follows LibTorch's current stream and informs the
# caching allocator. A CPU LibTorch still compiles comm_nccl.cpp (that is how CI compiles the GPU path)
# and, when the headers allow, compiles that LibTorch-CUDA path once more as a check.
#
# DTL_REQUIRE_GPU=ON (the gpu preset; ./lab gpu-check) turns every reason the build could not
# run on GPUs into a configure error instead of a build that quietly falls back to the stub:
# a LibTorch without CUDA, no CUDA toolkit, no NCCL or one older than 2.10, a CUDA toolkit whose
# major version differs from LibTorch's, or a pre-cxx11-ABI LibTorch (which cannot link with
# the distribution's gtest, fmt and benchmark).
option(DTL_REQUIRE_GPU "Fail at configure time unless this build can run on GPUs" OFF)

set(DTL_TORCH_HAS_CUDA OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda OR TARGET c10_cuda)
  set(DTL_TORCH_HAS_CUDA ON)
endif()

# LibTorch's CUDA major version: the libtorch zip's build-version ("2.5.1+cu124"), a pip
# torch's version.py (cuda = '12.4'), or the CUDA runtime bundled next to libtorch.
set(DTL_TORCH_CUDA_MAJOR "")
if(DTL_TORCH_HAS_CUDA AND TORCH_INSTALL_PREFIX)
  if(EXISTS ${TORCH_INSTALL_PREFIX}/build-version)
    file(READ ${TORCH_INSTALL_PREFIX}/build-version _dtl_build_version)
    if(_dtl_build_version MATCHES "\\+cu([0-9]+)[0-9]")
      set(DTL_TORCH_CUDA_MAJOR ${CMAKE_MATCH_1})
    endif()
  endif()
  if(NOT DTL_TORCH_CUDA_MAJOR AND EXISTS ${TORCH_INSTALL_PREFIX}/version.py)
    file(STRINGS ${TORCH_INSTALL_PREFIX}/version.py _dtl_version_py REGEX "^cuda")
    if(_dtl_version_py MATCHES "'([0-9]+)\\.")
      set(DTL_TORCH_CUDA_MAJOR ${CMAKE_MATCH_1})
    endif()
  endif()
  if(NOT DTL_TORCH_CUDA_MAJOR)
    file(GLOB _dtl_cudart ${TORCH_INSTALL_PREFIX}/lib/libcudart*.so.*)
    foreach(_lib IN LISTS _dtl_cudart)
      if(_lib MATCHES "\\.so\\.([0-9]+)")
        set(DTL_TORCH_CUDA_MAJOR ${CMAKE_MATCH_1})
      endif()
    endforeach()
  endif()
endif()

set(_dtl_torch_desc "LibTorch ${Torch_VERSION}: CPU only")
if(DTL_TORCH_HAS_CUDA)
  set(_dtl_torch_desc "LibTorch ${Torch_VERSION}: CUDA ${DTL_TORCH_CUDA_MAJOR}")
endif()
set(_dtl_nccl_desc "NCCL not found")
if(NCCL_VERSION)
  set(_dtl_nccl_desc "NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")
endif()
message(STATUS "dtl gpu: ${_dtl_torch_desc}; CUDA toolkit ${CUDAToolkit_VERSION}; ${_dtl_nccl_desc}")

# Everything that stops this build from running on GPUs, each with its fix.
set(_dtl_gpu_problems)
if(NOT DTL_TORCH_HAS_CUDA)
  list(APPEND _dtl_gpu_problems
    "the LibTorch found (${Torch_DIR}) has no CUDA: point -DTorch_DIR (or DTL_CMAKE_ARGS) at a CUDA LibTorch's share/cmake/Torch (cxx11 ABI zip from pytorch.org)")
endif()
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  list(APPEND _dtl_gpu_problems
    "the LibTorch found is a pre-cxx11-ABI build (TORCH_CXX_FLAGS: ${TORCH_CXX_FLAGS}); it cannot link with the distribution's gtest, fmt and benchmark: download the 'cxx11 ABI' LibTorch")
endif()
if(NOT DTL_WITH_NCCL)
  list(APPEND _dtl_gpu_problems "DTL_WITH_NCCL is OFF: the NCCL backend is not built")
elseif(NOT CUDAToolkit_FOUND)
  list(APPEND _dtl_gpu_problems
    "no CUDA toolkit found: install it, put nvcc on PATH or set -DCUDAToolkit_ROOT=/usr/local/cuda")
elseif(NCCL_VERSION AND NCCL_VERSION VERSION_LESS 2.10)
  list(APPEND _dtl_gpu_problems
    "NCCL ${NCCL_VERSION} (${NCCL_INCLUDE_DIR}) is older than 2.10 (ncclAvg, bfloat16): install a newer NCCL and set NCCL_HOME")
elseif(NOT DTL_HAVE_NCCL)
  list(APPEND _dtl_gpu_problems
    "NCCL not found (searched NCCL_ROOT, NCCL_HOME, CUDA_HOME, the CUDA toolkit, CONDA_PREFIX and pip's site-packages/nvidia/nccl): set NCCL_HOME=/path/with/include/nccl.h+lib/libnccl.so")
endif()
if(DTL_TORCH_CUDA_MAJOR AND CUDAToolkit_VERSION_MAJOR
   AND NOT DTL_TORCH_CUDA_MAJOR STREQUAL CUDAToolkit_VERSION_MAJOR)
  list(APPEND _dtl_gpu_problems
    "CUDA toolkit ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR}) but LibTorch was built with CUDA ${DTL_TORCH_CUDA_MAJOR}: use a LibTorch built for CUDA ${CUDAToolkit_VERSION_MAJOR}, or point -DCUDAToolkit_ROOT at a CUDA ${DTL_TORCH_CUDA_MAJOR} toolkit")
endif()

if(_dtl_gpu_problems)
  list(JOIN _dtl_gpu_problems "\n  - " _dtl_gpu_text)
  if(DTL_REQUIRE_GPU)
    message(FATAL_ERROR "DTL_REQUIRE_GPU is ON but this build cannot run on GPUs:\n  - ${_dtl_gpu_text}\n(notes/gpu.md explains the GPU build)")
  elseif(DTL_TORCH_HAS_CUDA OR TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
    # A CPU LibTorch without NCCL is the ordinary CPU build; anything else deserves a word.
    message(WARNING "dtl: this build will not run on GPUs:\n  - ${_dtl_gpu_text}")
  endif()
endif()

# The GPU targets (common/tests_gpu/gpu_targets.cmake) and the compile definition of the NCCL
# backend need targets that exist only once the whole tree was read: done at the end of the
# top-level CMakeLists.txt.
function(_dtl_gpu_finish)
  if(NOT TARGET dtl_common)
    return()
  endif()
  if(DTL_TORCH_HAS_CUDA)
    # A definition of the target dtl_common, not a property of its source files: a source
    # property set in dtl_common's directory reaches every target there that compiles the same
    # file, and nccl_layer_tests compiles comm_nccl.cpp again against the fake CUDA headers
    # (the real and fake CUDA declarations then collide). comm_nccl.cpp follows LibTorch's current
    # stream; memory.cpp reads the CUDA caching allocator's statistics; runtime.cpp accepts
    # --device cuda (with a CPU LibTorch it names the problem at start-up).
    target_compile_definitions(dtl_common PRIVATE DTL_TORCH_HAS_CUDA=1)
  endif()
  include(${PROJECT_SOURCE_DIR}/common/tests_gpu/gpu_targets.cmake)
endfunction()
cmake_language(DEFER CALL _dtl_gpu_finish)
