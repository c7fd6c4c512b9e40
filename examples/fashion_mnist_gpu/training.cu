// The device side of the GPU example: the Fashion-MNIST MLP on the GPU (cuBLAS for the matrix
// products, small kernels for the rest) as a `device_model`, trained by
// `allreduce::device_trainer` over NCCL or over TCP-staged device buffers.

#include "training.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include <cublas_v2.h>

#include <dtrain/allreduce/device_trainer.hpp>
#include <dtrain/collective/nccl.hpp>
#include <dtrain/collective/staged.hpp>
#include <dtrain/cuda/runtime.hpp>
#include <dtrain/updater/momentum.hpp>

namespace fashion_mnist_gpu {
namespace {

namespace cuda = dtrain::cuda;

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw dtrain::error(dtrain::errc::device_error,
                        std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
  }
}

unsigned blocks_for(std::size_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// dst row r = src row idx[r] (the batch's images, gathered from the split on the device).
__global__ void gather_rows(const float* src, const int* idx, std::size_t rows, std::size_t width, float* dst) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * width) return;
  const std::size_t r = i / width, c = i % width;
  dst[i] = src[static_cast<std::size_t>(idx[r]) * width + c];
}

// out[r][c] += bias[c], then ReLU unless this is the last layer.
__global__ void add_bias(float* out, const float* bias, std::size_t rows, std::size_t cols, bool relu) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = out[i] + bias[i % cols];
  out[i] = relu ? fmaxf(v, 0.0f) : v;
}

// Per row: softmax cross-entropy of the logits against the label; dz = (p - onehot) / rows.
// `hits` counts rows whose arg max is the label (evaluation).
__global__ void softmax_xent(const float* z, const int* idx, const std::uint8_t* labels, std::size_t rows,
                             std::size_t classes, float* dz, float* loss, unsigned* hits) {
  const std::size_t r = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* zr = z + r * classes;
  const int label = labels[idx != nullptr ? idx[r] : static_cast<int>(r)];
  std::size_t best = 0;
  for (std::size_t c = 1; c < classes; ++c) best = zr[c] > zr[best] ? c : best;
  const float top = zr[best];
  float sum = 0;
  for (std::size_t c = 0; c < classes; ++c) sum += expf(zr[c] - top);
  loss[r] = logf(sum) - (zr[label] - top);
  if (hits != nullptr && static_cast<int>(best) == label) atomicAdd(hits, 1u);
  if (dz == nullptr) return;
  for (std::size_t c = 0; c < classes; ++c) {
    const float p = expf(zr[c] - top) / sum;
    dz[r * classes + c] = (p - (static_cast<int>(c) == label ? 1.0f : 0.0f)) / static_cast<float>(rows);
  }
}

// db[c] = sum over rows of delta[r][c].
__global__ void column_sums(const float* delta, std::size_t rows, std::size_t cols, float* db) {
  const std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = 0;
  for (std::size_t r = 0; r < rows; ++r) s += delta[r * cols + c];
  db[c] = s;
}

// The ReLU's derivative: zero where the layer's output was not positive.
__global__ void relu_mask(float* delta, const float* act, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n && act[i] <= 0.0f) delta[i] = 0.0f;
}

// The images of one split, on the device.
struct device_split {
  cuda::device_buffer<float> pixels;
  cuda::device_buffer<std::uint8_t> labels;
  std::size_t size = 0;

  explicit device_split(const images& h) : pixels(h.pixels.size()), labels(h.labels.size()), size(h.size()) {
    cuda::check(cudaMemcpy(pixels.data(), h.pixels.data(), h.pixels.size_bytes(), cudaMemcpyHostToDevice),
                "upload pixels");
    cuda::check(cudaMemcpy(labels.data(), h.labels.data(), h.labels.size_bytes(), cudaMemcpyHostToDevice),
                "upload labels");
  }
};

// The MLP: ReLU hidden layers, softmax cross-entropy. Tensors 2l and 2l + 1 are layer l's weight
// (in x out, row-major) and bias, in one flat parameter buffer and one flat gradient buffer, so
// the trainer reduces its buckets in place.
class gpu_mlp {
 public:
  using value_type = float;
  using batch_type = std::span<const int>;  // indices into the training split

