# Compile settings shared by every dtl target, and the one torch precompiled header.
#
# Build economy: a TU that includes <torch/torch.h> costs ~22 s on 2 cores, ~13 s with a
# precompiled header. Every torch-using target reuses the single PCH built by dtl_torch_pch.

function(dtl_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(DTL_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

add_library(dtl_torch_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(dtl_torch_pch PUBLIC ${TORCH_LIBRARIES})
target_compile_options(dtl_torch_pch PUBLIC ${TORCH_CXX_FLAGS})
target_precompile_headers(dtl_torch_pch PRIVATE <torch/torch.h>)
dtl_warnings(dtl_torch_pch)

# dtl_use_torch(target): link LibTorch and reuse the shared torch PCH.
function(dtl_use_torch target)
  target_link_libraries(${target} PUBLIC dtl_torch_pch)
  target_precompile_headers(${target} REUSE_FROM dtl_torch_pch)
  dtl_warnings(${target})
endfunction()
