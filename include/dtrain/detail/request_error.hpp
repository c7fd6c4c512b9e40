#pragma once
// The words of a failed send or receive, shared by every transport's completion handle.

#include <string>

#include "dtrain/concepts/completion.hpp"

namespace dtrain::detail {

/// "receive from rank 1 on tag 5 (what the transport knows)": `dtrain::error` appends the code's
/// own words, so they are not repeated here.
inline std::string request_error_text(bool is_send, const envelope& e, const std::string& why = {}) {
  std::string peer = e.peer == any_peer ? "any rank" : "rank " + std::to_string(e.peer);
  std::string what = std::string(is_send ? "send to " : "receive from ") + peer + " on tag " + std::to_string(e.tag);
  if (!why.empty()) what += " (" + why + ")";
  return what;
}

}  // namespace dtrain::detail