  gpu_mlp(std::vector<int> widths, const device_split& train, std::uint64_t seed)
      : widths_(std::move(widths)), train_(&train) {
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_.get()), "cublasSetStream");
    std::size_t total = 0;
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      for (std::size_t n : {dim(l) * dim(l + 1), dim(l + 1)}) {
        offsets_.push_back(total);
        sizes_.push_back(n);
        total += n;
      }
    }
    params_ = cuda::device_buffer<float>(total);
    grads_ = cuda::device_buffer<float>(total);
    // PyTorch's Linear initialisation: uniform in +-1/sqrt(fan_in), drawn on the host.
    std::vector<float> init(total);
    std::mt19937_64 gen(seed);
    for (std::size_t l = 0; l < layers(); ++l) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(dim(l)));
      std::uniform_real_distribution<float> u(-bound, bound);
      for (std::size_t t : {2 * l, 2 * l + 1}) {
        for (std::size_t i = 0; i < sizes_[t]; ++i) init[offsets_[t] + i] = u(gen);
      }
    }
    cuda::check(cudaMemcpy(params_.data(), init.data(), total * sizeof(float), cudaMemcpyHostToDevice), "upload init");
  }
  gpu_mlp(const gpu_mlp&) = delete;
  gpu_mlp& operator=(const gpu_mlp&) = delete;
  ~gpu_mlp() { cublasDestroy(blas_); }

  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  dtrain::device_span<float> parameters(std::size_t i) { return {params_.data() + offsets_[i], sizes_[i]}; }
  dtrain::device_span<float> gradients(std::size_t i) { return {grads_.data() + offsets_[i], sizes_[i]}; }
  cudaStream_t stream() const noexcept { return stream_.get(); }

  double forward_backward(const batch_type& batch, dtrain::gradient_ready ready) {
    const std::size_t b = batch.size();
    reserve(b);
    cuda::check(cudaMemcpyAsync(idx_.data(), batch.data(), b * sizeof(int), cudaMemcpyHostToDevice, stream()),
                "upload batch");
    gather_rows<<<blocks_for(b * dim(0), 256), 256, 0, stream()>>>(train_->pixels.data(), idx_.data(), b, dim(0),
                                                                   acts_[0].data());
    forward(b);
    const std::size_t classes = dim(layers());
    softmax_xent<<<blocks_for(b, 128), 128, 0, stream()>>>(acts_.back().data(), idx_.data(), train_->labels.data(), b,
                                                           classes, deltas_.back().data(), loss_.data(), nullptr);
    for (std::size_t l = layers(); l-- > 0;) {  // last layer first
      const float one = 1, zero = 0;
      const int in = static_cast<int>(dim(l)), out = static_cast<int>(dim(l + 1)), rows = static_cast<int>(b);
      // dW (in x out) = act_l^T (in x b) * delta (b x out), all row-major.
      check_blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, rows, &one, deltas_[l + 1].data(), out,
                             acts_[l].data(), in, &zero, gradients(2 * l).data(), out),
                 "cublasSgemm dW");
      column_sums<<<blocks_for(dim(l + 1), 128), 128, 0, stream()>>>(deltas_[l + 1].data(), b, dim(l + 1),
                                                                     gradients(2 * l + 1).data());
      ready(2 * l + 1);
      ready(2 * l);
      if (l > 0) {  // delta_l (b x in) = delta (b x out) * W^T, then the ReLU before this layer
        check_blas(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, in, rows, out, &one, parameters(2 * l).data(), out,
                               deltas_[l + 1].data(), out, &zero, deltas_[l].data(), in),
                   "cublasSgemm delta");
        relu_mask<<<blocks_for(b * dim(l), 256), 256, 0, stream()>>>(deltas_[l].data(), acts_[l].data(), b * dim(l));
      }
    }
    cuda::check(cudaGetLastError(), "kernel launch");
    std::vector<float> losses(b);
    cuda::check(cudaMemcpyAsync(losses.data(), loss_.data(), b * sizeof(float), cudaMemcpyDeviceToHost, stream()),
                "download loss");
    cuda::check(cudaStreamSynchronize(stream()), "forward_backward");
    return std::accumulate(losses.begin(), losses.end(), 0.0) / static_cast<double>(b);
  }

  /// The share of `split` classified correctly.
  double accuracy(const device_split& split) {
    constexpr std::size_t chunk = 1000;
    reserve(chunk);
    cuda::device_buffer<unsigned> hits(1);
    cuda::check(cudaMemsetAsync(hits.data(), 0, sizeof(unsigned), stream()), "memset");
    for (std::size_t first = 0; first < split.size; first += chunk) {
      const std::size_t b = std::min(chunk, split.size - first);
      cuda::check(cudaMemcpyAsync(acts_[0].data(), split.pixels.data() + first * dim(0), b * dim(0) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream()),
                  "copy test images");
      forward(b);
      softmax_xent<<<blocks_for(b, 128), 128, 0, stream()>>>(acts_.back().data(), nullptr, split.labels.data() + first,
                                                             b, dim(layers()), nullptr, loss_.data(), hits.data());
    }
    unsigned total = 0;
    cuda::check(cudaMemcpyAsync(&total, hits.data(), sizeof total, cudaMemcpyDeviceToHost, stream()), "download hits");
    cuda::check(cudaStreamSynchronize(stream()), "accuracy");
    return static_cast<double>(total) / static_cast<double>(split.size);
  }

 private:
  std::size_t dim(std::size_t l) const { return static_cast<std::size_t>(widths_[l]); }
  std::size_t layers() const { return widths_.size() - 1; }

  void reserve(std::size_t rows) {
    if (rows <= capacity_) return;
    acts_.clear();
    deltas_.clear();
    for (std::size_t l = 0; l < widths_.size(); ++l) {
      acts_.emplace_back(rows * dim(l));
      deltas_.emplace_back(rows * dim(l));
    }
    idx_ = cuda::device_buffer<int>(rows);
    loss_ = cuda::device_buffer<float>(rows);
    capacity_ = rows;
  }

  // acts_[l + 1] (b x out) = relu(acts_[l] (b x in) * W_l (in x out) + b_l).
  void forward(std::size_t b) {
    for (std::size_t l = 0; l < layers(); ++l) {
      const float one = 1, zero = 0;
      const int in = static_cast<int>(dim(l)), out = static_cast<int>(dim(l + 1)), rows = static_cast<int>(b);
      check_blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, &one, parameters(2 * l).data(), out,
                             acts_[l].data(), in, &zero, acts_[l + 1].data(), out),
                 "cublasSgemm forward");
      add_bias<<<blocks_for(b * dim(l + 1), 256), 256, 0, stream()>>>(acts_[l + 1].data(), parameters(2 * l + 1).data(),
                                                                      b, dim(l + 1), l + 1 < layers());
    }
  }

  std::vector<int> widths_;
  const device_split* train_;
  cuda::stream stream_;
  cublasHandle_t blas_ = nullptr;
  std::vector<std::size_t> offsets_, sizes_;
  cuda::device_buffer<float> params_, grads_;
  std::vector<cuda::device_buffer<float>> acts_, deltas_;
  cuda::device_buffer<int> idx_;
  cuda::device_buffer<float> loss_;
  std::size_t capacity_ = 0;
};

