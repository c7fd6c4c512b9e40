// A program's log handler receives dtrain's log lines instead of stderr, with their levels, only
// those DTRAIN_LOG lets through (warn by default), until it is taken back.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../catch.hpp"
#include "dtrain/core/log.hpp"
#include "dtrain/detail/log.hpp"

namespace {
std::vector<std::pair<dtrain::log_level, std::string>> lines;
void keep(dtrain::log_level level, std::string_view text) { lines.emplace_back(level, std::string(text)); }
}  // namespace

TEST_CASE("log: a handler receives each line dtrain logs, with its level, and nullptr gives stderr back", "[core]") {
  using dtrain::log_level;
  const bool infos = dtrain::log_threshold() >= log_level::info;  // DTRAIN_LOG=info or debug
  lines.clear();
  dtrain::set_log_handler(keep);
  dtrain::detail::log(log_level::warn, "rank 0 refused a connection");
  dtrain::detail::log(log_level::info, "rank 0 listens on 127.0.0.1:1234");  // below the default threshold
  dtrain::detail::log(log_level::error, "the group failed");
  dtrain::set_log_handler(nullptr);
  // stderr again: the line lands in the file fd 2 points to for the moment, not in the handler.
  char path[] = "/tmp/dtrain_log_test_XXXXXX";
  const int file = ::mkstemp(path);
  REQUIRE(file >= 0);
  const int saved = ::dup(2);
  ::dup2(file, 2);
  dtrain::detail::log(log_level::warn, "to stderr, not to the handler");
  ::dup2(saved, 2);
  ::close(saved);
  ::close(file);
  std::ifstream in(path);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  CHECK(written == "dtrain warn: to stderr, not to the handler\n");
  std::vector<std::pair<log_level, std::string>> want{{log_level::warn, "rank 0 refused a connection"}};
  if (infos) want.emplace_back(log_level::info, "rank 0 listens on 127.0.0.1:1234");
  want.emplace_back(log_level::error, "the group failed");
  CHECK(lines == want);
}
