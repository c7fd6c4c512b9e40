#pragma once
/// @file
/// What every store shares: epoch keys, value helpers, and the throwing forms written once over a
/// store's `error_code` forms. The `store` concept is in concepts/store.hpp.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "dtrain/concepts/store.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain {

/// `key` in rendezvous epoch `epoch`: "e<epoch>/<key>".
inline std::string epoch_key(std::uint64_t epoch, std::string_view key) {
  std::string out = "e" + std::to_string(epoch) + "/";
  out.append(key);
  return out;
}

inline std::span<const std::byte> as_value(std::string_view text) noexcept {
  return std::as_bytes(std::span(text.data(), text.size()));
}
inline std::string value_text(const std::vector<std::byte>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size()};
}

/// Waits for the value `who` ("rank 3") publishes under `key` as it joins a group: the first wait
/// on a peer, where a launch that lost a process stops. @throws dtrain::error (timeout) naming
/// the rank that did not come and what to check
template <store Store>
std::vector<std::byte> get_published_by(Store& s, const std::string& key, const std::string& who, deadline d) {
  std::error_code ec;
  auto v = s.get(key, d, ec);
  if (ec == errc::timeout) {
    throw error(errc::timeout, "dtrain: " + who + " did not join the group before the deadline (no '" + key +
                                   "' in the store): is its process running, started against the same store, "
                                   "epoch and world size?");
  }
  throw_if(ec, "dtrain: store get '" + key + "'");
  return v;
}

namespace detail {

inline constexpr std::size_t max_store_key = 4096;
inline constexpr std::size_t max_store_value = std::size_t{64} << 20;

/// The throwing forms of a store's operations, written once over its `ec` forms. (`error` appends
/// the code's own words to each text.)
template <class Derived>
class store_throwing_forms {
 public:
  void set(const std::string& key, std::span<const std::byte> value, deadline d) {
    std::error_code ec;
    self().set(key, value, d, ec);
    throw_if(ec, "dtrain: store set '" + key + "'");
  }
  std::vector<std::byte> get(const std::string& key, deadline d) {
    std::error_code ec;
    auto v = self().get(key, d, ec);
    throw_if(ec,
             "dtrain: store get '" + key + "'" + (ec == errc::timeout ? ": no rank set it before the deadline" : ""));
    return v;
  }
  std::int64_t add(const std::string& key, std::int64_t delta, deadline d) {
    std::error_code ec;
    auto v = self().add(key, delta, d, ec);
    throw_if(ec, "dtrain: store add '" + key + "'");
    return v;
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

inline bool valid_store_call(const std::string& key, std::size_t value_size, std::error_code& ec) {
  if (key.empty() || key.size() > max_store_key || value_size > max_store_value) {
    ec = make_error_code(errc::invalid_argument);
    return false;
  }
  return true;
}

}  // namespace detail
}  // namespace dtrain
