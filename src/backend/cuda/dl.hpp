// Libraries the cuda backend loads at run time (NVML, CUPTI, nvJPEG: nvml.cpp, cupti.cpp,
// image_decode.cpp): a symbol into a typed function pointer, nullptr where the library lacks it.
#pragma once
#include <dlfcn.h>

namespace stepbench::cuda {

template <class F>
void resolve(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace stepbench::cuda
