# Builds README's FetchContent block exactly as it stands (the cmake block that begins
# "# CMakeLists.txt of your project") with FETCHCONTENT_SOURCE_DIR_DTRAIN pointing at this
# checkout, then runs a 2-process job of its `app` (readme_app/main.cpp) with the dtrain-run that
# the same build made. Fails if the block is gone, does not build, or the job fails.
file(REMOVE_RECURSE "${WORK_DIR}")
file(READ "${DTRAIN_SOURCE_DIR}/README.md" readme)
string(FIND "${readme}" "```cmake\n# CMakeLists.txt of your project\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no cmake block beginning '# CMakeLists.txt of your project'")
endif()
math(EXPR at "${at} + 9")
string(SUBSTRING "${readme}" ${at} -1 rest)
string(FIND "${rest}" "```" length)
string(SUBSTRING "${rest}" 0 ${length} block)
# The launcher's path, for this script only; README's block is written first, unchanged.
file(WRITE "${WORK_DIR}/src/CMakeLists.txt" "${block}\n"
     "file(GENERATE OUTPUT \"\${CMAKE_BINARY_DIR}/dtrain-run.path\" CONTENT \"$<TARGET_FILE:dtrain::dtrain-run>\")\n")
configure_file("${CMAKE_CURRENT_LIST_DIR}/readme_app/main.cpp" "${WORK_DIR}/src/main.cpp" COPYONLY)
foreach(step configure build)
  if(step STREQUAL "configure")
    set(cmd ${CMAKE_COMMAND} -S "${WORK_DIR}/src" -B "${WORK_DIR}/build" -G "${GENERATOR}"
            -DCMAKE_CXX_COMPILER=${CXX} -DFETCHCONTENT_SOURCE_DIR_DTRAIN=${DTRAIN_SOURCE_DIR})
  else()
    set(cmd ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "README's FetchContent project: ${step} failed")
  endif()
endforeach()
file(READ "${WORK_DIR}/build/dtrain-run.path" launcher)
if(NOT launcher MATCHES "^${WORK_DIR}/build/")
  message(FATAL_ERROR "dtrain-run is not the one this build made: ${launcher}")
endif()
execute_process(COMMAND "${launcher}" -n 2 "${WORK_DIR}/build/app" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out TIMEOUT 120)
message("${out}")
string(REGEX MATCHALL "rank [01] of 2: ok" oks "${out}")
list(LENGTH oks n)
if(NOT rc EQUAL 0 OR NOT n EQUAL 2)
  message(FATAL_ERROR "README's app under dtrain-run -n 2: exit ${rc}, ${n} of 2 ranks ok")
endif()
