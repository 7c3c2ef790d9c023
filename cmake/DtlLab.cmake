# dtl_add_lab: one call registers everything a lab needs.
#
#   dtl_add_lab(NUMBER 02 SLUG data_parallel
#               SOURCES data_parallel.cpp          # student-edited files; same names in solutions/
#               [FRAME stage.cpp]                   # given sources (labs/NN_slug), in both sides
#               TESTS tests/data_parallel_test.cpp # public tests (labs/NN_slug/tests)
#               [GRADING_TESTS ...]                 # default: grading/NN_slug/*_test.cpp
#               [BENCH bench.cpp] [MAIN main.cpp]
#               [WORLD_SIZES 1 2 3 4] [DEPENDS dtl_lab01_reference ...] [TIMEOUT 300]
#               [DEMO_RANKS 2])                     # default -n of ./lab run NN
#
# Builds, from labs/NN_slug and solutions/NN_slug:
#   dtl_labNN_student, dtl_labNN_reference   libraries (interface header in labs/NN_slug)
#   labNN_test_student / _reference          public tests: compiled once (OBJECT), linked twice
#   labNN_grade_student / _reference         grading tests, likewise
#   labNN_bench_student / _reference         Google Benchmark of the lab's workload
#   labNN_run_student / _reference           the demo (./lab run NN)
# and ctest entries labNN.{student,reference}.nN with labels labNN, student|reference.
# Only the reference entries run by default in `./lab test`; students run their own with
# `./lab test NN` (the student label).
#
# A student release (`./lab release`) has no solutions/NN_slug for most labs and no grading
# tests: then only the student side exists, its public tests build by default, and the
# skeleton check is what the release's CI runs.
function(dtl_add_lab)
  cmake_parse_arguments(L "" "NUMBER;SLUG;BENCH;MAIN;TIMEOUT;DEMO_RANKS"
                        "SOURCES;FRAME;TESTS;GRADING_TESTS;WORLD_SIZES;DEPENDS" ${ARGN})
  set(lab lab${L_NUMBER})
  set(name ${L_NUMBER}_${L_SLUG})
  set(lab_dir ${PROJECT_SOURCE_DIR}/labs/${name})
  set(sol_dir ${PROJECT_SOURCE_DIR}/solutions/${name})
  if(NOT L_WORLD_SIZES)
    set(L_WORLD_SIZES 1 2 3 4)
  endif()
  if(NOT L_TIMEOUT)
    set(L_TIMEOUT 300)
  endif()
  if(NOT L_GRADING_TESTS)
    file(GLOB L_GRADING_TESTS ${PROJECT_SOURCE_DIR}/grading/${name}/*_test.cpp)
  endif()
  set(sides student)
  if(EXISTS ${sol_dir})
    list(APPEND sides reference)
  else()
    set(L_GRADING_TESTS)  # hidden tests need the reference to be checked against
  endif()
  foreach(dep IN LISTS L_DEPENDS)
    if(NOT TARGET ${dep})
      message(FATAL_ERROR "lab ${L_NUMBER} builds on ${dep}, which this tree does not have: "
                          "build that lab too (DTL_ONLY_LABS), or, in a student release, publish "
                          "its solution (./lab release --publish-solutions)")
    endif()
  endforeach()

  foreach(side IN LISTS sides)
    if(side STREQUAL "student")
      set(dir ${lab_dir})
    else()
      set(dir ${sol_dir})
    endif()
    set(srcs)
    foreach(s IN LISTS L_SOURCES)
      list(APPEND srcs ${dir}/${s})
    endforeach()
    # The lab's given code (the frame): one copy, in labs/, compiled into both sides.
    foreach(s IN LISTS L_FRAME)
      list(APPEND srcs ${lab_dir}/${s})
    endforeach()
    add_library(dtl_${lab}_${side} STATIC ${srcs})
    target_include_directories(dtl_${lab}_${side} PUBLIC ${lab_dir})
    target_link_libraries(dtl_${lab}_${side} PUBLIC dtl_common ${L_DEPENDS})
    dtl_use_torch(dtl_${lab}_${side})
  endforeach()

  # Compile each kind of driver once, link it against both sides.
  # The drivers see the harness and the DEPENDS libraries (e.g. an earlier lab's reference as
  # ground truth); linking the object library carries those on to both executables.
  # Build economy: `./lab test` (CI) needs the public tests of both sides and the reference's
  # grading tests; the other executables are linked only when a command asks for them
  # (EXCLUDE_FROM_ALL: ./lab run/bench/grade build their own targets). Their sources are still
  # compiled by `all` (the OBJECT library) and linked once on the reference side, so nothing rots.
  macro(_dtl_lab_exe kind sources main_lib on_demand_sides)
    add_library(${lab}_${kind}_obj OBJECT ${sources})
    target_link_libraries(${lab}_${kind}_obj PUBLIC dtl_harness ${L_DEPENDS})
    target_include_directories(${lab}_${kind}_obj PUBLIC ${lab_dir})
    if(kind STREQUAL "bench")
      dtl_use_torch(${lab}_${kind}_obj)  # benchmarks time code: the build type's -O2
    else()
      dtl_use_torch(${lab}_${kind}_obj DRIVER)
    endif()
    set(_on_demand "${on_demand_sides}")  # macro arguments are not variables: IN_LIST needs one
    if(NOT reference IN_LIST sides)
      set(_on_demand "")  # without a reference, the student side is what `all` builds
    endif()
    foreach(side IN LISTS sides)
      if(side IN_LIST _on_demand)
        add_executable(${lab}_${kind}_${side} EXCLUDE_FROM_ALL $<TARGET_OBJECTS:${lab}_${kind}_obj>)
      else()
        add_executable(${lab}_${kind}_${side} $<TARGET_OBJECTS:${lab}_${kind}_obj>)
      endif()
      target_link_libraries(${lab}_${kind}_${side} PRIVATE ${lab}_${kind}_obj dtl_${lab}_${side} ${main_lib})
      dtl_use_torch(${lab}_${kind}_${side})
    endforeach()
  endmacro()

  set(test_srcs)
  foreach(s IN LISTS L_TESTS)
    list(APPEND test_srcs ${lab_dir}/${s})
  endforeach()
  if(test_srcs)
    _dtl_lab_exe(test "${test_srcs}" dtl_test_main "")
    foreach(side IN LISTS sides)
      dtl_add_mpi_test(NAME ${lab}.${side} TARGET ${lab}_test_${side} RANKS ${L_WORLD_SIZES}
                       LABELS "${lab};${side}" TIMEOUT ${L_TIMEOUT})
    endforeach()
    # Skeleton check: the untouched student tree must compile and every public test must fail
    # with "not implemented" (on 2 ranks, so rank-dependent stubs that would hang show up too).
    dtl_add_mpi_test(NAME ${lab}.skeleton TARGET ${lab}_test_student RANKS 2
                     LABELS "${lab};skeleton" TIMEOUT ${L_TIMEOUT}
                     ARGS --dtl_expect_unimplemented --dtl_timeout=60)
  endif()
  if(L_GRADING_TESTS)
    _dtl_lab_exe(grade "${L_GRADING_TESTS}" dtl_test_main student)
    # The reference must pass the grading tests too (CI runs these; students never see them).
    dtl_add_mpi_test(NAME ${lab}.grading TARGET ${lab}_grade_reference RANKS ${L_WORLD_SIZES}
                     LABELS "${lab};reference;grading-tests" TIMEOUT ${L_TIMEOUT})
  endif()
  # The autograder's split run of the reference against itself at 2 ranks (or the lab's
  # smallest size): every observed value must come out the same, or an honest student would lose
  # points to a test that is not deterministic (harness/tests/split_run.sh).
  if(TARGET ${lab}_test_reference)
    set(_split_n 2)
    if(NOT 2 IN_LIST L_WORLD_SIZES)
      list(GET L_WORLD_SIZES 0 _split_n)
    endif()
    set(_split_bins $<TARGET_FILE:${lab}_test_reference>)
    if(TARGET ${lab}_grade_reference)
      list(APPEND _split_bins $<TARGET_FILE:${lab}_grade_reference>)
    endif()
    add_test(NAME ${lab}.split.n${_split_n}
             COMMAND bash ${PROJECT_SOURCE_DIR}/harness/tests/split_run.sh ${MPIEXEC_EXECUTABLE}
                     ${MPIEXEC_NUMPROC_FLAG} ${_split_n} ${DTL_MPIEXEC_PREFLAGS} ${MPIEXEC_PREFLAGS}
                     -- ${_split_bins})
    set_tests_properties(${lab}.split.n${_split_n} PROPERTIES PROCESSORS ${_split_n}
                         TIMEOUT ${L_TIMEOUT} LABELS "${lab};reference;split"
                         ENVIRONMENT "${DTL_TEST_ENVIRONMENT}")
  endif()
  if(L_BENCH)
    _dtl_lab_exe(bench ${lab_dir}/${L_BENCH} dtl_bench_main student)
  endif()
  if(L_MAIN)
    _dtl_lab_exe(run ${lab_dir}/${L_MAIN} "" student)
    if(NOT L_DEMO_RANKS)
      set(L_DEMO_RANKS 2)
    endif()
    # ./lab run NN reads it when no -n is given.
    file(WRITE ${CMAKE_BINARY_DIR}/bin/${lab}.demo_ranks "${L_DEMO_RANKS}\n")
  endif()
  # Where the grader and ./lab find the lab's world sizes.
  set_property(GLOBAL APPEND PROPERTY DTL_LABS "${L_NUMBER}:${L_SLUG}:${L_WORLD_SIZES}")
endfunction()
