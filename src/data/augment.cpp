#include "data/augment.hpp"

#include <algorithm>
#include <cmath>

#include "data/data.hpp"
#include "data/random.hpp"

namespace stepbench {

namespace {

// One axis of the resize: R outputs from L inputs, output i at position i + off of a virtual
// length Lv (the centred window of the scaled axis). A triangle filter as wide as the scale when
// shrinking (antialiased, like PIL's and torchvision's bilinear resize), bilinear when growing.
struct Taps {
  int n = 0;  // the most taps of any output (the stride of w)
  std::vector<int> start, count;
  std::vector<float> w;  // R x n; count[i] of them used by output i
};
Taps make_taps(int L, int Lv, int off, int R) {
  const double scale = static_cast<double>(L) / Lv;
  const double support = std::max(1.0, scale);
  Taps t;
  t.n = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.start.resize(static_cast<std::size_t>(R));
  t.count.resize(static_cast<std::size_t>(R));
  t.w.assign(static_cast<std::size_t>(R) * t.n, 0.0f);
  for (int i = 0; i < R; ++i) {
    const double c = (i + off + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(std::floor(c - support)));
    const int hi = std::min(L, static_cast<int>(std::ceil(c + support)));
    float* w = t.w.data() + static_cast<std::size_t>(i) * t.n;
    double sum = 0;
    for (int j = lo; j < hi && j - lo < t.n; ++j) {
      const double x = std::abs((j + 0.5 - c) / support);
      w[j - lo] = static_cast<float>(x < 1 ? 1 - x : 0);
      sum += w[j - lo];
    }
    if (sum <= 0) {  // cannot happen for L >= 1, but never divide by zero
      w[0] = 1;
      sum = 1;
    }
    // zero weights at either end (the triangle's feet) are left out
    int first = 0, last = std::max(0, std::min(hi - lo, t.n) - 1);
    while (first < last && w[first] == 0) ++first;
    while (last > first && w[last] == 0) --last;
    t.start[static_cast<std::size_t>(i)] = lo + first;
    t.count[static_cast<std::size_t>(i)] = last - first + 1;
    for (int k = first; k <= last; ++k) w[k - first] = static_cast<float>(w[k] / sum);
    for (int k = last - first + 1; k < t.n; ++k) w[k] = 0;
  }
  return t;
}

}  // namespace

int default_store_size(std::int64_t image_size) {
  return static_cast<int>(std::lround(static_cast<double>(image_size) * 8.0 / 7.0));
}

void resize_to_store(const Image8& in, int R, std::vector<unsigned char>& out) {
  const int W = in.w, H = in.h;
  const double s = static_cast<double>(R) / std::min(W, H);
  const int Wv = std::max(R, static_cast<int>(std::lround(W * s)));
  const int Hv = std::max(R, static_cast<int>(std::lround(H * s)));
  const Taps tx = make_taps(W, Wv, (Wv - R) / 2, R);
  const Taps ty = make_taps(H, Hv, (Hv - R) / 2, R);
  // the input rows the outputs read
  const int y_lo = ty.start.front();
  int y_hi = 0;
  for (int i = 0; i < R; ++i)
    y_hi = std::max(y_hi, ty.start[static_cast<std::size_t>(i)] + ty.count[static_cast<std::size_t>(i)]);
  thread_local std::vector<float> tmp, row;
  tmp.resize(static_cast<std::size_t>(y_hi - y_lo) * R * 3);
  row.resize(static_cast<std::size_t>(W) * 3);
  for (int y = y_lo; y < y_hi; ++y) {  // horizontal, from the row converted to float once
    const unsigned char* src = in.px.data() + static_cast<std::size_t>(y) * W * 3;
    for (std::size_t i = 0; i < row.size(); ++i) row[i] = src[i];
    float* t = tmp.data() + static_cast<std::size_t>(y - y_lo) * R * 3;
    for (int x = 0; x < R; ++x) {
      const int j0 = tx.start[static_cast<std::size_t>(x)];
      const float* w = tx.w.data() + static_cast<std::size_t>(x) * tx.n;
      const int n = tx.count[static_cast<std::size_t>(x)];
      float a0 = 0, a1 = 0, a2 = 0;
      for (int k = 0; k < n; ++k) {
        const float* p = row.data() + static_cast<std::size_t>(j0 + k) * 3;
        a0 += w[k] * p[0];
        a1 += w[k] * p[1];
        a2 += w[k] * p[2];
      }
      t[x * 3] = a0;
      t[x * 3 + 1] = a1;
      t[x * 3 + 2] = a2;
    }
  }
  out.resize(static_cast<std::size_t>(R) * R * 3);
  std::vector<float> acc(static_cast<std::size_t>(R) * 3);
  for (int y = 0; y < R; ++y) {  // vertical, rounded to 8 bits
    const int j0 = ty.start[static_cast<std::size_t>(y)];
    const float* w = ty.w.data() + static_cast<std::size_t>(y) * ty.n;
    const int n = ty.count[static_cast<std::size_t>(y)];
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < n; ++k) {
      const float* t = tmp.data() + static_cast<std::size_t>(j0 + k - y_lo) * R * 3;
      const float wk = w[k];
      for (int i = 0; i < R * 3; ++i) acc[static_cast<std::size_t>(i)] += wk * t[i];
    }
    unsigned char* o = out.data() + static_cast<std::size_t>(y) * R * 3;
    for (int i = 0; i < R * 3; ++i)
      o[i] = static_cast<unsigned char>(std::clamp(acc[static_cast<std::size_t>(i)] + 0.5f, 0.0f, 255.0f));
  }
}

