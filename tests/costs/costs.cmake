# The tests that run longest, with their seconds under `ctest -j2` on a 2-vCPU machine (rounded):
# CTest starts the costliest first, so that none of them starts late and runs alone while the
# other slots stand empty. A test's COST outranks CTest's record of its past times (which it reads
# only for tests without one). Tests that run alone (RUN_SERIAL) add their time wherever they fall;
# the two listed outrank every other and go first. apply.cmake gives these to CTest; a name here
# that names no test fails the suite's gates (tests/gates/check_gates.cmake).
# dtrain_cost(SECONDS [TORCH2] NAME...): a long name comes in parts; TORCH2 marks a test that only
# a torch 2 tree has (CI's build-torch2, whose gates check those entries alone: .ci/run).

dtrain_cost(110 "inproc_large_allreduce")
dtrain_cost(105 "torch backend: PyTorch's own distributed test suite, every test Gloo passes passes on dtrain, 3 "
                "ranks")
dtrain_cost(91 "conformance: allreduce")
dtrain_cost(41 "fashion_mnist_parallel_device_pp2_tp2")
dtrain_cost(38 "torch backend: monitored_barrier names the late ranks as Gloo does, and releases them at once, 3 "
               "ranks")
dtrain_cost(36 "fuzz_frame_decoder")
dtrain_cost(35 "conformance: reduce")
dtrain_cost(31 "torch backend: monitored_barrier against Gloo's, 3 ranks over TCP")
dtrain_cost(31 "fashion_mnist_ps_bsp_reproducible")
dtrain_cost(31 "cmake_consumer_readme")
dtrain_cost(29 "hierarchical allreduce equals the serial reduction, uniform and unequal hosts, P = 1-9")
dtrain_cost(26 "conformance: reduce_scatter")
dtrain_cost(25 "cmake_consumer_add_subdirectory")
dtrain_cost(24 "cmake_consumer_fetchcontent")
dtrain_cost(24 "ps membership: a server added to the running job while another is SIGKILLed, the shards moving "
               "to it from the lost one too, bit for bit as the serial simulation under BSP and exactly once "
               "under ASP")
dtrain_cost(24 "torch backend: the CUDA test's calls on CPU tensors against Gloo, 2 ranks")
dtrain_cost(24 "uint8, int8 and bool reduce as documented, raw bytes broadcast and gather")
dtrain_cost(24 TORCH2 "torch backend: FSDP and HSDP on a 2x2 DeviceMesh over dtrain and over Gloo agree, 4 ranks")
dtrain_cost(23 "torch backend: sparse allreduce against Gloo, 3 ranks over TCP")
dtrain_cost(22 "ps membership: a server added to the running job takes its share of the shards from their first "
               "copies, k copies throughout, bit for bit as the serial simulation under BSP and exactly once "
               "under ASP")
dtrain_cost(22 TORCH2 "torch backend: FSDP trained over dtrain and over Gloo agree, 3 ranks")
dtrain_cost(21 "torch backend: every collective against Gloo, 3 ranks started by torchrun")
dtrain_cost(19 "flight_recorder")
dtrain_cost(17 "torch backend: sparse allreduce and DDP with a sparse embedding against Gloo, 3 ranks")
dtrain_cost(16 "sharded_mlp_zero3_4_fp32")
dtrain_cost(15 "sharded_mlp_zero3_4_bf16")
dtrain_cost(15 "torch backend: every collective against Gloo, 4 ranks, tcp:// init")
dtrain_cost(14 "mixed_conformance_dtrain_run_9")
dtrain_cost(14 "collectives: buffers past the message cap go in parts, and arrive whole")
dtrain_cost(14 "torch backend: groups take shared memory within a host and TCP across, hosts a,b,a,b")
dtrain_cost(14 "torch backend: every collective against Gloo, 2 ranks, env:// init")
dtrain_cost(13 "ps fail-over: a server SIGKILLed under ASP, every acknowledged push applied exactly once")
dtrain_cost(13 "shm_conformance_dtrain_run_8")
dtrain_cost(12 "mixed_conformance_dtrain_run_8")
dtrain_cost(12 "shm_conformance_dtrain_run_9")
dtrain_cost(11 "fashion_mnist_parallel_device_matches_host")
dtrain_cost(11 "shm_conformance_dtrain_run_7")
dtrain_cost(10 "torch backend: log lines, wait timeouts, sequence numbers and profiler events, 2 ranks")
dtrain_cost(10 "conformance: alltoall")
dtrain_cost(10 "mixed_conformance_dtrain_run_7")
dtrain_cost(9 "ps fail-over: with more shards than servers (7 on 3), a server SIGKILLed takes every shard it "
              "headed to the next copies, bit for bit under BSP, exactly once under ASP")
dtrain_cost(9 "cmake_consumer_build_tree")
dtrain_cost(9 "shm_conformance_dtrain_run_6")
dtrain_cost(9 "ps faults: a job that grew by a server, SIGKILLed mid-job and restarted from the checkpoints, "
              "grows again and ends exactly right")
dtrain_cost(9 "torch backend: a rank SIGKILLed mid-allreduce, the others raise within a second naming it")
dtrain_cost(9 "ps membership: a job restarted from its checkpoints after a late worker had entered it lets that "
              "worker enter again, bit for bit as the serial simulation")
dtrain_cost(8 "conformance: allgather")
dtrain_cost(8 "torch backend: DTRAIN_TRANSPORT=tcp puts every pair on TCP, 3 ranks on one host")
dtrain_cost(8 "shm_api_dtrain_run_5")
dtrain_cost(8 "torch backend: a group never destroyed ends with the interpreter, a collective in flight, 2 "
              "ranks")
dtrain_cost(8 "cmake_consumer_install")
