#pragma once
/// @file
/// The vocabulary of pipeline schedules: an action (receive, forward, send, backward, optimizer
/// step of one micro-batch on one chunk) and the pipeline's shape. A schedule is, for each rank,
/// a plain sequence of actions (`pipeline/schedule.hpp`).

#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::pipeline {

/// What one action does. Receives block until their message is in; sends start and return.
enum class action_kind : std::uint8_t {
  recv_activation,  ///< receive micro-batch `mb`'s input activation from the previous stage
  forward,          ///< run the stage forward on micro-batch `mb`
  send_activation,  ///< send micro-batch `mb`'s output activation to the next stage
  recv_gradient,    ///< receive the gradient of `mb`'s output from the next stage
  backward,         ///< run the stage backward on micro-batch `mb`
  send_gradient,    ///< send the gradient of `mb`'s input to the previous stage
  optimizer_step,   ///< update this rank's stages from their gradients (then zero them)
};

/// @returns the action kind's name, as traces and errors print it.
constexpr std::string_view action_name(action_kind k) noexcept {
  switch (k) {
    case action_kind::recv_activation: return "recv_activation";
    case action_kind::forward: return "forward";
    case action_kind::send_activation: return "send_activation";
    case action_kind::recv_gradient: return "recv_gradient";
    case action_kind::backward: return "backward";
    case action_kind::send_gradient: return "send_gradient";
    case action_kind::optimizer_step: return "optimizer_step";
  }
  return "unknown";
}

/// One action of one rank: its kind, the micro-batch and which of the rank's chunks (virtual
/// stages) it concerns. `optimizer_step` concerns every chunk; its `mb` is the last micro-batch
/// whose gradient it applies.
struct action {
  action_kind kind{};
  int mb = 0;
  int chunk = 0;
  friend constexpr bool operator==(const action&, const action&) noexcept = default;
};

/// The shape of a pipeline: p ranks, v chunks per rank, m micro-batches per step.
struct pipeline_shape {
  int ranks = 1;
  int chunks = 1;
  int micro_batches = 1;
  /// The number of stages, p * v.
  constexpr int stages() const noexcept { return ranks * chunks; }
  /// The stage that chunk `chunk` of rank `rank` runs.
  constexpr int stage_of(int rank, int chunk) const noexcept { return chunk * ranks + rank; }
};

/// @returns "recv_activation mb 3 chunk 1" and the like, for errors.
inline std::string describe(const action& a) {
  std::string s(action_name(a.kind));
  s.append(" mb ").append(std::to_string(a.mb)).append(" chunk ").append(std::to_string(a.chunk));
  return s;
}

}  // namespace dtrain::pipeline
