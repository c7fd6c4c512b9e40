# The suite's honesty, read from ctest's own listing of a configured and built tree. It fails when:
#   a test could pass although its program failed, or hide a failure as a skip:
#     PASS_REGULAR_EXPRESSION  ctest then ignores the exit status (a matched line is enough);
#     SKIP_REGULAR_EXPRESSION  a matched line makes any outcome a skip;
#     WILL_FAIL                inverts the verdict, so a crash passes;
#     DISABLED                 the test never runs, and ctest does not count it as failed;
#     SKIP_RETURN_CODE         on a test not listed as one that may skip (tests/tiers.cmake:
#                              a test of a [gpu] program where no device is present, or a test
#                              whose capability this machine lacks), since then a failure that
#                              exits with that code reads as a skip;
#   a test belongs to no tier (tests/tiers.cmake), or
#   (DTRAIN_FULL_SUITE) a tier holds fewer tests than its floor, or the costs file (COSTS, the
#   suite's tests/costs/costs.cmake) names a test the tree lacks.
#
#   cmake -DBUILD_DIR=<build tree> [-DCTEST=<ctest>] [-DCHECK_FLOORS=OFF] [-DCOSTS=<file> [-DCOSTS_OF=TORCH2]]
#         -P check_gates.cmake
# The CUDA build, which builds only its GPU tests, passes CHECK_FLOORS=OFF. The torch 2 tree passes it
# too, with COSTS_OF=TORCH2: its costs are the entries marked TORCH2, and the main tree's the others.
cmake_minimum_required(VERSION 3.25)
if(NOT BUILD_DIR)
  message(FATAL_ERROR "check_gates: pass -DBUILD_DIR=<a configured build tree>")
endif()
if(NOT CTEST)
  set(CTEST ctest)
endif()
if(NOT DEFINED CHECK_FLOORS)
  set(CHECK_FLOORS ON)
endif()
if(NOT EXISTS "${BUILD_DIR}/dtrain_suite.cmake")
  message(FATAL_ERROR "check_gates: ${BUILD_DIR}/dtrain_suite.cmake is missing (tests/tiers.cmake writes it)")
endif()
include("${BUILD_DIR}/dtrain_suite.cmake")

execute_process(COMMAND ${CTEST} --show-only=json-v1 WORKING_DIRECTORY ${BUILD_DIR}
                OUTPUT_VARIABLE listing ERROR_VARIABLE listing_error RESULT_VARIABLE listing_status)
if(NOT listing_status EQUAL 0)
  message(FATAL_ERROR "check_gates: ctest --show-only=json-v1 failed in ${BUILD_DIR}: ${listing_error}")
endif()

set(verdict_overrides PASS_REGULAR_EXPRESSION SKIP_REGULAR_EXPRESSION WILL_FAIL DISABLED)
set(offenders "")
set(listed_names "\n")
string(JSON count LENGTH "${listing}" tests)
foreach(tier IN LISTS DTRAIN_SUITE_TIERS)
  set(tier_count_${tier} 0)
