#pragma once
// Text checks for the tests that read an error's message.

#include <string_view>

namespace dtrain::testing {

/// Whether `part` occurs in `text`.
inline bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

}  // namespace dtrain::testing
