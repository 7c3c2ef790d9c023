# Multi-rank test registration.
#
# dtl_add_mpi_test(NAME <base> TARGET <exe> RANKS <n...> [LABELS <l...>] [TIMEOUT <s>] [ARGS <a...>])
# registers one ctest entry per world size, "<base>.n<N>", as
#   mpirun -n N <preflags> <exe> <args>
# with PROCESSORS N (so `ctest -j2` never runs two 4-rank jobs at once) and a TIMEOUT that
# backs up the harness's own per-test watchdog.

# mpirun flags and environment come from cmake/mpirun.env, the one file ./lab and the grader
# read too. Users may append their own flags to DTL_MPIEXEC_PREFLAGS.
file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/mpirun.env _dtl_mpirun_lines REGEX "^[A-Za-z0-9_]+=")
set(_dtl_env)
foreach(line IN LISTS _dtl_mpirun_lines)
  if(line MATCHES "^DTL_MPIRUN_FLAGS=(.*)$")
    separate_arguments(_dtl_flags UNIX_COMMAND "${CMAKE_MATCH_1}")
  else()
    list(APPEND _dtl_env "${line}")
  endif()
endforeach()
set(DTL_MPIEXEC_PREFLAGS ${_dtl_flags} CACHE STRING "Flags dtl passes to mpirun before the program")
set(DTL_TEST_ENVIRONMENT ${_dtl_env})

function(dtl_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "RANKS;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(n IN LISTS T_RANKS)
    set(test_name ${T_NAME}.n${n})
    add_test(NAME ${test_name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${DTL_MPIEXEC_PREFLAGS}
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_TARGET}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
    # Every entry leaves its gtest report in build/test-reports/<entry>.json (rank 0 writes it),
    # which ./lab test NN summarises as a table.
    set_tests_properties(${test_name} PROPERTIES
      PROCESSORS ${n} TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
      ENVIRONMENT "${DTL_TEST_ENVIRONMENT};GTEST_OUTPUT=json:${CMAKE_BINARY_DIR}/test-reports/${test_name}.json")
  endforeach()
endfunction()
