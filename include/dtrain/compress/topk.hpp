#pragma once
/// @file
/// Top-k sparsification with error feedback (Aji and Heafield 2017; Stich, Cordonnier and
/// Jaggi 2018, "Sparsified SGD with memory"; Lin et al. 2018, Deep Gradient Compression):
///
///   a = g + e;   S = the k entries of largest |a|;   send (i, a_i) for i in S;   e = a, zero on S
///
/// What is not sent is carried to the next step, so every gradient entry is applied eventually
/// and SGD converges at the rate of the dense method for k down to about 1% of n (the papers'
/// results). A compressor keeps the residual e of one buffer (a gradient bucket, a pushed
/// tensor); `sparse_add` sums the pairs the ranks sent back into a dense buffer.
///
/// <!-- frame: header_gradient -->
/// @code
/// dtrain::topk_compressor<float> c(n);                         // one per bucket
/// const std::size_t k = dtrain::topk_count(n, 0.01);
/// std::vector<std::int32_t> idx(k); std::vector<float> val(k);
/// c.compress(grad, idx, val);                                  // idx sorted, e updated
/// @endcode

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain {

/// The k kept of `n` entries at `density` (0 < density <= 1): at least one where n > 0.
/// @throws dtrain::error (invalid_argument) for a density outside (0, 1].
inline std::size_t topk_count(std::size_t n, double density) {
  if (!(density > 0 && density <= 1)) {
    throw error(errc::invalid_argument, "top-k density " + std::to_string(density) + " is not in (0, 1]");
  }
  if (n == 0) return 0;
  return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(density * static_cast<double>(n))), 1, n);
}

/// The residual of one buffer and the selection of its k largest entries.
template <std::floating_point T>
class topk_compressor {
 public:
  /// For a buffer of `n` entries (indices travel as int32). @throws dtrain::error if n >= 2^31.
  explicit topk_compressor(std::size_t n = 0) : residual_(n, T(0)) {
    if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw error(errc::invalid_argument, "top-k: a buffer of " + std::to_string(n) + " entries is past int32 indices");
    }
  }

  std::size_t size() const noexcept { return residual_.size(); }

  /// Selects the `indices.size()` entries of largest magnitude of g + e, writes them sorted by
  /// index with their values, and keeps the rest as the new residual. A NaN counts as the
  /// largest (so it is sent, not hidden in the residual). @pre g.size() == size(),
  /// indices.size() == values.size() <= size()
  void compress(std::span<const T> g, std::span<std::int32_t> indices, std::span<T> values) {
    DTRAIN_ASSERT(g.size() == residual_.size() && indices.size() == values.size() && indices.size() <= g.size(),
                  "top-k: sizes disagree");
    const std::size_t n = g.size(), k = indices.size();
    for (std::size_t i = 0; i < n; ++i) residual_[i] += g[i];
    if (k == 0) return;
    // Candidates: the entries at least as large as a threshold taken from a strided sample, a
    // little below the sample's share of k so that at least k pass (else every entry is one).
    // The exact k-th largest is then selected among the candidates alone (Deep Gradient
    // Compression's sampling, kept exact): every entry that large is a candidate.
    const std::size_t stride = std::max<std::size_t>(1, n / 4096);
    magnitudes_.clear();
    for (std::size_t i = 0; i < n; i += stride) magnitudes_.push_back(magnitude(residual_[i]));
    const double share = static_cast<double>(k) / static_cast<double>(n);
    const auto rank = std::min(magnitudes_.size(),
                               static_cast<std::size_t>(1.5 * share * static_cast<double>(magnitudes_.size())) + 8);
    std::nth_element(magnitudes_.begin(), magnitudes_.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                     magnitudes_.end(), std::greater<T>());
    T floor = magnitudes_[rank - 1];
    candidates_.clear();
    for (std::size_t i = 0; i < n; ++i) {
      if (magnitude(residual_[i]) >= floor) candidates_.push_back(static_cast<std::int32_t>(i));
    }
    if (candidates_.size() < k) {  // the sample misled: every entry is a candidate
      candidates_.resize(n);
      std::iota(candidates_.begin(), candidates_.end(), std::int32_t{0});
    }
    magnitudes_.resize(candidates_.size());
    for (std::size_t j = 0; j < candidates_.size(); ++j)
      magnitudes_[j] = magnitude(residual_[static_cast<std::size_t>(candidates_[j])]);
    std::nth_element(magnitudes_.begin(), magnitudes_.begin() + static_cast<std::ptrdiff_t>(k - 1), magnitudes_.end(),
                     std::greater<T>());
    const T threshold = magnitudes_[k - 1];
    // Everything above it, then entries equal to it (lowest indices first) up to k, in index
    // order; candidates are in index order already.
    std::size_t above = 0;
    for (std::int32_t i : candidates_) above += magnitude(residual_[static_cast<std::size_t>(i)]) > threshold ? 1 : 0;
    std::size_t ties = k - above, j = 0;
    for (std::int32_t c : candidates_) {
      if (j == k) break;
      const auto i = static_cast<std::size_t>(c);
      const T m = magnitude(residual_[i]);
      if (m > threshold || (m == threshold && ties > 0)) {
        if (!(m > threshold)) --ties;
        indices[j] = c;
        values[j++] = residual_[i];
        residual_[i] = T(0);
      }
    }
  }

  /// e: what has not been sent yet.
  std::span<const T> residual() const noexcept { return residual_; }

 private:
  static T magnitude(T x) noexcept { return std::isnan(x) ? std::numeric_limits<T>::infinity() : std::fabs(x); }

  std::vector<T> residual_;
  std::vector<T> magnitudes_;              // scratch for the selection
  std::vector<std::int32_t> candidates_;  // entries at least the sample's threshold, in order
};

/// out[indices[j]] += values[j] for every j. @throws dtrain::error (bad_data) for an index out
/// of range (pairs from another rank are data, not trusted).
template <class T>
void sparse_add(std::span<T> out, std::span<const std::int32_t> indices, std::span<const T> values) {
  DTRAIN_ASSERT(indices.size() == values.size(), "top-k: sizes disagree");
  for (std::size_t j = 0; j < indices.size(); ++j) {
    const auto i = static_cast<std::size_t>(indices[j]);
    if (indices[j] < 0 || i >= out.size()) {
      throw error(errc::bad_data, "top-k: index " + std::to_string(indices[j]) + " is outside a buffer of " +
                                      std::to_string(out.size()));
    }
    out[i] += values[j];
  }
}

}  // namespace dtrain
