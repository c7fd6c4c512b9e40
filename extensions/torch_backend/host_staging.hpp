#pragma once
// CUDA tensors through dtrain's host collectives, staged as Gloo stages them. At the call, on the
// caller's thread, the tensors the call reads are copied into pinned host memory on a side stream
// that first waits for the caller's current stream, so the copies see every kernel queued before
// the call. dtrain's thread waits for those copies, runs the collective on the host tensors, then
// queues the copies back on the side stream and completes the work's CUDA-aware future there;
// `Work::wait()` and the future's wait make the waiting thread's current stream wait for the
// future's events. The caller's stream is never blocked by the host, as with NCCL. A call on
// CPU tensors stages nothing.
//
// The CUDA calls go through c10's device-generic interfaces (streams, events, the caching
// allocator's stream tracking), so the module itself compiles no CUDA code and builds against a
// CPU-only torch too.

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <optional>
#include <utility>
#include <vector>

namespace dtrain::torch_backend {

class host_staging {
 public:
  /// Staging for a call named `what` whose tensors are on `device` (the CPU: nothing is staged).
  host_staging(c10::Device device, const char* what);

  /// The device of a call's tensors: that of the first one (the CPU for none).
  static c10::Device device_of(const std::vector<at::Tensor>& tensors);

  // On the caller's thread, at the call. Each returns a host tensor the collective can use in
  // place of `t`: `t` itself on the CPU, else a pinned contiguous tensor of its shape and dtype.

  /// A tensor the call reads: its data is copied to the host.
  at::Tensor read(const at::Tensor& t);
  /// A tensor the call fills: its host tensor is copied back into `t` once the call has run.
  at::Tensor write(const at::Tensor& t);
  /// A tensor the call reads and fills in place (allreduce's, broadcast's).
  at::Tensor read_write(const at::Tensor& t);
  std::vector<at::Tensor> read(const std::vector<at::Tensor>& ts);
  std::vector<at::Tensor> write(const std::vector<at::Tensor>& ts);
  std::vector<at::Tensor> read_write(const std::vector<at::Tensor>& ts);

  // On dtrain's thread.

  /// Before the collective: waits until the copies to the host have landed.
  void await_host_copies() const;
  /// After it: queues the copies back to the device, on the side stream.
  void copy_back();
  /// Runs `f` with the side stream current on its device. Completing the call's CUDA-aware
  /// future there records its events after the copies back, and every wait on the future or
  /// the work then orders the waiting thread's current stream after them.
  template <class F>
  void on_side_stream(F&& f) const;

  /// The devices a CUDA-aware future of this call's outputs spans: none for the CPU.
  std::vector<c10::Device> devices() const;

 private:
  bool staged() const { return side_.has_value(); }
  void check_device(const at::Tensor& t) const;
  at::Tensor host_twin(const at::Tensor& t) const;
  // The caching allocator must not hand `t`'s memory to another tensor while the side stream
  // may still copy from or into it, even if the caller frees `t` meanwhile.
  void keep_for_side_stream(const at::Tensor& t) const;

  c10::Device device_;
  const char* what_;
  std::optional<c10::Stream> side_;  // set when the call's tensors are on a GPU
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_back_;  // (the caller's tensor, its host twin)
};

template <class F>
void host_staging::on_side_stream(F&& f) const {
  c10::OptionalStreamGuard guard;
  if (side_) guard.reset_stream(*side_);
  std::forward<F>(f)();
}

}  // namespace dtrain::torch_backend
