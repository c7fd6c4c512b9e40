#pragma once
// Environment variables set for a scope, in a test program's process.

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::testing {

// Sets variables for its lifetime and gives back what they were (set or not), on any way out.
class scoped_env {
 public:
  explicit scoped_env(std::vector<std::pair<std::string, std::string>> vars) {
    for (auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      ::setenv(k.c_str(), v.c_str(), 1);
    }
  }
  scoped_env(std::string name, std::string value)
      : scoped_env(std::vector<std::pair<std::string, std::string>>{{std::move(name), std::move(value)}}) {}
  ~scoped_env() {
    for (const auto& [k, v] : saved_) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace dtrain::testing
