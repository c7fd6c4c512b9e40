#pragma once
// The point-to-point calls of one group (send, recv, recv from any source, batch_isend_irecv's).
// As in Gloo and NCCL, sends and receives progress independently: a receive waiting for its
// message holds up no later send, so a ring where every rank receives first, or a swap posted
// receive-first, finishes at once. Each call is posted to the transport in call order on this
// class's thread (messages between two ranks on one tag then match in call order), and its work
// completes when its own transfer has finished, in whatever order they finish. Each call has its
// own deadline. While transfers are in flight the thread sleeps between looks at them (20 us,
// doubling to 1 ms while nothing finishes): a pending receive costs no core.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "shared_world.hpp"

namespace dtrain::torch_backend {

class point_to_point {
 public:
  using request = group_transport::request;

  /// One call. `post` starts its transfer (on the thread, once the call's host copies landed);
  /// `finish` runs after it succeeded (a receive checks the size and writes back) and returns the
  /// rank the message came from; `complete` hands the outcome to the call's work.
  struct call {
    std::function<request()> post;
    std::function<int(request&)> finish;
    std::function<void(std::exception_ptr, int)> complete;
    deadline due = deadline::after(std::chrono::seconds(0));
    std::string what;  // "recv from rank 2 (tag 7) at rank 0", how its errors begin
    bool is_send = false;
  };

  point_to_point() = default;
  point_to_point(const point_to_point&) = delete;
  point_to_point& operator=(const point_to_point&) = delete;
  ~point_to_point() { stop(); }

  /// Queues `c` to be posted after every call submitted before it.
  void submit(call c);

  /// Fails the receives still waiting (cancelled) and every call submitted later; the sends
  /// called before it are posted and may finish within the linger time (10 s). Then stops the
  /// thread.
  void stop() noexcept;

 private:
  struct in_flight {
    request r;
    call c;
  };

  void run();
  // Finishes `f` if its transfer is over or its deadline has passed. @returns whether it did.
  static bool settle(in_flight& f);
  // Hands `c`'s outcome to its work: done (`failure` null, the sender `source`) or failed.
  static void complete(call& c, std::exception_ptr failure, int source = -1) noexcept;
  static std::exception_ptr shut_down(const call& c);

  std::mutex m_;
  std::condition_variable wake_;
  std::deque<call> incoming_;  // submitted, not yet posted
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dtrain::torch_backend
