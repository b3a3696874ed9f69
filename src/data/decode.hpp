// Reading and decoding one image file: JPEG (libjpeg-turbo) and PNG (libpng), told apart by their
// first bytes, decoded to 8-bit RGB. PNG's colour types all end as RGB much as Pillow's
// convert('RGB') makes them: grey replicated, palettes expanded, alpha dropped (not composited),
// 16-bit samples cut to their high byte (Pillow clips 16-bit grey instead), 1/2/4-bit grey scaled.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace stepbench {

// An 8-bit RGB image, rows packed (w * 3 bytes each).
struct Image8 {
  int w = 0, h = 0;
  std::vector<unsigned char> px;
};

enum class ImageFormat { jpeg, png, unknown };
ImageFormat sniff_image(const unsigned char* p, std::size_t n);
// by the name's extension (.jpg, .jpeg, .png, any case); unknown for anything else
ImageFormat image_format_of_name(const std::string& path);

// Reads a whole file into `out`. false with the reason when it cannot be opened or read, or is empty.
bool read_file(const std::string& path, std::vector<unsigned char>& out, std::string& why);

// Decodes a JPEG or PNG held in memory into `out`. false with the reason ("is not a JPEG or PNG",
// "is corrupt (...)", "claims W x H pixels in N bytes") for a file that is not one, is damaged, or
// claims more pixels than its bytes can hold (a damaged header must not make a gigabyte allocation).
bool decode_image(const unsigned char* p, std::size_t n, Image8& out, std::string& why);

// Whether p holds a JPEG whose header libjpeg-turbo reads, of a plausible size for its bytes (the
// check --decode gpu makes before a file goes to the device); false with the reason.
bool jpeg_header(const unsigned char* p, std::size_t n, std::string& why);

}  // namespace stepbench
