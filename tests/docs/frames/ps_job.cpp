// Statements in a function that returns the process's exit status (compiled only; the page's
// whole program, docs/parameter_server.md, runs as doc_ps_program).
// links: dtrain::asio
// needs: asio
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <dtrain/ps/trainer.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/transport/tcp.hpp>

int doc_block() {
// @block@
  return 0;
}
