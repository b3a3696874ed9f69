#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/io.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {
std::size_t dtype_bytes(const std::string& dt) {
  if (dt == "F32" || dt == "I32") return 4;
  if (dt == "F64" || dt == "I64") return 8;
  if (dt == "F16" || dt == "BF16" || dt == "I16") return 2;
  if (dt == "U8" || dt == "I8" || dt == "BOOL") return 1;
  return 0;
}
std::string shape_str(const std::vector<std::int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The bytes of `shape` in elements of `elem` bytes, checked: no negative dimension, and no product
// above `limit` (what the file holds), so a corrupt shape can neither overflow nor make a huge
// allocation.
std::uint64_t checked_bytes(const std::vector<std::int64_t>& shape, std::uint64_t elem, std::uint64_t limit) {
  std::uint64_t n = elem;
  for (auto d : shape) {
    if (d < 0) throw Error(fmt::format("shape {} has a negative dimension", shape_str(shape)));
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > limit / u)
      throw Error(fmt::format("shape {} needs more bytes than the file holds ({})", shape_str(shape), limit));
    n *= u;  // a zero dimension makes every later check pass and the product 0
  }
  return n;
}
}  // namespace

std::int64_t HostArray::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

HostArray HostArray::f32(std::vector<std::int64_t> shape, const float* data) {
  HostArray a{"F32", std::move(shape), {}};
  a.bytes.resize(static_cast<std::size_t>(a.numel()) * 4);
  std::memcpy(a.bytes.data(), data, a.bytes.size());
  return a;
}

TensorMap read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot open weights file '{}'", path));
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(f.tellg());
  f.seekg(0);
  std::uint64_t header_len = 0;
  if (size < 8 || !f.read(reinterpret_cast<char*>(&header_len), 8) || header_len > size - 8)
    throw Error(fmt::format("'{}' is not a safetensors file (bad header length)", path));
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    throw Error(fmt::format("'{}' is not a safetensors file: its header is not JSON ({})", path, e.what()));
  }
  const std::uint64_t data_size = size - 8 - header_len;
  std::vector<char> data(data_size);
  f.read(data.data(), static_cast<std::streamsize>(data_size));
  TensorMap out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    try {
      HostArray a;
      a.dtype = it->at("dtype").get<std::string>();
      a.shape = it->at("shape").get<std::vector<std::int64_t>>();
      const auto off = it->at("data_offsets").get<std::vector<std::uint64_t>>();
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_size) throw Error("data offsets outside the file");
      if (dtype_bytes(a.dtype) == 0) throw Error(fmt::format("unknown dtype {}", a.dtype));
      if (checked_bytes(a.shape, dtype_bytes(a.dtype), data_size) != off[1] - off[0])
        throw Error(fmt::format("{} bytes for shape {} of {}", off[1] - off[0], shape_str(a.shape), a.dtype));
      a.bytes.assign(data.begin() + static_cast<std::ptrdiff_t>(off[0]),
                     data.begin() + static_cast<std::ptrdiff_t>(off[1]));
      out.emplace(it.key(), std::move(a));
    } catch (const std::exception& e) {
      throw Error(fmt::format("'{}': tensor '{}' is corrupt: {}", path, it.key(), e.what()));
    }
  }
  return out;
}

void write_safetensors(const std::string& path, const TensorMap& tensors) {
  nlohmann::json j = nlohmann::json::object();
  std::uint64_t off = 0;
  for (const auto& [name, a] : tensors) {
    j[name] = {{"dtype", a.dtype}, {"shape", a.shape}, {"data_offsets", {off, off + a.bytes.size()}}};
    off += a.bytes.size();
  }
  j["__metadata__"] = {{"format", "pt"}, {"producer", "stepbench"}};
  std::string header = j.dump();
  while (header.size() % 8) header.push_back(' ');
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot write '{}'", path));
  const std::uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& [name, a] : tensors) f.write(a.bytes.data(), static_cast<std::streamsize>(a.bytes.size()));
  if (!f) throw Error(fmt::format("error writing '{}'", path));
}

namespace {
std::vector<float> download(const Graph& g, const float* p, std::size_t n) {
  std::vector<float> h(n);
  Backend& be = g.backend();
  be.copy(be.default_stream(), h.data(), p, n * sizeof(float));
  be.synchronize(be.default_stream());
  return h;
}
HostArray to_host(const ParamEntry& e, const std::vector<float>& stored) {
  std::vector<float> logical(e.numel());
  filter_from_storage(stored.data(), logical.data(), e);
  return HostArray::f32(e.shape, logical.data());
}
}  // namespace

TensorMap export_weights(const Graph& g) {
  TensorMap out;
  for (const auto& e : g.params()) out.emplace(e.name, to_host(e, download(g, g.data_of(e), e.count)));
  return out;
}

