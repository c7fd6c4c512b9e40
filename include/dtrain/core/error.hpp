#pragma once
/// @file
/// Error codes and the exception type shared by every layer of dtrain.
///
/// Blocking primitives come in pairs (as in Asio): `f(..., std::error_code& ec) noexcept` and a
/// throwing `f(...)` that raises `dtrain::error` with a message naming the operation, the peer and
/// what was expected. Recoverable failures (I/O, timeout, lost peer, protocol mismatch) are error
/// codes; broken contracts are `DTRAIN_ASSERT`.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>

namespace dtrain {

/// The recoverable failures dtrain reports. Zero is reserved for "no error".
enum class errc {
  timeout = 1,          ///< a deadline passed before the operation finished
  collective_mismatch,  ///< a peer sent a message that belongs to a different collective
  message_truncated,    ///< an incoming message is larger than the buffer posted for it
  peer_lost,            ///< the peer closed or died while an operation needed it
  invalid_argument,     ///< arguments that cannot describe a valid operation
  protocol_error,       ///< a malformed or unexpected frame
  cancelled,            ///< the operation was cancelled before it completed
  broken,               ///< a previous failure left the communicator unusable; rebuild it
  unsupported,          ///< the operation or type is not supported by this model
  auth_failed,          ///< a peer could not prove it holds the job token
  bad_data,             ///< a data file, checkpoint or record that is corrupt or of the wrong kind
  device_error,         ///< a CUDA or NCCL call failed (the message carries the library's text)
};

namespace detail {

class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dtrain"; }

  std::string message(int code) const override {
    switch (static_cast<errc>(code)) {
      case errc::timeout: return "deadline exceeded";
      case errc::collective_mismatch: return "collective mismatch between ranks";
      case errc::message_truncated: return "message larger than the receive buffer";
      case errc::peer_lost: return "peer lost";
      case errc::invalid_argument: return "invalid argument";
      case errc::protocol_error: return "protocol error";
      case errc::cancelled: return "operation cancelled";
      case errc::broken: return "communicator broken by an earlier error";
      case errc::unsupported: return "unsupported operation";
      case errc::device_error: return "GPU runtime or NCCL error";
      case errc::auth_failed: return "authentication failed";
      case errc::bad_data: return "corrupt or unexpected data";
    }
    return "unknown dtrain error";
  }
};

}  // namespace detail

/// The category of `dtrain::errc` codes.
inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl category;
  return category;
}

/// Makes `errc` values usable as `std::error_code` (found by ADL).
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// The exception every throwing dtrain primitive raises. `code()` tells what kind of failure it
/// was; `what()` names the operation, the peer and what was expected.
class error : public std::system_error {
 public:
  error(std::error_code code, const std::string& what) : std::system_error(code, what) {}
  error(errc code, const std::string& what) : std::system_error(make_error_code(code), what) {}

  /// `what()` without the ": <the code's message>" std::system_error appends: the text to pass on
  /// when wrapping or forwarding this error, so that the code is said once, not once per hop.
  std::string reason() const {
    std::string text = what();
    const std::string tail = ": " + code().message();
    if (text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0) {
      text.resize(text.size() - tail.size());
    }
    return text;
  }
};

/// Throws `error` if `ec` holds one; the throwing half of every `ec`/throwing pair.
inline void throw_if(const std::error_code& ec, const std::string& what) {
  if (ec) throw error(ec, what);
}

namespace detail {

[[noreturn]] inline void assertion_failed(const char* expr, const char* msg, const char* file,
                                          int line) noexcept {
  std::fprintf(stderr, "dtrain: contract violated at %s:%d: %s (%s)\n", file, line, msg, expr);
  std::abort();
}

}  // namespace detail
}  // namespace dtrain

template <>
struct std::is_error_code_enum<dtrain::errc> : std::true_type {};

/// Checks a contract that only a programming error can break; aborts with a message otherwise.
#define DTRAIN_ASSERT(expr, msg) \
  ((expr) ? static_cast<void>(0)  \
          : ::dtrain::detail::assertion_failed(#expr, msg, __FILE__, __LINE__))
