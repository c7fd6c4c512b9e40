#pragma once
// TCP ranks as threads of the test process, for tcp.cpp, tcp_forming.cpp and progress.cpp: the
// token and options every rank uses, and a runner that forms the group on loopback.

#include <chrono>
#include <string>

#include "../support/thread_ranks.hpp"
#include "dtrain/transport/tcp.hpp"

namespace dtrain::tcp_case {

using namespace std::chrono_literals;

inline const std::string token = "test-token";

inline tcp_options test_options() {
  tcp_options o;
  o.token = token;
  o.timeout = 20s;
  o.linger = 5s;
  return o;
}

// Runs body(rank, transport) on `n` threads, each a TCP rank; rethrows the first failure.
template <class Transport = tcp_transport, class Body>
void run_tcp(int n, Body body, tcp_options o = test_options()) {
  auto connect = [&](tcp_store& store, int r) { return Transport::connect(store, r, n, o, "127.0.0.1"); };
  testing::run_thread_ranks(n, token, connect, body);
}

}  // namespace dtrain::tcp_case
