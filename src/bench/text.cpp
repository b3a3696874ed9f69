#include "bench/text.hpp"

#include <algorithm>
#include <regex>

namespace stepbench {

std::size_t columns(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;  // count every byte that starts a code point
  return n;
}

std::string wrap(std::string_view text, std::size_t indent, std::size_t width, std::string_view first) {
  std::string out, line(first);
  bool empty = true;  // no word on `line` yet
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t sp = text.find(' ', pos);
    const std::string_view word = text.substr(pos, sp == std::string_view::npos ? text.npos : sp - pos);
    pos = sp == std::string_view::npos ? text.size() : sp + 1;
    if (word.empty()) continue;
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
