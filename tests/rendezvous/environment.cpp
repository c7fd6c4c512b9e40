// Launch detection from each launcher's variables, with a fake environment.

#include <map>

#include "../catch.hpp"
#include "dtrain/rendezvous/environment.hpp"

using namespace dtrain;

namespace {

launch_environment detect(const std::map<std::string, std::string>& vars) {
  return detect_launch([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("environment: no launcher means one rank", "[rendezvous]") {
  auto e = detect({});
  CHECK(e.launcher == "none");
  CHECK(e.rank == 0);
  CHECK(e.size == 1);
  CHECK(e.store_host == "127.0.0.1");
}

TEST_CASE("environment: dtrain-run's variables, with its external store", "[rendezvous]") {
  auto e = detect({{"DTRAIN_RANK", "2"}, {"DTRAIN_WORLD_SIZE", "4"}, {"DTRAIN_LOCAL_RANK", "2"},
                   {"DTRAIN_STORE", "10.1.2.3:4567"}});
  CHECK(e.launcher == "dtrain");
  CHECK(e.rank == 2);
  CHECK(e.size == 4);
  CHECK(e.local_rank == 2);
  CHECK(e.store_external);
  CHECK(e.store_host == "10.1.2.3");
  CHECK(e.store_port == 4567);
}

TEST_CASE("environment: torchrun's variables", "[rendezvous]") {
  auto e = detect({{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                   {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}});
  CHECK(e.launcher == "torchrun");
  CHECK(e.rank == 1);
  CHECK(e.size == 8);
  CHECK(e.local_size == 4);
  CHECK(e.store_host == "node7");
  CHECK(e.store_port == 29500);
  CHECK_FALSE(e.store_external);
}

TEST_CASE("environment: Open MPI on one machine derives the store from the job id", "[rendezvous]") {
  std::map<std::string, std::string> vars{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                          {"OMPI_MCA_ess_base_jobid", "1664548865"}};
  auto e = detect(vars);
  CHECK(e.launcher == "openmpi");
  CHECK(e.store_host == "127.0.0.1");
  CHECK(e.store_port >= 20000);
  CHECK(e.store_port < 32768);  // below the ephemeral range: no client socket holds it
  vars["OMPI_COMM_WORLD_RANK"] = "0";
  CHECK(detect(vars).store_port == e.store_port);  // every rank derives the same port
}

TEST_CASE("environment: Open MPI across machines asks for a master address", "[rendezvous]") {
  try {
    detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
            {"OMPI_MCA_ess_base_jobid", "7"}});
    FAIL("no error");
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("DTRAIN_MASTER_ADDR") != std::string::npos);
  }
}

TEST_CASE("environment: Slurm's first node hosts the store", "[rendezvous]") {
  auto e = detect({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                   {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NODELIST", "gpu[03-06,9],cpu1"}});
  CHECK(e.launcher == "slurm");
  CHECK(e.rank == 5);
  CHECK(e.local_rank == 1);
  CHECK(e.store_host == "gpu03");
  CHECK(e.store_port == detail::env::port_for_job("4242.0"));
  CHECK(detail::env::first_slurm_host("single") == "single");
  CHECK(detail::env::first_slurm_host("a1,b2") == "a1");
}

TEST_CASE("environment: PMI (MPICH Hydra) and a shared-directory store", "[rendezvous]") {
  auto e = detect({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"DTRAIN_STORE_DIR", "/shared/job1"}});
  CHECK(e.launcher == "pmi");
  CHECK(e.size == 2);
  CHECK(e.store_dir == "/shared/job1");
}

TEST_CASE("environment: malformed values are refused by name", "[rendezvous]") {
  auto bad = [](std::map<std::string, std::string> vars, const std::string& word) {
    try {
      detect(vars);
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find(word) != std::string::npos);
    }
  };
  bad({{"DTRAIN_RANK", "x"}, {"DTRAIN_WORLD_SIZE", "2"}}, "DTRAIN_RANK=x");
  bad({{"DTRAIN_RANK", "2"}, {"DTRAIN_WORLD_SIZE", "2"}}, "not below");
  bad({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}}, "MASTER_PORT");
  bad({{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "2"}, {"DTRAIN_STORE", "nocolon"}}, "host:port");
  // Half a launch: each process would otherwise run alone, a job of N separate copies.
  bad({{"RANK", "1"}, {"MASTER_PORT", "29524"}}, "RANK is set but WORLD_SIZE is not");
  bad({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}}, "WORLD_SIZE is set but RANK is not");
  bad({{"DTRAIN_WORLD_SIZE", "3"}}, "DTRAIN_WORLD_SIZE is set but DTRAIN_RANK is not");
  bad({{"OMPI_COMM_WORLD_SIZE", "3"}}, "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
  bad({{"PMI_RANK", "0"}}, "PMI_RANK is set but PMI_SIZE is not");
  // Slurm's allocation shell sets the task count alone: one process, as without a launcher.
  CHECK(detect({{"SLURM_NTASKS", "4"}}).size == 1);
  // Half of one pair beside a whole later one is that launcher's job (a Slurm script exporting
  // WORLD_SIZE for torch).
  const auto slurm = detect({{"WORLD_SIZE", "4"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"},
                             {"SLURM_STEP_NODELIST", "node1"}, {"SLURM_JOB_ID", "7"}});
  CHECK(slurm.launcher == "slurm");
  CHECK(slurm.rank == 1);
}
