#pragma once
/// @file
/// Hogwild! (Niu, Recht, Ré and Wright 2011): threads of one process update shared parameters
/// without locks. Each coordinate is read and written with relaxed atomic loads and stores
/// (plain moves on x86, and no data race in the C++ sense); a read-modify-write may lose a
/// concurrent one, which is the algorithm's bet: with sparse updates collisions are rare.
///
/// <!-- frame: header_hogwild -->
/// @code
/// dtrain::ps::run_hogwild(std::span(weights), 4, [&](int thread, auto shared) {
///   for (auto& sample : my_part(thread))
///     for (auto [j, g] : sparse_gradient(sample, shared)) shared.add(j, -lr * g);
/// });
/// @endcode

#include <atomic>
#include <concepts>
#include <cstddef>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace dtrain::ps {

/// A view of parameters shared by Hogwild threads. Cheap to copy.
template <std::floating_point T>
class hogwild_params {
 public:
  explicit hogwild_params(std::span<T> data) noexcept : data_(data) {}

  std::size_t size() const noexcept { return data_.size(); }
  /// The current value of coordinate i (possibly mid-way through other threads' updates).
  T load(std::size_t i) const noexcept { return std::atomic_ref<T>(data_[i]).load(std::memory_order_relaxed); }
  /// x_i <- x_i + d, without a lock: a concurrent update of the same coordinate may be lost.
  void add(std::size_t i, T d) const noexcept {
    std::atomic_ref<T> x(data_[i]);
    x.store(x.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }

 private:
  std::span<T> data_;
};

/// Runs `body(thread, hogwild_params<T>)` on `threads` threads over `params` and joins them;
/// rethrows the first exception a thread raised.
template <std::floating_point T, class Body>
void run_hogwild(std::span<T> params, int threads, Body&& body) {
  static_assert(std::atomic_ref<T>::is_always_lock_free, "Hogwild needs lock-free atomics of T");
  std::vector<std::thread> pool;
  std::exception_ptr first;
  std::mutex m;
  const hogwild_params<T> shared(params);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        body(t, shared);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace dtrain::ps
