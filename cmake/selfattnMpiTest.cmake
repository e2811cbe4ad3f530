# selfattn_add_mpi_test(NAME name RANKS n PROGRAM target [ARGS arg...] [LABELS label...])
#
# A ctest test (label `mpi`) that runs `target` on n MPI ranks: FindMPI's documented command line,
#   MPIEXEC_EXECUTABLE MPIEXEC_NUMPROC_FLAG n MPIEXEC_PREFLAGS program MPIEXEC_POSTFLAGS args,
# with what Open MPI needs on a 2-core CI machine that runs as root (other MPIs get no Open MPI flag and ignore the
# variables):
# - --oversubscribe: Open MPI refuses more ranks than cores without it (MPI_CXX_LIBRARY_VERSION_STRING tells Open MPI
#   apart: the top level sets MPI_DETERMINE_LIBRARY_VERSION);
# - OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1: it refuses to start as root without both;
# - OMP_NUM_THREADS=1: the ranks are the parallelism; with SELFATTN_OPENMP, n ranks of two threads on two cores
#   would wait for each other's time slices at every parallel region;
# - LSAN_OPTIONS: Open MPI never frees what MPI_Init allocates; under AddressSanitizer (scripts/test's sanitize
#   stage) that would fail every run. tests/mpi/lsan_suppressions.txt drops leaks allocated inside the MPI libraries
#   only, so ours are still reported; no effect without the sanitizer.
# PROCESSORS n keeps ctest -j from running other tests beside it; TIMEOUT 60: a rank that waits forever (a bug in a
# ring) fails the test instead of the CI job.
function(selfattn_add_mpi_test)
  cmake_parse_arguments(arg "" "NAME;RANKS;PROGRAM" "ARGS;LABELS" ${ARGN})
  set(open_mpi_flags "")
  if(MPI_CXX_LIBRARY_VERSION_STRING MATCHES "Open MPI")
    set(open_mpi_flags --oversubscribe)
  endif()
  add_test(NAME ${arg_NAME}
           COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${arg_RANKS} ${open_mpi_flags} ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:${arg_PROGRAM}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
  set(labels mpi ${arg_LABELS})
  set(environment OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
      "LSAN_OPTIONS=fast_unwind_on_malloc=0:suppressions=${PROJECT_SOURCE_DIR}/tests/mpi/lsan_suppressions.txt")
  set_tests_properties(${arg_NAME} PROPERTIES
    LABELS "${labels}" TIMEOUT 60 PROCESSORS ${arg_RANKS} ENVIRONMENT "${environment}")
endfunction()
