# check_gates.cmake is itself a gate, so it is shown failing here: on the fixture's suites it must
# refuse each rule's offender, naming it and the rule, and pass the suites the rules allow.
#
#   cmake -DFIXTURE=<fixture dir> -DWORK=<scratch dir> -DCHECK=<check_gates.cmake> -DCTEST=<ctest> -P ...
cmake_minimum_required(VERSION 3.25)
# case | what the check's error must say ("" where the suite must pass)
set(cases
  "honest|"
  "listed_skip|"
  "gpu_skip|"
  "pass_regex|offender \\(PASS_REGULAR_EXPRESSION\\)"
  "skip_regex|offender \\(SKIP_REGULAR_EXPRESSION\\)"
  "will_fail|offender \\(WILL_FAIL\\)"
  "disabled|offender \\(DISABLED\\)"
  "skip_code|offender \\(SKIP_RETURN_CODE 77, not a test that may skip here\\)"
  "gpu_skip_with_device|offender \\(SKIP_RETURN_CODE 77, not a test that may skip here\\)"
  "gpu_label_only|offender \\(SKIP_RETURN_CODE 77, not a test that may skip here\\)"
  "no_tier|offender \\(no tier"
  "below_floor|unit: 2 tests, below its floor of 3"
  "stale_cost|the costs name tests this tree lacks .* a renamed test hones$"
  "torch2_tree|"
  "torch2_tree_stale|the costs name tests this tree lacks .* a torch 2 tree's$")
foreach(row IN LISTS cases)
  string(REPLACE "|" ";" row "${row}")
  list(GET row 0 case)
  list(LENGTH row n)
  set(expected "")
  if(n GREATER 1)
    list(GET row 1 expected)
  endif()
  set(work "${WORK}/${case}")
  file(REMOVE_RECURSE "${work}")
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${FIXTURE} -B ${work} -DCASE=${case} OUTPUT_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_gates_selftest: cannot configure the fixture's case ${case}")
  endif()
  set(tree "")
  if(case MATCHES "^torch2_")  # checked as .ci/run checks the torch 2 tree
    set(tree -DCHECK_FLOORS=OFF -DCOSTS_OF=TORCH2)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${work} -DCTEST=${CTEST} -DCOSTS=${work}/costs.cmake ${tree}
                          -P ${CHECK}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps an error's first paragraph at a width its length decides: matched on one line.
  string(REPLACE "${WORK}" "<work>" flat "${err}")  # a path may hold any word
  string(STRIP "${flat}" flat)
  string(REGEX REPLACE "[ \n]+" " " flat "${flat}")
  if(expected STREQUAL "")
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "check_gates_selftest: the check refused the allowed suite '${case}':\n${out}${err}")
    endif()
  elseif(rc EQUAL 0 OR NOT flat MATCHES "${expected}" OR flat MATCHES "honest")
    message(FATAL_ERROR "check_gates_selftest: on '${case}' the check did not refuse the offender alone with "
                        "'${expected}' (status ${rc}):\n${out}${err}")
  endif()
  message(STATUS "check_gates_selftest: ${case}: ${rc}")
endforeach()
message(STATUS "check_gates_selftest: the check refuses each rule's offender, and only it")
