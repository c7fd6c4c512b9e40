#pragma once
/// @file
/// `executor<Link, Stage>`: runs one rank's action sequence of a pipeline schedule on its
/// chunks (stages), whatever the schedule. Activations and their gradients move between
/// neighbouring stages as tagged messages over any transport (host memory), or over a
/// point-to-point communicator of device memory (pipeline/device_link.hpp: the stages' tensors
/// and activations then live on the device); each carries its micro-batch, stage, element type
/// and count, checked on arrival, so a mismatched schedule or partition fails with both sides
/// named instead of computing on the wrong data.
///
/// Receives are posted a few actions ahead and waited for at their action; sends start at their
/// action and are waited for at the end of the step (their buffers live until then), so the
/// executor blocks exactly where `pipeline/simulate.hpp` says a rank waits.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/concepts/stage.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/flight/recorded.hpp"
#include "dtrain/pipeline/action.hpp"
#include "dtrain/pipeline/link.hpp"

namespace dtrain::pipeline {

/// How an executor runs a step.
struct executor_options {
  /// Deadline of each step, from its start: a receive not in by then raises `errc::timeout`
  /// naming the stage and micro-batch it waited for.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// First transport tag of the pipeline's messages; it uses 3 * stages tags from here. Another
  /// user of the same transport needs tags outside that range.
  std::uint64_t tag = 0x70697065'00000000;  // "pipe"
  /// GPipe's re-materialisation: drop what forward kept and run it again before backward.
  bool rematerialise = false;
  /// PipeDream's weight stashing: a micro-batch's backward runs on the weights its forward saw.
  bool stash_weights = false;
  /// Receives posted ahead of the action that waits for them.
  int receive_lookahead = 2;
};

/// What one step did on this rank.
struct step_report {
  /// The sum of the last stage's micro-batch losses (0 on ranks without the last stage).
  double loss_sum = 0;
  /// Whether this rank holds the last stage, i.e. whether `loss_sum` means anything.
  bool has_loss = false;
  /// Seconds in forward and backward, in the optimizer-step hook (averaging over replicas and
  /// updating), and from the step's start to its end. The rest of the wall time is the bubble:
  /// waiting for neighbours' messages and the executor's own work.
  double compute_seconds = 0;
  double update_seconds = 0;
  double wall_seconds = 0;
  /// The share of the step this rank sat idle in the pipeline: 1 - compute / (wall - update).
  double bubble() const noexcept {
    const double pipeline = wall_seconds - update_seconds;
    return pipeline > 0 ? 1.0 - compute_seconds / pipeline : 0.0;
  }
  /// The most micro-batches forwarded and not yet backwarded at once, over all chunks.
  int peak_live = 0;
};

/// What the executor calls back into its trainer during a step.
struct step_hooks {
  /// At each optimizer-step action, with its micro-batch.
  std::function<void(int mb)> optimizer_step;
  /// Right after a chunk's last backward before the next optimizer step: its gradients for
  /// that update are final (the trainer starts averaging them over the replicas). May be empty.
  std::function<void(int chunk)> gradients_final;
};

/// Runs action sequences on `chunks` (this rank's stages, chunk c being stage c * p + rank) over
/// `transport`, the pipeline group (rank r holds chunks of stages r, r + p, ...): a host
/// transport, or a device link (pipeline/device_link.hpp) with stages of its memory.
template <class Transport, class Stage>
  requires stage<Stage, typename Transport::memory_space>
class executor {
 public:
  using value_type = typename Stage::value_type;

  /// @param transport the pipeline group; outlives the executor. @param chunks this rank's stages.
  executor(Transport& transport, std::span<Stage> chunks, executor_options options = {})
      : transport_(transport), chunks_(chunks), options_(options), buffers_(chunks.size()) {
    if constexpr (transport_messages) {
      log_ = flight::p2p_log(flight::group_of(transport, 0), flight::members_of(transport));
    }
  }

  const executor_options& options() const noexcept { return options_; }

