// The KV cache codecs (formats/kv_codec.h) against the float64 reference rounding of
// formats/minifloat.h: fp8 e4m3 / e5m2, e2m1 and bf16 element encoders over a sweep of float
// bit patterns (every exponent, subnormals, ties) and every code, saturation and NaN; then whole
// slots of each dtype: the layouts' byte counts (DeepSeek-V3's nvfp4 row is 352 bytes), the
// round-trip error bounds of each format, zero rows, Inf and NaN, fixed per-tensor scales.
#include "../random_values.h"
#include "core/dtype.h"
#include "formats/kv_codec.h"
#include "formats/minifloat.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace moet {
namespace {

constexpr MinifloatSpec kE5M2Sat = {5, 2, 15, 57344.0, true};

// The reference byte of x: float64 rounding to the format, then its bit pattern.
uint8_t reference_fp8(float x, Fp8Kind kind) {
  if (kind == Fp8Kind::e4m3) return e4m3_from_double(double(x));
  const double r = minifloat_round(double(x), kE5M2Sat);
  return uint8_t(minifloat_encode(r, kE5M2Sat) | (std::signbit(r) ? 0x80 : 0));
}

// About 2^21 float bit patterns spread over all of them (every exponent, both signs, NaN and Inf
// patterns), each also with its rounding bit for e4m3 set.
std::vector<float> float_sweep() {
  std::vector<float> out;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += (uint64_t(1) << 11) + 7) {
    out.push_back(kv_bits_float(uint32_t(u)));
    out.push_back(kv_bits_float(uint32_t(u) | 0x00080000u));  // a mantissa tie bit pattern nearby
  }
  return out;
}

TEST(KvCodec, Fp8EncodeMatchesTheFloat64ReferenceOnASweep) {
  const std::vector<float> sweep = float_sweep();
  for (Fp8Kind kind : {Fp8Kind::e4m3, Fp8Kind::e5m2}) {
    int64_t checked = 0;
    for (float x : sweep) {
      const uint8_t code = fp8_encode(x, kind);
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(fp8_decode(code, kind))) << x;
        continue;
      }
      ASSERT_EQ(code, reference_fp8(x, kind)) << "kind " << int(kind) << " x " << x << " bits " << kv_float_bits(x);
      ++checked;
    }
    EXPECT_GT(checked, 4000000 / 2);
  }
}

TEST(KvCodec, Fp8TiesRoundToEvenAtEveryScale) {
  for (Fp8Kind kind : {Fp8Kind::e4m3, Fp8Kind::e5m2}) {
    for (int code = 0; code < 0x7e; ++code) {  // midpoints between consecutive finite codes
      const float a = fp8_decode(uint8_t(code), kind), b = fp8_decode(uint8_t(code + 1), kind);
      if (!std::isfinite(b) || b > fp8_max_finite(kind)) break;
      const float mid = (a + b) / 2;  // exact in float
      const uint8_t even = (code % 2 == 0) ? uint8_t(code) : uint8_t(code + 1);
      EXPECT_EQ(fp8_encode(mid, kind), even) << int(kind) << " " << code;
      EXPECT_EQ(fp8_encode(-mid, kind), even | 0x80) << int(kind) << " " << code;
    }
  }
}

TEST(KvCodec, Fp8DecodeMatchesTheReferenceForEveryCode) {
  for (int b = 0; b < 256; ++b) {
    const float e4m3 = fp8_decode(uint8_t(b), Fp8Kind::e4m3);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(e4m3));
    } else {
      EXPECT_EQ(double(e4m3), e4m3_to_double(uint8_t(b))) << b;
      EXPECT_EQ(fp8_encode(e4m3, Fp8Kind::e4m3), uint8_t(b)) << b;
    }
    const float e5m2 = fp8_decode(uint8_t(b), Fp8Kind::e5m2);
    const double reference = minifloat_decode(uint32_t(b & 0x7f), {5, 2, 15, 57344.0, false});
    if (std::isnan(reference)) {
      EXPECT_TRUE(std::isnan(e5m2)) << b;
    } else {
      EXPECT_EQ(double(std::fabs(e5m2)), reference) << b;
      EXPECT_EQ(std::signbit(e5m2), (b & 0x80) != 0) << b;
      if (std::isfinite(reference)) {
        EXPECT_EQ(fp8_encode(e5m2, Fp8Kind::e5m2), uint8_t(b)) << b;
      }
    }
  }
}

