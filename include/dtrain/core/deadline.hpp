#pragma once
/// @file
/// One deadline model for every blocking operation: an absolute point on the steady clock.

#include <chrono>

namespace dtrain {

/// An absolute point in time by which a blocking operation must finish. Deadlines, not
/// durations, are passed down the layers, so that a collective made of many waits cannot take
/// longer in total than its caller allowed.
class deadline {
 public:
  using clock = std::chrono::steady_clock;

  /// A deadline at `when`.
  constexpr explicit deadline(clock::time_point when) noexcept : at_(when) {}

  /// A deadline `timeout` from now. A timeout past the clock's range (`milliseconds::max()`, a
  /// large configured value) never expires rather than wrapping into the past; a negative or NaN
  /// one has expired already.
  template <class Rep, class Period>
  static deadline after(std::chrono::duration<Rep, Period> timeout) noexcept {
    return deadline(clock::now()).later(timeout);
  }

  /// A deadline `extra` after this one, for a step that must answer after its caller's own
  /// timeout has: `never()` stays `never()`, a sum past the clock's range never expires, and a
  /// negative or NaN `extra` adds nothing.
  template <class Rep, class Period>
  constexpr deadline later(std::chrono::duration<Rep, Period> extra) const noexcept {
    using exact = std::chrono::duration<long double>;  // holds any duration without overflow
    if (!(exact(extra) > exact::zero())) return *this;
    if (exact(extra) >= exact(clock::time_point::max() - at_)) return never();
    return deadline(at_ + std::chrono::duration_cast<clock::duration>(extra));
  }

  /// A deadline that never expires; for callers that really mean "wait forever".
  static constexpr deadline never() noexcept { return deadline(clock::time_point::max()); }

  /// @returns the absolute point in time.
  constexpr clock::time_point time() const noexcept { return at_; }

  /// @returns true once the deadline has passed.
  bool expired() const noexcept { return clock::now() >= at_; }

  /// @returns the time left, zero once expired.
  clock::duration remaining() const noexcept {
    auto now = clock::now();
    return now >= at_ ? clock::duration::zero() : at_ - now;
  }

  friend constexpr bool operator==(deadline, deadline) noexcept = default;
  friend constexpr auto operator<=>(deadline, deadline) noexcept = default;

 private:
  clock::time_point at_;
};

}  // namespace dtrain