TensorMap export_gradients(const Graph& g) {
  TensorMap out;
  for (const auto& e : g.params())
    if (e.trainable) out.emplace(e.name, to_host(e, download(g, g.grad_of(e), e.count)));
  return out;
}

void import_weights(Graph& g, const TensorMap& tensors) {
  Backend& be = g.backend();
  std::set<std::string> used;
  std::vector<float> stored;
  for (const auto& e : g.params()) {
    auto it = tensors.find(e.name);
    if (it == tensors.end()) throw Error(fmt::format("weights: tensor '{}' is missing", e.name));
    const HostArray& a = it->second;
    if (a.dtype != "F32") throw Error(fmt::format("weights: tensor '{}' is {}, expected F32", e.name, a.dtype));
    if (a.shape != e.shape)
      throw Error(fmt::format("weights: tensor '{}' has shape {}, expected {}", e.name, shape_str(a.shape),
                              shape_str(e.shape)));
    stored.resize(e.count);
    filter_to_storage(a.as<float>(), stored.data(), e);
    be.copy(be.default_stream(), g.data_of(e), stored.data(), e.count * sizeof(float));
    used.insert(e.name);
  }
  be.synchronize(be.default_stream());
  for (const auto& [name, a] : tensors) {
    if (used.count(name)) continue;
    const bool counter = name.size() > 20 && name.compare(name.size() - 20, 20, ".num_batches_tracked") == 0;
    if (!counter) throw Error(fmt::format("weights: unexpected tensor '{}' (not part of this model)", name));
  }
}

// ---- npy -----------------------------------------------------------------------------------------
HostArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("cannot open '{}'", path));
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(f.tellg());
  f.seekg(0);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw Error(fmt::format("'{}' is not a .npy file", path));
  std::uint32_t hlen = 0;
  if (magic[6] == 1) {
    std::uint16_t h16 = 0;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  if (!f || hlen > size) throw Error(fmt::format("'{}': truncated .npy header", path));
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) throw Error(fmt::format("'{}': truncated .npy header", path));
  auto field = [&](const std::string& key) {
    const auto k = header.find("'" + key + "'");
    if (k == std::string::npos) throw Error(fmt::format("'{}': .npy header has no {}", path, key));
    return header.substr(header.find(':', k) + 1);
  };
  const std::string descr_part = field("descr");
  const auto q1 = descr_part.find('\''), q2 = descr_part.find('\'', q1 + 1);
  const std::string descr = descr_part.substr(q1 + 1, q2 - q1 - 1);
  if (field("fortran_order").find("True") < field("fortran_order").find(','))
    throw Error(fmt::format("'{}': Fortran-ordered arrays are not supported; save with np.ascontiguousarray", path));
  const std::string shape_part = field("shape");
  HostArray a;
  std::string num;
  const auto open = shape_part.find('('), close = shape_part.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open)
    throw Error(fmt::format("'{}': .npy header's shape is not a tuple", path));
  auto push = [&] {
    if (num.size() > 18) throw Error(fmt::format("'{}': .npy dimension {} is too large", path, num));
    a.shape.push_back(std::stoll(num));
    num.clear();
  };
  for (char c : shape_part.substr(open + 1, close - open - 1)) {
    if (std::isdigit(static_cast<unsigned char>(c)))
      num += c;
    else if (c == ',' || c == ' ' || c == 'L')  // 'L': Python 2's long suffix
      (num.empty() ? void() : push());
    else
      throw Error(fmt::format("'{}': .npy header's shape has '{}'", path, c));
  }
  if (!num.empty()) push();
  if (descr == "<f4")
    a.dtype = "F32";
  else if (descr == "<f8")
    a.dtype = "F64";
  else if (descr == "<i4")
    a.dtype = "I32";
  else if (descr == "<i8")
    a.dtype = "I64";
  else
    throw Error(fmt::format("'{}': unsupported .npy dtype '{}' (use float32 or int64)", path, descr));
  const std::uint64_t start = static_cast<std::uint64_t>(f.tellg()), left = size > start ? size - start : 0;
  std::uint64_t need = 0;
  try {
    need = checked_bytes(a.shape, dtype_bytes(a.dtype), left);
  } catch (const Error& e) {
    throw Error(fmt::format("'{}': truncated .npy data: {}", path, e.what()));
  }
  if (need > left)
    throw Error(fmt::format("'{}': truncated .npy data ({} bytes for shape {}, {} in the file)", path, need,
                            shape_str(a.shape), left));
  a.bytes.resize(need);
  if (!f.read(a.bytes.data(), static_cast<std::streamsize>(a.bytes.size())))
    throw Error(fmt::format("'{}': truncated .npy data", path));
  return a;
}

}  // namespace stepbench