  /// Checks, before the first step, that each neighbouring pair of stages agrees on the schedule
  /// (its name, ranks, chunks, micro-batches) and on the size of the activation between them,
  /// so that ranks built with different partitions or schedules fail at once, naming both.
  /// Every rank of the pipeline group calls it. @throws dtrain::error `invalid_argument` on a
  /// disagreement; `timeout` or `peer_lost` as receives do.
  void handshake(const pipeline_shape& shape, std::string_view schedule) {
    const auto until = deadline::after(options_.timeout);
    std::vector<typename words::buffer> incoming(chunks_.size()), outgoing(chunks_.size());
    std::vector<logged_t<decltype(words::irecv(transport_, 0, 0, words::view(incoming[0])))>> receives, sends;
    signature hello_sig;
    hello_sig.type = dtype::int64, hello_sig.count = hello_words;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const int s = stage_of(shape, static_cast<int>(c));
      if (s == 0) continue;
      words::resize(incoming[c], hello_words);
      const int from = rank_of(shape, s - 1);
      receives.push_back(logged(words::irecv(transport_, from, hello_tag(shape, s), words::view(incoming[c])), from,
                                hello_tag(shape, s), false, hello_sig));
    }
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const int s = stage_of(shape, static_cast<int>(c));
      if (s + 1 >= shape.stages()) continue;
      const hello h = hello_of(shape, schedule, chunks_[c].output_size());
      std::int64_t w[hello_words];
      std::memcpy(w, &h, sizeof h);
      words::resize(outgoing[c], hello_words);
      words::from_host(words::view(outgoing[c]), std::span<const std::int64_t>(w));
      const int to = rank_of(shape, s + 1);
      const std::uint64_t tag = hello_tag(shape, s + 1);
      sends.push_back(logged(words::isend(transport_, to, tag, signature{}, words::view(outgoing[c])), to, tag, true,
                             hello_sig));
    }
    for (auto& r : receives) r.wait(until);
    for (auto& r : sends) r.wait(until);
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const int s = stage_of(shape, static_cast<int>(c));
      if (s == 0) continue;
      const hello mine = hello_of(shape, schedule, chunks_[c].input_size());
      const std::vector<std::int64_t> w = words::to_host(words::view(incoming[c]));
      hello theirs;
      std::memcpy(static_cast<void*>(&theirs), w.data(), sizeof theirs);  // trivially copyable
      const std::string who = "pipeline: stage " + std::to_string(s) + " (rank " + std::to_string(transport_.rank()) +
                              ") and stage " + std::to_string(s - 1) + " (rank " +
                              std::to_string(rank_of(shape, s - 1)) + ")";
      if (theirs.ranks != mine.ranks || theirs.chunks != mine.chunks || theirs.micro_batches != mine.micro_batches ||
          std::string_view(theirs.schedule) != std::string_view(mine.schedule)) {
        misbuilt(who + " run different schedules: " + describe_hello(mine) + " here, " + describe_hello(theirs) +
                 " there");
      }
      if (theirs.elements != mine.elements) {
        misbuilt(who + " disagree on the activation between them: " + std::to_string(mine.elements) +
                 " elements expected here, " + std::to_string(theirs.elements) +
                 " sent there (different partitions of the model?)");
      }
    }
  }

  // Only the stage after the seam can see it: it tells every rank, where the transport can (the
  // others would wait in their first step until the group lost it), and raises the same.
  [[noreturn]] void misbuilt(const std::string& why) {
    if constexpr (requires { transport_.abort(why, errc::invalid_argument); }) {
      transport_.abort(why, errc::invalid_argument);
    }
    throw error(errc::invalid_argument, why);
  }

  /// Runs `actions` (this rank's sequence for `shape`) as step `step`, calling `hooks`.
  /// @throws dtrain::error on a timeout, a lost peer or a message that does not match what the
  /// action expects; the step is then abandoned.
  step_report run(const std::vector<action>& actions, const pipeline_shape& shape, std::uint64_t step,
                  const step_hooks& hooks) {
    if (shape.ranks != transport_.size() || shape.chunks != static_cast<int>(chunks_.size())) {
      throw error(errc::invalid_argument, "pipeline: the schedule is for " + std::to_string(shape.ranks) + " ranks x " +
                                              std::to_string(shape.chunks) + " chunks, this rank has a group of " +
                                              std::to_string(transport_.size()) + " and " +
                                              std::to_string(chunks_.size()) + " chunks");
    }
    step_state state{actions, shape, step, deadline::after(options_.timeout)};
    const auto start = clock::now();
    for (auto& b : buffers_) b.resize(shape.micro_batches);
    const std::vector<bool> final_backward = final_backwards(actions);
    for (std::size_t i = 0; i < actions.size(); ++i) {
      post_receives_until(state, i + static_cast<std::size_t>(std::max(options_.receive_lookahead, 1)));
      run_one(state, i, hooks);
      if (final_backward[i] && hooks.gradients_final) hooks.gradients_final(actions[i].chunk);
    }
    for (auto& send : state.sends) send.wait(state.until);
    state.report.wall_seconds = seconds_since(start);
    state.report.has_loss = holds_last_stage(shape);
    return state.report;
  }

 private:
  using clock = std::chrono::steady_clock;
  using values = link<Transport, value_type>;  // activations and their messages
  using words = link<Transport, std::int64_t>;  // the handshake's
  using buffer = typename values::buffer;
  // A host transport's messages go into the flight recorder here; a device link's communicator
  // records its own.
  static constexpr bool transport_messages = transport<Transport>;
  template <class R>
  using logged_t = std::conditional_t<transport_messages, flight::recorded<R>, R>;
  using request = logged_t<decltype(values::irecv(std::declval<Transport&>(), 0, 0, typename values::span{}))>;

  template <class R>
  logged_t<R> logged(R r, int peer, std::uint64_t tag, bool sending, const signature& sig) {
    if constexpr (transport_messages) {
      return log_.post(std::move(r), peer, tag, sending, sig);
    } else {
      return r;
    }
  }
  using const_span = typename values::const_span;

  // One micro-batch's activation buffers on one chunk (and, under weight stashing, the weights
  // its forward saw), kept across steps.
  struct micro_batch_buffers {
    buffer input, output, output_grad, input_grad, stashed;
  };

  struct step_state {
    const std::vector<action>& actions;
    pipeline_shape shape;
    std::uint64_t step;
    deadline until;
    std::vector<request> sends{};
    std::vector<std::pair<std::size_t, request>> receives{};  // (action index, request), in order
    std::size_t posted_until = 0;                             // actions below this have their receive posted
    int live = 0;
    step_report report{};
  };

  // What neighbouring stages tell each other in `handshake`.
  struct hello {
    std::uint64_t ranks = 0, chunks = 0, micro_batches = 0, elements = 0;
    char schedule[32] = {};
  };
  static constexpr std::size_t hello_words = sizeof(hello) / sizeof(std::int64_t);
  static_assert(sizeof(hello) % sizeof(std::int64_t) == 0);

  static hello hello_of(const pipeline_shape& shape, std::string_view schedule, std::size_t elements) {
    hello h{static_cast<std::uint64_t>(shape.ranks), static_cast<std::uint64_t>(shape.chunks),
            static_cast<std::uint64_t>(shape.micro_batches), elements, {}};
    schedule.copy(h.schedule, std::min(schedule.size(), sizeof h.schedule - 1));
    return h;
  }

  static std::string describe_hello(const hello& h) {
    return std::string(h.schedule) + " on " + std::to_string(h.ranks) + " ranks x " + std::to_string(h.chunks) +
           " chunks, " + std::to_string(h.micro_batches) + " micro-batches";
  }

  // After the step's tags (2 per stage), one per stage for the handshake.
  std::uint64_t hello_tag(const pipeline_shape& shape, int stage) const noexcept {
    return options_.tag + 2 * static_cast<std::uint64_t>(shape.stages()) + static_cast<std::uint64_t>(stage);
  }

  // Which backwards are their chunk's last before the next optimizer step.
  std::vector<bool> final_backwards(const std::vector<action>& actions) const {
    std::vector<bool> last(actions.size(), false);
    std::vector<bool> seen(chunks_.size(), false);
    for (std::size_t i = actions.size(); i-- > 0;) {
      const action& a = actions[i];
      if (a.kind == action_kind::optimizer_step) seen.assign(chunks_.size(), false);
      if (a.kind != action_kind::backward || seen[static_cast<std::size_t>(a.chunk)]) continue;
      seen[static_cast<std::size_t>(a.chunk)] = true;
      last[i] = true;
    }
    return last;
  }

  static double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }
  bool holds_last_stage(const pipeline_shape& s) const noexcept {
    return (s.stages() - 1) % s.ranks == transport_.rank();
  }
  int stage_of(const pipeline_shape& s, int chunk) const noexcept { return s.stage_of(transport_.rank(), chunk); }
  static int rank_of(const pipeline_shape& s, int stage) noexcept { return stage % s.ranks; }

  // Messages into stage s: activations on tag + 2s, gradients on tag + 2s + 1.
  std::uint64_t tag_into(int stage, bool activation) const noexcept {
    return options_.tag + 2 * static_cast<std::uint64_t>(stage) + (activation ? 0 : 1);
  }

  signature message_signature(int to_stage, int mb, std::size_t count) const noexcept {
    signature sig;
    sig.type = dtype_of<value_type>::value;
    sig.root = to_stage;
    sig.count = count;
    sig.seq = static_cast<std::uint64_t>(mb);
    return sig;
  }

  static std::string describe_message(bool activation, int to_stage, const signature& sig) {
    return std::string(activation ? "activation" : "gradient") + " of micro-batch " + std::to_string(sig.seq) +
           " into stage " + std::to_string(to_stage) + " (" + std::string(dtype_name(sig.type)) + ", " +
           std::to_string(sig.count) + " elements)";
  }

  buffer& receive_buffer(const action& a) {
    auto& b = buffers_[a.chunk][a.mb];
    const Stage& s = chunks_[a.chunk];
    auto& v = a.kind == action_kind::recv_activation ? b.input : b.output_grad;
    values::resize(v, a.kind == action_kind::recv_activation ? s.input_size() : s.output_size());
    return v;
  }

  void post_receives_until(step_state& st, std::size_t end) {
    end = std::min(end, st.actions.size());
    for (; st.posted_until < end; ++st.posted_until) {
      const action& a = st.actions[st.posted_until];
      if (a.kind != action_kind::recv_activation && a.kind != action_kind::recv_gradient) continue;
      const bool activation = a.kind == action_kind::recv_activation;
      const int s = stage_of(st.shape, a.chunk);
      auto& v = receive_buffer(a);
      const int from = rank_of(st.shape, activation ? s - 1 : s + 1);
      const auto view = values::view(v);
      st.receives.emplace_back(st.posted_until,
                               logged(values::irecv(transport_, from, tag_into(s, activation), view), from,
                                      tag_into(s, activation), false, message_signature(s, a.mb, view.size())));
    }
  }

  void receive(step_state& st, std::size_t index, const action& a) {
    auto it = std::find_if(st.receives.begin(), st.receives.end(), [&](const auto& r) { return r.first == index; });
    const bool activation = a.kind == action_kind::recv_activation;
    const int s = stage_of(st.shape, a.chunk);
    const signature want = message_signature(s, a.mb, values::view(receive_buffer(a)).size());
    const std::string from = "stage " + std::to_string(activation ? s - 1 : s + 1) + " (rank " +
                             std::to_string(rank_of(st.shape, activation ? s - 1 : s + 1)) + ")";
    std::error_code ec;
    if (!it->second.wait(st.until, ec) && ec != values::mismatch) {
      std::string why;  // the transport's account: which rank was lost, or why a rank aborted
      if constexpr (requires { it->second.detail(); }) why = std::string(it->second.detail());
      throw error(ec, "pipeline step " + std::to_string(st.step) + ": waiting for the " +
                          describe_message(activation, s, want) + " from " + from + (why.empty() ? "" : ": " + why));
    }
    const signature& got = it->second.info().sig;
    if (ec || got != want) {
      throw error(errc::collective_mismatch, "pipeline step " + std::to_string(st.step) + ": expected the " +
                                                 describe_message(activation, s, want) + " from " + from +
                                                 ", got a message with the " +
                                                 describe_message(activation, static_cast<int>(got.root), got) +
                                                 " (do both ranks run the same schedule and partition?)");
    }
    st.receives.erase(it);
  }

  void send(step_state& st, const action& a) {
    const bool activation = a.kind == action_kind::send_activation;
    const int to = stage_of(st.shape, a.chunk) + (activation ? 1 : -1);
    auto& b = buffers_[a.chunk][a.mb];
    const const_span v = values::view(activation ? b.output : b.input_grad);
    const signature sig = message_signature(to, a.mb, v.size());
    st.sends.push_back(logged(values::isend(transport_, rank_of(st.shape, to), tag_into(to, activation), sig, v),
                              rank_of(st.shape, to), tag_into(to, activation), true, sig));
  }

  void run_one(step_state& st, std::size_t index, const step_hooks& hooks) {
    const action& a = st.actions[index];
    switch (a.kind) {
      case action_kind::recv_activation:
      case action_kind::recv_gradient: receive(st, index, a); return;
      case action_kind::send_activation:
      case action_kind::send_gradient: send(st, a); return;
      case action_kind::forward: forward(st, a); return;
      case action_kind::backward: backward(st, a); return;
      case action_kind::optimizer_step: {
        const auto start = clock::now();
        hooks.optimizer_step(a.mb);
        st.report.update_seconds += seconds_since(start);
        return;
      }
    }
  }

  micro_batch mb_of(const step_state& st, const action& a) const noexcept {
    return micro_batch{st.step, a.mb, st.shape.micro_batches};
  }

  // Runs stage forward for `a`, writing its output into `out`; returns the stage's loss.
  double run_forward(step_state& st, const action& a, buffer& out) {
    Stage& s = chunks_[a.chunk];
    auto& b = buffers_[a.chunk][a.mb];
    if (stage_of(st.shape, a.chunk) == 0) values::resize(b.input, 0);
    values::resize(out, s.output_size());
    return s.forward(mb_of(st, a), const_span(values::view(b.input)), values::view(out));
  }

  void forward(step_state& st, const action& a) {
    trace::scope span(trace::recorder::global().enabled() ? "F" + std::to_string(a.mb) : std::string(), "pipeline");
    const auto start = clock::now();
    auto& b = buffers_[a.chunk][a.mb];
    if (options_.stash_weights) copy_parameters(chunks_[a.chunk], b.stashed);
    const double loss = run_forward(st, a, b.output);
    if (stage_of(st.shape, a.chunk) == st.shape.stages() - 1) st.report.loss_sum += loss;
    if (options_.rematerialise) chunks_[a.chunk].discard(mb_of(st, a));
    st.report.peak_live = std::max(st.report.peak_live, ++st.live);
    st.report.compute_seconds += seconds_since(start);
  }

  void backward(step_state& st, const action& a) {
    trace::scope span(trace::recorder::global().enabled() ? "B" + std::to_string(a.mb) : std::string(), "pipeline");
    const auto start = clock::now();
    Stage& s = chunks_[a.chunk];
    auto& b = buffers_[a.chunk][a.mb];
    if (options_.stash_weights) swap_parameters(s, b.stashed);  // the weights forward saw
    if (options_.rematerialise) run_forward(st, a, scratch_);
    const int stage = stage_of(st.shape, a.chunk);
    if (stage == st.shape.stages() - 1) values::resize(b.output_grad, 0);
    values::resize(b.input_grad, stage == 0 ? 0 : s.input_size());
    s.backward(mb_of(st, a), const_span(values::view(b.output_grad)), values::view(b.input_grad));
    if (options_.stash_weights) swap_parameters(s, b.stashed);  // back to the latest
    --st.live;
    st.report.compute_seconds += seconds_since(start);
  }

  static void copy_parameters(Stage& s, buffer& into) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.tensor_count(); ++i) n += s.parameters(i).size();
    values::resize(into, n);
    std::size_t at = 0;
    for (std::size_t i = 0; i < s.tensor_count(); ++i) {
      const auto p = s.parameters(i);
      values::copy(values::view(into).subspan(at, p.size()), const_span(p));
      at += p.size();
    }
  }

  void swap_parameters(Stage& s, buffer& with) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < s.tensor_count(); ++i) {
      const auto p = s.parameters(i);
      values::swap(p, values::view(with).subspan(at, p.size()), swap_scratch_);
      at += p.size();
    }
  }

  Transport& transport_;
  std::span<Stage> chunks_;
  executor_options options_;
  std::vector<std::vector<micro_batch_buffers>> buffers_;  // [chunk][micro-batch]
  buffer scratch_;                                          // a re-materialised forward's output
  buffer swap_scratch_;                                     // a device link's swap goes through it
  flight::p2p_log log_;                                     // a host transport's messages, recorded
};

}  // namespace dtrain::pipeline
