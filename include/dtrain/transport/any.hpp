#pragma once
/// @file
/// `any_transport`: any transport behind one type, chosen at run time.
///
/// Two uses: a program that picks its transport from a flag (`--transport inproc|tcp`), and a
/// translation unit that must not see a transport's headers. The second is why it exists: nvcc
/// cannot compile Boost.Asio, so a CUDA file instantiates `staged_communicator<any_transport>`
/// and a host file builds the `tcp_transport` and hands it over.
///
/// <!-- frame: header_any_transport -->
/// @code
/// dtrain::any_transport t(dtrain::tcp_transport::from_environment());   // host .cpp
/// run_on_gpu(std::move(t));                                               // .cu: staged_communicator<any_transport>
/// @endcode
///
/// Cost: one virtual call per operation and one allocation per completion handle; next to a
/// network message (tens of microseconds) it does not show.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/transport/progress.hpp"

namespace dtrain {

/// The completion of an `any_transport` operation: the wrapped transport's own handle.
class any_completion {
 public:
  any_completion() = default;
  // The self-check comes first: checking `completion<any_completion>` here would recurse.
  template <class C>
    requires(!std::same_as<std::remove_cvref_t<C>, any_completion>) && completion<C>
  explicit any_completion(C c) : self_(std::make_unique<model<C>>(std::move(c))) {}

  bool wait(deadline d, std::error_code& ec) noexcept { return self_ == nullptr || self_->wait(d, ec); }
  void wait(deadline d) {
    if (self_ != nullptr) self_->wait(d);
  }
  bool test() noexcept { return self_ == nullptr || self_->test(); }
  void cancel() noexcept {
    if (self_ != nullptr) self_->cancel();
  }
  const envelope& info() const noexcept { return self_ != nullptr ? self_->info() : empty_; }
  /// What the transport knows beyond the error code (which peer was lost, and how); may be empty.
  const std::string& detail() const noexcept { return self_ != nullptr ? self_->detail() : empty_detail_; }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual bool wait(deadline d, std::error_code& ec) noexcept = 0;
    virtual void wait(deadline d) = 0;
    virtual bool test() noexcept = 0;
    virtual void cancel() noexcept = 0;
    virtual const envelope& info() const noexcept = 0;
    virtual const std::string& detail() const noexcept = 0;
  };
  template <class C>
  struct model final : concept_t {
    explicit model(C c) : c_(std::move(c)) {}
    bool wait(deadline d, std::error_code& ec) noexcept override { return c_.wait(d, ec); }
    void wait(deadline d) override { c_.wait(d); }
    bool test() noexcept override { return c_.test(); }
    void cancel() noexcept override { c_.cancel(); }
    const envelope& info() const noexcept override { return c_.info(); }
    const std::string& detail() const noexcept override {
      if constexpr (requires { { c_.detail() } -> std::convertible_to<const std::string&>; }) {
        return c_.detail();
      } else {
        return empty_detail_;
      }
    }
    C c_;
  };

  std::unique_ptr<concept_t> self_;
  static inline const envelope empty_{};
  static inline const std::string empty_detail_{};
};

/// A host-memory transport of any type, erased. A model of `transport`.
class any_transport {
 public:
  using memory_space = host_memory;
  using request = any_completion;

  /// Takes `t` over. @pre `T` works on host memory (a device transport would need staging).
  template <class T>
    requires(!std::same_as<std::remove_cvref_t<T>, any_transport>) && transport<T> &&
            std::same_as<typename T::memory_space, host_memory>
  explicit any_transport(T t) : self_(std::make_unique<model<T>>(std::move(t))) {}

  int rank() const noexcept { return self_->rank(); }
  int size() const noexcept { return self_->size(); }
  /// The wrapped transport's `spare_cores()` (progress.hpp), false where it has none.
  bool spare_cores() const noexcept { return self_->spare_cores(); }
  request isend(int peer, std::uint64_t tag, const signature& sig, std::span<const std::byte> bytes) {
    return self_->isend(peer, tag, sig, bytes);
  }
  request isend(int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
    return self_->isend(peer, tag, sig, parts);
  }
  request irecv(int peer, std::uint64_t tag, std::span<std::byte> buffer) { return self_->irecv(peer, tag, buffer); }
  request irecv(int peer, std::uint64_t tag, std::vector<std::byte>& buffer) { return self_->irecv(peer, tag, buffer); }
  request irecv(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow) {
    return self_->irecv(peer, tag, parts, overflow);
  }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual int rank() const noexcept = 0;
    virtual int size() const noexcept = 0;
    virtual bool spare_cores() const noexcept = 0;
    virtual request isend(int peer, std::uint64_t tag, const signature& sig, std::span<const std::byte> bytes) = 0;
    virtual request isend(int peer, std::uint64_t tag, const signature& sig, gather_list parts) = 0;
    virtual request irecv(int peer, std::uint64_t tag, std::span<std::byte> buffer) = 0;
    virtual request irecv(int peer, std::uint64_t tag, std::vector<std::byte>& buffer) = 0;
    virtual request irecv(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow) = 0;
  };
  template <class T>
  struct model final : concept_t {
    explicit model(T t) : t_(std::move(t)) {}
    int rank() const noexcept override { return t_.rank(); }
    int size() const noexcept override { return t_.size(); }
    bool spare_cores() const noexcept override { return spare_cores_of(t_); }
    request isend(int peer, std::uint64_t tag, const signature& sig, std::span<const std::byte> bytes) override {
      return request(t_.isend(peer, tag, sig, bytes));
    }
    request isend(int peer, std::uint64_t tag, const signature& sig, gather_list parts) override {
      return request(t_.isend(peer, tag, sig, parts));
    }
    request irecv(int peer, std::uint64_t tag, std::span<std::byte> buffer) override {
      return request(t_.irecv(peer, tag, buffer));
    }
    request irecv(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow) override {
      return request(t_.irecv(peer, tag, parts, overflow));
    }
    request irecv(int peer, std::uint64_t tag, std::vector<std::byte>& buffer) override {
      return request(t_.irecv(peer, tag, buffer));
    }
    T t_;
  };

  std::unique_ptr<concept_t> self_;
};

static_assert(completion<any_completion>);

}  // namespace dtrain