CropBox random_crop_box(int R, const PipelineOptions& o, std::uint64_t rng_state) {
  std::uint64_t s = rng_state;
  const int W = R, H = R;
  const double area = static_cast<double>(W) * H;
  CropBox b{0, 0, W, H, false};
  bool found = false;
  for (int t = 0; t < 10 && !found; ++t) {
    const double a = area * (o.scale_min + (o.scale_max - o.scale_min) * uniform(s));
    const double lr = std::log(o.ratio_min) + (std::log(o.ratio_max) - std::log(o.ratio_min)) * uniform(s);
    const double r = std::exp(lr);
    const int w = static_cast<int>(std::lround(std::sqrt(a * r))), h = static_cast<int>(std::lround(std::sqrt(a / r)));
    if (w > 0 && h > 0 && w <= W && h <= H) {
      b.w = w;
      b.h = h;
      b.x = static_cast<int>(uniform(s) * (W - w + 1));
      b.y = static_cast<int>(uniform(s) * (H - h + 1));
      found = true;
    }
  }
  if (!found) {  // centre crop clamped to the ratio range (a square always is within it)
    b.x = (W - b.w) / 2;
    b.y = (H - b.h) / 2;
  }
  b.flip = uniform(s) < 0.5;
  return b;
}

void crop_resize(const unsigned char* src, int R, const CropBox& b, int S, float* out) {
  // bilinear, sampling at pixel centres (align_corners = false); the columns' taps once per image
  thread_local std::vector<std::size_t> c0, c1;
  thread_local std::vector<float> wxs;
  c0.resize(static_cast<std::size_t>(S));
  c1.resize(static_cast<std::size_t>(S));
  wxs.resize(static_cast<std::size_t>(S));
  for (int x = 0; x < S; ++x) {
    const double sx = std::clamp((x + 0.5) * b.w / S - 0.5, 0.0, b.w - 1.0);
    const int x0 = static_cast<int>(sx), x1 = std::min(x0 + 1, b.w - 1);
    wxs[static_cast<std::size_t>(x)] = static_cast<float>(sx - x0);
    c0[static_cast<std::size_t>(x)] = static_cast<std::size_t>(b.x + x0) * 3;
    c1[static_cast<std::size_t>(x)] = static_cast<std::size_t>(b.x + x1) * 3;
  }
  for (int y = 0; y < S; ++y) {
    const double sy = std::clamp((y + 0.5) * b.h / S - 0.5, 0.0, b.h - 1.0);
    const int y0 = static_cast<int>(sy), y1 = std::min(y0 + 1, b.h - 1);
    const float wy = static_cast<float>(sy - y0);
    const unsigned char* r0 = src + static_cast<std::size_t>(b.y + y0) * R * 3;
    const unsigned char* r1 = src + static_cast<std::size_t>(b.y + y1) * R * 3;
    float* o = out + static_cast<std::size_t>(y) * S * 3;
    for (int x = 0; x < S; ++x) {
      const std::size_t a = c0[static_cast<std::size_t>(x)], c = c1[static_cast<std::size_t>(x)];
      const float wx = wxs[static_cast<std::size_t>(x)];
      for (int k = 0; k < 3; ++k) {
        const float top = r0[a + k] + wx * (r0[c + k] - r0[a + k]);
        const float bot = r1[a + k] + wx * (r1[c + k] - r1[a + k]);
        o[x * 3 + k] = top + wy * (bot - top);
      }
    }
  }
}

void flip_normalise(const float* in, int S, bool flip, Layout layout, const PipelineOptions& o, float* dst) {
  float scale[3], shift[3];
  for (int k = 0; k < 3; ++k) {
    scale[k] = 1.0f / (255.0f * o.stddev[k]);
    shift[k] = -o.mean[k] / o.stddev[k];
  }
  const std::size_t plane = static_cast<std::size_t>(S) * S;
  for (int y = 0; y < S; ++y) {
    const float* row = in + static_cast<std::size_t>(y) * S * 3;
    if (layout == Layout::nhwc) {
      float* d = dst + static_cast<std::size_t>(y) * S * 3;
      for (int x = 0; x < S; ++x) {
        const int xo = flip ? S - 1 - x : x;
        for (int k = 0; k < 3; ++k) d[xo * 3 + k] = row[x * 3 + k] * scale[k] + shift[k];
      }
    } else {
      for (int k = 0; k < 3; ++k) {
        float* d = dst + k * plane + static_cast<std::size_t>(y) * S;
        for (int x = 0; x < S; ++x) d[flip ? S - 1 - x : x] = row[x * 3 + k] * scale[k] + shift[k];
      }
    }
  }
}

bool decode_crop_normalise(const std::string& path, float* dst, const PipelineOptions& o, std::uint64_t rng_state,
                           std::string& why) {
  thread_local std::vector<unsigned char> file, stored;
  thread_local Image8 img;
  thread_local std::vector<float> crop;
  if (!read_file(path, file, why) || !decode_image(file.data(), file.size(), img, why)) return false;
  const int R = o.store_size > 0 ? o.store_size : default_store_size(o.image_size);
  const int S = static_cast<int>(o.image_size);
  resize_to_store(img, R, stored);
  const CropBox b = random_crop_box(R, o, rng_state);
  crop.resize(static_cast<std::size_t>(S) * S * 3);
  crop_resize(stored.data(), R, b, S, crop.data());
  flip_normalise(crop.data(), S, b.flip, o.layout, o, dst);
  return true;
}

}  // namespace stepbench
