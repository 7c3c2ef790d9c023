# DtlFmt: which fmt the build uses, as the target fmt::fmt.
#
# PyTorch's pip wheels, conda packages and the libtorch zip ship fmt's headers next to their own
# (include/fmt: fmt 10 or 11, compiled into LibTorch), while a distribution's libfmt may be
# another version (Debian 12: fmt 9). LibTorch's include directory comes first on every compile
# line, so with both, every <fmt/format.h> is LibTorch's copy and the link against the
# distribution's libfmt fails (undefined fmt::v10::vformat). So: when LibTorch brings fmt, use
# those headers alone, header-only (FMT_HEADER_ONLY: fmt's functions are compiled into each
# object, nothing to link); otherwise find the installed fmt (find_package). Either way the rest
# of the tree links fmt::fmt. -DDTL_FMT=system|torch forces a choice; -DDTL_FMT_INCLUDE_DIR=DIR
# uses the fmt headers in DIR header-only (`./lab gpu-build` compiles the tree that way against
# fmt 11, the generation pip and conda LibTorch 2.5+ bring).
set(DTL_FMT "auto" CACHE STRING "fmt to use: auto (LibTorch's when it ships one), torch, system")
set_property(CACHE DTL_FMT PROPERTY STRINGS auto torch system)
set(DTL_FMT_INCLUDE_DIR "" CACHE PATH "fmt headers to use header-only (overrides DTL_FMT)")

set(DTL_TORCH_FMT_DIR "")
foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
  # A system include directory (Debian's libtorch-dev installs into /usr/include, where
  # libfmt-dev's headers live too) is not LibTorch's own fmt.
  if(dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES OR dir STREQUAL "/usr/include")
    continue()
  endif()
  if(EXISTS ${dir}/fmt/format.h AND EXISTS ${dir}/fmt/format-inl.h AND NOT DTL_TORCH_FMT_DIR)
    set(DTL_TORCH_FMT_DIR ${dir})
  endif()
endforeach()

set(_dtl_fmt_whose "LibTorch's ")
# No LibTorch fmt and no usable fmt package: fmt's headers alone, header-only. The kit for older
# nodes (./lab kit) carries only fmt's headers, since its library would need the newer glibc of
# the Debian release the headers come from.
if(NOT DTL_FMT_INCLUDE_DIR AND NOT DTL_TORCH_FMT_DIR AND NOT DTL_FMT STREQUAL "torch")
  find_package(fmt 8 QUIET)
  if(NOT fmt_FOUND)
    find_path(DTL_FMT_HEADERS fmt/format-inl.h DOC "fmt headers used header-only when no fmt package is found")
    if(DTL_FMT_HEADERS)
      set(DTL_FMT_INCLUDE_DIR ${DTL_FMT_HEADERS})
    endif()
  endif()
endif()
if(DTL_FMT_INCLUDE_DIR)
  if(NOT EXISTS ${DTL_FMT_INCLUDE_DIR}/fmt/format.h)
    message(FATAL_ERROR "DTL_FMT_INCLUDE_DIR=${DTL_FMT_INCLUDE_DIR} has no fmt/format.h")
  endif()
  set(DTL_TORCH_FMT_DIR ${DTL_FMT_INCLUDE_DIR})
  set(_dtl_fmt_whose "")
endif()
if(DTL_FMT_INCLUDE_DIR OR DTL_FMT STREQUAL "torch" OR (DTL_FMT STREQUAL "auto" AND DTL_TORCH_FMT_DIR))
  if(NOT DTL_TORCH_FMT_DIR)
    message(FATAL_ERROR "DTL_FMT=torch, but the LibTorch found (${Torch_DIR}) ships no fmt headers")
  endif()
  file(STRINGS ${DTL_TORCH_FMT_DIR}/fmt/core.h _dtl_fmt_line REGEX "^#define FMT_VERSION ")
  if(NOT _dtl_fmt_line)
    file(STRINGS ${DTL_TORCH_FMT_DIR}/fmt/base.h _dtl_fmt_line REGEX "^#define FMT_VERSION ")
  endif()
  string(REGEX MATCH "[0-9]+" _dtl_fmt_code "${_dtl_fmt_line}")  # 100100 is 10.1.0
  math(EXPR _dtl_fmt_major "${_dtl_fmt_code} / 10000")
  math(EXPR _dtl_fmt_minor "${_dtl_fmt_code} / 100 % 100")
  math(EXPR _dtl_fmt_patch "${_dtl_fmt_code} % 100")
  set(DTL_FMT_VERSION "${_dtl_fmt_major}.${_dtl_fmt_minor}.${_dtl_fmt_patch}")
  if(_dtl_fmt_major LESS 8)
    message(FATAL_ERROR "fmt ${DTL_FMT_VERSION} in ${DTL_TORCH_FMT_DIR}: dtl needs fmt 8 or later "
                        "(fmt::format_string); point DTL_FMT_INCLUDE_DIR at newer fmt headers")
  endif()
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${DTL_TORCH_FMT_DIR}
    INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
  set(DTL_FMT_USED "${_dtl_fmt_whose}fmt ${DTL_FMT_VERSION}, header-only (${DTL_TORCH_FMT_DIR}/fmt)"
      CACHE INTERNAL "the fmt this build uses")
  message(STATUS "dtl: ${DTL_FMT_USED}")
else()
  if(NOT fmt_FOUND)
    find_package(fmt 8 QUIET)
  endif()
  if(NOT fmt_FOUND)
    message(FATAL_ERROR "dtl needs fmt 8 or later: none found (install libfmt-dev, or point "
                        "DTL_FMT_INCLUDE_DIR at fmt's headers; LibTorch 2.x brings its own)")
  endif()
  set(DTL_FMT_USED "fmt ${fmt_VERSION} (${fmt_DIR})" CACHE INTERNAL "the fmt this build uses")
  message(STATUS "dtl: ${DTL_FMT_USED}")
endif()
