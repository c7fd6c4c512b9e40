#pragma once
// linear_model with the one thing a device model adds: the stream its work runs on. Under
// Thrust's CPP system a device buffer is a std::span and a stream is the calling thread.

#include "dtrain/allreduce/thrust_backend.hpp"
#include "linear_model.hpp"

namespace dtrain::testing {

class device_linear_model : public linear_model {
 public:
  using linear_model::linear_model;
  detail::thrust_space::stream_handle stream() const noexcept { return {}; }
};
static_assert(device_model<device_linear_model>);

}  // namespace dtrain::testing
