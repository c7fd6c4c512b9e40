// The tests' main, for Catch2 v2 (Debian bookworm's) and v3 alike. Catch2's own main exits with
// the number of failed assertions, capped at 255: a test with 77 failures would exit 77, which
// ctest reads as "skipped" where a test may skip. Any failure exits 1 here; only a test that says
// it cannot run (tests/gpu/gpu.hpp) exits 77.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv) == 0 ? 0 : 1; }
