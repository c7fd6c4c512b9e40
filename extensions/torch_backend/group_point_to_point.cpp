// The point-to-point calls of a dtrain group: send, recv (from a rank or any source), and the
// post that monitored_barrier's messages take too. Each call is posted on the point-to-point
// thread in call order and completes when its own transfer has finished (point_to_point.hpp),
// so a waiting receive holds up no send.
#include <c10/core/GradMode.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "process_group.hpp"
#include "tensors.hpp"

namespace dtrain::torch_backend {
namespace {

// The tag point-to-point messages travel on: apart from the communicator's collectives.
constexpr std::uint64_t p2p_tag(int tag) noexcept {
  return 0x7470'0000'0000'0000ull + static_cast<std::uint32_t>(tag);  // "tp"
}

// A send's or receive's name in errors: "send to rank 2 (tag 7)".
std::string named(const std::string& what, int tag) { return what + " (tag " + std::to_string(tag) + ")"; }

}  // namespace

dtrain_process_group::work_ptr dtrain_process_group::send(tensors& t, int dst, int tag) {
  check_one(t, "send");
  TORCH_CHECK(dst >= 0 && dst < getSize() && dst != getRank(), "dtrain: send to rank ", dst, " from rank ", getRank(),
              " of ", getSize());
  host_staging staging(t[0].device(), "send");
  at::Tensor x = staging.read(t[0]).contiguous();
  calls_.fetch_add(1);  // sends and receives count too, as in Gloo
  return post(::c10d::OpType::SEND, t, std::move(staging), named("send to rank " + std::to_string(dst), tag),
              deadline::after(timeout_.load()), [this, x, dst, tag] {
                const std::span<const std::byte> bytes(static_cast<const std::byte*>(x.data_ptr()), x.nbytes());
                return comm_->transport().isend(dst, p2p_tag(tag), signature{}, bytes);
              });
}

dtrain_process_group::work_ptr dtrain_process_group::recv(tensors& t, int src, int tag) {
  check_one(t, "recv");
  TORCH_CHECK(src >= 0 && src < getSize() && src != getRank(), "dtrain: recv from rank ", src, " at rank ", getRank(),
              " of ", getSize());
  return receive(::c10d::OpType::RECV, t, src, tag);
}

dtrain_process_group::work_ptr dtrain_process_group::recvAnysource(tensors& t, int tag) {
  check_one(t, "recv");
  return receive(::c10d::OpType::RECVANYSOURCE, t, any_peer, tag);
}

dtrain_process_group::work_ptr dtrain_process_group::receive(::c10d::OpType type, tensors& t, int src, int tag) {
  host_staging staging(t[0].device(), "recv");
  auto into = std::make_shared<dense>(staging.write(t[0]));
  const auto bytes = std::span(static_cast<std::byte*>(into->data.data_ptr()), into->data.nbytes());
  // A message larger than the tensor lands here instead, so that its error can say its size.
  auto larger = std::make_shared<std::vector<std::byte>>();
  const std::string what = src == any_peer ? "recv from any rank" : "recv from rank " + std::to_string(src);
  calls_.fetch_add(1);
  return post(
      type, t, std::move(staging), named(what, tag), deadline::after(timeout_.load()),
      [this, into, bytes, larger, src, tag] {
        const std::span<std::byte> parts[] = {bytes};
        return comm_->transport().irecv(src, p2p_tag(tag), scatter_list(parts), larger.get());
      },
      [into, bytes, larger, tag](point_to_point::request& r) {
        const int from = r.info().peer;
        if (r.info().bytes != bytes.size()) {
          throw error(errc::invalid_argument, "dtrain: recv from rank " + std::to_string(from) + " (tag " +
                                                  std::to_string(tag) + "): " + std::to_string(r.info().bytes) +
                                                  " bytes arrived for a tensor of " + std::to_string(bytes.size()));
        }
        into->write_back();
        return from;
      });
}

dtrain_process_group::work_ptr dtrain_process_group::post(::c10d::OpType type, tensors t, host_staging staging,
                                                          std::string what, deadline due,
                                                          std::function<point_to_point::request()> start,
                                                          std::function<int(point_to_point::request&)> finish) {
  TORCH_CHECK(comm_.has_value(), "dtrain: ", ::c10d::opTypeToString(type), " on a group that was shut down");
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(due.remaining());
  auto work = c10::make_intrusive<dtrain_work>(getRank(), type, t, t, std::move(staging), what, timeout);
  point_to_point::call c;
  c.post = [work, start = std::move(start)] {
    work->staging().await_host_copies();
    auto r = start();
    work->posted();
    return r;
  };
  c.finish = [work, finish = std::move(finish)](point_to_point::request& r) {
    const c10::NoGradGuard no_autograd;  // c10d's calls write their tensors as NCCL does
    const int from = finish ? finish(r) : -1;
    work->staging().copy_back();
    return from;
  };
  c.complete = [work](std::exception_ptr failure, int source) {
    work->complete(failure ? as_torch_error(failure) : nullptr, source);
  };
  c.due = due;
  c.what = std::move(what) + " at rank " + std::to_string(getRank());
  c.is_send = type == ::c10d::OpType::SEND;
  point_to_point_.submit(std::move(c));
  return work;
}

}  // namespace dtrain::torch_backend