static_assert(dtrain::device_model<gpu_mlp>);

template <class Collective>
std::vector<epoch_report> train(Collective comm, const settings& s, const images& train_h, const images& test_h,
                                const callbacks& report) {
  using clock = std::chrono::steady_clock;
  const int rank = comm.rank(), size = comm.size();
  const std::size_t local = s.global_batch / static_cast<std::size_t>(size);
  if (local == 0) {
    throw dtrain::error(dtrain::errc::invalid_argument, "a global batch of " + std::to_string(s.global_batch) +
                                                            " cannot be split across " + std::to_string(size) +
                                                            " ranks");
  }
  const device_split train_d(train_h), test_d(test_h);
  gpu_mlp model(s.widths, train_d, s.seed);
  dtrain::allreduce::trainer_options o;
  o.first_bucket_bytes = s.first_bucket_bytes;
  o.bucket_bytes = s.bucket_bytes;
  o.overlap = s.overlap;
  dtrain::allreduce::device_trainer trainer(std::move(comm), dtrain::momentum<float>(s.lr, s.momentum), model, o);

  std::vector<int> order(train_h.size());
  const std::size_t steps = train_h.size() / s.global_batch;
  std::vector<epoch_report> epochs;
  for (int epoch = 1; epoch <= s.epochs; ++epoch) {
    // The same permutation on every rank; rank r takes its slice of each global batch.
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(s.seed * 1000003 + static_cast<std::uint64_t>(epoch)));
    const auto stats_before = trainer.stats();
    const auto t0 = clock::now();
    double loss_sum = 0;
    for (std::size_t k = 0; k < steps; ++k) {
      const std::span<const int> mine(order.data() + k * s.global_batch + static_cast<std::size_t>(rank) * local,
                                      local);
      const double loss = trainer.step(mine).loss;
      loss_sum += loss;
      if (report.progress && s.log_every > 0 && (k + 1) % s.log_every == 0)
        report.progress({epoch, k + 1, steps, loss});
    }
    cuda::check(cudaStreamSynchronize(model.stream()), "epoch");
    const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
    const auto& st = trainer.stats();
    epoch_report r;
    r.epoch = epoch;
    r.train_loss = loss_sum / static_cast<double>(steps);
    r.test_accuracy = model.accuracy(test_d);
    r.seconds = seconds;
    r.samples_per_second = static_cast<double>(steps * local * static_cast<std::size_t>(size)) / seconds;
    const double step_seconds = st.step_seconds - stats_before.step_seconds;
    r.comm_share = step_seconds > 0 ? (st.wait_seconds - stats_before.wait_seconds) / step_seconds : 0;
    if (report.epoch) report.epoch(r);
    epochs.push_back(r);
  }
  return epochs;
}

}  // namespace

std::vector<epoch_report> train_over_nccl(dtrain::nccl_communicator comm, const settings& s, const images& train_h,
                                          const images& test_h, const callbacks& report) {
  return train(std::move(comm), s, train_h, test_h, report);
}

std::vector<epoch_report> train_over_staged(dtrain::any_transport transport, const settings& s, const images& train_h,
                                            const images& test_h, const callbacks& report) {
  return train(dtrain::staged_communicator<dtrain::any_transport>(std::move(transport)), s, train_h, test_h, report);
}

}  // namespace fashion_mnist_gpu
