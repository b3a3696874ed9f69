#include "data/decode.hpp"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "tensor/error.hpp"

namespace stepbench {

namespace {

struct TjHandle {
  tjhandle h;
  TjHandle() : h(tjInitDecompress()) {
    if (!h) throw Error("libjpeg-turbo: could not create a handle");
  }
  ~TjHandle() { tjDestroy(h); }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};

// A damaged header may claim gigapixels in a few bytes: refuse what the file cannot hold (JPEG and
// PNG compress well, but not past ~2000:1 with room for a flat image) and anything past 2^28 pixels.
bool plausible_size(int w, int h, std::size_t bytes, std::string& why) {
  const double pixels = static_cast<double>(w) * h;
  if (pixels > 268435456.0 || pixels * 3 > 2048.0 * static_cast<double>(bytes) + 67108864.0) {
    why = fmt::format(
        "claims {} x {} pixels in {} bytes (a damaged header, or an image far larger than training "
        "needs)",
        w, h, bytes);
    return false;
  }
  return true;
}

bool decode_jpeg(const unsigned char* p, std::size_t n, Image8& out, std::string& why) {
  // The thread's decompressor. After a damaged file it is made anew: libjpeg-turbo 2.1 can leave a
  // handle that failed mid-header in a state in which the next, valid file fails too ("Bogus DQT
  // index"; tests/data/jpeg_mutation_test.cpp).
  thread_local std::unique_ptr<TjHandle> handle;
  if (!handle) handle = std::make_unique<TjHandle>();
  struct Renew {  // on every return but the decoded one
    std::unique_ptr<TjHandle>& h;
    bool ok = false;
    ~Renew() {
      if (!ok) h.reset();
    }
  } renew{handle};
  const tjhandle tj = handle->h;
  auto* src = const_cast<unsigned char*>(p);  // TurboJPEG 2.1 takes non-const input it does not write
  int W = 0, H = 0, sub = 0, cs = 0;
  if (tjDecompressHeader3(tj, src, n, &W, &H, &sub, &cs) != 0 || W <= 0 || H <= 0) {
    why = fmt::format("is not a JPEG ({})", tjGetErrorStr2(tj));
    return false;
  }
  if (!plausible_size(W, H, n, why)) return false;
  out.w = W;
  out.h = H;
  out.px.resize(static_cast<std::size_t>(W) * H * 3);
  if (tjDecompress2(tj, src, n, out.px.data(), W, 0, H, TJPF_RGB, TJFLAG_FASTDCT) != 0 &&
      tjGetErrorCode(tj) == TJERR_FATAL) {
    why = fmt::format("is corrupt ({})", tjGetErrorStr2(tj));
    return false;
  }
  renew.ok = true;
  return true;
}

struct PngRead {
  const unsigned char* p;
  std::size_t n, off = 0;
  char msg[160] = "";
};

void png_read_mem(png_structp png, png_bytep out, png_size_t len) {
  auto* s = static_cast<PngRead*>(png_get_io_ptr(png));
  if (s->n - s->off < len) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, s->p + s->off, len);
  s->off += len;
}
[[noreturn]] void png_fail(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(s->msg, sizeof s->msg, "%s", msg);
  png_longjmp(png, 1);
}
void png_warn(png_structp, png_const_charp) {}

// Everything that setjmp may skip over lives outside the function that calls setjmp.
struct PngState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::vector<unsigned char> rows;
  std::vector<png_bytep> ptrs;
  int w = 0, h = 0, channels = 0;
  ~PngState() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

bool png_decode_into(PngState& st, PngRead& src, std::string& why) {
  if (setjmp(png_jmpbuf(st.png))) {
    why = fmt::format("is corrupt ({})", src.msg);
    return false;
  }
  png_set_read_fn(st.png, &src, png_read_mem);
  png_set_user_limits(st.png, 65535, 65535);
  png_set_chunk_malloc_max(st.png, 64u << 20);
  png_read_info(st.png, st.info);
  const int W = static_cast<int>(png_get_image_width(st.png, st.info));
  const int H = static_cast<int>(png_get_image_height(st.png, st.info));
  if (!plausible_size(W, H, src.n, why)) return false;
  const int type = png_get_color_type(st.png, st.info);
  const int depth = png_get_bit_depth(st.png, st.info);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(st.png);  // tRNS becomes an alpha channel
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(st.png);
  if (depth == 16) png_set_strip_16(st.png);
  png_set_interlace_handling(st.png);
  png_read_update_info(st.png, st.info);
  st.channels = png_get_channels(st.png, st.info);
  const std::size_t rowbytes = png_get_rowbytes(st.png, st.info);
  if (png_get_bit_depth(st.png, st.info) != 8 || st.channels < 1 || st.channels > 4 ||
      rowbytes != static_cast<std::size_t>(W) * st.channels) {
    why = "is a PNG this decoder cannot convert to 8-bit RGB";
    return false;
  }
  st.rows.resize(rowbytes * static_cast<std::size_t>(H));
  st.ptrs.resize(static_cast<std::size_t>(H));
  for (int y = 0; y < H; ++y) st.ptrs[static_cast<std::size_t>(y)] = st.rows.data() + rowbytes * y;
  png_read_image(st.png, st.ptrs.data());
  st.w = W;
  st.h = H;
  return true;
}

bool decode_png(const unsigned char* p, std::size_t n, Image8& out, std::string& why) {
  PngRead src{p, n};
  PngState st;
  st.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_fail, png_warn);
  if (!st.png) throw Error("libpng: could not create a read struct");
  st.info = png_create_info_struct(st.png);
  if (!st.info) throw Error("libpng: could not create an info struct");
  if (!png_decode_into(st, src, why)) return false;
  out.w = st.w;
  out.h = st.h;
  const std::size_t px = static_cast<std::size_t>(st.w) * st.h;
  out.px.resize(px * 3);
  const unsigned char* s = st.rows.data();
  unsigned char* d = out.px.data();
  switch (st.channels) {
    case 1:  // grey
    case 2:  // grey + alpha: the alpha is dropped
      for (std::size_t i = 0; i < px; ++i) d[3 * i] = d[3 * i + 1] = d[3 * i + 2] = s[i * st.channels];
      break;
    case 3: std::memcpy(d, s, px * 3); break;
    default:  // RGBA: the alpha is dropped
      for (std::size_t i = 0; i < px; ++i) std::memcpy(d + 3 * i, s + 4 * i, 3);
  }
  return true;
}

}  // namespace

