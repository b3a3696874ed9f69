// The terminal text helpers: wrap keeps lines within their width, a figure with its unit, and
// labelled lines under their label.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "bench/text.hpp"

using namespace stepbench;

namespace {

std::vector<std::string> text_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST(Text, WrapBreaksAtSpacesWithinTheWidth) {
  const std::string w = wrap("aaa bbb ccc ddd", 4, 11);
  EXPECT_EQ(w, "aaa bbb ccc\n    ddd\n");
  for (const auto& l : text_lines(wrap("one two three four five six seven eight nine ten", 2, 12)))
    EXPECT_LE(columns(l), 12u) << l;
  EXPECT_EQ(wrap("averylongword x", 0, 5), "averylongword\nx\n");  // a long word stands alone
}

TEST(Text, WrapKeepsAFigureWithItsUnit) {
  // "optimizer 103.6 MiB," at the edge: the figure moves down with its unit
  const std::string w = wrap("gradients 103.6 MiB, optimizer 103.6 MiB, io 4.1 MiB", 6, 36);
  EXPECT_EQ(w, "gradients 103.6 MiB, optimizer\n      103.6 MiB, io 4.1 MiB\n");
  for (const char* unit : {"KiB", "GiB", "B", "ms", "us", "s", "GB/s", "Gb/s"}) {
    const std::string t = std::string("xxxxxxx 12.5 ") + unit + ")";
    EXPECT_EQ(text_lines(wrap(t, 0, 12)).back(), std::string("12.5 ") + unit + ")") << unit;
  }
  // a word that only looks like a unit after a non-number breaks as any word
  EXPECT_EQ(wrap("xxxxxxx about s", 0, 13), "xxxxxxx about\ns\n");
}

TEST(Text, LabelledLinesRunUnderTheirText) {
  const std::string l = labelled("sync", std::string(120, 'x').replace(60, 1, " "));
  const auto ls = text_lines(l);
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0].rfind("sync             x", 0), 0u);
  EXPECT_EQ(ls[1].rfind(std::string(17, ' ') + "x", 0), 0u);
}
