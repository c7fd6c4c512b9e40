#pragma once
// The tensor-parallel tests' reference: an MLP block (column layer, tanh, row layer) computed
// unsplit, with its gradients, in plain loops.

#include <cmath>
#include <cstddef>
#include <vector>

namespace dtrain::testing {

constexpr std::size_t in = 5, hidden = 7, out = 4;

inline std::vector<double> filled(std::size_t n, double salt) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(salt * static_cast<double>(i + 1) + salt);
  return v;
}

// The unsplit block, written out: h = tanh(x W1^T + b1), y = h W2^T + b2, loss 0.5 |y - t|^2,
// on `batch` rows.
struct unsplit {
  std::size_t batch;
  std::vector<double> w1 = filled(hidden * in, 0.7), b1 = filled(hidden, 0.3), w2 = filled(out * hidden, 1.1),
                      b2 = filled(out, 0.5), x = filled(batch * in, 0.9), t = filled(batch * out, 0.2);
  std::vector<double> h, y, dy, dh, dx, gw1, gb1, gw2, gb2;

  explicit unsplit(std::size_t rows = 3) : batch(rows) {
    h.assign(batch * hidden, 0);
    y.assign(batch * out, 0);
    for (std::size_t s = 0; s < batch; ++s) {
      for (std::size_t j = 0; j < hidden; ++j) {
        double z = b1[j];
        for (std::size_t i = 0; i < in; ++i) z += x[s * in + i] * w1[j * in + i];
        h[s * hidden + j] = std::tanh(z);
      }
      for (std::size_t o = 0; o < out; ++o) {
        double z = b2[o];
        for (std::size_t j = 0; j < hidden; ++j) z += h[s * hidden + j] * w2[o * hidden + j];
        y[s * out + o] = z;
      }
    }
    dy.resize(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) dy[i] = y[i] - t[i];
    gw2.assign(w2.size(), 0), gb2.assign(out, 0), dh.assign(h.size(), 0);
    gw1.assign(w1.size(), 0), gb1.assign(hidden, 0), dx.assign(x.size(), 0);
    for (std::size_t s = 0; s < batch; ++s) {
      for (std::size_t o = 0; o < out; ++o) {
        gb2[o] += dy[s * out + o];
        for (std::size_t j = 0; j < hidden; ++j) {
          gw2[o * hidden + j] += dy[s * out + o] * h[s * hidden + j];
          dh[s * hidden + j] += dy[s * out + o] * w2[o * hidden + j];
        }
      }
      for (std::size_t j = 0; j < hidden; ++j) {
        const double dz = dh[s * hidden + j] * (1 - h[s * hidden + j] * h[s * hidden + j]);
        gb1[j] += dz;
        for (std::size_t i = 0; i < in; ++i) {
          gw1[j * in + i] += dz * x[s * in + i];
          dx[s * in + i] += dz * w1[j * in + i];
        }
      }
    }
  }
};

}  // namespace dtrain::testing
