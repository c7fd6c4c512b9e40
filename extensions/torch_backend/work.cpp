#include "work.hpp"

#include <torch/version.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "dtrain/core/error.hpp"

namespace dtrain::torch_backend {

std::exception_ptr torch_error(const std::string& text) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, __LINE__}, text));
#else
  return std::make_exception_ptr(std::runtime_error(text));
#endif
}

// A deadline's error begins "Timed out", as Gloo's and NCCL's do, which scripts and torch's own
// tests match.
std::exception_ptr as_torch_error(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const error& e) {
    std::string text = e.what();
    if (e.code() == make_error_code(errc::timeout)) {
      const std::string_view ours = "dtrain: ";  // "dtrain: Timed out at rank 0 ...", "... in recv ..."
      const std::size_t at = text.rfind(ours, 0) == 0 ? ours.size() : 0;
      text.insert(at, text.compare(at, 5, "rank ") == 0 ? "Timed out at " : "Timed out in ");
    }
    return torch_error(text);
  } catch (...) {
  }
  return failure;
}

// Gloo's names, under which torch's tests and profile analysers look for a call: a call's
// coalesced and single-tensor forms share its name, and a receive from any rank is
// "recvAnySource".
const char* profiling_title(::c10d::OpType type) noexcept {
  using op = ::c10d::OpType;
  switch (type) {
    case op::BROADCAST: return "dtrain:broadcast";
    case op::ALLREDUCE:
    case op::ALLREDUCE_COALESCED: return "dtrain:all_reduce";
    case op::REDUCE: return "dtrain:reduce";
    case op::ALLGATHER:
    case op::_ALLGATHER_BASE:
    case op::ALLGATHER_COALESCED: return "dtrain:all_gather";
    case op::GATHER: return "dtrain:gather";
    case op::SCATTER: return "dtrain:scatter";
    case op::REDUCE_SCATTER:
    case op::_REDUCE_SCATTER_BASE: return "dtrain:reduce_scatter";
    case op::ALLTOALL_BASE:
    case op::ALLTOALL: return "dtrain:all_to_all";
    case op::SEND: return "dtrain:send";
    case op::RECV: return "dtrain:recv";
    case op::RECVANYSOURCE: return "dtrain:recvAnySource";
    case op::BARRIER: return "dtrain:barrier";
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
    case op::COALESCED: return "dtrain:coalesced";
#endif
    default: return "dtrain:call";
  }
}

dtrain_work::dtrain_work(int rank, ::c10d::OpType type, const std::vector<at::Tensor>& inputs,
                         std::vector<at::Tensor> outputs, host_staging staging, std::string what,
                         std::chrono::milliseconds timeout)
    : Work(rank, type, profiling_title(type), inputs),
      outputs_(std::move(outputs)),
      staging_(std::move(staging)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       staging_.devices())),
      what_(std::move(what)),
      timeout_(timeout) {}

void dtrain_work::complete(std::exception_ptr failure, int source_rank) {
  source_rank_ = source_rank;
  // The future first, as Gloo does: whoever wait() wakes finds it complete too.
  if (failure) {
    future_->setError(failure);
  } else {  // a CUDA-aware future records its events on the current stream: the copies' stream
    staging_.on_side_stream([&] { future_->markCompleted(c10::IValue(outputs_)); });
  }
  finish(failure);
}

std::string dtrain_work::where_it_is() const {
  const std::int64_t state = state_.load();
  if (state == queued_state) return "it waits in the group's queue for the calls made before it";
  if (state == posted_state) return "its transfer is posted and under way";
  return "it runs as dtrain's collective #" + std::to_string(state) + " and waits for its peers";
}

bool dtrain_work::wait(std::chrono::milliseconds timeout) {
  {
    std::unique_lock lock(mutex_);
    const auto done = [&] { return completed_; };
    if (timeout == std::chrono::milliseconds(0)) {  // c10d's kNoTimeout: no limit
      cv_.wait(lock, done);
    } else if (!cv_.wait_for(lock, timeout, done)) {
      lock.unlock();  // the error's backtrace is taken without holding up complete()
      TORCH_CHECK(false, "dtrain: work.wait(timeout=", timeout.count(), " ms): ", what_, " at rank ", rank_,
                  " has not finished: ", where_it_is(), ". The call goes on under its own timeout (",
                  timeout_.count(), " ms), whose error names the peer it waits for: wait again, or end the group "
                  "with torch.distributed.destroy_process_group()");
    }
    if (exception_) std::rethrow_exception(exception_);
  }
  synchronize();
  return true;  // as c10d's: a work cannot be aborted
}

}  // namespace dtrain::torch_backend
