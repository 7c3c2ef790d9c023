# DtlDeps: the libraries dtl needs besides LibTorch and NCCL, found the same way by the tree and
# by the kit's probe (tools/kit_probe: `./lab kit --probe` checks a node's kit without LibTorch).
find_package(MPI REQUIRED COMPONENTS CXX)
# dtl uses MPI's C API only. Without these, every TU that includes <mpi.h> (through
# dtl/runtime.hpp) compiles OpenMPI's deprecated C++ bindings, whose inline code references
# hundreds of MPI symbols: noise in the grader's audit of what student code calls.
add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
# GoogleTest 1.10 or later (GTEST_SKIP, the *_SUITE names). Its own CMake package first, as CMake
# 3.20+ does: CMake's FindGTest before 3.23 defines no GTest::gmock.
find_package(GTest CONFIG QUIET)
if(NOT GTest_FOUND)
  find_package(GTest REQUIRED)
endif()
find_package(benchmark REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
include(DtlFmt)  # fmt: LibTorch's own copy (header-only) when it brings one, else the installed fmt
find_package(Threads REQUIRED)

# libseccomp, for the grader's sandbox: pkg-config's entry when there is one, else the header and
# library found directly (a node without root has no pkg-config of its own; the kit carries
# libseccomp but not pkg-config).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(SECCOMP QUIET IMPORTED_TARGET libseccomp)
endif()
add_library(dtl::seccomp INTERFACE IMPORTED)
if(TARGET PkgConfig::SECCOMP)
  target_link_libraries(dtl::seccomp INTERFACE PkgConfig::SECCOMP)
else()
  find_path(DTL_SECCOMP_INCLUDE_DIR seccomp.h)
  find_library(DTL_SECCOMP_LIBRARY seccomp)
  if(NOT DTL_SECCOMP_INCLUDE_DIR OR NOT DTL_SECCOMP_LIBRARY)
    message(FATAL_ERROR "libseccomp not found: the grader's sandbox needs it (Debian and Ubuntu: "
                        "libseccomp-dev; RHEL: libseccomp-devel; without root: ./lab kit carries it)")
  endif()
  target_include_directories(dtl::seccomp INTERFACE ${DTL_SECCOMP_INCLUDE_DIR})
  target_link_libraries(dtl::seccomp INTERFACE ${DTL_SECCOMP_LIBRARY})
endif()
