// Weight files (safetensors, with torchvision's state_dict names) and .npy arrays.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace stepbench {

struct HostArray {
  std::string dtype;  // safetensors names: "F32", "I64", "I32"
  std::vector<std::int64_t> shape;
  std::vector<char> bytes;
  std::int64_t numel() const;
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  static HostArray f32(std::vector<std::int64_t> shape, const float* data);
};
using TensorMap = std::map<std::string, HostArray>;

// Errors (missing file, bad header, truncated data) throw Error naming the file and what is wrong.
TensorMap read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const TensorMap& tensors);
HostArray read_npy(const std::string& path);  // little-endian f4/f8/i4/i8, C order

// Parameters and BN buffers under torchvision's names, filters in O,I,KH,KW. A missing, extra,
// mis-typed or mis-shaped tensor is an Error naming it; num_batches_tracked may be present or not.
TensorMap export_weights(const Graph& g);
void import_weights(Graph& g, const TensorMap& tensors);
// Gradients of the trainable parameters under the parameters' names.
TensorMap export_gradients(const Graph& g);

}  // namespace stepbench
