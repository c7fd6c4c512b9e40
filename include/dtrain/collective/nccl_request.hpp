#pragma once
/// @file
/// `nccl_request`: what `nccl_communicator`'s `i*` collectives return, an operation in flight on
/// its stream. Included by collective/nccl.hpp (use that).

#include <memory>
#include <string>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/flight/recorder.hpp"

namespace dtrain {

/// An operation in flight on an NCCL communicator's stream.
template <class Owner>
class nccl_request {
 public:
  nccl_request() = default;
  /// @returns true once the operation has finished. @throws as `wait`
  bool test() {
    if (owner_ == nullptr || done_) return true;
    recorded([&] {
      owner_->check_async(what_);
      done_ = event_->ready();
    });
    return done_;
  }
  /// Waits under the communicator's timeout. @throws dtrain::error `timeout` or `device_error`
  ///   naming the operation; the communicator is aborted then.
  void wait() {
    if (owner_ != nullptr && !done_) wait(deadline::after(owner_->options().timeout));
  }
  void wait(deadline d) {
    if (owner_ == nullptr || done_) return;
    recorded([&] {
      owner_->wait_for(*event_, what_, d);
      done_ = true;
    });
  }

 private:
  // Runs `f` and tells the flight recorder how the call ended, if it did.
  template <class F>
  void recorded(F&& f) {
    try {
      f();
    } catch (const error& e) {
      flight_.failed(flight::recorder::intern(e.what()));
      throw;
    }
    if (done_) flight_.completed();
  }

  friend Owner;
  Owner* owner_ = nullptr;
  std::shared_ptr<cuda::event> event_;
  std::string what_;
  flight::recorder::handle flight_;
  bool done_ = false;
};

}  // namespace dtrain
