# Read by CTest once every test is defined (CMakeLists.txt here): tests/costs/costs.cmake's costs.
function(dtrain_cost seconds)
  if("${ARGV1}" STREQUAL "TORCH2")  # the marker, read as check_gates.cmake reads it
    list(REMOVE_AT ARGN 0)
  endif()
  string(CONCAT name ${ARGN})
  set_tests_properties("${name}" PROPERTIES COST ${seconds})
endfunction()
include(${CMAKE_CURRENT_LIST_DIR}/costs.cmake)
