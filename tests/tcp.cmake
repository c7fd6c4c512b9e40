# TCP transport, rendezvous and launching: real sockets, real processes.

dtrain_add_test(test_rendezvous SOURCES rendezvous/stores.cpp rendezvous/environment.cpp LIBS dtrain::asio TIER tcp)
dtrain_add_test(test_tcp SOURCES transport/tcp.cpp transport/tcp_forming.cpp transport/progress.cpp
                transport/early_messages.cpp LIBS dtrain::asio TIER tcp)
dtrain_add_test(test_shm SOURCES transport/shm.cpp LIBS dtrain::asio TIER shm)
dtrain_add_test(test_mixed SOURCES transport/mixed.cpp LIBS dtrain::asio TIER mixed)
if(TARGET dtrain_test_thrust_cpp)
  # Staged point-to-point of device buffers over TCP, on host memory under Thrust's CPP system.
  dtrain_add_test(test_staged_p2p SOURCES collective/staged_p2p.cpp LIBS dtrain_test_thrust_cpp dtrain::asio TIER tcp)
  # The pipeline executor on device memory, stages talking through those messages.
  dtrain_add_test(test_device_pipeline SOURCES pipeline/device_executor.cpp
                  LIBS dtrain_test_thrust_cpp dtrain::asio TIER tcp)
endif()

add_executable(tcp_worker transport/tcp_worker.cpp)
target_link_libraries(tcp_worker PRIVATE dtrain::asio dtrain_test_build)

# Multi-process tests pass or fail by exit status only: every rank exits non-zero on a wrong
# result, and dtrain-run (tested by tools/dtrain_run.sh) and mpirun exit non-zero when any rank
# does. No test here matches its output with PASS_REGULAR_EXPRESSION, which would make ctest
# ignore the exit status (tests/gates/check_gates.cmake keeps it so).

# dtrain-run's own contract: environment, prefixed output, a failed rank stops the rest and its
# status is the launcher's.
add_test(NAME dtrain_run_contract COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/dtrain_run.sh $<TARGET_FILE:dtrain-run>)
set_tests_properties(dtrain_run_contract PROPERTIES TIMEOUT 120 LABELS tcp)

# docs/parameter_server.md's whole program (its first block, compiled by the doc-block rules)
# run as the page says: one server, two workers, each of which must have trained.
if(TARGET doc_block_docs_parameter_server_1)
  # Its object is compiled in full (dtrain_linked_doc_blocks), the other blocks' only to IR.
  add_executable(doc_ps_program $<TARGET_OBJECTS:doc_block_docs_parameter_server_1>)
  target_link_libraries(doc_ps_program PRIVATE dtrain::asio)
  add_test(NAME doc_ps_program COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/examples/status_and_line.sh 0
                                       "[2] worker done: w[0] from 1 to" $<TARGET_FILE:dtrain-run> --servers 1 -n 3
                                       $<TARGET_FILE:doc_ps_program>)
  set_tests_properties(doc_ps_program PROPERTIES TIMEOUT 120 LABELS tcp)
elseif(Python3_Interpreter_FOUND)
  message(FATAL_ERROR "dtrain: docs/parameter_server.md's first block is no longer the program doc_ps_program runs")
endif()

# The flight recorder in real processes: a rank skips a call, calls a different size, aborts, is
# SIGKILLed, sleeps past the collectives' deadline and past dtrain-run's time limit; each time
# dtrain-run's report must name that rank and that call (and a clean job must leave no report).
add_executable(flight_worker tools/flight_worker.cpp)
target_link_libraries(flight_worker PRIVATE dtrain::asio dtrain_test_build)
add_test(NAME flight_recorder
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/flight_recorder.sh $<TARGET_FILE:dtrain-run>
                 $<TARGET_FILE:flight_worker>)
set_tests_properties(flight_recorder PROPERTIES TIMEOUT 300 LABELS tcp)

# Every collective and algorithm across 2..6 processes started by dtrain-run.
foreach(n RANGE 2 6)
  add_test(NAME tcp_conformance_dtrain_run_${n}
           COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_worker> conformance)
  set_tests_properties(tcp_conformance_dtrain_run_${n} PROPERTIES TIMEOUT 600 LABELS tcp)
endforeach()

# The API beyond even, blocking calls (v forms, small types, user's operators, nonblocking
# calls in any wait order, two threads on one communicator) over real sockets.
foreach(n 2 3 5)
  add_test(NAME tcp_api_dtrain_run_${n} COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_worker> api)
  set_tests_properties(tcp_api_dtrain_run_${n} PROPERTIES TIMEOUT 600 LABELS tcp)
endforeach()

