// What the op tests stand on: the host conversions between fp32 and the 16-bit types, channel-slice
// views, the backend registry and the enum name tables, and the cpu backend's refusals and casts.
#include <cmath>
#include <limits>
#include <string>

#include "support/test_util.hpp"

namespace stepbench {
namespace {

using test::random_vec;

// Host conversions (what tests and host batches use), against known bit patterns and exhaustively.
TEST(Tensor, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);                          // rounds past the largest half: infinity
  EXPECT_EQ(float_to_f16(-std::ldexp(1.0f, -24)), 0x8001);            // the smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);             // a tie below it goes to even (zero)
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: to even
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to even (up)
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  EXPECT_EQ(f16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<std::uint16_t>(h);
    if (!((u & 0x7c00) == 0x7c00 && (u & 0x3ff))) {
      ASSERT_EQ(float_to_f16(f16_to_float(u)), u) << std::hex << h;
    }
    if (!((u & 0x7f80) == 0x7f80 && (u & 0x7f))) {
      ASSERT_EQ(float_to_bf16(bf16_to_float(u)), u) << std::hex << h;
    }
  }
  // halfway between two neighbours rounds to the even one, everywhere in the normal range
  for (std::uint16_t u = 0x0400; u < 0x7bff; u = static_cast<std::uint16_t>(u + 97)) {
    const float mid = 0.5f * (f16_to_float(u) + f16_to_float(static_cast<std::uint16_t>(u + 1)));
    EXPECT_EQ(float_to_f16(mid), (u & 1) ? u + 1 : u) << std::hex << u;
  }
}

// --precision tf32 means tensor-op math on the backend, wherever a backend is made from the
// configuration (the benchmark's towers and `stepbench check` both go through BackendOptions).
TEST(Registry, PrecisionTf32TurnsTensorMathOn) {
  BackendOptions o;
  o.kind = BackendKind::cpu;
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16}) {
    o.precision = p;
    EXPECT_EQ(make_backend(o)->tensor_math(), p == Precision::tf32) << to_string(p);
  }
  EXPECT_EQ(storage_dtype(Precision::tf32), DType::f32);
  EXPECT_EQ(storage_dtype(Precision::bf16), DType::bf16);
}

TEST(Registry, PrecisionTf32TurnsTensorMathOnOnTheGpu) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  BackendOptions o = test::gpu_options();
  o.precision = Precision::tf32;
  auto gpu = make_backend(o);
  EXPECT_TRUE(gpu->tensor_math());
  EXPECT_EQ(gpu->versions().at("tf32"), "on");
  o.precision = Precision::fp32;
  EXPECT_EQ(make_backend(o)->versions().at("tf32"), "off");
}

// Every enum's name table round-trips, and an unknown name is a UsageError naming the choices.
TEST(Names, EveryTableRoundTripsAndRejectsUnknownNames) {
  auto round_trip = [](auto e) {
    using E = decltype(e);
    for (const auto& n : names_of<E>()) EXPECT_EQ(to_string(parse_enum<E>(n, "x")), n);
  };
  round_trip(DType{});
  round_trip(Layout{});
  round_trip(Precision{});
  round_trip(BackendKind{});
  round_trip(OptimizerKind{});
  round_trip(FilterFormat{});
  EXPECT_EQ(parse_enum<DType>("float16", "precision"), DType::f16);  // an alias
  try {
    parse_enum<Precision>("fp64", "precision");
    ADD_FAILURE() << "fp64 parsed";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "unknown precision 'fp64': use fp32, tf32, bf16 or fp16");
  }
}

TEST(Backend, UnknownNamesAreUsageErrors) {
  EXPECT_THROW(parse_enum<BackendKind>("tpu", "backend"), UsageError);
  EXPECT_THROW(parse_enum<Layout>("nwhc", "layout"), UsageError);
  EXPECT_THROW(parse_enum<DType>("fp8", "precision"), UsageError);
  EXPECT_THROW(parse_enum<OptimizerKind>("adam", "optimizer"), UsageError);
}

