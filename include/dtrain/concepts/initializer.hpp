#pragma once
/// @file
/// The `initializer` concept: how a parameter-server table fills a key it has not seen.

#include <concepts>
#include <span>
#include <string_view>

#include "dtrain/concepts/sharding.hpp"

namespace dtrain::ps {

/// An initializer sets a new key's values, the same way for the same key on every run.
template <class I, class T>
concept initializer = std::copy_constructible<I> && requires(const I& i, key_type k, std::span<T> v) {
  { I::name } -> std::convertible_to<std::string_view>;
  { i(k, v) } -> std::same_as<void>;
};

}  // namespace dtrain::ps