# Allreduces past the 1 GiB frame cap (2 GiB + 68 bytes) with every algorithm, on 2 and 4 ranks,
# each alone (RUN_SERIAL): a rank holds its buffer and the algorithm's scratch, and every rank
# checks that its peak resident size stays under 3.5 buffers (7.5 GB). Parts past the 256 MiB
# message cap wait for the receiver's clear-to-send and tree reductions send on credit, so no
# rank keeps early messages it has no room for (4 ranks held 8.3 GB each without them and
# outgrew this 24 GiB machine; with them the largest peak is 6.5 GB). The collectives' deadline is
# 10 minutes, not the worker's 60 s: this VM faults in memory it has not touched before at 0.2-0.45
# GB/s when 4 processes do it at once (0.86 GB/s alone), so on a fresh machine 4 ranks' first ring
# allreduce took 61 s and the binomial tree's 46 s (8-10 s once the memory is warm). A job still
# running at 850 s is stopped by dtrain-run, which keeps every rank's flight record, before CTest's
# 900 s kill.
foreach(n 2 4)
  add_test(NAME tcp_large_allreduce_${n}
           COMMAND $<TARGET_FILE:dtrain-run> --time-limit 850 -n ${n} $<TARGET_FILE:tcp_worker> large-allreduce)
  set_tests_properties(tcp_large_allreduce_${n} PROPERTIES TIMEOUT 900 RUN_SERIAL TRUE LABELS tcp
                       ENVIRONMENT DTRAIN_TIMEOUT_MS=600000)
endforeach()

# Process groups over real sockets: every collective and algorithm on the groups of three splits
# and along both axes of a mesh, all at once; two groups of the same ranks on two threads.
add_executable(tcp_groups_worker transport/tcp_groups_worker.cpp)
target_link_libraries(tcp_groups_worker PRIVATE dtrain::asio dtrain_test_build)
foreach(n 3 4 6)
  add_test(NAME tcp_groups_dtrain_run_${n} COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_groups_worker>)
  set_tests_properties(tcp_groups_dtrain_run_${n} PROPERTIES TIMEOUT 600 LABELS tcp)
endforeach()

# Pipeline schedules over real sockets against the serial reference: the world as one pipeline,
# (even worlds) two data-parallel replicas of a pipeline along a mesh axis, and (4 ranks) two
# tensor-parallel stages.
add_executable(tcp_pipeline_worker pipeline/tcp_pipeline_worker.cpp)
target_link_libraries(tcp_pipeline_worker PRIVATE dtrain::asio dtrain_test_build)
foreach(n 1 2 3 4)
  add_test(NAME tcp_pipeline_dtrain_run_${n}
           COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_pipeline_worker>)
  set_tests_properties(tcp_pipeline_dtrain_run_${n} PROPERTIES TIMEOUT 600 LABELS tcp)
endforeach()
# Stages built with different seams: the one that finds it tells every rank, each of which must
# raise it (the worker's exit status says so).
add_test(NAME tcp_pipeline_misfit_3 COMMAND $<TARGET_FILE:dtrain-run> -n 3 $<TARGET_FILE:tcp_pipeline_worker> misfit)
set_tests_properties(tcp_pipeline_misfit_3 PROPERTIES TIMEOUT 300 LABELS tcp)

# The same on an emulated cluster (bench/emulated_cluster.sh: a network namespace per host, links
# shaped by tc), where the hosts are real: discover_hosts must find the launcher's placement.
# Needs root (tiers.cmake): without it, skipped (77).
foreach(layout "2;2" "3;2")
  list(GET layout 0 h)
  list(GET layout 1 l)
  add_test(NAME tcp_emulated_cluster_${h}x${l}
           COMMAND ${PROJECT_SOURCE_DIR}/bench/emulated_cluster.sh --hosts ${h} --ranks-per-host ${l} --port 2960${h}
                   -- $<TARGET_FILE:tcp_groups_worker>)
  set_tests_properties(tcp_emulated_cluster_${h}x${l} PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE LABELS netns)
  dtrain_skip_unless(DTRAIN_CAN_NETNS REASON "network namespaces need root, iproute2 and tc"
                     TESTS tcp_emulated_cluster_${h}x${l})
endforeach()

# Every collective and algorithm, and the API beyond them, over shared memory across 1..9
# processes started by dtrain-run.
foreach(n RANGE 1 9)
  add_test(NAME shm_conformance_dtrain_run_${n}
           COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_worker> conformance)
  set_tests_properties(shm_conformance_dtrain_run_${n}
                       PROPERTIES TIMEOUT 600 ENVIRONMENT DTRAIN_TEST_TRANSPORT=shm LABELS shm)
