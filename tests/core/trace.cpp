// The trace recorder writes a Chrome trace that holds what was recorded, from every thread.

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>

#include "../catch.hpp"
#include "dtrain/core/trace.hpp"

using namespace dtrain;

namespace {
std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("a disabled recorder records nothing and writes nothing", "[trace]") {
  trace::recorder r(nullptr);
  CHECK_FALSE(r.enabled());
  { trace::scope s("work", "compute", r); }
  CHECK(r.size() == 0);
  CHECK(r.flush());
}

TEST_CASE("scopes from several threads become complete events in a Chrome trace", "[trace]") {
  const std::string prefix = "/tmp/dtrain_trace_test_" + std::to_string(::getpid());
  {
    trace::recorder r(prefix.c_str());
    r.set_rank(3);
    r.name_thread("compute");
    { trace::scope s("forward \"1\"", "compute", r); }
    std::thread other([&] {
      r.name_thread("communication");
      trace::scope s("allreduce", "communication", r);
    });
    other.join();
    CHECK(r.size() == 2);
  }  // the destructor flushes
  const std::string path = prefix + ".3.json";
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::remove(path.c_str());
  CHECK(text.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0) == 0);
  CHECK(count(text, "\"ph\":\"X\"") == 2);
  CHECK(count(text, "\"pid\":3") == 5);  // process name, two thread names, two events
  CHECK(text.find("\"name\":\"forward \\\"1\\\"\"") != std::string::npos);  // quotes escaped
  CHECK(text.find("\"args\":{\"name\":\"communication\"}") != std::string::npos);
  CHECK(text.find("\"dropped_events\":0") != std::string::npos);
  // The two events ran on different tracks.
  const auto first_tid = text.find("\"tid\":", text.find("\"ph\":\"X\""));
  const auto second_tid = text.find("\"tid\":", text.rfind("\"ph\":\"X\""));
  CHECK(text.substr(first_tid, 8) != text.substr(second_tid, 8));
}
