#pragma once
// Text checks for the tests that read an error's message or a program's output.

#include <string_view>

namespace dtrain::testing {

/// Whether `word` occurs in `text`.
inline bool has(std::string_view text, std::string_view word) { return text.find(word) != std::string_view::npos; }

}  // namespace dtrain::testing
