# check_gates.cmake must fail on a suite where a test ignores its exit status, and pass on one
# where none does: it is itself a gate, so it is shown failing here.
#
#   cmake -DFIXTURE=<fixture dir> -DWORK=<scratch dir> -DCHECK=<check_gates.cmake> -DCTEST=<ctest> -P ...
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${FIXTURE} -B ${WORK} OUTPUT_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_gates_selftest: cannot configure the fixture")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${WORK} -DCTEST=${CTEST} -P ${CHECK}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "exit_ignored \\(PASS_REGULAR_EXPRESSION\\)" OR err MATCHES "honest")
  message(FATAL_ERROR "check_gates_selftest: the check let an exit-ignoring test through (status ${rc}):\n${out}${err}")
endif()
message(STATUS "check_gates_selftest: the check refuses the fixture's exit-ignoring test, and only it")