TEST(KvCodec, Fp8SaturatesKeepsNaNAndTheSignOfZero) {
  for (Fp8Kind kind : {Fp8Kind::e4m3, Fp8Kind::e5m2}) {
    const float max = fp8_max_finite(kind);
    EXPECT_EQ(fp8_decode(fp8_encode(INFINITY, kind), kind), max);
    EXPECT_EQ(fp8_decode(fp8_encode(-INFINITY, kind), kind), -max);
    EXPECT_EQ(fp8_decode(fp8_encode(3e38f, kind), kind), max);
    EXPECT_EQ(fp8_decode(fp8_encode(max * 1.01f, kind), kind), max);
    EXPECT_TRUE(std::isnan(fp8_decode(fp8_encode(NAN, kind), kind)));
    EXPECT_EQ(fp8_encode(-0.0f, kind), 0x80);
    EXPECT_EQ(fp8_encode(std::numeric_limits<float>::denorm_min(), kind), 0x00);
  }
}

TEST(KvCodec, E2m1AndBf16MatchTheirReferences) {
  for (float x : float_sweep()) {
    if (!std::isnan(x)) {
      ASSERT_EQ(e2m1_encode(x), e2m1_from_double(double(x))) << x;
    }
    ASSERT_EQ(kv_bf16_encode(x), float_to_bf16(x)) << x;
  }
  for (int n = 0; n < 16; ++n) EXPECT_EQ(double(e2m1_decode(uint8_t(n))), e2m1_to_double(uint8_t(n))) << n;
  EXPECT_EQ(e2m1_decode(e2m1_encode(100.0f)), 6.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(-INFINITY)), -6.0f);
}

// A slot of `layout` encoded from x, decoded again.
struct RoundTrip {
  std::vector<uint8_t> slot;
  std::vector<float> decoded;
};

RoundTrip round_trip(const KvLayout& layout, const std::vector<float>& x, float fixed_scale = 0.0f) {
  const KvSlotLayout s = kv_slot_layout(layout);
  RoundTrip r{std::vector<uint8_t>(size_t(s.bytes), 0xee), std::vector<float>(size_t(s.values))};
  kv_slot_encode(layout, s, x.data(), fixed_scale, r.slot.data());
  kv_slot_decode(layout, s, r.slot.data(), 0, s.values, r.decoded.data());
  return r;
}

TEST(KvCodec, SlotBytesOfEachDtype) {
  const KvLayout mla{KvDtype::nvfp4, 1, 576, 512, true};  // DeepSeek-V3 / Kimi-K2
  EXPECT_EQ(kv_slot_layout(mla).bytes, 352);
  EXPECT_EQ(kv_slot_layout({KvDtype::fp8_e4m3, 1, 576, 512, true}).bytes, 592);  // 576 + 2 scales, to 16
  EXPECT_EQ(kv_slot_layout({KvDtype::bf16, 1, 576, 512, true}).bytes, 1152);
  EXPECT_EQ(kv_slot_layout({KvDtype::f32, 1, 576, 512, true}).bytes, 2304);
  EXPECT_EQ(kv_slot_layout({KvDtype::fp8_e5m2, 4, 128, 128, false}).bytes, 528);  // Qwen3: 512 + 4 scales
  EXPECT_EQ(kv_slot_layout({KvDtype::bf16, 4, 128, 128, false}).bytes, 1024);
}

TEST(KvCodec, Fp8SlotsRoundTripWithinHalfAStepOfTheirGroupScale) {
  const KvLayout gqa{KvDtype::fp8_e4m3, 3, 40, 40, false};
  const KvLayout latent{KvDtype::fp8_e5m2, 1, 48, 32, true};
  for (const KvLayout& layout : {gqa, latent}) {
    const KvSlotLayout s = kv_slot_layout(layout);
    std::vector<float> x = random_floats(size_t(s.values), 11);
    for (int64_t i = s.values - 8; i < s.values; ++i) x[size_t(i)] *= 100.0f;  // the last group has another range
    const RoundTrip r = round_trip(layout, x);
    const Fp8Kind kind = kv_fp8_kind(layout.dtype);
    const double relative = kind == Fp8Kind::e4m3 ? 1.0 / 16 : 1.0 / 8;  // half an ulp: 2^-(mant + 1)
    for (int64_t g = 0; g < s.groups; ++g) {
      int64_t begin = 0, end = 0;
      kv_group_range(layout, g, &begin, &end);
      float scale = 0.0f, amax = 0.0f;
      std::memcpy(&scale, r.slot.data() + s.scale_offset + 4 * g, 4);
      for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[size_t(i)]));
      EXPECT_EQ(scale, amax / fp8_max_finite(kind)) << g;
      for (int64_t i = begin; i < end; ++i) {
        const double err = std::fabs(double(r.decoded[size_t(i)]) - double(x[size_t(i)]));
        // Half an ulp of the value (normal codes), or half the subnormal step times the scale.
        const double bound = std::max(std::fabs(double(x[size_t(i)])) * relative,
                                      double(scale) * (kind == Fp8Kind::e4m3 ? 0x1p-10 : 0x1p-17)) * 1.0001;
        EXPECT_LE(err, bound) << "group " << g << " value " << i;
      }
      // The largest |x| of a group maps onto the largest code.
      int64_t at = begin;
      for (int64_t i = begin; i < end; ++i)
        if (std::fabs(x[size_t(i)]) > std::fabs(x[size_t(at)])) at = i;
      EXPECT_EQ(r.slot[size_t(at)] & 0x7f, kind == Fp8Kind::e4m3 ? 0x7e : 0x7b);
    }
    for (int64_t i = s.scale_offset + 4 * s.groups; i < s.bytes; ++i) EXPECT_EQ(r.slot[size_t(i)], 0) << "padding";
  }
}

