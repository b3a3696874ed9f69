// One name table per enum serves parsing, printing and the JSON context. An enum E takes part by
// declaring `constexpr auto enum_names(E)` beside it (found by argument-dependent lookup), which
// returns a std::array of EnumName<E>: the first name of each value is its canonical one, later
// entries for the same value are accepted aliases.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace stepbench {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  enum_names(e);
};

template <NamedEnum E>
constexpr std::string_view to_string(E e) {
  for (const auto& n : enum_names(E{}))
    if (n.value == e) return n.name;
  return "?";
}

// The canonical names, in the table's order.
template <NamedEnum E>
std::vector<std::string> names_of() {
  std::vector<std::string> out;
  std::vector<E> seen;
  for (const auto& n : enum_names(E{})) {
    bool dup = false;
    for (E s : seen) dup = dup || s == n.value;
    if (!dup) {
      seen.push_back(n.value);
      out.emplace_back(n.name);
    }
  }
  return out;
}

template <NamedEnum E>
std::optional<E> try_parse_enum(std::string_view s) {
  for (const auto& n : enum_names(E{}))
    if (n.name == s) return n.value;
  return std::nullopt;
}

// "a, b or c"
std::string join_or(const std::vector<std::string>& names);
[[noreturn]] void throw_unknown_name(std::string_view what, std::string_view s, const std::vector<std::string>& names);

// Throws UsageError "unknown <what> '<s>': use a, b or c".
template <NamedEnum E>
E parse_enum(std::string_view s, std::string_view what) {
  if (auto v = try_parse_enum<E>(s)) return *v;
  throw_unknown_name(what, s, names_of<E>());
}

}  // namespace stepbench
