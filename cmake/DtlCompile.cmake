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
target_compile_options(dtl_torch_pch PUBLIC ${TORCH_CXX_FLAGS})
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
target_compile_options(dtl_torch_pch_driver PUBLIC ${TORCH_CXX_FLAGS} PRIVATE ${DTL_DRIVER_OPT})
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

