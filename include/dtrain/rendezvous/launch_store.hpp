#pragma once
/// @file
/// `with_launch_store(timeout, token, form)`: the rendezvous store a launcher describes (see
/// `detect_launch`), handed to `form(store, env)`: a file store when DTRAIN_STORE_DIR is set;
/// otherwise a TCP store served by the launcher (DTRAIN_STORE) or by rank 0 at the master
/// address and port. Every transport that forms from the environment forms through it.

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "dtrain/core/deadline.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/rendezvous/environment.hpp"
#include "dtrain/rendezvous/file_store.hpp"
#include "dtrain/rendezvous/tcp_store.hpp"

namespace dtrain {

/// What `form` made, and the store server rank 0 runs, which must live as long as it does.
template <class T>
struct formed_from_launch {
  T value;
  std::shared_ptr<void> server;
};

/// Calls `form(store, env)` with the launcher's store and environment. `bind_address`, when not
/// empty, is where rank 0's store listens (else the store host's address, resolved by `resolve`).
/// @throws dtrain::error when the environment is incomplete or the store cannot be reached
template <class Form, class Resolve>
auto with_launch_store(std::chrono::milliseconds timeout, const std::string& token, const std::string& bind_address,
                       Resolve&& resolve, Form&& form) {
  launch_environment env = detect_launch();
  using made = decltype(form(std::declval<file_store&>(), env));
  if (!env.store_dir.empty()) {
    file_store store(env.store_dir);
    return formed_from_launch<made>{form(store, env), nullptr};
  }
  const deadline d = deadline::after(timeout);
  std::shared_ptr<tcp_store_server> server;
  if (!env.store_external && env.rank == 0) {
    server = std::make_shared<tcp_store_server>(bind_address.empty() ? resolve(env.store_host) : bind_address,
                                                env.store_port, token);
    detail::log(detail::log_level::info, "rank 0 serves the rendezvous store on " + env.store_host + ":" +
                                             std::to_string(server->port()));
    if (env.store_port == 0) env.store_port = server->port();
  }
  auto reach = [&] {
    try {
      return tcp_store(env.store_host, env.store_port, d, token);
    } catch (const error& e) {
      if (e.code() != errc::timeout) throw;
      throw error(errc::timeout, e.reason() + (env.store_external ? "; is the store DTRAIN_STORE names running?"
                                                                  : "; rank 0 serves it: is rank 0 running, and do "
                                                                    "all ranks name the same address and port "
                                                                    "(MASTER_ADDR and MASTER_PORT or their DTRAIN_ "
                                                                    "forms, where set)?"));
    }
  };
  tcp_store store = reach();
  return formed_from_launch<made>{form(store, env), std::move(server)};
}

}  // namespace dtrain