TEST(KvCodec, Fp8ZeroRowsInfAndNaN) {
  const KvLayout layout{KvDtype::fp8_e4m3, 2, 16, 16, false};
  std::vector<float> x(32, 0.0f);
  x[3] = -0.0f;
  x[17] = 2.0f;
  x[18] = INFINITY;
  x[19] = NAN;
  x[20] = -INFINITY;
  const RoundTrip r = round_trip(layout, x);
  const KvSlotLayout s = kv_slot_layout(layout);
  float scale0 = -1.0f;
  std::memcpy(&scale0, r.slot.data() + s.scale_offset, 4);
  EXPECT_EQ(scale0, 0.0f);  // a zero head: scale 0, decodes to zeros of the same sign
  for (int i = 0; i < 16; ++i) EXPECT_EQ(r.decoded[size_t(i)], 0.0f);
  EXPECT_TRUE(std::signbit(r.decoded[3]));
  EXPECT_EQ(r.decoded[17], 2.0f);                   // the finite amax, exactly (code 448 * scale)
  EXPECT_EQ(r.decoded[18], 2.0f);                   // +Inf saturates to the largest code
  EXPECT_TRUE(std::isnan(r.decoded[19]));
  EXPECT_EQ(r.decoded[20], -2.0f);
  // A head of nothing but Inf: no finite amax, scale 0, so it decodes to zeros.
  std::vector<float> inf(32, INFINITY);
  for (float v : round_trip(layout, inf).decoded) EXPECT_EQ(v, 0.0f);
}

TEST(KvCodec, Fp8FixedScalesQuantizeAgainstTheCheckpointScale) {
  const KvLayout layout{KvDtype::fp8_e4m3, 1, 16, 16, false};
  std::vector<float> x = random_floats(16, 5);
  x[0] = 1000.0f;  // beyond 448 * 0.5: saturates
  const RoundTrip r = round_trip(layout, x, 0.5f);
  float scale = 0.0f;
  std::memcpy(&scale, r.slot.data() + kv_slot_layout(layout).scale_offset, 4);
  EXPECT_EQ(scale, 0.5f);
  EXPECT_EQ(r.decoded[0], 224.0f);
  for (size_t i = 1; i < 16; ++i)
    EXPECT_EQ(r.decoded[i], fp8_decode(fp8_encode(x[i] / 0.5f, Fp8Kind::e4m3), Fp8Kind::e4m3) * 0.5f);
}

