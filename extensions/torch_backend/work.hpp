#pragma once
// The `Work` a dtrain group's calls return: c10d's completion handle, completed by dtrain's
// threads. Each is named in torch's profilers ("dtrain:all_reduce", as Gloo's are
// "gloo:all_reduce"), and a `wait(timeout)` that runs out says which call it was and where it is.

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "host_staging.hpp"

namespace dtrain::torch_backend {

/// The name torch's profilers show for a call of `type`: "dtrain:" and c10d's name of the call.
const char* profiling_title(::c10d::OpType type) noexcept;

/// An error as torch reports one of a backend's: under torch 2.2 and later a DistBackendError
/// (Python's RuntimeError subclass, which elastic code catches, as Gloo's and NCCL's failures
/// are), before that a runtime_error (Python's RuntimeError).
std::exception_ptr torch_error(const std::string& text);

/// A dtrain error as `torch_error`, a deadline's beginning "Timed out", as Gloo's and NCCL's do.
/// Anything but a dtrain error passes through unchanged.
std::exception_ptr as_torch_error(std::exception_ptr failure);

/// A c10d `Work` that dtrain's thread completes: `wait(timeout)` as c10d's, a future of the
/// output tensors for DDP's communication hooks. For CUDA tensors the future is CUDA-aware, and
/// both order the waiting thread's current stream after the copies back (`host_staging`).
class dtrain_work final : public ::c10d::Work {
 public:
  /// `inputs` are the tensors the profilers show the call with (shapes under `record_shapes`);
  /// `what` names the call in a `wait` that runs out ("all_reduce", "send to rank 2 (tag 7)");
  /// `timeout` is the call's own, which dtrain enforces.
  dtrain_work(int rank, ::c10d::OpType type, const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs,
              host_staging staging, std::string what, std::chrono::milliseconds timeout);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override { return source_rank_; }
  /// The current stream waits for the work's results (c10d's `wait()` calls this once the work
  /// is done): the future's wait does that, where the work's tensors are on a GPU.
  void synchronize() override { future_->wait(); }
  /// As c10d's; a `timeout` that runs out raises naming the call, whether it is still queued or
  /// which of dtrain's collectives it runs as, and that it goes on under the call's own deadline.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;  // 0: c10d's kNoTimeout

  host_staging& staging() { return staging_; }
  /// The call has begun: a collective as dtrain's collective number `sequence`.
  void running_as(std::uint64_t sequence) noexcept { state_.store(static_cast<std::int64_t>(sequence)); }
  /// A send or receive has been handed to the transport.
  void posted() noexcept { state_.store(posted_state); }
  /// Marks the work done (`failure` null) or failed; called once, from dtrain's thread.
  void complete(std::exception_ptr failure, int source_rank = -1);

 private:
  static constexpr std::int64_t queued_state = -2, posted_state = -1;
  std::string where_it_is() const;

  std::vector<at::Tensor> outputs_;
  host_staging staging_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // CUDA-aware where the tensors are on a GPU
  int source_rank_ = -1;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::atomic<std::int64_t> state_{queued_state};  // queued, posted, or the collective's number
};

}  // namespace dtrain::torch_backend
