// The readers of untrusted files (safetensors, .npy) against damaged inputs: every truncation,
// every single-bit flip of the header, and hand-made hostile headers (huge, negative and
// overflowing dimensions, offsets past the end or wrapping, lengths larger than the file). Each
// must end in an Error or a correct read: no crash, no hang, no allocation beyond the file's size.
// (Run under the asan preset, a read outside a buffer fails the test too.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "io/io.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("stepbench-io-" + std::to_string(getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string put(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::uint64_t payload(const TensorMap& m) {
  std::uint64_t n = 0;
  for (const auto& [k, a] : m) n += a.bytes.size();
  return n;
}

// Reads with `read`; true when it threw stepbench's Error, false when it read. Any other exception
// fails the test: a reader reports damage as Error with the file's name.
template <class F>
bool rejects(F read, const std::string& what) {
  try {
    read();
    return false;
  } catch (const Error&) {
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw " << typeid(e).name() << " (" << e.what() << "), not Error";
    return true;
  }
}

std::string npy(const std::string& dict, const std::string& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(h.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  return out + h + data;
}

std::string safetensors(const std::string& header, const std::string& data) {
  const std::uint64_t len = header.size();
  return std::string(reinterpret_cast<const char*>(&len), 8) + header + data;
}

TEST(IoMutation, SafetensorsEveryTruncationAndHeaderBitFlip) {
  Scratch s;
  TensorMap m;
  const float w[6] = {1, 2, 3, 4, 5, 6};
  m["a.weight"] = HostArray::f32({2, 3}, w);
  m["b.ids"] = HostArray{"I64", {2}, std::vector<char>(16, 1)};
  const std::string good = s.dir / "good.safetensors";
  write_safetensors(good, m);
  const std::string bytes = slurp(good);
  ASSERT_EQ(read_safetensors(good).size(), 2u);
  int rejected = 0;
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    const std::string p = s.put("t.safetensors", bytes.substr(0, len));
    rejected += rejects([&] { read_safetensors(p); }, fmt::format("truncated to {}", len));
  }
  EXPECT_EQ(rejected, static_cast<int>(bytes.size()));  // every truncation is damage
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  for (std::size_t i = 0; i < 8 + header_len; ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::string b = bytes;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      const std::string p = s.put("f.safetensors", b);
      try {
        const TensorMap r = read_safetensors(p);
        EXPECT_LE(payload(r), b.size()) << "flip at " << i << ":" << bit;
        for (const auto& [k, a] : r) EXPECT_GE(a.numel(), 0) << k;
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "flip at " << i << ":" << bit << ": " << e.what();
      }
    }
}

TEST(IoMutation, SafetensorsHostileHeaders) {
  Scratch s;
  const std::string data(24, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"huge dims that overflow to the right byte count",
       R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})"},
      {"a negative dimension", R"({"x": {"dtype": "F32", "shape": [-2, -3], "data_offsets": [0, 24]}})"},
      {"offsets past the end", R"({"x": {"dtype": "F32", "shape": [6], "data_offsets": [0, 4000]}})"},
      {"offsets that wrap", R"({"x": {"dtype": "F32", "shape": [6], "data_offsets": [18446744073709551615, 23]}})"},
      {"offsets reversed", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})"},
      {"an unknown dtype", R"({"x": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})"},
      {"a shape that is not a list", R"({"x": {"dtype": "F32", "shape": "6", "data_offsets": [0, 24]}})"},
      {"a tensor that is not an object", R"({"x": 5})"},
      {"no data_offsets", R"({"x": {"dtype": "F32", "shape": [6]}})"},
      {"a header that is not JSON", "{\"x\": [1, 2"},
      {"a name that is not UTF-8", "{\"\xff\xfe\": {\"dtype\": \"F32\", \"shape\": [6], \"data_offsets\": [0, 24]}}"},
  };
  for (const auto& [what, header] : cases) {
    const std::string p = s.put("h.safetensors", safetensors(header, data));
    EXPECT_TRUE(rejects([&] { read_safetensors(p); }, what)) << what;
  }
  // a header length larger than the file, and one that wraps when 8 is added
  for (std::uint64_t len : {std::uint64_t{1} << 40, ~std::uint64_t{0}, ~std::uint64_t{0} - 7}) {
    const std::string p =
        s.put("l.safetensors", std::string(reinterpret_cast<const char*>(&len), 8) + "{}" + std::string(30, ' '));
    EXPECT_TRUE(rejects([&] { read_safetensors(p); }, fmt::format("header length {}", len)));
  }
  // overlapping tensors are legal and read
  const std::string p = s.put(
      "o.safetensors",
      safetensors(
          R"({"a": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
          data));
  EXPECT_EQ(read_safetensors(p).at("b").bytes.size(), 8u);
}

TEST(IoMutation, NpyEveryTruncationHeaderBitFlipAndHostileShapes) {
  Scratch s;
  const std::string data(6 * 4, '\x01');
  const std::string bytes = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data);
  const std::string good = s.put("good.npy", bytes);
  ASSERT_EQ(read_npy(good).shape, (std::vector<std::int64_t>{2, 3}));
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    const std::string p = s.put("t.npy", bytes.substr(0, len));
    EXPECT_TRUE(rejects([&] { read_npy(p); }, fmt::format("truncated to {}", len))) << len;
  }
  for (std::size_t i = 0; i < bytes.size() - data.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::string b = bytes;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      const std::string p = s.put("f.npy", b);
      try {
        const HostArray a = read_npy(p);
        EXPECT_LE(a.bytes.size(), b.size()) << i << ":" << bit;
        EXPECT_EQ(static_cast<std::uint64_t>(a.numel()) * (a.dtype == "F64" || a.dtype == "I64" ? 8 : 4),
                  a.bytes.size())
            << i << ":" << bit;
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "flip at " << i << ":" << bit << ": " << e.what();
      }
    }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a negative dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"},
      {"a huge dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"},
      {"dimensions whose product overflows",
       "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"},
      {"more elements than the file holds", "{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }"},
      {"a shape that is not a tuple", "{'descr': '<f4', 'fortran_order': False, 'shape': 6, }"},
      {"a float16 descr", "{'descr': '<f2', 'fortran_order': False, 'shape': (6,), }"},
      {"Fortran order", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }"},
      {"no descr", "{'fortran_order': False, 'shape': (6,), }"},
  };
  for (const auto& [what, dict] : cases) {
    const std::string p = s.put("h.npy", npy(dict, data));
    EXPECT_TRUE(rejects([&] { read_npy(p); }, what)) << what;
  }
  // version 2 with a 4-byte header length beyond the file
  std::string v2 = std::string("\x93NUMPY\x02\x00", 8);
  const std::uint32_t big = 0xfffffff0u;
  v2.append(reinterpret_cast<const char*>(&big), 4);
  const std::string p = s.put("v2.npy", v2 + "{}");
  EXPECT_TRUE(rejects([&] { read_npy(p); }, "v2 header length 4 GB"));
}

}  // namespace
}  // namespace stepbench
