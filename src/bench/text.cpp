#include "bench/text.hpp"

#include <algorithm>
#include <cctype>
#include <regex>

namespace stepbench {

std::size_t columns(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;  // count every byte that starts a code point
  return n;
}

namespace {

// "MiB", "ms," or "Gb/s)": a unit, which stays on the line of the figure before it
bool is_unit(std::string_view w) {
  while (!w.empty() && std::string_view(",;:.)]").find(w.back()) != std::string_view::npos) w.remove_suffix(1);
  for (std::string_view u : {"B", "KiB", "MiB", "GiB", "TiB", "kB", "MB", "GB", "ns", "us", "ms", "s", "GB/s", "Gb/s",
                             "MB/s", "GiB/s", "MiB/s"})
    if (w == u) return true;
  return false;
}

}  // namespace

std::string wrap(std::string_view text, std::size_t indent, std::size_t width, std::string_view first) {
  std::string out, line(first);
  bool empty = true;  // no word on `line` yet
  std::size_t pos = 0;
  const auto next_word = [&] {
    while (pos < text.size() && text[pos] == ' ') ++pos;
    const std::size_t sp = text.find(' ', pos);
    const std::string_view word = text.substr(pos, sp == std::string_view::npos ? text.npos : sp - pos);
    pos = sp == std::string_view::npos ? text.size() : sp;
    return word;
  };
  while (pos < text.size()) {
    std::string_view word = next_word();
    if (word.empty()) continue;
    // a figure and its unit break as one word
    if (std::isdigit(static_cast<unsigned char>(word.back())) != 0) {
      const std::size_t at = pos;
      const std::string_view unit = next_word();
      if (!unit.empty() && is_unit(unit))
        word = text.substr(static_cast<std::size_t>(word.data() - text.data()),
                           static_cast<std::size_t>(unit.data() + unit.size() - word.data()));
      else
        pos = at;
    }
    if (!empty && columns(line) + 1 + columns(word) > width) {
      out += line + "\n";
      line = std::string(indent, ' ');
      empty = true;
    }
    if (!empty) line += ' ';
    line += word;
    empty = false;
  }
  return out + line + "\n";
}

std::string labelled(std::string_view label, std::string_view text, std::size_t label_width) {
  std::string first(label);
  first.resize(std::max(label_width, columns(label) + 1), ' ');
  return wrap(text, first.size(), kWidth, first);
}

std::string short_device_name(std::string name) {
  static const std::regex noise(R"(\((R|TM|tm|r)\)| CPU @ [0-9.]+ ?GHz| Processor| CPU(?= \())");
  name = std::regex_replace(name, noise, "");
  static const std::regex spaces(" {2,}");
  return std::regex_replace(name, spaces, " ");
}

}  // namespace stepbench