ImageFormat sniff_image(const unsigned char* p, std::size_t n) {
  static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(p, png_sig, 8) == 0) return ImageFormat::png;
  if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return ImageFormat::jpeg;
  return ImageFormat::unknown;
}

ImageFormat image_format_of_name(const std::string& path) {
  std::string e = std::filesystem::path(path).extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (e == ".jpg" || e == ".jpeg") return ImageFormat::jpeg;
  if (e == ".png") return ImageFormat::png;
  return ImageFormat::unknown;
}

bool read_file(const std::string& path, std::vector<unsigned char>& out, std::string& why) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    why = "cannot be opened";
    return false;
  }
  const auto end = in.tellg();
  if (end <= 0) {
    why = end == 0 ? "is empty" : "cannot be read";
    return false;
  }
  out.resize(static_cast<std::size_t>(end));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()))) {
    why = "cannot be read";
    return false;
  }
  return true;
}

bool decode_image(const unsigned char* p, std::size_t n, Image8& out, std::string& why) {
  switch (sniff_image(p, n)) {
    case ImageFormat::png: return decode_png(p, n, out, why);
    case ImageFormat::jpeg: return decode_jpeg(p, n, out, why);
    default: break;
  }
  why = "is neither a JPEG nor a PNG (its first bytes are neither's signature)";
  return false;
}

bool jpeg_header(const unsigned char* p, std::size_t n, std::string& why) {
  if (sniff_image(p, n) != ImageFormat::jpeg) {
    why = "is not a JPEG";
    return false;
  }
  thread_local std::unique_ptr<TjHandle> handle;
  handle = std::make_unique<TjHandle>();  // fresh each time: a failed header can spoil a handle (decode_jpeg)
  int W = 0, H = 0, sub = 0, cs = 0;
  if (tjDecompressHeader3(handle->h, const_cast<unsigned char*>(p), n, &W, &H, &sub, &cs) != 0 || W <= 0 || H <= 0) {
    why = fmt::format("is not a JPEG ({})", tjGetErrorStr2(handle->h));
    return false;
  }
  return plausible_size(W, H, n, why);
}

}  // namespace stepbench
