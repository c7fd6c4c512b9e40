#pragma once
// Click-through data for the example: synthetic samples with hashed features whose frequencies
// follow a power law, labelled by a known true logistic model (so the trained model can be
// compared with the truth), or a libsvm-format file.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/hash.hpp>

namespace ctr {

inline constexpr std::uint64_t key_space = std::uint64_t{1} << 24;

struct sample {
  std::vector<std::uint64_t> features;  // sorted, unique hashed feature ids (binary features)
  float label = 0;                      // 0 or 1
};

inline std::uint64_t mix(std::uint64_t z) { return dtrain::splitmix64(z); }

/// The true model: a weight per feature from a hash (no table needed), large for the thousand
/// most frequent features and small for the long tail (which a finite sample cannot teach), plus
/// a bias that puts the click rate near 25%.
struct true_model {
  double bias = -1.2;
  double weight(std::uint64_t feature_rank) const {
    const std::uint64_t h = mix(feature_rank * 0x632be59bd9b4e019ull);
    const double u1 = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (static_cast<double>(mix(h) >> 11) + 0.5) * 0x1.0p-53;
    const double g = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    return (feature_rank < 1000 ? 0.8 : 0.02) * g;
  }
};

/// Samples with `per_sample` features, drawn with P(rank r) ~ 1/(r + 1) over the key space;
/// a feature's id is its rank hashed into the key space.
class generator {
 public:
  generator(std::uint64_t seed, int per_sample) : gen_(seed), per_sample_(per_sample) {}

  sample next(const true_model& truth, double* logit_out = nullptr) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    sample s;
    double logit = truth.bias;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> picked;  // (id, rank)
    const double log_n = std::log(static_cast<double>(key_space) + 1.0);
    for (int i = 0; i < per_sample_; ++i) {
      const auto rank = static_cast<std::uint64_t>(std::exp(u(gen_) * log_n) - 1.0);  // log-uniform: ~1/r
      picked.emplace_back(mix(rank) % key_space, rank);
    }
    std::sort(picked.begin(), picked.end());
    picked.erase(std::unique(picked.begin(), picked.end(),
                             [](const auto& a, const auto& b) { return a.first == b.first; }),
                 picked.end());
    for (const auto& [id, rank] : picked) {
      s.features.push_back(id);
      logit += truth.weight(rank);
    }
    s.label = u(gen_) < 1.0 / (1.0 + std::exp(-logit)) ? 1.0f : 0.0f;
    if (logit_out != nullptr) *logit_out = logit;
    return s;
  }

 private:
  std::mt19937_64 gen_;
  int per_sample_;
};

/// Reads a libsvm file ("label idx:value ..."; labels 0/1 or -1/+1; idx hashed into the key
/// space; values other than 1 are refused, since the model has binary features). Keeps the
/// lines i with i % parts == part. @throws dtrain::error `bad_data` naming the line.
inline std::vector<sample> read_libsvm(const std::string& path, int part, int parts) {
  std::ifstream in(path);
  if (!in) throw dtrain::error(dtrain::errc::bad_data, "cannot open " + path);
  std::vector<sample> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    if (static_cast<int>(n % static_cast<std::size_t>(parts)) != part) continue;
    auto bad = [&](const std::string& what) {
      return dtrain::error(dtrain::errc::bad_data, path + ":" + std::to_string(n) + ": " + what);
    };
    std::istringstream ls(line);
    std::string label;
    ls >> label;
    sample s;
    if (label == "1" || label == "+1") s.label = 1;
    else if (label == "0" || label == "-1") s.label = 0;
    else throw bad("label '" + label + "' is not 0/1 or -1/+1");
    std::string item;
    while (ls >> item) {
      const auto colon = item.find(':');
      if (colon == std::string::npos) throw bad("'" + item + "' is not index:value");
      char* end = nullptr;
      const unsigned long long idx = std::strtoull(item.c_str(), &end, 10);
      if (end != item.c_str() + colon) throw bad("index in '" + item + "' is not a number");
      const double value = std::strtod(item.c_str() + colon + 1, &end);
      if (*end != '\0') throw bad("value in '" + item + "' is not a number");
      if (value != 1.0) throw bad("value " + item.substr(colon + 1) + " is not 1 (the model has binary features)");
      s.features.push_back(mix(idx) % key_space);
    }
    std::sort(s.features.begin(), s.features.end());
    s.features.erase(std::unique(s.features.begin(), s.features.end()), s.features.end());
    out.push_back(std::move(s));
  }
  if (out.empty()) throw dtrain::error(dtrain::errc::bad_data, path + " holds no samples for this worker");
  return out;
}

/// Area under the ROC curve of `scores` for `labels` (ties count half).
inline double auc(const std::vector<double>& scores, const std::vector<float>& labels) {
  std::vector<std::size_t> order(scores.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
  double positives = 0, negatives = 0, rank_sum = 0;
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mid = 0.5 * static_cast<double>(i + j + 1);  // 1-based average rank of the tie
    for (std::size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        rank_sum += mid;
        positives += 1;
      } else {
        negatives += 1;
      }
    }
    i = j;
  }
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace ctr
