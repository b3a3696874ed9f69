// --config FILE: a strict check of the TOML file before CLI11 reads it. CLI11 skips what it does
// not understand (a misspelt key ran with the default, a malformed line was accepted), so every
// line must be a comment or `key = value` with a key the command has, given once, and a value that
// is a TOML string, number, boolean or array of them.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>

#include "cli/flags.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// A TOML value at s[i...]: advances i past it, or returns false.
bool parse_value(const std::string& s, std::size_t& i, int depth = 0);

void skip_space(const std::string& s, std::size_t& i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
}

bool parse_string(const std::string& s, std::size_t& i) {
  const char q = s[i++];
  while (i < s.size() && s[i] != q) {
    if (q == '"' && s[i] == '\\') {
      if (++i >= s.size()) return false;
    }
    ++i;
  }
  if (i >= s.size()) return false;  // unterminated
  ++i;
  return true;
}

bool parse_number(const std::string& s, std::size_t& i) {
  const std::size_t start = i;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  auto digits = [&] {
    const std::size_t d = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '_' && i > d))) ++i;
    return i > d;
  };
  if (!digits()) return false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i > start;
}

bool parse_value(const std::string& s, std::size_t& i, int depth) {
  if (i >= s.size()) return false;
  if (s[i] == '"' || s[i] == '\'') return parse_string(s, i);
  if (s.compare(i, 4, "true") == 0) {
    i += 4;
    return true;
  }
  if (s.compare(i, 5, "false") == 0) {
    i += 5;
    return true;
  }
  if (s[i] == '[') {
    if (depth > 8) return false;
    ++i;
    skip_space(s, i);
    if (i < s.size() && s[i] == ']') return ++i, true;
    while (true) {
      skip_space(s, i);
      if (!parse_value(s, i, depth + 1)) return false;
      skip_space(s, i);
      if (i < s.size() && s[i] == ',') {
        ++i;
        skip_space(s, i);
        if (i < s.size() && s[i] == ']') return ++i, true;  // a trailing comma
        continue;
      }
      if (i < s.size() && s[i] == ']') return ++i, true;
      return false;
    }
  }
  return parse_number(s, i);
}

}  // namespace

std::map<std::string, int> check_config_file(const CLI::App& app, const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UsageError(fmt::format("--config {}: cannot read the file", path));
  std::set<std::string> keys;
  for (const CLI::Option* o : app.get_options())
    for (const auto& n : o->get_lnames())
      if (n != "config" && n != "help") keys.insert(n);
  std::map<std::string, int> seen;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    const std::string where = fmt::format("--config {} line {}", path, n);
    std::size_t i = 0;
    skip_space(line, i);
    if (i == line.size() || line[i] == '#' || line[i] == '\r') continue;
    if (line[i] == '[')
      throw UsageError(fmt::format("{}: sections ('{}') are not used; write key = value lines at the top level", where,
                                   line.substr(i)));
    const std::size_t k0 = i;
    while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '-' || line[i] == '_'))
      ++i;
    const std::string key = line.substr(k0, i - k0);
    skip_space(line, i);
    if (key.empty() || i >= line.size() || line[i] != '=')
      throw UsageError(fmt::format("{}: '{}' is not key = value (a TOML line such as batch-size = 64)", where, line));
    ++i;
    skip_space(line, i);
    const std::size_t v0 = i;
    if (!parse_value(line, i))
      throw UsageError(fmt::format("{}: the value of '{}' is not a TOML string, number, boolean or array: {}", where,
                                   key, line.substr(v0)));
    skip_space(line, i);
    if (i < line.size() && line[i] != '#' && line[i] != '\r')
      throw UsageError(fmt::format("{}: unexpected text after the value of '{}': {}", where, key, line.substr(i)));
    // image_size is not image-size to CLI11 (it would skip it silently): unknown, with the suggestion
    const std::string& name = key;
    if (!keys.count(name)) {
      std::string best;
      std::size_t best_d = 4;  // suggest only a near miss
      for (const auto& k : keys)
        if (const std::size_t d = edit_distance(name, k); d < best_d) best_d = d, best = k;
      throw UsageError(fmt::format("{}: unknown key '{}'{}; run --help for the flags (a key is a flag without --)",
                                   where, key, best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best)));
    }
    if (auto [it, fresh] = seen.emplace(name, n); !fresh)
      throw UsageError(fmt::format("{}: '{}' is given twice (first on line {})", where, key, it->second));
  }
  return seen;
}

}  // namespace stepbench::cli