endforeach()
if(count GREATER 0)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON test GET "${listing}" tests ${i})
    string(JSON name GET "${test}" name)
    string(APPEND listed_names "${name}\n")
    set(labels "")
    set(skip_code "")
    string(JSON program ERROR_VARIABLE no_command GET "${test}" command 0)
    if(no_command)
      set(program "")
    endif()
    get_filename_component(program "${program}" NAME_WE)
    string(JSON properties ERROR_VARIABLE no_properties GET "${test}" properties)
    set(nprops 0)
    if(NOT no_properties)
      string(JSON nprops LENGTH "${properties}")
    endif()
    if(nprops GREATER 0)
      math(EXPR plast "${nprops} - 1")
      foreach(j RANGE ${plast})
        string(JSON property GET "${properties}" ${j} name)
        string(JSON value GET "${properties}" ${j} value)
        if(property IN_LIST verdict_overrides)
          if(property MATCHES "^(WILL_FAIL|DISABLED)$" AND NOT value)
            continue()
          endif()
          list(APPEND offenders "${name} (${property})")
        elseif(property STREQUAL "LABELS")
          string(JSON nlabels LENGTH "${value}")
          math(EXPR llast "${nlabels} - 1")
          foreach(k RANGE ${llast})
            string(JSON label GET "${value}" ${k})
            list(APPEND labels ${label})
          endforeach()
        elseif(property STREQUAL "SKIP_RETURN_CODE")
          set(skip_code ${value})
        endif()
      endforeach()
    endif()
    if(NOT skip_code STREQUAL "")
      if(NOT (name IN_LIST DTRAIN_SUITE_MAY_SKIP
              OR (program IN_LIST DTRAIN_SUITE_GPU_PROGRAMS AND DTRAIN_SUITE_GPU_MAY_SKIP)))
        list(APPEND offenders "${name} (SKIP_RETURN_CODE ${skip_code}, not a test that may skip here)")
      endif()
    endif()
    set(tiered OFF)
    if(name MATCHES "_NOT_BUILT")  # Catch2's stand-in for a program not built: ctest fails it
      set(tiered ON)
    endif()
    foreach(label IN LISTS labels)
      if(label IN_LIST DTRAIN_SUITE_TIERS)
        set(tiered ON)
        math(EXPR tier_count_${label} "${tier_count_${label}} + 1")
      endif()
    endforeach()
    if(NOT tiered)
      string(REPLACE ";" ", " tiers "${DTRAIN_SUITE_TIERS}")
      list(APPEND offenders "${name} (no tier: label it with one of ${tiers})")
    endif()
  endforeach()
endif()

set(short_tiers "")
set(summary "")
foreach(floor IN LISTS DTRAIN_SUITE_FLOORS)
  string(REGEX MATCH "^([a-z]+)=([0-9]+)$" _ "${floor}")
  set(tier ${CMAKE_MATCH_1})
  list(APPEND summary "${tier} ${tier_count_${tier}}")
  if(CHECK_FLOORS AND DTRAIN_SUITE_FULL AND tier_count_${tier} LESS CMAKE_MATCH_2)
    list(APPEND short_tiers "${tier}: ${tier_count_${tier}} tests, below its floor of ${CMAKE_MATCH_2}")
  endif()
endforeach()

# The full suite has every test the costs name; one it lacks was renamed or removed.
set(stale_costs "")
function(dtrain_cost seconds)
  set(marked "")
  if("${ARGV1}" STREQUAL "TORCH2")
    list(REMOVE_AT ARGN 0)
    set(marked TORCH2)
  endif()
  if(NOT marked STREQUAL "${COSTS_OF}")  # another tree's entry
    return()
  endif()
  string(CONCAT name ${ARGN})
  string(FIND "${listed_names}" "\n${name}\n" at)
  if(at EQUAL -1)
    set(stale_costs "${stale_costs}\n  ${name}" PARENT_SCOPE)
  endif()
endfunction()
if(COSTS AND DTRAIN_SUITE_FULL AND (CHECK_FLOORS OR COSTS_OF STREQUAL "TORCH2"))
  include(${COSTS})
endif()
if(stale_costs)
  message(FATAL_ERROR "check_gates: the costs name tests this tree lacks (rename or drop them in ${COSTS}):"
                      "${stale_costs}")
endif()

if(offenders)
  list(JOIN offenders "\n  " text)
  message(FATAL_ERROR "check_gates: these tests can pass whatever their exit status, hide a failure as a skip, "
                      "or belong to no tier; make the program's exit status the verdict (77 skips only where "
                      "tests/tiers.cmake allows it) and give each a tier:\n  ${text}")
endif()
if(short_tiers)
  list(JOIN short_tiers "\n  " text)
  message(FATAL_ERROR "check_gates: tiers below their floor (tests/tiers.cmake), a dependency or a "
                      "registration went missing:\n  ${text}")
endif()
list(JOIN summary ", " summary)
message(STATUS "check_gates: ${count} tests in ${BUILD_DIR}, each judged by its exit status; per tier: ${summary}")
