#pragma once
/// @file
/// Values every rank of a job must hold alike (a trainer's plan and options), each with a name:
/// the ranks gather the values, one `std::int64_t` each, and a disagreement names the first
/// field that differs with both ranks' values, where a digest could only say that something did.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dtrain::detail {

struct agreed_field {
  enum class kind { count, real, flag, digest, choice };
  const char* name;
  std::int64_t value;
  kind as = kind::count;
  std::span<const char* const> choices{};  // `choice`: the names of the values 0, 1, ...

  static agreed_field count(const char* name, std::uint64_t v) {
    return {name, static_cast<std::int64_t>(v), kind::count};
  }
  static agreed_field real(const char* name, double v) { return {name, std::bit_cast<std::int64_t>(v), kind::real}; }
  static agreed_field flag(const char* name, bool v) { return {name, v ? 1 : 0, kind::flag}; }
  static agreed_field digest(const char* name, std::uint64_t v) {
    return {name, static_cast<std::int64_t>(v), kind::digest};
  }
  template <class Enum>
  static agreed_field choice(const char* name, Enum v, std::span<const char* const> names) {
    return {name, static_cast<std::int64_t>(v), kind::choice, names};
  }

  std::string text(std::int64_t v) const {
    switch (as) {
      case kind::real: return std::to_string(std::bit_cast<double>(v));
      case kind::flag: return v != 0 ? "true" : "false";
      case kind::digest: return "digest " + std::to_string(static_cast<std::uint64_t>(v));
      case kind::choice:
        if (v >= 0 && static_cast<std::size_t>(v) < choices.size()) return choices[static_cast<std::size_t>(v)];
        return std::to_string(v);
      case kind::count: break;
    }
    return std::to_string(v);
  }
};

/// What this rank sends: the fields' values, in order.
inline std::vector<std::int64_t> values_of(std::span<const agreed_field> fields) {
  std::vector<std::int64_t> values;
  values.reserve(fields.size());
  for (const agreed_field& f : fields) values.push_back(f.value);
  return values;
}

/// Given every rank's values of `fields` (rank r's at [r n, r n + n), n = fields.size()), "" when
/// every rank holds rank 0's, else "<field>: rank 0 has <value>, rank r has <value>" for the first
/// rank r that differs and the first of its fields that does. Every rank sees the same values,
/// so every rank says the same.
inline std::string field_disagreement(std::span<const agreed_field> fields, std::span<const std::int64_t> all) {
  const std::size_t n = fields.size();
  for (std::size_t r = 1; n > 0 && (r + 1) * n <= all.size(); ++r) {
    for (std::size_t f = 0; f < n; ++f) {
      const std::int64_t ours = all[f], theirs = all[r * n + f];
      if (ours == theirs) continue;
      return std::string(fields[f].name) + ": rank 0 has " + fields[f].text(ours) + ", rank " + std::to_string(r) +
             " has " + fields[f].text(theirs);
    }
  }
  return {};
}

}  // namespace dtrain::detail