// bf16 where oneDNN's ISA has native bf16 (AVX512_BF16 or AMX), else refused naming the ISA found
// (ctest isa_avx2.ops runs this under ONEDNN_MAX_CPU_ISA=AVX2: the refusal on an AVX2 EPYC); fp16
// never.
TEST(Backend, CpuRejectsPrecisionsItCannotRunWithTheReason) {
  auto be = make_cpu_backend();
  EXPECT_NO_THROW(be->require(DType::f32));
  const std::string isa = be->versions().at("cpu_isa");
  const bool native = isa == "avx512_core_bf16" || isa == "avx512_core_amx";
  try {
    be->require(DType::bf16);
    EXPECT_TRUE(native) << "bf16 accepted where oneDNN's ISA is " << isa;
  } catch (const UnsupportedError& e) {
    EXPECT_FALSE(native) << e.what();
    EXPECT_NE(std::string(e.what()).find("native bf16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("finds " + isa + " here"), std::string::npos) << e.what();
  }
  EXPECT_THROW(be->require(DType::f16), UnsupportedError);
  EXPECT_EQ(be->versions().at("bf16"), native ? "native" : "none");
  // The tests' emulation (BackendOptions::emulate_bf16) takes bf16 anywhere, and only where the CPU
  // lacks native bf16 does it replace oneDNN's bf16 convolution and inner product.
  BackendOptions o;
  o.precision = Precision::bf16;
  o.emulate_bf16 = true;
  auto emulating = make_backend(o);
  EXPECT_NO_THROW(emulating->require(DType::bf16));
  EXPECT_THROW(emulating->require(DType::f16), UnsupportedError);
  EXPECT_EQ(emulating->versions().at("bf16"), native ? "native" : "emulated on fp32 (tests only)");
  const auto x = TensorDesc::dense({2, 16, 8, 8}, DType::bf16, Layout::nhwc),
             y = TensorDesc::dense({2, 16, 8, 8}, DType::bf16, Layout::nhwc);
  const std::string algo = emulating->make_conv(x, y, ConvParams{3, 3, 1, 1, 1, 1})->algorithm();
  EXPECT_EQ(algo.rfind("bf16 emulated", 0) == 0, !native) << algo;
}

// The hand-written kernels run the widest of their builds (src/backend/cpu/isa.hpp) that oneDNN's
// effective ISA reaches: ONEDNN_MAX_CPU_ISA=SSE41 (isa_sse41.*) selects the plain x86-64 build,
// AVX2 (isa_avx2.*) the AVX2 one, so each build runs the op tests on an AVX-512 machine.
TEST(Backend, CpuKernelBuildFollowsOnednnsIsa) {
  auto be = make_cpu_backend();
  const auto v = be->versions();
  const std::string isa = v.at("cpu_isa"), kernels = v.at("cpu_kernels");
  if (isa.rfind("isa#", 0) == 0) GTEST_SKIP() << "oneDNN's ISA " << isa << " has no name in the backend yet";
  std::string want = isa.rfind("avx512_core", 0) == 0 ? "avx512" : isa.rfind("avx2", 0) == 0 ? "avx2" : "x86-64";
  if (v.at("cpu_kernel_builds") == "x86-64") want = "x86-64";  // one plain build (not GCC on x86-64)
  EXPECT_EQ(kernels, want) << "oneDNN's effective ISA " << isa;
}

TEST(Backend, CpuCastsEveryStorageType) {
  auto be = make_cpu_backend();
  const auto v = random_vec(70000, 29, -70000, 70000);  // more than one chunk, beyond fp16's range too
  const std::vector<float> f(v.begin(), v.end());
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> dev(f.size()), host(f.size());
    be->cast(be->default_stream(), f.data(), DType::f32, dev.data(), t, f.size());
    convert(f.data(), DType::f32, host.data(), t, f.size());
    EXPECT_EQ(dev, host) << to_string(t);
    std::vector<float> back(f.size());
    be->cast(be->default_stream(), dev.data(), t, back.data(), DType::f32, f.size());
    // round to nearest: within half a unit in the last place; fp16 overflows to inf from 65520 on
    // (65504 and half its spacing of 32), and its subnormals are spaced 2^-24 apart
    std::size_t bad = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      const double x = f[i], got = back[i];
      if (t == DType::f16 && std::abs(x) >= 65520)
        bad += !(std::isinf(got) && (got > 0) == (x > 0));
      else
        bad += !(std::abs(got - x) <= std::max(test::unit_roundoff(t) * std::abs(x), 0x1p-25));
    }
    EXPECT_EQ(bad, 0u) << to_string(t);
  }
}

TEST(Tensor, ChannelSliceKeepsStridesAndShiftsBase) {
  float buf[2 * 6 * 2 * 2];
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    Tensor t{buf, TensorDesc::dense({2, 6, 2, 2}, DType::f32, l)};
    Tensor s = t.channel_slice(2, 3);
    EXPECT_EQ(s.shape().c, 3);
    EXPECT_EQ(s.desc.strides, t.desc.strides);
    EXPECT_FALSE(s.desc.is_dense());
    EXPECT_EQ(s.as<float>(), buf + 2 * t.desc.strides.c);
    EXPECT_THROW(t.channel_slice(4, 3), Error);
  }
}

}  // namespace
}  // namespace stepbench
