#include "host_staging.hpp"

#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace dtrain::torch_backend {

host_staging::host_staging(c10::Device device, const char* what) : device_(device), what_(what) {
  if (device.is_cpu()) return;
  TORCH_CHECK(device.is_cuda(), "dtrain: ", what, ": a tensor on ", device,
              "; the dtrain backend moves CPU and CUDA tensors");
  const c10::impl::VirtualGuardImpl gpu(device.type());
  // A pool stream, not the caller's: the copies then never queue behind (or hold up) kernels
  // the caller launches after the call. It starts after everything queued before the call.
  side_ = gpu.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  c10::Event caller_reached_call(device.type());
  caller_reached_call.record(gpu.getStream(device));
  caller_reached_call.block(*side_);
}

c10::Device host_staging::device_of(const std::vector<at::Tensor>& tensors) {
  return tensors.empty() ? c10::Device(c10::kCPU) : tensors.front().device();
}

void host_staging::check_device(const at::Tensor& t) const {
  TORCH_CHECK(t.device() == device_, "dtrain: ", what_, ": tensors on ", device_, " and on ", t.device(),
              " in one call; every tensor of a call must be on the same device");
}

at::Tensor host_staging::host_twin(const at::Tensor& t) const {
  return at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
}

void host_staging::keep_for_side_stream(const at::Tensor& t) const {
  c10::impl::VirtualGuardImpl(device_.type()).recordDataPtrOnStream(t.storage().data_ptr(), *side_);
}

at::Tensor host_staging::read(const at::Tensor& t) {
  check_device(t);
  if (!staged()) return t;
  at::Tensor host = host_twin(t);
  const c10::OptionalStreamGuard on_side(*side_);
  const c10::NoGradGuard no_autograd;  // a copy for the collective, not part of any graph
  host.copy_(t, /*non_blocking=*/true);
  keep_for_side_stream(t);
  return host;
}

at::Tensor host_staging::write(const at::Tensor& t) {
  check_device(t);
  if (!staged()) return t;
  at::Tensor host = host_twin(t);
  keep_for_side_stream(t);
  copies_back_.emplace_back(t, host);
  return host;
}

at::Tensor host_staging::read_write(const at::Tensor& t) {
  at::Tensor host = read(t);
  if (staged()) copies_back_.emplace_back(t, host);
  return host;
}

namespace {
template <class Each>
std::vector<at::Tensor> each_of(const std::vector<at::Tensor>& ts, Each&& each) {
  std::vector<at::Tensor> hosts;
  hosts.reserve(ts.size());
  for (const auto& t : ts) hosts.push_back(each(t));
  return hosts;
}
}  // namespace

std::vector<at::Tensor> host_staging::read(const std::vector<at::Tensor>& ts) {
  return each_of(ts, [this](const at::Tensor& t) { return read(t); });
}

std::vector<at::Tensor> host_staging::write(const std::vector<at::Tensor>& ts) {
  return each_of(ts, [this](const at::Tensor& t) { return write(t); });
}

std::vector<at::Tensor> host_staging::read_write(const std::vector<at::Tensor>& ts) {
  return each_of(ts, [this](const at::Tensor& t) { return read_write(t); });
}

void host_staging::await_host_copies() const {
  if (staged()) side_->synchronize();
}

void host_staging::copy_back() {
  if (!staged()) return;
  const c10::OptionalStreamGuard on_side(*side_);
  // From pinned memory, asynchronously: the host allocator keeps each twin's block until its
  // copy has run, even once the twin is freed.
  for (auto& [mine, host] : copies_back_) mine.copy_(host, /*non_blocking=*/true);
  copies_back_.clear();  // the work may live on in Python: its pinned twins need not
}

std::vector<c10::Device> host_staging::devices() const {
  if (!staged()) return {};
  return {device_};
}

}  // namespace dtrain::torch_backend
