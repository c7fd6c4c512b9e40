// Positive and negative compile-time tests of every concept: the archetypes and dtrain's models
// satisfy them; types that break one clause each do not.

#include <cstdint>
#include <string>
#include <vector>

#include "../archetypes/archetypes.hpp"
#include "../catch.hpp"
#include "dtrain/dtrain.hpp"

namespace {
using namespace dtrain;
using namespace dtrain::archetypes;

// --- element ---
static_assert(element<float> && element<double> && element<std::int32_t> && element<std::int64_t>);
static_assert(element<float16> && element<bfloat16>);
static_assert(!element<char>, "no dtype tag");
static_assert(!element<std::string>, "not trivially copyable and no tag");
static_assert(element<std::uint8_t> && element<std::int8_t> && element<bool> && element<std::byte>);
static_assert(floating_element<float> && floating_element<double> && floating_element<bfloat16> &&
              floating_element<float16>);
static_assert(!floating_element<std::int32_t> && !floating_element<long double> && !floating_element<bool>);
static_assert(!element<std::uint16_t>, "no dtype tag");

// --- completion ---
static_assert(completion<completion_archetype>);
static_assert(completion<inproc_request>);
struct completion_without_cancel {
  bool wait(deadline, std::error_code&) noexcept { return true; }
  void wait(deadline) {}
  bool test() noexcept { return true; }
  const envelope& info() const noexcept { return e; }
  envelope e;
};
static_assert(!completion<completion_without_cancel>);
struct completion_copy_only {  // wait that may throw where noexcept is required
  bool wait(deadline, std::error_code&) { return true; }
  void wait(deadline) {}
  bool test() noexcept { return true; }
  void cancel() noexcept {}
  const envelope& info() const noexcept { return e; }
  envelope e;
};
static_assert(!completion<completion_copy_only>);

// --- transport ---
static_assert(transport<transport_archetype>);
static_assert(transport<inproc_transport>);
struct transport_without_growing_receive : transport_archetype {
  completion_archetype irecv(int, std::uint64_t, std::vector<std::byte>&) = delete;
};
static_assert(!transport<transport_without_growing_receive>);
struct transport_without_gathered_send : transport_archetype {
  completion_archetype isend(int, std::uint64_t, const signature&, gather_list) = delete;
};
static_assert(!transport<transport_without_gathered_send>);
struct transport_without_scattered_receive : transport_archetype {
  completion_archetype irecv(int, std::uint64_t, scatter_list, std::vector<std::byte>*) = delete;
};
static_assert(!transport<transport_without_scattered_receive>);
struct transport_without_memory_space {
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  completion_archetype isend(int, std::uint64_t, const signature&, std::span<const std::byte>) { return {}; }
  completion_archetype irecv(int, std::uint64_t, std::span<std::byte>) { return {}; }
  completion_archetype irecv(int, std::uint64_t, std::vector<std::byte>&) { return {}; }
  completion_archetype isend(int, std::uint64_t, const signature&, gather_list) { return {}; }
  completion_archetype irecv(int, std::uint64_t, scatter_list, std::vector<std::byte>*) { return {}; }
};
static_assert(!transport<transport_without_memory_space>);
struct transport_with_bad_completion : transport_archetype {
  int isend(int, std::uint64_t, const signature&, std::span<const std::byte>) { return 0; }
};
static_assert(!transport<transport_with_bad_completion>);

// --- collective ---
static_assert(collective<collective_archetype>);
static_assert(collective<collective_archetype, double>);
static_assert(collective<communicator<inproc_transport>>);
static_assert(collective<ring<inproc_transport>, std::int64_t>);
static_assert(collective<halving_doubling<inproc_transport>, float16>);
static_assert(collective<communicator<inproc_transport>, bfloat16>);
static_assert(!collective<collective_archetype, char>, "not an element type");
struct collective_without_barrier : collective_archetype {
  void barrier() = delete;
};
static_assert(!collective<collective_without_barrier>);
static_assert(!collective<transport_archetype>, "a transport is not a collective");

// --- memory spaces: a buffer from the wrong space does not compile ---
static_assert(collective<device_collective_archetype>);
static_assert(collective<device_collective_archetype, double>);
static_assert(std::is_convertible_v<device_span<float>, device_span<const float>>);
static_assert(!std::is_convertible_v<device_span<float>, std::span<float>>, "device memory is not a host span");
static_assert(!std::is_convertible_v<std::span<float>, device_span<float>>, "host memory is not a device span");
static_assert(!std::is_convertible_v<device_span<const float>, device_span<float>>);
static_assert(!std::is_convertible_v<float*, device_span<float>>, "a raw pointer must be vouched for explicitly");
static_assert(std::is_same_v<buffer_of<communicator<inproc_transport>, float>, std::span<float>>);
static_assert(std::is_same_v<buffer_of<device_collective_archetype, float>, device_span<float>>);
template <class C, class Buffer>
concept allreduces = requires(C& c, Buffer b) { c.allreduce(b, reduce_op::sum); };
static_assert(allreduces<communicator<inproc_transport>, std::span<float>>);
static_assert(!allreduces<communicator<inproc_transport>, device_span<float>>,
              "a host collective refuses device memory");
static_assert(!allreduces<ring<inproc_transport>, device_span<float>>);
static_assert(allreduces<device_collective_archetype, device_span<float>>);
static_assert(!allreduces<device_collective_archetype, std::span<float>>, "a device collective refuses host memory");
template <class R, class Dst, class Src>
concept reduces = requires(const R& r, Dst d, Src s) { r(d, s, reduce_op::sum); };
static_assert(!reduces<host_reduction, device_span<float>, device_span<const float>>,
              "host reductions read host memory");

// --- reduction ---
static_assert(reduction<reduction_archetype>);
static_assert(reduction<host_reduction, float16>);
struct reduction_without_average {
  using memory_space = host_memory;
  template <class T> void operator()(std::span<T>, std::span<const T>, reduce_op) const {}
};
static_assert(!reduction<reduction_without_average>);

// --- consistency ---
static_assert(consistency<consistency_archetype>);
static_assert(consistency<bsp> && consistency<asp> && consistency<ssp<3>> && consistency<soft_sync<2>>);
struct consistency_without_name {
  std::int64_t staleness_bound() const noexcept { return 0; }
  bool may_advance(std::int64_t, std::int64_t) const noexcept { return true; }
  int pushes_to_apply(int) const noexcept { return 1; }
  std::int64_t visible_clock(std::int64_t) const noexcept { return -1; }
};
static_assert(!consistency<consistency_without_name>);

// --- stage ---
static_assert(stage<stage_archetype>);
struct stage_with_int_values : stage_archetype {
  using value_type = int;
};
static_assert(!stage<stage_with_int_values>, "activations and parameters are floating point");
struct stage_without_sizes {
  using value_type = double;
  std::size_t tensor_count() const noexcept { return 0; }
  std::span<double> parameters(std::size_t) { return {}; }
  std::span<double> gradients(std::size_t) { return {}; }
  double forward(const micro_batch&, std::span<const double>, std::span<double>) { return 0; }
  void backward(const micro_batch&, std::span<const double>, std::span<double>) {}
  void discard(const micro_batch&) {}
};
static_assert(!stage<stage_without_sizes>, "a stage says its activations' sizes");
struct stage_without_discard {
  using value_type = double;
  std::size_t tensor_count() const noexcept { return 0; }
  std::span<double> parameters(std::size_t) { return {}; }
  std::span<double> gradients(std::size_t) { return {}; }
  std::size_t input_size() const noexcept { return 0; }
  std::size_t output_size() const noexcept { return 0; }
  double forward(const micro_batch&, std::span<const double>, std::span<double>) { return 0; }
  void backward(const micro_batch&, std::span<const double>, std::span<double>) {}
};
static_assert(!stage<stage_without_discard>, "re-materialisation needs discard");
struct stage_with_whole_batch_backward {
  using value_type = double;
  std::size_t tensor_count() const noexcept { return 0; }
  std::span<double> parameters(std::size_t) { return {}; }
  std::span<double> gradients(std::size_t) { return {}; }
  std::size_t input_size() const noexcept { return 0; }
  std::size_t output_size() const noexcept { return 0; }
  double forward(const micro_batch&, std::span<const double>, std::span<double>) { return 0; }
  void backward(std::span<const double>, std::span<double>) {}
  void discard(const micro_batch&) {}
};
static_assert(!stage<stage_with_whole_batch_backward>, "backward names its micro-batch");
// --- model ---
static_assert(model<model_archetype>);
struct model_with_int_parameters : model_archetype {
  using value_type = int;
};
static_assert(!model<model_with_int_parameters>, "parameters are floating point");
struct model_without_ready : model_archetype {
  double forward_backward(const batch_type&) { return 0; }
};
static_assert(!model<model_without_ready>, "the backward pass must report gradients as ready");
struct model_without_batch {
  using value_type = float;
  std::size_t tensor_count() const noexcept { return 0; }
  std::span<float> parameters(std::size_t) { return {}; }
  std::span<float> gradients(std::size_t) { return {}; }
};
static_assert(!model<model_without_batch>);
struct model_with_const_gradients : model_archetype {
  std::span<const float> gradients(std::size_t) { return {}; }
};
static_assert(!model<model_with_const_gradients>, "the trainer averages gradients in place");

// --- unit model ---
static_assert(unit_model<unit_model_archetype>);
static_assert(!unit_model<model_archetype> && !model<unit_model_archetype>, "a unit model holds no parameters");
struct unit_model_with_gradient_ready : unit_model_archetype {
  double forward_backward(const batch_type&, gradient_ready) { return 0; }
};
static_assert(!unit_model<unit_model_with_gradient_ready>, "it reads parameters through unit_access");
struct unit_model_without_initialize : model_archetype {
  std::size_t unit_count() const noexcept { return 0; }
  std::vector<std::size_t> unit_tensors(std::size_t) const { return {}; }
  double forward_backward(const batch_type&, unit_access<float>&) { return 0; }
};
static_assert(!unit_model<unit_model_without_initialize>, "the root initialises each unit");
// The sharded trainer takes the archetypes: stages 1 and 2 a model, stage 3 a unit model.
static_assert(sizeof(sharded::trainer<ring<inproc_transport>, sharded::zero2, sgd<float>, model_archetype>) > 0);
static_assert(sizeof(sharded::trainer<ring<inproc_transport>, sharded::zero3, sgd<float>, unit_model_archetype>) > 0);

// --- updater ---
static_assert(updater<updater_archetype>);
static_assert(updater<sgd<>> && updater<momentum<>> && updater<adagrad<>> && updater<rmsprop<>>);
static_assert(updater<adam<double>, double>);
static_assert(updater<staleness_aware<adam<>>>);
static_assert(updater<ftrl<>> && updater<ftrl<double>, double>);
static_assert(!updater<sgd<float>, double>, "a float updater does not step double parameters");
struct updater_without_state : updater_archetype {
  std::span<float> state() noexcept = delete;
};
static_assert(!updater<updater_without_state>);

}  // namespace

TEST_CASE("concepts: compile-time checks hold", "[concepts]") {
  // The static_asserts above are the test; this case reports that the file compiled.
  STATIC_REQUIRE(transport<inproc_transport>);
  STATIC_REQUIRE(collective<communicator<inproc_transport>>);
}
