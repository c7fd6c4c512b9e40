// One rank of the flight-recorder tests (tools/flight_recorder.sh), started by dtrain-run over
// TCP: every rank runs allreduces of 1024 floats on the world and on a group of the even or the
// odd ranks, and rank DTRAIN_TEST_BAD_RANK (default 1) goes wrong at its fifth world call:
//
//   flight_worker ok         nobody goes wrong
//   flight_worker skip       it skips that call and returns from main (status 0)
//   flight_worker size       it calls it with 512 floats
//   flight_worker abort      it calls std::abort() before it (a crash in user code)
//   flight_worker kill       it SIGKILLs itself before it (nothing of it can dump)
//   flight_worker sleep      it sleeps DTRAIN_TEST_SLEEP_S seconds before it (default 60), with
//                            SIGTERM ignored: only the dump dtrain-run asks for (SIGUSR2) records
//                            it, and SIGKILL ends it
//   flight_worker ask        it sends itself the dump signal there, checks the dump it wrote
//                            (its 8 calls so far, all completed) and goes on: the job succeeds
//   flight_worker message    no collectives: three rounds of a ring of messages (1024 floats,
//                            tag 7) on the world's transport, recorded as the pipeline executor
//                            records its own; rank DTRAIN_TEST_BAD_RANK sleeps
//                            DTRAIN_TEST_SLEEP_S seconds in user code before its third send
//
// The collectives time out after DTRAIN_TIMEOUT_MS (default 3000). Exit status: 0 success,
// 3 the collective failed with a dtrain::error, 1 a wrong sum.

#include <signal.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/flight/dump.hpp"
#include "dtrain/flight/recorded.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

template <class Comm>
bool summed(Comm& comm, std::size_t n, int members) {
  std::vector<float> x(n, 1.0f);
  comm.allreduce(std::span(x), dtrain::reduce_op::sum);
  return x[0] == static_cast<float>(members) && x[n - 1] == static_cast<float>(members);
}

// The calls in this process's dump, if it was asked for (its reason line) and every call
// completed; -1 otherwise.
int completed_calls_in_dump() {
  std::ifstream in(dtrain::flight::dumper::global().path());
  int calls = 0;
  bool asked = false;
  for (std::string line; std::getline(in, line);) {
    asked = asked || line == "reason asked (SIGUSR2)";
    if (line.rfind("call ", 0) == 0) calls += line.find(" state=completed ") != std::string::npos ? 1 : -1000;
  }
  return asked ? calls : -1;
}

// Mode `message`: the ring of messages; a receive that times out raises.
int ring_of_messages(dtrain::process_group<dtrain::tcp_transport>& world, int bad, std::chrono::milliseconds timeout) {
  const int rank = world.rank(), size = world.size(), next = (rank + 1) % size, prev = (rank + size - 1) % size;
  dtrain::flight::p2p_log log(dtrain::flight::group_of(world, 0), dtrain::flight::members_of(world));
  std::vector<float> out(1024, static_cast<float>(rank)), in(1024);
  dtrain::signature sig;
  sig.count = in.size();
  for (int k = 0; k < 3; ++k) {
    auto rx = log.post(world.irecv(prev, 7, std::as_writable_bytes(std::span(in))), prev, 7, false, sig);
    if (rank == bad && k == 2) std::this_thread::sleep_for(std::chrono::seconds(env_int("DTRAIN_TEST_SLEEP_S", 60)));
    auto tx = log.post(world.isend(next, 7, sig, std::as_bytes(std::span(out))), next, 7, true, sig);
    rx.wait(dtrain::deadline::after(timeout));
    tx.wait(dtrain::deadline::after(timeout));
    if (in[0] != static_cast<float>(prev)) {
      std::fprintf(stderr, "rank %d: a wrong message from rank %d\n", rank, prev);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int bad = env_int("DTRAIN_TEST_BAD_RANK", 1);
  try {
    dtrain::tcp_options o;
    o.timeout = std::chrono::milliseconds(env_int("DTRAIN_TIMEOUT_MS", 3000));
    dtrain::communicator_options co;
    co.timeout = o.timeout;
    dtrain::process_group world(dtrain::tcp_transport::from_environment(o), o.timeout);
    if (mode == "message") return ring_of_messages(world, bad, o.timeout);
    const int rank = world.rank(), size = world.size();
    auto half = world.split(rank % 2);
    dtrain::communicator<dtrain::process_group<dtrain::tcp_transport>> all(world, co);
    dtrain::communicator<dtrain::process_group<dtrain::tcp_transport>> parity(std::move(*half), co);
    for (int call = 0; call < 6; ++call) {
      if (rank == bad && call == 4) {
        if (mode == "skip") return 0;
        // A crash comes once the others wait in call 4: a send completes when the transport has
        // it, so dying at once could take call 3's last message with it (a rank then fails in 3).
        if (mode == "abort" || mode == "kill") std::this_thread::sleep_for(std::chrono::milliseconds(300));
        if (mode == "abort") std::abort();
        if (mode == "kill") ::raise(SIGKILL);
        if (mode == "sleep") {
          std::signal(SIGTERM, SIG_IGN);  // every thread's: the transport's threads take signals too
          std::this_thread::sleep_for(std::chrono::seconds(env_int("DTRAIN_TEST_SLEEP_S", 60)));
        }
        if (mode == "ask") {
          ::raise(dtrain::flight::dump_signal);  // handled before raise returns
          if (const int calls = completed_calls_in_dump(); calls != 8) {
            std::fprintf(stderr, "rank %d: its dump holds %d completed calls, not 8\n", rank, calls);
            return 1;
          }
        }
      }
      const std::size_t n = rank == bad && call == 4 && mode == "size" ? 512 : 1024;
      if (!summed(all, n, size) || !summed(parity, 1024, parity.size())) {
        std::fprintf(stderr, "rank %d: wrong sum in call %d\n", rank, call);
        return 1;
      }
    }
    return 0;
  } catch (const dtrain::error& e) {
    std::fprintf(stderr, "caught dtrain::error: %s\n", e.what());
    return 3;
  }
}
