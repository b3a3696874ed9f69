// The hand-written kernels, built once per x86 instruction set and picked at run time.
//
// The project compiles for plain x86-64 (SSE2), so that one binary runs on every machine; GCC then
// vectorises the kernels' loops 4 floats (2 doubles) wide. batch_norm.cpp, pool.cpp,
// elementwise.cpp, add_relu.cpp and optimizer.cpp are therefore compiled three times (CMakeLists.txt): as
// themselves, and through generated files that define STEPBENCH_CPU_ISA as avx2 or avx512 first.
// Each file's code between STEPBENCH_CPU_ISA_BEGIN and STEPBENCH_CPU_ISA_END is compiled for that
// set (GCC's target pragma) in a namespace of its own: isa_base, isa_avx2, isa_avx512. The
// functions of common.hpp in stepbench::cpu (isa.cpp) call the widest build that both the CPU and
// oneDNN's effective ISA allow (so ONEDNN_MAX_CPU_ISA=AVX2 or SSE41 selects the narrower builds too).
//
// Everything a kernel file includes comes before BEGIN: the inline functions and templates of
// headers (std, fmt, the project's) stay plain x86-64 code in every build, so whichever copy of one
// the linker keeps runs on any CPU. Templates that run a kernel's loops must be defined inside the
// region (loops.hpp): a template is compiled for the target in force where it is defined, and an
// avx512 lambda cannot be inlined into a plain one. tests/ci/check_isa_objects.sh checks both
// halves on the built objects.
#pragma once
#include <string_view>

#if !defined(STEPBENCH_CPU_ISA)
#define STEPBENCH_CPU_ISA base
#endif
#define STEPBENCH_CPU_ISA_CAT2(a, b) a##b
#define STEPBENCH_CPU_ISA_CAT(a, b) STEPBENCH_CPU_ISA_CAT2(a, b)
#define STEPBENCH_CPU_ISA_NS STEPBENCH_CPU_ISA_CAT(isa_, STEPBENCH_CPU_ISA)

#define STEPBENCH_CPU_ISA_base 0
#define STEPBENCH_CPU_ISA_avx2 1
#define STEPBENCH_CPU_ISA_avx512 2
#define STEPBENCH_CPU_ISA_LEVEL STEPBENCH_CPU_ISA_CAT(STEPBENCH_CPU_ISA_, STEPBENCH_CPU_ISA)

// GCC only: clang (clang-tidy reads these files) compiles the region for plain x86-64.
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__)) && \
    STEPBENCH_CPU_ISA_LEVEL == 2
#define STEPBENCH_CPU_ISA_PRAGMAS \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512vl,avx512bw,avx512dq,avx2\")")
#define STEPBENCH_CPU_ISA_POP _Pragma("GCC pop_options")
#elif defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__)) && \
    STEPBENCH_CPU_ISA_LEVEL == 1
#define STEPBENCH_CPU_ISA_PRAGMAS _Pragma("GCC push_options") _Pragma("GCC target(\"avx2\")")
#define STEPBENCH_CPU_ISA_POP _Pragma("GCC pop_options")
#else
#define STEPBENCH_CPU_ISA_PRAGMAS
#define STEPBENCH_CPU_ISA_POP
#endif

// The region: a kernel file puts its code, after all its includes, between these two, in namespace
// stepbench::cpu::STEPBENCH_CPU_ISA_NS.
#define STEPBENCH_CPU_ISA_BEGIN STEPBENCH_CPU_ISA_PRAGMAS
#define STEPBENCH_CPU_ISA_END STEPBENCH_CPU_ISA_POP

namespace stepbench::cpu {

enum class KernelIsa { base, avx2, avx512 };

// The build of the kernels in use: the widest this CPU supports (AVX-512 needs F, BW, VL and DQ)
// that oneDNN's effective ISA also reaches. Decided once per process.
KernelIsa kernel_isa();
std::string_view to_string(KernelIsa isa);
// The builds this binary has: "x86-64 avx2 avx512" (GCC on x86-64), else "x86-64".
std::string_view kernel_builds();

}  // namespace stepbench::cpu
