# Builds a consumer project from the docs exactly as it stands: the cmake block of DOC (a file
# under the source tree) that begins with the line MARKER, with FETCHCONTENT_SOURCE_DIR_DTRAIN
# pointing at this checkout and the sources of APP (a folder beside this script). With
# LAUNCH=ON it then runs a 2-process job of the block's first executable, APP_TARGET, with the
# dtrain-run the same build made. Fails if the block is gone, does not build, or the job fails.
file(REMOVE_RECURSE "${WORK_DIR}")
file(READ "${DTRAIN_SOURCE_DIR}/${DOC}" page)
string(FIND "${page}" "```cmake\n${MARKER}\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${DOC} has no cmake block beginning '${MARKER}'")
endif()
math(EXPR at "${at} + 9")
string(SUBSTRING "${page}" ${at} -1 rest)
string(FIND "${rest}" "```" length)
string(SUBSTRING "${rest}" 0 ${length} block)
# The launcher's path, for this script only; the block is written first, unchanged.
file(WRITE "${WORK_DIR}/src/CMakeLists.txt" "${block}\n")
if(LAUNCH)
  file(APPEND "${WORK_DIR}/src/CMakeLists.txt"
       "file(GENERATE OUTPUT \"\${CMAKE_BINARY_DIR}/dtrain-run.path\" CONTENT \"$<TARGET_FILE:dtrain::dtrain-run>\")\n")
endif()
file(COPY "${CMAKE_CURRENT_LIST_DIR}/${APP}/" DESTINATION "${WORK_DIR}/src")
foreach(step configure build)
  if(step STREQUAL "configure")
    set(cmd ${CMAKE_COMMAND} -S "${WORK_DIR}/src" -B "${WORK_DIR}/build" -G "${GENERATOR}"
            -DCMAKE_CXX_COMPILER=${CXX} -DFETCHCONTENT_SOURCE_DIR_DTRAIN=${DTRAIN_SOURCE_DIR} ${EXTRA_ARGS})
  else()
    set(cmd ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${DOC}'s consumer project: ${step} failed")
  endif()
endforeach()
if(NOT LAUNCH)
  return()
endif()
file(READ "${WORK_DIR}/build/dtrain-run.path" launcher)
if(NOT launcher STREQUAL "${WORK_DIR}/build/_deps/dtrain-build/tools/dtrain-run")  # where README says
  message(FATAL_ERROR "dtrain-run is not where the docs say this build puts it: ${launcher}")
endif()
execute_process(COMMAND "${launcher}" -n 2 "${WORK_DIR}/build/${APP_TARGET}" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
message("${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "rank 0 of 2: ok" OR NOT out MATCHES "rank 1 of 2: ok")
  message(FATAL_ERROR "${DOC}'s ${APP_TARGET} under dtrain-run -n 2: exit ${rc}, not both ranks ok")
endif()
