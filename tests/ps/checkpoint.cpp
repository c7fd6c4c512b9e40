// Shard checkpoints: a restored shard continues bit for bit like the original; corrupt,
// truncated, foreign or mismatched files are refused with a message saying why. The state a
// joining server starts from (ps/shard_transfer.hpp) likewise.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "../catch.hpp"
#include "dtrain/ps/checkpoint.hpp"
#include "dtrain/ps/shard_transfer.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"

using namespace dtrain;
using namespace dtrain::ps;

namespace {

using adam_table = table<float, lazy_adam<float>, uniform_initializer>;

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("dtrain_ckpt_") + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Pushes `rounds` random sparse gradients of length-2 keys into `t`.
void train(adam_table& t, int rounds, unsigned seed) {
  std::mt19937_64 gen(seed);
  for (int r = 0; r < rounds; ++r) {
    std::vector<key_type> keys;
    for (int i = 0; i < 50; ++i) keys.push_back(gen() % 5000);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<float> g(keys.size() * 2);
    for (float& v : g) v = static_cast<float>(static_cast<std::int64_t>(gen() % 2001) - 1000) / 1000.0f;
    t.push(keys, g, 2);
  }
}

std::vector<float> pull_all(adam_table& t) {
  std::vector<key_type> keys(5000);
  for (key_type k = 0; k < 5000; ++k) keys[k] = k;
  std::vector<float> out(keys.size() * 2);
  t.pull(keys, out, 2);
  return out;
}

std::string load_error(const std::string& path, std::uint32_t shard = 1) {
  adam_table t(lazy_adam<float>(0.01), uniform_initializer{0.1, 3});
  try {
    load_checkpoint(path, t, shard, 4);
  } catch (const dtrain::error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("a restored shard continues bit for bit like the original", "[ps][checkpoint]") {
  const std::string path = temp_path("roundtrip");
  adam_table original(lazy_adam<float>(0.01), uniform_initializer{0.1, 3});
  train(original, 100, 1);
  shard_state st{1, 4, 100, {7, 9, 8}};
  save_checkpoint(path, original, st);
  save_checkpoint(path, original, st);  // replacing an existing checkpoint works too
  CHECK_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));

  adam_table restored(lazy_adam<float>(0.01), uniform_initializer{0.1, 3});
  const auto got = load_checkpoint(path, restored, 1, 4);
  CHECK(got.version == 100);
  CHECK(got.clocks == std::vector<std::int64_t>{7, 9, 8});
  CHECK(restored.size() == original.size());
  train(original, 50, 2);  // the same further pushes: Adam's moments and step counts must match
  train(restored, 50, 2);
  CHECK(pull_all(restored) == pull_all(original));
  std::remove(path.c_str());
}

TEST_CASE("broken or mismatched checkpoints are refused, saying why", "[ps][checkpoint]") {
  const std::string path = temp_path("broken");
  adam_table t(lazy_adam<float>(0.01), uniform_initializer{0.1, 3});
  train(t, 20, 1);
  save_checkpoint(path, t, shard_state{1, 4, 20, {20, 20}});
  std::ifstream in(path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; };

  CHECK(load_error(path) == "no error");
  CHECK_THAT(load_error(path, 2), Catch::Contains("belongs to shard 1 of 4, not shard 2 of 4"));
  std::string flipped = good;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x10);
  write(flipped);
  CHECK_THAT(load_error(path), Catch::Contains("is corrupt: its checksum does not match"));
  write(good.substr(0, good.size() / 3));
  CHECK_THAT(load_error(path), Catch::Contains("is corrupt"));
  write("not a checkpoint at all, just text");
  CHECK_THAT(load_error(path), Catch::Contains("is not a dtrain checkpoint"));
  write("");
  CHECK_THAT(load_error(path), Catch::Contains("is not a dtrain checkpoint"));

  table<float, momentum<float>, uniform_initializer> other(momentum<float>(0.1), uniform_initializer{0.1, 3});
  train(t, 1, 5);
  save_checkpoint(path, other, shard_state{1, 4, 0, {}});
  CHECK_THAT(load_error(path), Catch::Contains("was written by updater momentum (1 state slots, 4-byte values); "
                                               "this server runs lazy_adam (3 slots, 4-byte values)"));
  table<float, lazy_adam<float>> zero_init(lazy_adam<float>(0.01));
  save_checkpoint(path, zero_init, shard_state{1, 4, 0, {}});
  CHECK_THAT(load_error(path), Catch::Contains("written with the zero initializer; this server uses uniform"));

  CHECK_THAT(load_error(path + ".missing"), Catch::Contains("cannot open"));
  write(good);
  CHECK_THROWS_WITH(load_checkpoint(path, t, 1, 4), Catch::Contains("not empty"));
  std::remove(path.c_str());
}

TEST_CASE(
    "a shard's state sent to a joining server continues bit for bit like the original, and a damaged one is refused",
    "[ps][checkpoint][replication]") {
  adam_table sparse(lazy_adam<float>(0.01), uniform_initializer{0.1, 3}),
      dense(lazy_adam<float>(0.01), uniform_initializer{0.1, 3});
  train(sparse, 30, 1);
  train(dense, 10, 2);
  const chain_position at{41, 40, 12, {7, 9}, {{0, 5}, {3, 17}}};
  const std::vector<std::byte> bytes = write_shard_state(at, sparse, dense);
  CHECK(bytes.size() % 8 == 0);
  adam_table s2(lazy_adam<float>(0.01), uniform_initializer{0.1, 3}),
      d2(lazy_adam<float>(0.01), uniform_initializer{0.1, 3});
  const chain_position got = read_shard_state(bytes, s2, d2, "server 2");
  CHECK(got.sequence == 41);
  CHECK(got.version == 40);
  CHECK(got.rounds == 12);
  CHECK(got.joined == std::vector<int>{7, 9});
  CHECK(got.last_push == at.last_push);
  train(sparse, 5, 3);  // updater state came too: both go on alike
  train(s2, 5, 3);
  CHECK(pull_all(sparse) == pull_all(s2));
  CHECK(pull_all(dense) == pull_all(d2));

  auto refusal = [&](std::vector<std::byte> b) {
    adam_table s3(lazy_adam<float>(0.01), uniform_initializer{0.1, 3}),
        d3(lazy_adam<float>(0.01), uniform_initializer{0.1, 3});
    try {
      read_shard_state(b, s3, d3, "server 2");
    } catch (const dtrain::error& e) {
      CHECK(e.code() == errc::bad_data);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(refusal({bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)}),
             Catch::Contains("the state of a shard from server 2 is truncated"));
  std::vector<std::byte> wrong = bytes;
  wrong[0] = std::byte{'X'};
  CHECK_THAT(refusal(wrong), Catch::Contains("does not start with DTRNJOIN"));
  std::vector<std::byte> longer = bytes;
  longer.resize(bytes.size() + 16);
  CHECK_THAT(refusal(longer), Catch::Contains("16 bytes after its tables"));
}