endforeach()
foreach(n 2 3 5)
  add_test(NAME shm_api_dtrain_run_${n} COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_worker> api)
  set_tests_properties(shm_api_dtrain_run_${n} PROPERTIES TIMEOUT 600 ENVIRONMENT DTRAIN_TEST_TRANSPORT=shm LABELS shm)
endforeach()

# The shared-memory conformance and API with single copy from 4 KiB (the default is 16 MiB, which
# no message here reaches): large messages are read from the sender's memory across processes, and
# every rank checks it sent through both paths with no fallback it did not ask for (tcp_worker's
# DTRAIN_TEST_EXPECT_PATHS), as does the mixed transport on 2 emulated hosts.
set(single_copy_from_4k "DTRAIN_SHM_SINGLE_COPY_BYTES=4096;DTRAIN_TEST_EXPECT_PATHS=single-copy")
foreach(run "conformance;2" "conformance;3" "conformance;5" "api;3")
  list(GET run 0 mode)
  list(GET run 1 n)
  add_test(NAME shm_single_copy_${mode}_dtrain_run_${n}
           COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_worker> ${mode})
  set_tests_properties(shm_single_copy_${mode}_dtrain_run_${n} PROPERTIES TIMEOUT 600 LABELS shm ENVIRONMENT
                       "DTRAIN_TEST_TRANSPORT=shm;${single_copy_from_4k}")
endforeach()
add_test(NAME mixed_single_copy_conformance_dtrain_run_4
         COMMAND $<TARGET_FILE:dtrain-run> -n 4 $<TARGET_FILE:tcp_worker> conformance)
set_tests_properties(mixed_single_copy_conformance_dtrain_run_4 PROPERTIES TIMEOUT 600 LABELS mixed ENVIRONMENT
                     "DTRAIN_TEST_TRANSPORT=mixed;DTRAIN_TEST_HOSTS=2;${single_copy_from_4k}")

# The TCP conformance again over the mixed transport in 1..9 processes: rank r on emulated host
# r % hosts, so ranks of one host (interleaved in the world) share memory and the others use TCP.
foreach(layout "1;1" "2;2" "3;2" "4;2" "5;2" "6;3" "7;3" "8;3" "9;4")
  list(GET layout 0 n)
  list(GET layout 1 hosts)
  add_test(NAME mixed_conformance_dtrain_run_${n}
           COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:tcp_worker> conformance)
  set_tests_properties(mixed_conformance_dtrain_run_${n} PROPERTIES TIMEOUT 600
                       ENVIRONMENT "DTRAIN_TEST_TRANSPORT=mixed;DTRAIN_TEST_HOSTS=${hosts}" LABELS mixed)
endforeach()
add_test(NAME mixed_api_dtrain_run_4 COMMAND $<TARGET_FILE:dtrain-run> -n 4 $<TARGET_FILE:tcp_worker> api)
set_tests_properties(mixed_api_dtrain_run_4 PROPERTIES TIMEOUT 600
                     ENVIRONMENT "DTRAIN_TEST_TRANSPORT=mixed;DTRAIN_TEST_HOSTS=2" LABELS mixed)

# The same under Open MPI's mpirun: rank and size from OMPI_COMM_WORLD_*, rank 0 serves the store.
find_program(DTRAIN_MPIRUN mpirun)
if(DTRAIN_MPIRUN)
  foreach(n RANGE 2 6)
    add_test(NAME tcp_conformance_mpirun_${n}
             COMMAND ${DTRAIN_MPIRUN} --allow-run-as-root --oversubscribe -np ${n}
                     $<TARGET_FILE:tcp_worker> conformance)
    set_tests_properties(tcp_conformance_mpirun_${n} PROPERTIES TIMEOUT 600 LABELS mpirun)
  endforeach()
endif()

# Faults across processes: SIGKILL mid-allreduce, a wrong token, junk on every listening port,
# a mismatched collective. The test program starts the worker processes itself.
dtrain_add_test(test_tcp_faults SOURCES transport/tcp_faults.cpp LIBS dtrain::asio TIER tcp)
target_compile_definitions(test_tcp_faults PRIVATE
                           DTRAIN_TCP_WORKER="$<TARGET_FILE:tcp_worker>"
                           DTRAIN_RUN="$<TARGET_FILE:dtrain-run>")
add_dependencies(test_tcp_faults tcp_worker dtrain-run)

# The same faults over shared memory: a SIGKILLed rank is named within 100 ms, nothing is left in
# /dev/shm, another job's rank is refused.
dtrain_add_test(test_shm_faults SOURCES transport/shm_faults.cpp LIBS dtrain::asio TIER shm)
target_compile_definitions(test_shm_faults PRIVATE DTRAIN_TCP_WORKER="$<TARGET_FILE:tcp_worker>")
add_dependencies(test_shm_faults tcp_worker)

