# Read by CTest once every test is defined (CMakeLists.txt here): tests/costs/costs.cmake's costs.
function(dtrain_cost seconds)
  list(REMOVE_ITEM ARGN TORCH2)
  string(CONCAT name ${ARGN})
  set_tests_properties("${name}" PROPERTIES COST ${seconds})
endfunction()
include(${CMAKE_CURRENT_LIST_DIR}/costs.cmake)
