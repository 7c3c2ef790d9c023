# FindNCCL: the NCCL header and library.
#
# Looked up, in order, under: -DNCCL_ROOT, $NCCL_HOME, $NCCL_ROOT, $CUDA_HOME, the CUDA toolkit
# found by find_package(CUDAToolkit), $CONDA_PREFIX, and pip's layout
# (site-packages/nvidia/nccl/{include,lib}, library named libnccl.so.2: the nvidia-nccl-cu12
# wheel that a pip-installed torch pulls in, found next to that torch or in the Python
# interpreter's site-packages).
#
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION (parsed from nccl.h) and the
# imported target NCCL::NCCL. find_package(NCCL 2.10) treats an older NCCL as not found;
# NCCL_VERSION still says which one was seen.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_HOME} $ENV{NCCL_ROOT} $ENV{CUDA_HOME})
if(CUDAToolkit_FOUND)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
endif()
if(DEFINED ENV{CONDA_PREFIX})
  list(APPEND _nccl_hints $ENV{CONDA_PREFIX})
endif()

# pip: nvidia/nccl next to a pip-installed torch, or in the interpreter's site-packages.
set(_nccl_pip_dirs)
if(TORCH_INSTALL_PREFIX)
  list(APPEND _nccl_pip_dirs ${TORCH_INSTALL_PREFIX}/../nvidia/nccl)
endif()
find_program(_nccl_python NAMES python3 python)
mark_as_advanced(_nccl_python)
if(_nccl_python)
  execute_process(
    COMMAND ${_nccl_python} -c
            "import site, sysconfig; p = sysconfig.get_paths(); print(';'.join([p['purelib'], p['platlib']] + site.getsitepackages() + [site.getusersitepackages()]))"
    OUTPUT_VARIABLE _nccl_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nccl_rc)
  if(_nccl_rc EQUAL 0)
    foreach(_dir IN LISTS _nccl_site)
      list(APPEND _nccl_pip_dirs ${_dir}/nvidia/nccl)
    endforeach()
  endif()
endif()
foreach(_dir IN LISTS _nccl_pip_dirs)
  if(EXISTS ${_dir}/include/nccl.h)
    list(APPEND _nccl_hints ${_dir})
  endif()
endforeach()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

unset(NCCL_VERSION)
if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _match "${_nccl_defines}")
    set(_nccl_${_part} ${CMAKE_MATCH_1})
  endforeach()
  if(NOT _nccl_MAJOR STREQUAL "")
    set(NCCL_VERSION ${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH})
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_INCLUDE_DIR NCCL_LIBRARY
                                  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                                              INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
