#pragma once
/// @file
/// The lanes `nccl_communicator`'s point-to-point messages travel on: for every ordered pair of
/// ranks, a two-rank NCCL communicator and a stream used in that one direction. Included by
/// collective/nccl_p2p.hpp (use collective/nccl.hpp).
///
/// NCCL runs one communicator's operations one after another on the GPU and pairs a rank's
/// sends to a peer with that peer's receives in the order both were posted. On one shared
/// communicator a receive posted before its send would hold back every later operation of the
/// rank that posted it: a ring where each rank receives first would never finish. On a lane of
/// its own, an operation waits for nothing but its own peer.

#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "dtrain/collective/nccl_types.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/cuda/runtime.hpp"

namespace dtrain::detail::nccl {

// What travels ahead of every payload: the receiver matches the tag and checks the signature
// before it receives a byte of the payload, so a wrong size never reaches NCCL.
struct p2p_header {
  std::uint64_t tag = 0;
  signature sig{};
};

// Where a lane's ranks sit in its two-rank communicator.
inline constexpr int lane_sender = 0, lane_receiver = 1;

// A point-to-point operation's state, shared by its request and, while it waits for its
// message, by the lane it waits on.
struct p2p_op {
  enum class phase { waiting, enqueued, finished };
  bool receive = false;
  int peer = 0;
  std::uint64_t tag = 0;
  signature want{};             // a receive's expectation; a send's own signature
  signature got{};              // what a receive's sender sent
  std::byte* data = nullptr;    // a receive's destination
  cuda::event posted;           // the caller's stream-0 work when the operation was posted
  cuda::event done;             // recorded after the operation's last copy on its lane
  phase at = phase::waiting;
  std::error_code result{};
};

// A message that came before its receive: its header and its payload in scratch memory.
struct early_message {
  p2p_header header;
  void* scratch = nullptr;
  std::shared_ptr<cuda::event> landed;  // recorded after its payload's receive
};

// Device memory from the stream-ordered pool: neither taking nor giving it back waits.
inline void* allocate_on(cudaStream_t s, std::size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) cuda::check(cudaMallocAsync(&p, bytes, s), "cudaMallocAsync");
  return p;
}
inline void release_on(void* p, cudaStream_t s) noexcept {
  if (p != nullptr) cudaFreeAsync(p, s);
}

// One direction between this rank and one peer (or itself: no communicator, copies only).
struct lane {
  ncclComm_t comm = nullptr;
  cuda::stream stream;  // non-blocking: stream-0 work never waits for a pending receive
  cuda::stream copies;  // early messages into their receives: never behind a header receive
  // Receiving: one header receive posted while receives wait.
  cuda::device_buffer<p2p_header> header_device{1};
  cuda::pinned_buffer<p2p_header> header_host{1};
  cuda::event header_landed;
  bool header_posted = false;
  std::deque<std::shared_ptr<p2p_op>> waiting;  // receives posted before their message, in order
  std::deque<early_message> early;              // messages posted before their receive, in order
  // Sending: a header slot per send in flight, reused once its send is done. Made when the lanes
  // are: allocating pinned or device memory may wait for the device, where a receive waits.
  static constexpr std::size_t slots_made = 32;
  struct slot {
    cuda::pinned_buffer<p2p_header> host{1};
    cuda::device_buffer<p2p_header> device{1};
    std::shared_ptr<p2p_op> user;
  };
  std::deque<slot> slots;

  lane() = default;
  lane(const lane&) = delete;  // owns `comm`; kept in a deque, which never moves its elements
  lane& operator=(const lane&) = delete;
  ~lane() {
    if (comm != nullptr) ncclCommAbort(comm);  // a posted header receive may never be matched
    for (auto& m : early) release_on(m.scratch, stream.get());
    if (stream.get() != nullptr) cudaStreamSynchronize(stream.get());
    if (copies.get() != nullptr) cudaStreamSynchronize(copies.get());
  }
};

// Stops every lane's operations before any is aborted: aborting one frees its memory, which waits
// for the device, where another lane's kernel may wait for a peer that is gone. ncclCommRevoke
// (NCCL 2.28 and later, looked up at run time) stops them; without it they are aborted in turn.
inline void abort_lanes(std::deque<lane>& a, std::deque<lane>& b) noexcept {
  using revoke_fn = ncclResult_t (*)(ncclComm_t, int);
  static const auto revoke = reinterpret_cast<revoke_fn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
  if (revoke != nullptr) {
    for (auto* lanes : {&a, &b}) {
      for (lane& l : *lanes) {
        if (l.comm != nullptr) revoke(l.comm, 0);
      }
    }
    const deadline d = deadline::after(std::chrono::seconds(10));
    for (auto* lanes : {&a, &b}) {
      for (lane& l : *lanes) {
        ncclResult_t state = ncclInProgress;
        while (l.comm != nullptr && state == ncclInProgress && !d.expired()) {
          if (ncclCommGetAsyncError(l.comm, &state) != ncclSuccess) break;
          std::this_thread::yield();
        }
      }
    }
  }
  for (auto* lanes : {&a, &b}) {
    for (lane& l : *lanes) {
      if (l.comm != nullptr) ncclCommAbort(std::exchange(l.comm, nullptr));
    }
  }
}

