# Compile settings shared by every dtl target, and the torch precompiled headers.
#
# Build economy: every torch-using target reuses one of two PCHs built here (<torch/torch.h>,
# 586 MB each). With it a lab's test TU still takes 15-18 s on the 2-core course machine (2026-11:
# most of it template instantiation, not parsing), the runtime's and harness's larger ones 40-70 s
# two at a time; the whole tree's 200 TUs, about 45 minutes cold.

# -Wno-unknown-pragmas: a pragma the build does not enable (#pragma omp without -fopenmp) is
# honest code that compiles to the serial loop; under CI's -Werror it would fail the build.
function(dtl_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas)
  if(DTL_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

add_library(dtl_torch_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(dtl_torch_pch PUBLIC ${TORCH_LIBRARIES})
# MPI's compile options too (an OpenMPI whose wrapper says -pthread, as Debian 11's and many
# clusters' do): -pthread defines _REENTRANT, and GCC refuses a PCH built without a macro the TU
# defines ("not used because `_REENTRANT' is defined"), so every TU that links MPI would parse
# all of torch again. Empty for Debian 12's OpenMPI.
target_compile_options(dtl_torch_pch PUBLIC ${TORCH_CXX_FLAGS} ${MPI_CXX_COMPILE_OPTIONS})
target_precompile_headers(dtl_torch_pch PRIVATE <torch/torch.h>)
dtl_warnings(dtl_torch_pch)

# Drivers (test, demo and fixture sources) compile at -O1: their work happens in what they call
# (the lab's own code, dtl_common, LibTorch: all at the build type's -O2), and at -O1 a test TU
# compiles in ~60% of the time (7 s instead of 12 s, measured on a 2-core machine), with the
# -O2 PCH's header parsing saved all the same. GCC accepts a PCH only with the same -O level, so
# the drivers share a second PCH built with their flags. Benchmarks stay at -O2: they time code.
# Debug builds (-O0) leave drivers alone.
set(DTL_DRIVER_OPT "")
if(CMAKE_BUILD_TYPE MATCHES "^(RelWithDebInfo|Release|MinSizeRel)$")
  set(DTL_DRIVER_OPT -O1)
endif()
add_library(dtl_torch_pch_driver STATIC ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(dtl_torch_pch_driver PUBLIC ${TORCH_LIBRARIES})
target_compile_options(dtl_torch_pch_driver PUBLIC ${TORCH_CXX_FLAGS} ${MPI_CXX_COMPILE_OPTIONS}
                       PRIVATE ${DTL_DRIVER_OPT})
target_precompile_headers(dtl_torch_pch_driver PRIVATE <torch/torch.h>)
dtl_warnings(dtl_torch_pch_driver)

# dtl_use_torch(target [DRIVER]): link LibTorch and reuse a shared torch PCH; DRIVER compiles
# the target's own sources at the drivers' -O1 (above).
function(dtl_use_torch target)
  target_link_libraries(${target} PUBLIC dtl_torch_pch)
  if("DRIVER" IN_LIST ARGN)
    target_compile_options(${target} PRIVATE ${DTL_DRIVER_OPT})
    target_precompile_headers(${target} REUSE_FROM dtl_torch_pch_driver)
  else()
    target_precompile_headers(${target} REUSE_FROM dtl_torch_pch)
  endif()
  dtl_warnings(${target})
endfunction()


# ccache and the PCHs. GCC's .gch is not reproducible byte for byte (it holds the compiler's
# memory image), and ccache hashes every file a TU includes, so every torch TU of a new build
# directory missed the cache: a grading's scratch copy, the release check, a CI clone recompiled
# the runtime from nothing (8-10 minutes on 2 cores) although sources and flags were the same.
# With CCACHE_PCH_EXTSUM (the launcher in CMakeLists.txt) ccache hashes <pch>.gch.sum instead,
# written here from what determines the PCH and never a path: the compiler, the flags, LibTorch's
# version header and the stamps of its headers. Measured: a second build directory of the runtime
# and harness took 12 s, all 22 TUs from the cache (the first: 22 misses). A LibTorch upgrade
# changes those headers, which reruns CMake (a configure dependency) and so the sums.
find_file(DTL_TORCH_VERSION_H torch/version.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
find_file(DTL_TORCH_H torch/torch.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
set(_dtl_torch_stamp "")
foreach(_h ${DTL_TORCH_VERSION_H} ${DTL_TORCH_H})
  file(READ ${_h} _text)
  file(TIMESTAMP ${_h} _when "%s" UTC)
  string(APPEND _dtl_torch_stamp "${_text};${_when};")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_h})
endforeach()
get_directory_property(_dtl_options COMPILE_OPTIONS)
get_directory_property(_dtl_definitions COMPILE_DEFINITIONS)
string(TOUPPER "${CMAKE_BUILD_TYPE}" _dtl_config)
foreach(_pch dtl_torch_pch dtl_torch_pch_driver)
  get_target_property(_pch_options ${_pch} COMPILE_OPTIONS)
  set(_inputs "sum v1;${CMAKE_CXX_COMPILER_ID};${CMAKE_CXX_COMPILER_VERSION};${CMAKE_CXX_STANDARD}"
              "${CMAKE_CXX_FLAGS};${CMAKE_CXX_FLAGS_${_dtl_config}};${_dtl_options};${_dtl_definitions}"
              "${_pch_options};${TORCH_CXX_FLAGS};${TORCH_INCLUDE_DIRS};${DTL_FMT_INCLUDE_DIR}"
              "${_dtl_torch_stamp}")
  string(SHA256 _sum "${_inputs}")
  file(WRITE ${CMAKE_BINARY_DIR}/CMakeFiles/${_pch}.dir/cmake_pch.hxx.gch.sum "${_sum}\n")
endforeach()
