#pragma once
// Fashion-MNIST from Debian's dataset-fashion-mnist package (or any directory holding the four
// IDX files, gzipped or not): 60000 training and 10000 test images of 28x28 grey pixels, 10
// classes. The files are gunzipped with zlib and parsed by dtrain/data/idx.hpp.

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <zlib.h>

#include <dtrain/core/error.hpp>
#include <dtrain/data/idx.hpp>

namespace fashion_mnist {

inline const char* default_directory = "/usr/share/datasets/fashion-mnist";
inline const char* install_hint =
    "Install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist), or pass --data DIR "
    "with train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
    "t10k-labels-idx1-ubyte.gz";

/// zlib's message without the path it prefixes.
inline std::string zlib_reason(gzFile f) {
  int code = Z_OK;
  std::string why = gzerror(f, &code);
  if (const auto colon = why.rfind(": "); colon != std::string::npos) why = why.substr(colon + 2);
  return why;
}

/// The whole file, decompressed if it is gzip (zlib reads plain files unchanged).
inline std::vector<std::uint8_t> read_maybe_gzipped(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw dtrain::error(dtrain::errc::bad_data,
                        "cannot open " + path + ": " + std::strerror(errno) + ". " + install_hint);
  }
  std::vector<std::uint8_t> out;
  std::uint8_t chunk[1 << 16];
  for (;;) {
    const int n = gzread(f, chunk, sizeof chunk);
    if (n < 0) {
      const std::string why = zlib_reason(f);
      gzclose(f);
      throw dtrain::error(dtrain::errc::bad_data, path + " is corrupt (" + why + "). " + install_hint);
    }
    if (n == 0) {
      int code = Z_OK;
      gzerror(f, &code);
      if (code != Z_OK && code != Z_STREAM_END) {  // e.g. a truncated download: "unexpected end of file"
        const std::string why = zlib_reason(f);
        gzclose(f);
        throw dtrain::error(dtrain::errc::bad_data, path + " is corrupt (" + why + "). " + install_hint);
      }
      break;
    }
    out.insert(out.end(), chunk, chunk + n);
    if (out.size() > (std::size_t{1} << 30)) {
      gzclose(f);
      throw dtrain::error(dtrain::errc::bad_data, path + " decompresses to more than 1 GiB; not Fashion-MNIST");
    }
  }
  gzclose(f);
  return out;
}

/// One split as floats in [0, 1], row-major [n][784], and labels.
struct split {
  std::vector<float> pixels;
  std::vector<std::uint8_t> labels;
  std::size_t size() const { return labels.size(); }
};

inline constexpr std::size_t pixels_per_image = 28 * 28;
inline constexpr int classes = 10;

/// Reads `<dir>/<prefix>-images-idx3-ubyte[.gz]` and its labels.
/// @throws dtrain::error `bad_data` naming the file, what is wrong with it and how to get it.
inline split load(const std::string& dir, const std::string& prefix) {
  auto path_of = [&](const std::string& stem) {
    const std::string plain = dir + "/" + stem;
    return std::filesystem::exists(plain) ? plain : plain + ".gz";
  };
  const std::string images_path = path_of(prefix + "-images-idx3-ubyte");
  const std::string labels_path = path_of(prefix + "-labels-idx1-ubyte");
  auto images = dtrain::data::parse_idx(read_maybe_gzipped(images_path), 3, images_path);
  auto labels = dtrain::data::parse_idx(read_maybe_gzipped(labels_path), 1, labels_path);
  if (images.item_size() != pixels_per_image) {
    throw dtrain::error(dtrain::errc::bad_data, images_path + " holds images of " +
                                                    std::to_string(images.item_size()) + " pixels, not 28x28");
  }
  auto both = dtrain::data::pair_images_labels(std::move(images), std::move(labels), classes, prefix + " split");
  split s;
  s.pixels.resize(both.images.values.size());
  for (std::size_t i = 0; i < s.pixels.size(); ++i) s.pixels[i] = static_cast<float>(both.images.values[i]) / 255.0f;
  s.labels = std::move(both.labels.values);
  return s;
}

}  // namespace fashion_mnist
