# The suite's tiers: tests that appear or vanish together with one dependency or capability. Every
# test carries its tier as a ctest label (`ctest -L shm` runs one tier), and tests/gates/
# check_gates.cmake refuses a test with no tier.
#
# With DTRAIN_FULL_SUITE=ON (README's test command, so CI's), configuring fails where a tier's
# dependency is missing, and the gate fails where a tier holds fewer tests than its floor: on a
# machine prepared by scripts/install-deps.sh no tier vanishes quietly.
#
# A test may report itself skipped (exit 77) only where this machine lacks a capability that no
# package brings (a CUDA device; root for network namespaces): dtrain_skip_unless gives it
# SKIP_RETURN_CODE there and lists it with its reason; where the capability is present, 77 is a
# failure like any other exit status. check_gates.cmake refuses any other SKIP_RETURN_CODE.

option(DTRAIN_FULL_SUITE
       "Fail to configure where a test tier's dependency is missing, and fail the gate below a tier's floor" OFF)

# Capabilities no package brings. Without one, the tests that need it may skip.
execute_process(COMMAND id -u OUTPUT_VARIABLE _dtrain_uid OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
find_program(DTRAIN_IP_PROGRAM ip PATHS /usr/sbin /sbin)
find_program(DTRAIN_TC_PROGRAM tc PATHS /usr/sbin /sbin)
set(DTRAIN_CAN_NETNS OFF)
if(_dtrain_uid STREQUAL "0" AND DTRAIN_IP_PROGRAM AND DTRAIN_TC_PROGRAM)
  set(DTRAIN_CAN_NETNS ON)
endif()
set_property(GLOBAL PROPERTY DTRAIN_CAN_NETNS ${DTRAIN_CAN_NETNS})
find_program(DTRAIN_NVIDIA_SMI nvidia-smi)
set(DTRAIN_GPU_PRESENT OFF)
if(DTRAIN_NVIDIA_SMI)
  execute_process(COMMAND ${DTRAIN_NVIDIA_SMI} -L OUTPUT_VARIABLE _dtrain_gpus RESULT_VARIABLE _dtrain_smi ERROR_QUIET)
  if(_dtrain_smi EQUAL 0 AND _dtrain_gpus MATCHES "GPU [0-9]")
    set(DTRAIN_GPU_PRESENT ON)
  endif()
endif()
set_property(GLOBAL PROPERTY DTRAIN_GPU_PRESENT ${DTRAIN_GPU_PRESENT})
# The fuzz tier: a trial link of an empty fuzz target, since clang without its runtime links nothing.
find_program(DTRAIN_FUZZ_CLANG NAMES clang++-14 clang++)
set(DTRAIN_CAN_FUZZ OFF)
if(DTRAIN_FUZZ_CLANG)
  set(_dtrain_probe "${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe.cpp")
  file(WRITE "${_dtrain_probe}" "extern \"C\" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }\n")
  execute_process(COMMAND ${DTRAIN_FUZZ_CLANG} -fsanitize=fuzzer,address "${_dtrain_probe}" -o "${_dtrain_probe}.out"
                  RESULT_VARIABLE _dtrain_fuzz_link OUTPUT_QUIET ERROR_QUIET)
  if(_dtrain_fuzz_link EQUAL 0)
    set(DTRAIN_CAN_FUZZ ON)
  endif()
endif()
set_property(GLOBAL PROPERTY DTRAIN_CAN_FUZZ ${DTRAIN_CAN_FUZZ})

# dtrain_tier(<tier> <test>...): puts add_test's tests (of this directory) in a tier.
function(dtrain_tier tier)
  set_property(TEST ${ARGN} APPEND PROPERTY LABELS ${tier})
endfunction()

# dtrain_skip_unless(<capability variable> REASON <why> TESTS <test>...): where the capability is
# missing, exit 77 reads as skipped and the test is listed as one that may skip, with the reason.
function(dtrain_skip_unless capability)
  cmake_parse_arguments(ARG "" "REASON" "TESTS" ${ARGN})
  get_property(present GLOBAL PROPERTY ${capability})  # also right in examples/, a sibling directory
  if(NOT present)
    set_tests_properties(${ARG_TESTS} PROPERTIES SKIP_RETURN_CODE 77)
    foreach(test IN LISTS ARG_TESTS)
      set_property(GLOBAL APPEND PROPERTY DTRAIN_MAY_SKIP "${test}")
      message(STATUS "dtrain: '${test}' may skip here: ${ARG_REASON}")
    endforeach()
  endif()
endfunction()

# The [gpu] tests Catch2 discovers at build time: their properties, with SKIP_RETURN_CODE only
# where no device is present. Their names are known only once built, so their programs are listed
# (dtrain_gpu_programs): check_gates.cmake lets a test of those programs skip where no device is.
set(DTRAIN_GPU_TEST_PROPERTIES TIMEOUT 300 LABELS gpu)
if(NOT DTRAIN_GPU_PRESENT)
  list(APPEND DTRAIN_GPU_TEST_PROPERTIES SKIP_RETURN_CODE 77)
endif()
function(dtrain_gpu_programs)
  set_property(GLOBAL APPEND PROPERTY DTRAIN_GPU_PROGRAMS ${ARGN})
endfunction()

# Which tiers this configuration has, checked at the end of the top-level directory (after
# examples/ has added its tests) and written where check_gates.cmake reads it.
function(dtrain_check_tiers)
  # tier     | floor | what it needs (what scripts/install-deps.sh installs). A floor is the tier's
  # count when it was last set: raise it as tests are added, lower it only with tests removed.
  set(DTRAIN_TIER_TABLE
    "unit     | 209 | Catch2"
    "gates    | 5 | Python 3 (the layering and rank-thread checks)"
    "cmake    | 5 | CMake"
    "thrust   | 9 | Thrust (libthrust-dev)"
    "tcp      | 77 | Boost.Asio and libcrypto (libboost-dev, libssl-dev)"
    "shm      | 32 | Boost.Asio and libcrypto (libboost-dev, libssl-dev)"
    "mixed    | 16 | Boost.Asio and libcrypto (libboost-dev, libssl-dev)"
    "mpirun   | 5 | Open MPI's mpirun (openmpi-bin)"
    "fuzz     | 1 | clang++-14 and its libFuzzer runtime (clang-14, libclang-rt-14-dev)"
    "examples | 12 | Eigen, zlib, CLI11, fmt and the Fashion-MNIST data (dataset-fashion-mnist)"
    "bench    | 10 | the benchmarks (DTRAIN_BUILD_BENCH), dtrain-run, Boost.Asio and Python 3"
    "torch    | 12 | a Python that imports torch, libtorch, pybind11 (python3-torch, libtorch-dev), expecttest (PyPI)"
    "netns    | 3 | root, iproute2 and tc (a capability: without root these tests may skip)"
    "gpu      | 5 | the CUDA toolkit and NCCL (a capability: without a device these tests may skip)")
  set(present unit gates cmake)
  set(missing "")
  # every label a test may carry
  set(tiers unit gates cmake thrust tcp shm mixed mpirun fuzz examples bench torch netns gpu)
  foreach(pair "thrust;Thrust_FOUND" "tcp;DTRAIN_HAS_ASIO" "shm;DTRAIN_HAS_ASIO" "mixed;DTRAIN_HAS_ASIO"
               "mpirun;DTRAIN_MPIRUN" "fuzz;DTRAIN_CAN_FUZZ" "examples;DTRAIN_HAS_EXAMPLE_TESTS"
               "bench;DTRAIN_HAS_BENCH_TESTS"
               "torch;DTRAIN_HAS_TORCH_TESTS" "netns;DTRAIN_CAN_NETNS" "gpu;DTRAIN_HAS_NCCL")
    list(GET pair 0 tier)
    list(GET pair 1 variable)
    get_property(value GLOBAL PROPERTY ${variable})  # set by a subdirectory
    set(here "${${variable}}")                      # set in this directory, or a cache variable
    if(here OR value)
      list(APPEND present ${tier})
    elseif(NOT tier MATCHES "^(netns|gpu)$")
      list(APPEND missing ${tier})
    endif()
  endforeach()
  set(floors "")
  foreach(row IN LISTS DTRAIN_TIER_TABLE)
    string(REGEX MATCH "^([a-z]+) *\\| *([0-9]+) *\\| *(.*)$" _ "${row}")
    set(tier ${CMAKE_MATCH_1})
    if(tier IN_LIST present)
      list(APPEND floors "${tier}=${CMAKE_MATCH_2}")
    elseif(tier IN_LIST missing)
      set(why_${tier} "${CMAKE_MATCH_3}")
    endif()
  endforeach()
  if(missing)
    set(text "")
    foreach(tier IN LISTS missing)
      string(APPEND text "\n  ${tier}: needs ${why_${tier}}")
    endforeach()
    if(DTRAIN_FULL_SUITE)
      message(FATAL_ERROR "dtrain: DTRAIN_FULL_SUITE, but these test tiers cannot be built here "
                          "(scripts/install-deps.sh installs what they need):${text}")
    endif()
    message(STATUS "dtrain: these test tiers are not built here:${text}")
  endif()
  get_property(may_skip GLOBAL PROPERTY DTRAIN_MAY_SKIP)
  get_property(gpu_programs GLOBAL PROPERTY DTRAIN_GPU_PROGRAMS)
  get_property(gpu_present GLOBAL PROPERTY DTRAIN_GPU_PRESENT)
  set(gpu_may_skip ON)
  if(gpu_present)
    set(gpu_may_skip OFF)
  endif()
  file(WRITE "${PROJECT_BINARY_DIR}/dtrain_suite.cmake"
       "# Written by tests/tiers.cmake for tests/gates/check_gates.cmake.\n"
       "set(DTRAIN_SUITE_FULL ${DTRAIN_FULL_SUITE})\n"
       "set(DTRAIN_SUITE_FLOORS \"${floors}\")\n"
       "set(DTRAIN_SUITE_TIERS \"${tiers}\")\n"
       "set(DTRAIN_SUITE_MAY_SKIP \"${may_skip}\")\n"
       "set(DTRAIN_SUITE_GPU_PROGRAMS \"${gpu_programs}\")\n"
       "set(DTRAIN_SUITE_GPU_MAY_SKIP ${gpu_may_skip})\n")
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL dtrain_check_tiers)
