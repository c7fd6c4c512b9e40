#pragma once
// PyTorch's rendezvous store (a c10d::Store: the TCPStore behind env:// and tcp://, or the
// prefixed store of a new_group) as a dtrain `store`, so dtrain's TCP transport meets its peers
// where torch.distributed already brought every rank.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::torch_backend {

class c10d_store {
 public:
  explicit c10d_store(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, std::span<const std::byte> value, deadline) {
    translated(key, "set", [&] {
      const auto* p = reinterpret_cast<const std::uint8_t*>(value.data());
      store_->set(key, std::vector<std::uint8_t>(p, p + value.size()));
    });
  }

  // c10d's `get` waits as long as the store's own timeout says; the deadline is the caller's,
  // so wait until it first, then read.
  std::vector<std::byte> get(const std::string& key, deadline d) {
    std::vector<std::byte> out;
    translated(key, "get", [&] {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining());
      store_->wait({key}, std::max(std::chrono::milliseconds(1), left));
      const std::vector<std::uint8_t> v = store_->get(key);
      out.resize(v.size());
      std::copy(v.begin(), v.end(), reinterpret_cast<std::uint8_t*>(out.data()));
    });
    return out;
  }

  std::int64_t add(const std::string& key, std::int64_t delta, deadline) {
    std::int64_t v = 0;
    translated(key, "add", [&] { v = store_->add(key, delta); });
    return v;
  }

  bool set(const std::string& key, std::span<const std::byte> value, deadline d, std::error_code& ec) noexcept {
    return quietly(ec, [&] { set(key, value, d); });
  }
  std::vector<std::byte> get(const std::string& key, deadline d, std::error_code& ec) noexcept {
    std::vector<std::byte> v;
    quietly(ec, [&] { v = get(key, d); });
    return v;
  }
  std::int64_t add(const std::string& key, std::int64_t delta, deadline d, std::error_code& ec) noexcept {
    std::int64_t v = 0;
    quietly(ec, [&] { v = add(key, delta, d); });
    return v;
  }

 private:
  // c10d raises c10::Error (a std::exception); dtrain's callers expect dtrain::error.
  template <class F>
  static void translated(const std::string& key, const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      const std::string text = e.what();
      const bool late = text.find("imeout") != std::string::npos || text.find("timed out") != std::string::npos;
      throw error(late ? errc::timeout : errc::peer_lost,
                  std::string("torch store ") + what + " '" + key + "': " + text);
    }
  }

  template <class F>
  static bool quietly(std::error_code& ec, F&& f) noexcept {
    try {
      f();
      ec.clear();
      return true;
    } catch (const error& e) {
      ec = e.code();
    } catch (...) {
      ec = make_error_code(errc::peer_lost);
    }
    return false;
  }

  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace dtrain::torch_backend
