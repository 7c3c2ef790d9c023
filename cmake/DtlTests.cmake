# Multi-rank test registration.
#
# dtl_add_mpi_test(NAME <base> TARGET <exe> RANKS <n...> [LABELS <l...>] [TIMEOUT <s>] [ARGS <a...>])
# registers one ctest entry per world size, "<base>.n<N>", as
#   mpirun -n N <preflags> <exe> <args>
# with PROCESSORS N (so `ctest -j2` never runs two 4-rank jobs at once) and a TIMEOUT that
# backs up the harness's own per-test watchdog.

# OpenMPI: more ranks than cores is the normal case on a laptop or CI box, and binding each
# rank to one core would make oversubscribed ranks fight. Users may append their own flags.
set(DTL_MPIEXEC_PREFLAGS --oversubscribe --bind-to none CACHE STRING "Flags dtl passes to mpirun before the program")

# mpirun refuses root unless told; CI boxes and containers run as root. yield_when_idle: an
# MPI rank waiting for a peer yields its core instead of spinning, which oversubscribed ranks
# (4 on 2 cores) need to make progress at all.
set(DTL_TEST_ENVIRONMENT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1)

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
    set_tests_properties(${test_name} PROPERTIES
      PROCESSORS ${n} TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
      ENVIRONMENT "${DTL_TEST_ENVIRONMENT}")
  endforeach()
endfunction()
