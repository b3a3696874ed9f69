// Text for the terminal: lines of at most kWidth columns (the summary's limit), a label column,
// device names without their trademarks.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace stepbench {

constexpr std::size_t kWidth = 100;  // the widest line the default output prints

// Columns `s` takes on a terminal (UTF-8: a code point is one column; no wide characters here).
std::size_t columns(std::string_view s);
// `first` then `text`, broken at spaces into lines of at most `width` columns, every line after the
// first indented by `indent` spaces; each line ends with '\n'. A word longer than a line stands alone.
std::string wrap(std::string_view text, std::size_t indent = 0, std::size_t width = kWidth,
                 std::string_view first = "");
// "label" padded to `label_width`, then `text`, wrapped under the text.
std::string labelled(std::string_view label, std::string_view text, std::size_t label_width = 17);
// "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz (2 threads)" -> "Intel Xeon Gold 6338 (2 threads)".
std::string short_device_name(std::string name);

}  // namespace stepbench