# Ranks in separate network namespaces joined by veth pairs (root only; skips otherwise).
add_test(NAME tcp_netns COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/transport/netns.sh $<TARGET_FILE:tcp_worker> 3)
set_tests_properties(tcp_netns PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE LABELS netns)
dtrain_skip_unless(DTRAIN_CAN_NETNS REASON "network namespaces need root and iproute2" TESTS tcp_netns)

# The frame and handshake decoders under libFuzzer (clang 14), for a bounded time; where clang or
# its fuzzer runtime is missing the fuzz tier is (tiers.cmake: a DTRAIN_FULL_SUITE build fails).
if(DTRAIN_CAN_FUZZ)
  add_test(NAME fuzz_frame_decoder
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzzer.sh ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR} 30)
  set_tests_properties(fuzz_frame_decoder PROPERTIES TIMEOUT 300 LABELS fuzz)
endif()

# The allreduce trainer across real processes, against the serial simulation.
add_executable(trainer_worker allreduce/trainer_worker.cpp)
target_link_libraries(trainer_worker PRIVATE dtrain::asio dtrain_test_build)
foreach(mode sync local-sgd)
  foreach(n 2 3 4)
    add_test(NAME allreduce_trainer_tcp_${mode}_${n}
             COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:trainer_worker> ${mode})
    set_tests_properties(allreduce_trainer_tcp_${mode}_${n} PROPERTIES TIMEOUT 300 LABELS tcp)
  endforeach()
endforeach()
# Mixed precision (a bfloat16 model, float master weights) across processes.
foreach(n 2 3)
  add_test(NAME allreduce_trainer_tcp_bf16_${n}
           COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:trainer_worker> bf16)
  set_tests_properties(allreduce_trainer_tcp_bf16_${n} PROPERTIES TIMEOUT 300 LABELS tcp)
endforeach()
# A job resumed from a mid-epoch checkpoint ends bit-identical to the straight job (issue 16).
add_test(NAME allreduce_trainer_tcp_resume_2
         COMMAND $<TARGET_FILE:dtrain-run> -n 2 $<TARGET_FILE:trainer_worker> resume)
set_tests_properties(allreduce_trainer_tcp_resume_2 PROPERTIES TIMEOUT 300 LABELS tcp)

# The sharded trainer across real processes, against the serial simulation of every rank.
add_executable(sharded_worker sharded/sharded_worker.cpp)
target_link_libraries(sharded_worker PRIVATE dtrain::asio dtrain_test_build)
foreach(run zero1:3 zero2:3 zero3:3 zero3:4 hybrid:4 zero2:8 zero3:8 hybrid:8 bf16:3 bf16:8)
  string(REPLACE ":" ";" run ${run})
  list(GET run 0 mode)
  list(GET run 1 n)
  add_test(NAME sharded_trainer_tcp_${mode}_${n}
           COMMAND $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:sharded_worker> ${mode})
  set_tests_properties(sharded_trainer_tcp_${mode}_${n} PROPERTIES TIMEOUT 300 LABELS tcp)
endforeach()

# The parameter server across real processes: 2 servers and 2 or 3 workers under dtrain-run.
add_executable(ps_worker ps/ps_worker.cpp)
target_link_libraries(ps_worker PRIVATE dtrain::asio dtrain_test_build)
foreach(n 4 5)
  add_test(NAME ps_tcp_bsp_${n} COMMAND ${CMAKE_COMMAND} -E env DTRAIN_PS_SERVERS=2
                                        $<TARGET_FILE:dtrain-run> -n ${n} $<TARGET_FILE:ps_worker> bsp)
  set_tests_properties(ps_tcp_bsp_${n} PROPERTIES TIMEOUT 300 LABELS tcp)
endforeach()
add_test(NAME ps_tcp_asp_4 COMMAND ${CMAKE_COMMAND} -E env DTRAIN_PS_SERVERS=2
                                   $<TARGET_FILE:dtrain-run> -n 4 $<TARGET_FILE:ps_worker> asp)
set_tests_properties(ps_tcp_asp_4 PROPERTIES TIMEOUT 300 LABELS tcp)
dtrain_add_test(test_ps_faults SOURCES ps/faults.cpp ps/membership.cpp LIBS dtrain::asio TIER tcp)
target_compile_definitions(test_ps_faults PRIVATE DTRAIN_PS_WORKER="$<TARGET_FILE:ps_worker>")
add_dependencies(test_ps_faults ps_worker)