// Waits until `comm` leaves ncclInProgress, or `d` passes. @throws dtrain::error
inline void settle_lane(ncclComm_t comm, deadline d, const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) throw error(errc::device_error, "nccl: " + what + ": " + text(state));
    if (d.expired()) throw error(errc::timeout, "nccl: " + what + ": not done within the deadline");
    std::this_thread::yield();
  }
}

// The partner of `rank` in round `round` of a round robin among `even` ranks (the circle
// method: over `even - 1` rounds every pair meets once).
constexpr int partner_in(int round, int rank, int even) noexcept {
  const int m = even - 1;
  if (rank == m) return round;
  if (rank == round) return m;
  return ((2 * round - rank) % m + m) % m;
}

// One byte each way on a new pair of lanes, while both ranks are here: NCCL connects a pair on
// its first operation, which needs both ranks, so a later receive never waits on a peer that
// is busy elsewhere for that. Both in one NCCL group, so that each rank's connections are made
// together with its peer's.
inline void connect(lane& out, lane& in, deadline d, const std::string& what) {
  auto check = [&](ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) throw error(errc::device_error, "nccl: " + what + ": " + text(r));
  };
  check(ncclGroupStart());
  check(ncclSend(out.header_device.data(), 1, ncclUint8, lane_receiver, out.comm, out.stream.get()));
  check(ncclRecv(in.header_device.data(), 1, ncclUint8, lane_sender, in.comm, in.stream.get()));
  check(ncclGroupEnd());
  for (lane* l : {&out, &in}) {
    settle_lane(l->comm, d, what);
    l->header_landed.record(l->stream.get());
    while (!l->header_landed.ready()) {
      settle_lane(l->comm, d, what);
      if (d.expired()) throw error(errc::timeout, "nccl: " + what + ": the first message did not arrive in time");
      std::this_thread::yield();
    }
  }
}

// This rank's lanes to (`out`) and from (`in`) every rank of `parent`, the group of `size`:
// two ncclCommSplit calls per round of a round robin, collective over `parent`. The entry of
// this rank itself is the lane of its messages to itself, in `in`.
inline void form_lanes(ncclComm_t parent, int rank, int size, deadline d, std::deque<lane>& out,
                       std::deque<lane>& in) {
  for (int p = 0; p < size; ++p) out.emplace_back(), in.emplace_back();
  for (int p = 0; p < size; ++p) {
    if (p != rank) out[static_cast<std::size_t>(p)].slots.resize(lane::slots_made);
  }
  const cudaStream_t self = in[static_cast<std::size_t>(rank)].stream.get();
  release_on(allocate_on(self, 1), self);  // the stream-ordered pool set up now, not under a receive
  cuda::check(cudaStreamSynchronize(self), "cudaStreamSynchronize");
  const int even = size + size % 2;  // with an odd size, each round's partner `size` is nobody
  for (int round = 0; round + 1 < even; ++round) {
    const int partner = partner_in(round, rank, even);
    const bool paired = partner < size;
    const std::string what = "forming the point-to-point lanes of rank " + std::to_string(rank) + " and " +
                             std::to_string(partner) + " (every rank of the group forms its own)";
    for (const bool lower_sends : {true, false}) {
      const bool sends = paired && (rank < partner) == lower_sends;
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      config.splitShare = 0;  // a lane's abort must not reach the others
      // NCCL writes the new communicator from its own thread when the split ends: into the lane,
      // which outlives a failure here (the deque never moves it), or into a sink that always lives.
      static thread_local ncclComm_t nobody = nullptr;
      ncclComm_t* child = paired ? &(sends ? out : in)[static_cast<std::size_t>(partner)].comm : &nobody;
      const int color = paired ? std::min(rank, partner) : NCCL_SPLIT_NOCOLOR;
      const ncclResult_t r = ncclCommSplit(parent, color, sends ? lane_sender : lane_receiver, child, &config);
      if (r != ncclSuccess && r != ncclInProgress) throw error(errc::device_error, "nccl: " + what + ": " + text(r));
      settle_lane(parent, d, what);
      if (paired) settle_lane(*child, d, what);
    }
    if (paired) connect(out[static_cast<std::size_t>(partner)], in[static_cast<std::size_t>(partner)], d, what);
  }
}

}  // namespace dtrain::detail::nccl
