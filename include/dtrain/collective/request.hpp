#pragma once
/// @file
/// `collective_request`: the handle of a collective started with an `i` form (`iallreduce`,
/// `ibroadcast`, ...), to `test` or `wait` on, as MPI_Request or PyTorch's `Work`; and the queue
/// that runs those collectives on the communicator's own thread.
///
/// <!-- frame: header_inproc_comm -->
/// @code
/// auto a = comm.iallreduce(std::span(grads), dtrain::reduce_op::sum);
/// auto b = comm.ibroadcast(std::span(weights), 0);
/// b.wait();  // any order: the communicator's thread runs them in the order they were started
/// a.wait();  // rethrows the collective's error, if it failed
/// @endcode

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace dtrain {

namespace detail {

/// What a request and the thread running its collective share.
struct call_state {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr failure;
};

}  // namespace detail

/// The handle of one collective started with an `i` form. Its buffers must stay alive and
/// untouched until `test` returns true or `wait` returns. Every collective has its
/// communicator's deadline, so `wait` always returns. A default-constructed request is complete.
class collective_request {
 public:
  collective_request() = default;
  explicit collective_request(std::shared_ptr<detail::call_state> s) : state_(std::move(s)) {}

  /// Whether the collective has finished (successfully or not). Never blocks.
  bool test() const {
    if (!state_) return true;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }

  /// Blocks until the collective finishes. @throws the error the collective failed with
  /// (`dtrain::error` naming the operation and the peer), each time it is called.
  void wait() const {
    if (!state_) return;
    std::unique_lock lock(state_->mutex);
    state_->finished.wait(lock, [&] { return state_->done; });
    if (state_->failure) std::rethrow_exception(state_->failure);
  }

  /// Waits at most `limit`. @returns whether it finished; @throws as `wait` if it failed.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> limit) const {
    if (!state_) return true;
    std::unique_lock lock(state_->mutex);
    if (!state_->finished.wait_for(lock, limit, [&] { return state_->done; })) return false;
    if (state_->failure) std::rethrow_exception(state_->failure);
    return true;
  }

 private:
  std::shared_ptr<detail::call_state> state_;
};

namespace detail {

/// Runs collectives one at a time, in the order they were submitted, on a thread started with
/// the first submission. A communicator's blocking calls queue behind its pending `i` calls, so
/// every rank issues the same sequence whatever each waits on first.
class call_queue {
 public:
  call_queue() = default;
  call_queue(const call_queue&) = delete;
  call_queue& operator=(const call_queue&) = delete;
  ~call_queue() { stop(); }

  /// Queues `job`. @returns its request.
  collective_request submit(std::function<void()> job) {
    auto state = std::make_shared<call_state>();
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back({std::move(job), state});
      if (!thread_.joinable()) {
        thread_ = std::thread([this] { run(); });
        worker_id_ = thread_.get_id();  // before the thread can take the lock and run a job
      }
    }
    wake_.notify_one();
    return collective_request(std::move(state));
  }

  /// Whether the calling thread is the queue's own.
  bool on_worker() const noexcept { return std::this_thread::get_id() == worker_id_; }

  /// Whether a submitted collective has not yet finished.
  bool busy() const {
    std::lock_guard lock(mutex_);
    return !jobs_.empty() || running_;
  }

  /// Finishes everything queued, then stops the thread (a later submission starts it again).
  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (!thread_.joinable()) return;
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
    std::lock_guard lock(mutex_);
    thread_ = std::thread();
    worker_id_ = std::thread::id{};
    stopping_ = false;
  }

 private:
  struct queued {
    std::function<void()> body;
    std::shared_ptr<call_state> state;
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and everything queued has run
      queued next = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
      lock.unlock();
      std::exception_ptr failure;
      try {
        next.body();
      } catch (...) {
        failure = std::current_exception();
      }
      {
        std::lock_guard done(next.state->mutex);
        next.state->done = true;
        next.state->failure = failure;
      }
      next.state->finished.notify_all();
      // The job's captures go before the lock is taken again: their destructors may wait for a
      // thread that waits for this lock (a tensor freed here can need Python's GIL, held by a
      // thread that is queueing the next call).
      next.body = nullptr;
      lock.lock();
      running_ = false;
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<queued> jobs_;
  bool running_ = false;
  bool stopping_ = false;
  std::atomic<std::thread::id> worker_id_{};
  std::thread thread_;
};

/// How a communicator orders its calls: blocking ones run on the caller's thread under a mutex,
/// or behind the `i` calls still queued; `i` calls run on the queue's thread under the same
/// mutex. So several threads may use one communicator; each rank must still issue the same
/// collectives in the same order. Moving one first finishes the source's queued calls (they
/// refer to the source object).
class call_serializer {
 public:
  call_serializer() = default;
  call_serializer(call_serializer&& other) { other.stop(); }
  call_serializer& operator=(call_serializer&& other) {
    stop();
    other.stop();
    return *this;
  }

  /// Runs the blocking call `f` in its turn.
  template <class F>
  void run(F&& f) {
    if (queue_->on_worker()) {
      f();  // an `i` call's body: its job already holds the mutex
    } else if (queue_->busy()) {
      submit([&] { f(); }).wait();  // behind the `i` calls still queued
    } else {
      std::lock_guard lock(*mutex_);
      f();
    }
  }

  /// Queues `job` to run after everything submitted before it.
  collective_request submit(std::function<void()> job) {
    return queue_->submit([mutex = mutex_.get(), job = std::move(job)] {
      std::lock_guard lock(*mutex);
      job();
    });
  }

  /// Finishes every queued call and stops the queue's thread.
  void stop() { queue_->stop(); }

 private:
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  std::unique_ptr<call_queue> queue_ = std::make_unique<call_queue>();
};

}  // namespace detail
}  // namespace dtrain