TEST(KvCodec, Nvfp4LatentRowsRoundTripWithinTheirBlockScales) {
  const KvLayout layout{KvDtype::nvfp4, 1, 576, 512, true};
  const KvSlotLayout s = kv_slot_layout(layout);
  std::vector<float> x = random_floats(576, 21, 0.5f);
  for (int i = 32; i < 48; ++i) x[size_t(i)] = 0.0f;  // a zero block
  const RoundTrip r = round_trip(layout, x);
  for (int64_t b = 0; b < s.groups; ++b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[size_t(b * 16 + i)]));
    const uint8_t scale_code = r.slot[size_t(s.scale_offset + b)];
    EXPECT_EQ(scale_code, fp8_encode(amax / 6.0f, Fp8Kind::e4m3)) << b;
    const double sd = fp8_decode(scale_code, Fp8Kind::e4m3);
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t k = b * 16 + i;
      const double v = x[size_t(k)], d = r.decoded[size_t(k)];
      // Rounding costs at most half the widest e2m1 step (2, between 4 and 6) times the scale;
      // saturation of amax / sd above 6 (the scale rounded down by up to 2^-4) at most 0.4 of it.
      EXPECT_LE(std::fabs(d - v), sd * 1.0 + 1e-12) << k;
      if (sd > 0) {
        EXPECT_EQ(d, e2m1_to_double(e2m1_from_double(double(x[size_t(k)] / float(sd)))) * sd) << k;
      }
    }
  }
  for (int i = 32; i < 48; ++i) EXPECT_EQ(r.decoded[size_t(i)], 0.0f);
  for (int64_t i = 512; i < 576; ++i)
    EXPECT_EQ(double(r.decoded[size_t(i)]), e4m3_to_double(e4m3_from_double(x[size_t(i)]))) << "rope " << i;
  for (int64_t i = s.scale_offset + s.groups; i < s.bytes; ++i) EXPECT_EQ(r.slot[size_t(i)], 0) << "padding";
}

TEST(KvCodec, Nvfp4NaNPoisonsItsBlockAndInfSaturates) {
  const KvLayout layout{KvDtype::nvfp4, 1, 48, 32, true};
  std::vector<float> x = random_floats(48, 3);
  x[5] = NAN;
  x[20] = -INFINITY;
  const RoundTrip r = round_trip(layout, x);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(r.decoded[size_t(i)])) << i;
  float amax = 0.0f;
  for (int i = 16; i < 32; ++i)
    if (std::isfinite(x[size_t(i)])) amax = std::max(amax, std::fabs(x[size_t(i)]));
  EXPECT_EQ(r.decoded[20], -6.0f * fp8_decode(fp8_encode(amax / 6.0f, Fp8Kind::e4m3), Fp8Kind::e4m3));
  for (int i = 16; i < 48; ++i) EXPECT_FALSE(std::isnan(r.decoded[size_t(i)])) << i;
}

TEST(KvCodec, TheSlotDecodersAgreeBitForBit) {  // kv_slot_value (GPU), kv_slot_value4 (GPU), kv_slot_decode (CPU)
  const std::vector<KvLayout> layouts = {{KvDtype::f32, 3, 40, 40, false},    {KvDtype::bf16, 3, 40, 40, false},
                                         {KvDtype::fp8_e4m3, 3, 40, 40, false}, {KvDtype::fp8_e5m2, 1, 48, 32, true},
                                         {KvDtype::fp8_e4m3, 1, 576, 512, true}, {KvDtype::nvfp4, 1, 576, 512, true},
                                         {KvDtype::nvfp4, 1, 48, 32, true}};
  for (const KvLayout& layout : layouts) {
    const KvSlotLayout s = kv_slot_layout(layout);
    std::vector<float> x = random_floats(size_t(s.values), 13, 3.0f);
    x[7] = 0.0f;
    const RoundTrip r = round_trip(layout, x);
    for (int64_t begin : {int64_t(0), int64_t(4), s.values / 2}) {  // kv_slot_decode of partial ranges too
      std::vector<float> part(size_t(s.values - begin));
      kv_slot_decode(layout, s, r.slot.data(), begin, s.values - begin, part.data());
      for (int64_t i = begin; i < s.values; ++i) {
        const float value = kv_slot_value(layout, s, r.slot.data(), i);
        ASSERT_EQ(kv_float_bits(part[size_t(i - begin)]), kv_float_bits(value)) << int(layout.dtype) << " " << i;
      }
    }
    for (int64_t first = 0; first < s.values; first += 4) {
      float four[4];
      kv_slot_value4(layout, s, r.slot.data(), first, four);
      for (int i = 0; i < 4; ++i)
        ASSERT_EQ(kv_float_bits(four[i]), kv_float_bits(r.decoded[size_t(first + i)]))
            << int(layout.dtype) << " " << first;
    }
  }
}

TEST(KvCodec, Bf16AndF32SlotsKeepTheirValues) {
  const std::vector<float> x = random_floats(64, 9);
  const RoundTrip f32 = round_trip({KvDtype::f32, 2, 32, 32, false}, x);
  EXPECT_EQ(std::memcmp(f32.decoded.data(), x.data(), 64 * sizeof(float)), 0);
  const RoundTrip bf16 = round_trip({KvDtype::bf16, 2, 32, 32, false}, x);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(bf16.decoded[i], bf16_to_float(float_to_bf16(x[i])));
}

}  // namespace
}  // namespace moet
