# GPU tests and checks, included by cmake/DtlGpu.cmake at the end of the top-level
# CMakeLists.txt (once dtl_common and the harness exist; targets live in the top directory).
#
#   gpu.nccl.nN   nccl_tests (nccl_test.cpp) with --device cuda: the NCCL backend on CUDA tensors.
#                 Label gpu; `./lab test --gpu` runs the sizes up to the GPU count.
#   gpu.smoke.nN  nccl_smoke (smoke_test.cpp): the first-GPU-machine suite of `./lab gpu-check`
#                 (streams, lifetimes, every dtype x op, p2p, splits, barrier, timeouts).
#   common.nccl_no_device.n1   the checks that need no GPU (no_device_test.cpp), in CI.
#   dtl_cuda_headers_compile   compiles the LibTorch-CUDA paths of comm_nccl.cpp and memory.cpp
#                 against a CPU LibTorch's c10/cuda headers (never linked): CI's guard on them.
# GPU tests hold the ctest resource lock "gpu": two never share the GPUs.

set(_gpu_defs)
if(DTL_TORCH_HAS_CUDA)
  set(_gpu_defs DTL_TORCH_HAS_CUDA=1)
endif()

# Targets from common/CMakeLists.txt until it hands nccl_tests over to this file.
if(NOT TARGET nccl_tests)
  add_executable(nccl_tests ${CMAKE_CURRENT_LIST_DIR}/nccl_test.cpp ${CMAKE_CURRENT_LIST_DIR}/no_device_test.cpp)
  target_link_libraries(nccl_tests PRIVATE dtl_common dtl_test_main)
  dtl_use_torch(nccl_tests DRIVER)
else()
  target_sources(nccl_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/no_device_test.cpp)
endif()

add_executable(nccl_smoke ${CMAKE_CURRENT_LIST_DIR}/smoke_test.cpp)
target_link_libraries(nccl_smoke PRIVATE dtl_common dtl_test_main)
dtl_use_torch(nccl_smoke DRIVER)

foreach(target nccl_tests nccl_smoke)
  if(_gpu_defs)
    target_compile_definitions(${target} PRIVATE ${_gpu_defs})
  endif()
  if(DTL_HAVE_NCCL)
    target_link_libraries(${target} PRIVATE CUDA::cudart)
  endif()
endforeach()

dtl_add_mpi_test(NAME gpu.nccl TARGET nccl_tests RANKS 1 2 3 4 8 LABELS gpu TIMEOUT 300
                 ARGS --device cuda)
dtl_add_mpi_test(NAME gpu.smoke TARGET nccl_smoke RANKS 1 2 3 4 8 LABELS gpu-check TIMEOUT 600
                 ARGS --device cuda)
foreach(n 1 2 3 4 8)
  set_tests_properties(gpu.nccl.n${n} gpu.smoke.n${n} PROPERTIES RESOURCE_LOCK gpu)
endforeach()
dtl_add_mpi_test(NAME common.nccl_no_device TARGET nccl_tests RANKS 1 LABELS common TIMEOUT 120
                 ARGS --gtest_filter=NcclNoDevice.*)

# --device cuda with a CPU-only LibTorch: the Runtime names the problem at start-up.
if(NOT DTL_TORCH_HAS_CUDA)
  dtl_add_mpi_test(NAME common.cuda_needs_a_cuda_libtorch TARGET nccl_tests RANKS 1 LABELS common
                   TIMEOUT 120 ARGS --device cuda)
  set_tests_properties(common.cuda_needs_a_cuda_libtorch.n1 PROPERTIES
                       PASS_REGULAR_EXPRESSION "--device cuda: this build's LibTorch .* is CPU-only")
endif()

# --device cuda with a CUDA LibTorch and no GPU visible (none here; CUDA_VISIBLE_DEVICES=-1 hides a
# GPU machine's): the Runtime says so at start-up and names the way out.
if(DTL_TORCH_HAS_CUDA AND DTL_HAVE_NCCL)
  dtl_add_mpi_test(NAME common.cuda_without_a_gpu TARGET nccl_tests RANKS 1 LABELS common
                   TIMEOUT 120 ARGS --device cuda)
  set_property(TEST common.cuda_without_a_gpu.n1 APPEND PROPERTY ENVIRONMENT CUDA_VISIBLE_DEVICES=-1)
  set_tests_properties(common.cuda_without_a_gpu.n1 PROPERTIES PASS_REGULAR_EXPRESSION
                       "(no usable CUDA device|no CUDA device found).*--device cpu --backend mpi")
endif()

# comm_nccl.cpp with DTL_TORCH_HAS_CUDA=1 against the installed (CPU) LibTorch's c10/cuda
# headers. A Debian LibTorch lacks the generated c10/cuda/impl/cuda_cmake_macros.h (it only
# carries a Windows export switch); C10_CUDA_NO_CMAKE_CONFIGURE_FILE skips it.
if(DTL_HAVE_NCCL AND NOT DTL_TORCH_HAS_CUDA)
  set(_c10_cuda_found OFF)
  set(_c10_cuda_macros ON)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS ${dir}/c10/cuda/CUDAStream.h)
      set(_c10_cuda_found ON)
      if(NOT EXISTS ${dir}/c10/cuda/impl/cuda_cmake_macros.h)
        set(_c10_cuda_macros OFF)
      endif()
    endif()
  endforeach()
  if(_c10_cuda_found)
    add_library(dtl_cuda_headers_compile OBJECT ${CMAKE_CURRENT_LIST_DIR}/cuda_headers_compile.cpp
                                                ${CMAKE_CURRENT_LIST_DIR}/cuda_memory_compile.cpp)
    target_link_libraries(dtl_cuda_headers_compile PRIVATE dtl_common CUDA::cudart NCCL::NCCL)
    dtl_use_torch(dtl_cuda_headers_compile)
    target_compile_definitions(dtl_cuda_headers_compile PRIVATE DTL_TORCH_HAS_CUDA=1)
    if(NOT _c10_cuda_macros)
      target_compile_definitions(dtl_cuda_headers_compile PRIVATE C10_CUDA_NO_CMAKE_CONFIGURE_FILE)
    endif()
    # Built with the NCCL tests, so building them (as CI does) also checks this path.
    add_dependencies(nccl_tests dtl_cuda_headers_compile)
  else()
    message(STATUS "dtl gpu: this LibTorch ships no c10/cuda headers; the LibTorch-CUDA path "
                   "of comm_nccl.cpp is compiled only by a CUDA LibTorch build")
  endif()
endif()
