// RAII owners of backend memory (Buffer, HostBuffer). Included at the end of backend/backend.hpp, so
// that every user of the Backend has them.
#pragma once
#include <cstddef>
#include <utility>

#include "backend/backend.hpp"

namespace stepbench {

// RAII owner of a backend allocation: Buffer (device memory) and HostBuffer (host memory, pinned on
// the cuda backend, so copies to the device are asynchronous and run at full speed).
template <void* (Backend::*Allocate)(std::size_t), void (Backend::*Free)(void*)>
class OwnedMemory {
 public:
  OwnedMemory() = default;
  OwnedMemory(Backend& be, std::size_t bytes) : be_(&be), bytes_(bytes), p_(bytes ? (be.*Allocate)(bytes) : nullptr) {}
  OwnedMemory(OwnedMemory&& o) noexcept { *this = std::move(o); }
  OwnedMemory& operator=(OwnedMemory&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_;
      bytes_ = o.bytes_;
      p_ = o.p_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~OwnedMemory() { reset(); }
  void reset() {
    if (p_) (be_->*Free)(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  Backend* be_ = nullptr;
  std::size_t bytes_ = 0;
  void* p_ = nullptr;
};
using Buffer = OwnedMemory<&Backend::allocate, &Backend::deallocate>;
using HostBuffer = OwnedMemory<&Backend::allocate_host, &Backend::deallocate_host>;

}  // namespace stepbench
