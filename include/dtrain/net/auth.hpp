#pragma once
// The job token and the HMAC-SHA256 challenge-response every dtrain connection starts with.
//
// connector -> acceptor  hello     magic "DTRH", version, role, rank, size, epoch, nonce_c
// acceptor  -> connector challenge status, nonce_a, HMAC(token, "acceptor"  | hello | nonce_a),
//                                  refusal reason (text, when status != 0)
// connector -> acceptor  response  HMAC(token, "connector" | hello | nonce_a)
// acceptor  -> connector verdict   status
// Both sides prove they hold the token, neither sends it, and fresh nonces on both sides make a
// recorded handshake useless. Nothing a peer sends reaches the application before the verdict.

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"

namespace dtrain::detail::auth {

using nonce = std::array<std::byte, 32>;
using mac = std::array<std::byte, 32>;

/// What a connection is for; an acceptor admits only the role it serves.
enum class role : std::uint16_t { transport = 1, store = 2 };

struct hello {
  static constexpr std::uint32_t magic = 0x48525444;  // "DTRH"
  static constexpr std::uint16_t version = 1;
  static constexpr std::size_t size = 56;

  role who = role::transport;
  std::int32_t rank = 0;
  std::int32_t world = 0;
  std::uint64_t epoch = 0;
  nonce n{};
};

using hello_bytes = std::array<std::byte, hello::size>;

inline hello_bytes encode(const hello& h) {
  using dtrain::detail::wire::put;
  hello_bytes b{};
  put(&b[0], hello::magic);
  put(&b[4], hello::version);
  put(&b[6], static_cast<std::uint16_t>(h.who));
  put(&b[8], static_cast<std::uint32_t>(h.rank));
  put(&b[12], static_cast<std::uint32_t>(h.world));
  put(&b[16], h.epoch);
  for (std::size_t i = 0; i < h.n.size(); ++i) b[24 + i] = h.n[i];
  return b;
}

/// Decodes a hello; std::nullopt for anything that is not one.
inline std::optional<hello> decode(const hello_bytes& b) {
  using dtrain::detail::wire::get;
  if (get<std::uint32_t>(&b[0]) != hello::magic || get<std::uint16_t>(&b[4]) != hello::version) {
    return std::nullopt;
  }
  auto who = get<std::uint16_t>(&b[6]);
  if (who != static_cast<std::uint16_t>(role::transport) && who != static_cast<std::uint16_t>(role::store)) {
    return std::nullopt;
  }
  hello h;
  h.who = static_cast<role>(who);
  h.rank = static_cast<std::int32_t>(get<std::uint32_t>(&b[8]));
  h.world = static_cast<std::int32_t>(get<std::uint32_t>(&b[12]));
  h.epoch = get<std::uint64_t>(&b[16]);
  for (std::size_t i = 0; i < h.n.size(); ++i) h.n[i] = b[24 + i];
  return h;
}

struct challenge {
  static constexpr std::size_t reason_size = 96;
  static constexpr std::size_t size = 4 + 32 + 32 + reason_size;
  std::uint32_t status = 0;  // 0: go on; otherwise refused, see reason
  nonce n{};
  mac proof{};
  std::string reason;
};

using challenge_bytes = std::array<std::byte, challenge::size>;

inline challenge_bytes encode(const challenge& c) {
  challenge_bytes b{};
  dtrain::detail::wire::put(&b[0], c.status);
  for (std::size_t i = 0; i < 32; ++i) b[4 + i] = c.n[i];
  for (std::size_t i = 0; i < 32; ++i) b[36 + i] = c.proof[i];
  for (std::size_t i = 0; i < c.reason.size() && i < challenge::reason_size - 1; ++i) {
    b[68 + i] = static_cast<std::byte>(c.reason[i]);
  }
  return b;
}

inline challenge decode(const challenge_bytes& b) {
  challenge c;
  c.status = dtrain::detail::wire::get<std::uint32_t>(&b[0]);
  for (std::size_t i = 0; i < 32; ++i) c.n[i] = b[4 + i];
  for (std::size_t i = 0; i < 32; ++i) c.proof[i] = b[36 + i];
  for (std::size_t i = 68; i < b.size() && b[i] != std::byte{0}; ++i) {
    auto ch = static_cast<char>(b[i]);
    c.reason.push_back(ch >= ' ' && ch <= '~' ? ch : '?');  // a peer's text, printed later
  }
  return c;
}

inline nonce random_nonce() {
  nonce n{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    throw error(errc::auth_failed, "dtrain: the system random generator failed (RAND_bytes)");
  }
  return n;
}

/// HMAC-SHA256(token, message).
inline mac hmac(std::string_view token, std::string_view message) {
  mac out{};
  unsigned int len = 0;
  static const unsigned char empty_key = 0;  // HMAC needs a valid pointer even for no key
  const void* key = token.empty() ? static_cast<const void*>(&empty_key) : token.data();
  HMAC(EVP_sha256(), key, static_cast<int>(token.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), reinterpret_cast<unsigned char*>(out.data()), &len);
  return out;
}

/// HMAC-SHA256(token, label | hello | nonce).
inline mac prove(std::string_view token, std::string_view label, const hello_bytes& h,
                 const nonce& n) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(h.data()), h.size());
  msg.append(reinterpret_cast<const char*>(n.data()), n.size());
  return hmac(token, msg);
}

inline bool same(const mac& a, const mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

/// The job token: `explicit_token` if given, else $DTRAIN_TOKEN, else the contents of the file
/// named by $DTRAIN_TOKEN_FILE (trailing whitespace removed). Empty when none is configured.
/// @throws dtrain::error if DTRAIN_TOKEN_FILE names a file that cannot be read or is empty
inline std::string load_token(const std::optional<std::string>& explicit_token) {
  if (explicit_token) return *explicit_token;
  if (const char* t = std::getenv("DTRAIN_TOKEN"); t != nullptr && *t != '\0') return t;
  const char* path = std::getenv("DTRAIN_TOKEN_FILE");
  if (path == nullptr || *path == '\0') return {};
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  if (!in || token.empty()) {
    throw error(errc::auth_failed, std::string("dtrain: DTRAIN_TOKEN_FILE=") + path +
                                       " cannot be read or holds no token");
  }
  return token;
}

/// A fresh random token as 64 hex digits (for launchers).
inline std::string generate_token() {
  nonce n = random_nonce();
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (auto b : n) {
    auto v = std::to_integer<unsigned>(b);
    s.push_back(digits[v >> 4]);
    s.push_back(digits[v & 15]);
  }
  return s;
}

}  // namespace dtrain::detail::auth
