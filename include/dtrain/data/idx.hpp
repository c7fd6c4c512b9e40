#pragma once
/// @file
/// The IDX format of MNIST and Fashion-MNIST (yann.lecun.com/exdb/mnist): a big-endian header
/// (two zero bytes, a type code, the number of dimensions, each dimension as uint32) followed by
/// the values. Parsed from bytes already in memory (decompress `.gz` files first), with every
/// field checked, so a truncated or foreign file is an error that says what is wrong.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::data {

/// An IDX array of unsigned bytes (type code 0x08, the only one MNIST-style data uses).
struct idx_array {
  std::vector<std::uint32_t> shape;  ///< e.g. {60000, 28, 28} for images, {60000} for labels
  std::vector<std::uint8_t> values;  ///< row-major, shape[0] * shape[1] * ... values

  /// Items along the first dimension (samples).
  std::size_t items() const noexcept { return shape.empty() ? 0 : shape[0]; }
  /// Values per item (28 * 28 for images, 1 for labels).
  std::size_t item_size() const noexcept {
    std::size_t n = 1;
    for (std::size_t d = 1; d < shape.size(); ++d) n *= shape[d];
    return n;
  }
};

/// Parses an IDX file's bytes. `name` (the file name) appears in error messages.
/// @param dims the number of dimensions expected (3 for images, 1 for labels)
/// @throws dtrain::error `bad_data` naming `name` and the fault: too short, wrong magic, an
///   element type other than unsigned byte, the wrong number of dimensions, a zero or absurd
///   dimension, or a size that disagrees with the header.
inline idx_array parse_idx(std::span<const std::uint8_t> bytes, std::size_t dims, const std::string& name) {
  auto fail = [&](const std::string& what) -> void {
    throw error(errc::bad_data, name + " is not a valid IDX file: " + what);
  };
  if (bytes.size() < 4) fail("it has " + std::to_string(bytes.size()) + " bytes, fewer than the 4-byte magic");
  if (bytes[0] != 0 || bytes[1] != 0) fail("the magic does not start with two zero bytes");
  if (bytes[2] != 0x08) fail("element type code " + std::to_string(bytes[2]) + " is not unsigned byte (8)");
  if (bytes[3] != dims) {
    fail("it has " + std::to_string(bytes[3]) + " dimensions, " + std::to_string(dims) + " expected");
  }
  const std::size_t header = 4 + 4 * dims;
  if (bytes.size() < header) fail("the header is truncated");
  idx_array out;
  std::size_t count = 1;
  for (std::size_t d = 0; d < dims; ++d) {
    const std::uint8_t* p = bytes.data() + 4 + 4 * d;
    const std::uint32_t n =
        (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
    if (n == 0) fail("dimension " + std::to_string(d) + " is zero");
    if (count > (std::size_t{1} << 40) / n) fail("the dimensions describe more than 2^40 values");
    count *= n;
    out.shape.push_back(n);
  }
  if (bytes.size() - header != count) {
    fail("the header describes " + std::to_string(count) + " values but " + std::to_string(bytes.size() - header) +
         " follow it (a truncated or corrupted file?)");
  }
  out.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

/// Images and labels of one split, checked to belong together.
struct labelled_images {
  idx_array images;  ///< [n][rows][cols]
  idx_array labels;  ///< [n], each < classes
};

/// Checks that `images` and `labels` describe the same samples and that every label is below
/// `classes`. @throws dtrain::error `bad_data` naming the files.
inline labelled_images pair_images_labels(idx_array images, idx_array labels, int classes, const std::string& name) {
  if (images.items() != labels.items()) {
    throw error(errc::bad_data, name + ": " + std::to_string(images.items()) + " images but " +
                                    std::to_string(labels.items()) + " labels");
  }
  for (std::size_t i = 0; i < labels.values.size(); ++i) {
    if (labels.values[i] >= classes) {
      throw error(errc::bad_data, name + ": label " + std::to_string(labels.values[i]) + " of sample " +
                                      std::to_string(i) + " is not below " + std::to_string(classes));
    }
  }
  return {std::move(images), std::move(labels)};
}

}  // namespace dtrain::data
