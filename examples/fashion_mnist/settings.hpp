#pragma once
// The Fashion-MNIST example's settings (its command line) and what both of its trainers share:
// the layer widths, the parameters' digest and the JSON summary the bench scripts read.

#include <chrono>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <dtrain/core/error.hpp>
#include <dtrain/core/hash.hpp>

#include "dataset.hpp"

namespace example {

struct settings {
  std::string data = fashion_mnist::default_directory;
  int epochs = 20;
  std::size_t global_batch = 128;
  double lr = 0.05, momentum = 0.9;
  std::string schedule = "cosine";
  double warmup_epochs = 0;
  std::vector<int> hidden{256, 128};
  std::string compress = "none";
  double density = 0.01;  // --compress topk: the share of each bucket a rank sends
  std::size_t local_sgd = 1, local_sgd_after = 0;
  double first_bucket_kib = 0, bucket_mib = 25;  // 0: the trainer's automatic first bucket
  bool no_overlap = false;
  std::size_t log_every = 100, limit_train = 0;
  std::uint64_t seed = 1;
  std::string json;
  double min_accuracy = 0;
  // The parameter-server trainer (--trainer ps): servers are the first DTRAIN_PS_SERVERS ranks.
  std::string trainer = "allreduce", consistency = "bsp", algorithm = "sync";
  std::string transport = "auto";
  int tau = 8;               // the period of ADAG, EASGD, model averaging; DynSGD's window
  double rho = 0.5;          // EASGD's elasticity (alpha = lr * rho)
  double time_budget = 0;    // > 0: stop training after this many seconds (equal-time comparisons)
  int replicas = 1;          // copies of each parameter shard (chain replication over the servers)
  std::size_t slice_kib = 4096;  // the parameters travel and are sharded in slices of this size
};

using clock_type = std::chrono::steady_clock;
inline double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// 784, the hidden widths, 10.
inline std::vector<int> layer_widths(const settings& s) {
  std::vector<int> widths{static_cast<int>(fashion_mnist::pixels_per_image)};
  widths.insert(widths.end(), s.hidden.begin(), s.hidden.end());
  widths.push_back(fashion_mnist::classes);
  return widths;
}

// The final parameters' bits in 16 hex digits: equal digests mean bit-identical models.
inline std::string digest_of(std::span<const float> x) {
  return fmt::format("{:016x}", dtrain::fnv1a().bytes(std::as_bytes(x)).value());
}

// The summary the bench and plot scripts read.
inline void write_summary(const settings& s, const std::string& framework, int ranks, double samples_per_second,
                   const std::vector<double>& epoch_seconds, double comm_share, double accuracy,
                   const std::vector<std::pair<double, double>>& curve, double final_loss, double bytes_per_step = 0) {
  if (s.json.empty()) return;
  std::ofstream out(s.json);
  out << fmt::format(
      "{{\"framework\":\"{}\",\"ranks\":{},\"epochs\":{},\"global_batch\":{},\"samples_per_second\":{:.1f},"
      "\"epoch_seconds\":[{:.4f}],\"communication_share\":{:.4f},\"test_accuracy\":{:.4f},\"test_loss\":{:.5f},"
      "\"compress\":\"{}\",\"density\":{},\"payload_bytes_per_step\":{:.0f},\"curve\":[",
      framework, ranks, epoch_seconds.size(), s.global_batch, samples_per_second, fmt::join(epoch_seconds, ","),
      comm_share, accuracy, final_loss, s.compress, s.density, bytes_per_step);
  for (std::size_t i = 0; i < curve.size(); ++i) {
    out << fmt::format("{}[{:.4f},{:.4f}]", i ? "," : "", curve[i].first, curve[i].second);
  }
  out << "]}\n";
  if (!out) throw dtrain::error(dtrain::errc::bad_data, "cannot write " + s.json);
}

}  // namespace example
