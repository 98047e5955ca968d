// The KV cache's number formats (the slot layouts of core/paged_kv.h): element codecs for bf16,
// fp8 e4m3 / e5m2 and e2m1, and the reference quantizer and dequantizer of a slot. Header-only
// C++17 with host and device element functions, so the CPU kernels, the CUDA kernels and the tests
// use the same arithmetic and a CUDA kernel's cache bytes can be compared with the CPU's (memcmp).
//
// Every rounding is round-to-nearest-even. fp8 encodes saturate (overflow and +-Inf -> the
// largest finite code of the sign; e4m3fn as everywhere in moet, e5m2 "satfinite" like vLLM's
// KV cache) and keep NaN (0x7f | sign); e2m1 saturates at 6 and has no NaN. Quantizing one group
// of values (a GQA head, an MLA latent's value prefix or rope key; docs/kv.md):
//   fp8    amax = the largest finite |x| of the group; scale = amax / max_finite (float division;
//          the fixed per-tensor scale instead when there is one); code = fp8(x / scale). A group
//          whose finite values are all zero gets scale 0 and its values encoded as they are
//          (+-0, +-Inf -> +-max, NaN), so it decodes to +-0 (NaN stays NaN).
//   nvfp4  per 16 latent values: scale = e4m3(amax / 6) (then decoded: sd); nibble = e2m1(x / sd)
//          (x itself when sd is 0); a block holding a NaN gets the NaN scale 0x7f (all 16 decode
//          to NaN). The rope values are e4m3(x), no scale.
// Decoding: value = float(code) * scale (one float product), bf16 exactly.
#pragma once

#include "core/paged_kv.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#define MOET_KV_HD MOET_HOST_DEVICE inline

namespace moet {

enum class Fp8Kind : uint8_t { e4m3, e5m2 };

MOET_KV_HD uint32_t kv_float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
MOET_KV_HD float kv_bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

MOET_KV_HD float fp8_max_finite(Fp8Kind kind) { return kind == Fp8Kind::e4m3 ? 448.0f : 57344.0f; }

// The fp8 byte of x (see above).
MOET_KV_HD uint8_t fp8_encode(float x, Fp8Kind kind) {
  const bool e4m3 = kind == Fp8Kind::e4m3;
  const int mant = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const uint32_t u = kv_float_bits(x), a = u & 0x7fffffffu;
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  if (a > 0x7f800000u) return uint8_t(sign | 0x7f);                                        // NaN
  if (kv_bits_float(a) >= fp8_max_finite(kind)) return uint8_t(sign | (e4m3 ? 0x7e : 0x7b));  // saturate
  const int exponent = int(a >> 23) - 127, min_exponent = 1 - bias;
  if (exponent < min_exponent) {  // a subnormal code (or zero): |x| in units of the smallest one, rounded
    const float units = rintf(kv_bits_float(a) * kv_bits_float(uint32_t(127 + mant - min_exponent) << 23));
    return uint8_t(sign | uint8_t(units));  // 2^mant units is the smallest normal code: still right
  }
  const int shift = 23 - mant;
  const uint32_t rounded = (a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift;
  return uint8_t(sign | uint8_t(rounded - (uint32_t(127 - bias) << mant)));
}

MOET_KV_HD float fp8_decode(uint8_t code, Fp8Kind kind) {
  const uint32_t sign = uint32_t(code & 0x80) << 24, magnitude = code & 0x7fu;
  if (kind == Fp8Kind::e4m3) {
    if (magnitude == 0x7f) return kv_bits_float(sign | 0x7fc00000u);
    const uint32_t e = magnitude >> 3, m = magnitude & 7u;
    if (e == 0) return kv_bits_float(sign | kv_float_bits(float(m) * 0x1p-9f));
    return kv_bits_float(sign | ((e + 120u) << 23) | (m << 20));
  }
  if (magnitude >= 0x7c) return kv_bits_float(sign | (magnitude == 0x7c ? 0x7f800000u : 0x7fc00000u));
  const uint32_t e = magnitude >> 2, m = magnitude & 3u;
  if (e == 0) return kv_bits_float(sign | kv_float_bits(float(m) * 0x1p-16f));
  return kv_bits_float(sign | ((e + 112u) << 23) | (m << 21));
}

// bf16 as core/dtype.h (round to nearest even, NaN quieted).
MOET_KV_HD uint16_t kv_bf16_encode(float x) {
  uint32_t bits = kv_float_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}
MOET_KV_HD float kv_bf16_decode(uint16_t bits) { return kv_bits_float(uint32_t(bits) << 16); }

// e2m1 nibble (sign bit 3) of x, as formats/minifloat.h's e2m1_from_double.
MOET_KV_HD uint8_t e2m1_encode(float x) {
  const float a = fabsf(x);
  const uint8_t magnitude = uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                                    (a >= 3.5f) + (a > 5.0f));
  return uint8_t(((kv_float_bits(x) >> 31) ? 8 : 0) | magnitude);
}
MOET_KV_HD float e2m1_decode(uint8_t nibble) {
  const uint32_t m = nibble & 7u, e = m >> 1, f = m & 1u;
  const float magnitude = e == 0 ? 0.5f * float(f) : float(2 + f) * kv_bits_float((125u + e) << 23);  // 2^(e-2)
  return (nibble & 8) ? -magnitude : magnitude;
}

// The scale of an fp8 group whose largest finite |x| is amax (fixed > 0: that scale).
MOET_KV_HD float fp8_group_scale(float amax, Fp8Kind kind, float fixed) {
  return fixed > 0.0f ? fixed : amax / fp8_max_finite(kind);
}
MOET_KV_HD uint8_t fp8_quantize(float x, float scale, Fp8Kind kind) {
  return fp8_encode(scale > 0.0f ? x / scale : x, kind);
}
// An nvfp4 block's e4m3 scale byte from its amax and whether it holds a NaN, and one nibble.
MOET_KV_HD uint8_t nvfp4_block_scale(float amax, bool has_nan) {
  return has_nan ? uint8_t(0x7f) : fp8_encode(amax / 6.0f, Fp8Kind::e4m3);
}
MOET_KV_HD uint8_t nvfp4_quantize(float x, uint8_t scale_code) {
  const float sd = fp8_decode(scale_code, Fp8Kind::e4m3);
  return e2m1_encode(sd > 0.0f ? x / sd : x);
}
// |x| when finite, else 0 (the amax of a group skips Inf and NaN).
MOET_KV_HD float kv_finite_abs(float x) { return (kv_float_bits(x) & 0x7f800000u) == 0x7f800000u ? 0.0f : fabsf(x); }

MOET_KV_HD Fp8Kind kv_fp8_kind(KvDtype dtype) { return dtype == KvDtype::fp8_e5m2 ? Fp8Kind::e5m2 : Fp8Kind::e4m3; }

// Group g of a slot: [begin, end) of its values (fp8): a GQA slot's heads, a latent row's value
// prefix and rope key.
MOET_KV_HD void kv_group_range(const KvLayout& layout, int64_t g, int64_t* begin, int64_t* end) {
  if (!layout.v_aliases_k) {
    *begin = g * layout.k_dim;
    *end = *begin + layout.k_dim;
  } else {
    *begin = g == 0 ? 0 : layout.v_dim;
    *end = g == 0 && layout.k_dim > layout.v_dim ? layout.v_dim : layout.k_dim;
  }
}
MOET_KV_HD int64_t kv_group_of(const KvLayout& layout, int64_t i) {
  return layout.v_aliases_k ? (i < layout.v_dim ? 0 : 1) : i / layout.k_dim;
}

// Value i of a slot, decoded.
MOET_KV_HD float kv_slot_value(const KvLayout& layout, const KvSlotLayout& s, const uint8_t* slot, int64_t i) {
  switch (layout.dtype) {
    case KvDtype::f32: return reinterpret_cast<const float*>(slot)[i];
    case KvDtype::bf16: return kv_bf16_decode(reinterpret_cast<const uint16_t*>(slot)[i]);
    case KvDtype::fp8_e4m3:
    case KvDtype::fp8_e5m2: {
      float scale;
      memcpy(&scale, slot + s.scale_offset + 4 * kv_group_of(layout, i), sizeof scale);
      return fp8_decode(slot[i], kv_fp8_kind(layout.dtype)) * scale;
    }
    case KvDtype::nvfp4:
      if (i >= layout.v_dim) return fp8_decode(slot[s.rope_offset + i - layout.v_dim], Fp8Kind::e4m3);
      return e2m1_decode(uint8_t(slot[i / 2] >> (4 * (i & 1)))) *
             fp8_decode(slot[s.scale_offset + i / kKvNvfp4Block], Fp8Kind::e4m3);
  }
  return 0.0f;
}

// Values [first, first + 4) of a slot, decoded into out, where first % 4 == 0 and the four lie in
// one fp8 group (group sizes that are multiples of 4): the same floats as kv_slot_value, with one
// scale read (the GPU kernels' staging loads).
MOET_KV_HD void kv_slot_value4(const KvLayout& layout, const KvSlotLayout& s, const uint8_t* slot, int64_t first,
                               float* out) {
  switch (layout.dtype) {
    case KvDtype::f32:
    case KvDtype::bf16:
      for (int i = 0; i < 4; ++i) out[i] = kv_slot_value(layout, s, slot, first + i);
      return;
    case KvDtype::fp8_e4m3:
    case KvDtype::fp8_e5m2: {
      float scale;
      memcpy(&scale, slot + s.scale_offset + 4 * kv_group_of(layout, first), sizeof scale);
      uint32_t codes;
      memcpy(&codes, slot + first, sizeof codes);
      for (int i = 0; i < 4; ++i) out[i] = fp8_decode(uint8_t(codes >> (8 * i)), kv_fp8_kind(layout.dtype)) * scale;
      return;
    }
    case KvDtype::nvfp4: {
      if (first >= layout.v_dim) {
        uint32_t codes;
        memcpy(&codes, slot + s.rope_offset + first - layout.v_dim, sizeof codes);
        for (int i = 0; i < 4; ++i) out[i] = fp8_decode(uint8_t(codes >> (8 * i)), Fp8Kind::e4m3);
        return;
      }
      const float scale = fp8_decode(slot[s.scale_offset + first / kKvNvfp4Block], Fp8Kind::e4m3);
      uint16_t nibbles;
      memcpy(&nibbles, slot + first / 2, sizeof nibbles);
      for (int i = 0; i < 4; ++i) out[i] = e2m1_decode(uint8_t(nibbles >> (4 * i))) * scale;
      return;
    }
  }
}

// Every fp8 byte and e2m1 nibble decoded (the tables the host decoder indexes).
struct KvDecodeTables {
  float e4m3[256], e5m2[256], e2m1[16];
};
inline const KvDecodeTables& kv_decode_tables() {
  static const KvDecodeTables tables = [] {
    KvDecodeTables t{};
    for (int b = 0; b < 256; ++b) {
      t.e4m3[b] = fp8_decode(uint8_t(b), Fp8Kind::e4m3);
      t.e5m2[b] = fp8_decode(uint8_t(b), Fp8Kind::e5m2);
    }
    for (int n = 0; n < 16; ++n) t.e2m1[n] = e2m1_decode(uint8_t(n));
    return t;
  }();
  return tables;
}

// Values [begin, begin + count) of a slot, decoded into out: the floats of kv_slot_value, a
// dtype's loop at a time (the CPU attention's reads).
inline void kv_slot_decode(const KvLayout& layout, const KvSlotLayout& s, const uint8_t* slot, int64_t begin,
                           int64_t count, float* out) {
  switch (layout.dtype) {
    case KvDtype::f32: memcpy(out, slot + 4 * begin, sizeof(float) * size_t(count)); return;
    case KvDtype::bf16: {
      const uint16_t* values = reinterpret_cast<const uint16_t*>(slot) + begin;
      for (int64_t i = 0; i < count; ++i) out[i] = kv_bf16_decode(values[i]);
      return;
    }
    case KvDtype::fp8_e4m3:
    case KvDtype::fp8_e5m2: {
      const KvDecodeTables& tables = kv_decode_tables();
      const float* table = layout.dtype == KvDtype::fp8_e4m3 ? tables.e4m3 : tables.e5m2;
      for (int64_t i = 0; i < count;) {  // runs of one group
        const int64_t g = kv_group_of(layout, begin + i);
        int64_t group_begin = 0, group_end = 0;
        kv_group_range(layout, g, &group_begin, &group_end);
        float scale;
        memcpy(&scale, slot + s.scale_offset + 4 * g, sizeof scale);
        const int64_t end = group_end - begin < count ? group_end - begin : count;
        for (; i < end; ++i) out[i] = table[slot[begin + i]] * scale;
      }
      return;
    }
    case KvDtype::nvfp4: {
      const KvDecodeTables& t = kv_decode_tables();
      const int64_t end = begin + count, latent_end = end < layout.v_dim ? end : layout.v_dim;
      int64_t v = begin;
      for (; v < latent_end; ++v)
        out[v - begin] =
            t.e2m1[(slot[v / 2] >> (4 * (v & 1))) & 15] * t.e4m3[slot[s.scale_offset + v / kKvNvfp4Block]];
      for (; v < end; ++v) out[v - begin] = t.e4m3[slot[s.rope_offset + v - layout.v_dim]];
      return;
    }
  }
}

// A slot is encoded in independent units, each writing its own bytes (so a GPU thread can take
// one): a value (f32, bf16), a group with its scale (fp8), a 16-value block with its scale, then
// each rope value (nvfp4).
MOET_KV_HD int64_t kv_slot_units(const KvLayout& layout, const KvSlotLayout& s) {
  switch (layout.dtype) {
    case KvDtype::f32:
    case KvDtype::bf16: return s.values;
    case KvDtype::fp8_e4m3:
    case KvDtype::fp8_e5m2: return s.groups;
    case KvDtype::nvfp4: return s.groups + (layout.k_dim - layout.v_dim);
  }
  return 0;
}

// Encodes unit u of the slot's values x (s.values of them) into `slot`. fixed_scale: the cache's
// per-tensor fp8 scale (K's or V's), 0 for none.
MOET_KV_HD void kv_encode_unit(const KvLayout& layout, const KvSlotLayout& s, const float* x, float fixed_scale,
                               uint8_t* slot, int64_t u) {
  switch (layout.dtype) {
    case KvDtype::f32: reinterpret_cast<float*>(slot)[u] = x[u]; return;
    case KvDtype::bf16: reinterpret_cast<uint16_t*>(slot)[u] = kv_bf16_encode(x[u]); return;
    case KvDtype::fp8_e4m3:
    case KvDtype::fp8_e5m2: {
      const Fp8Kind kind = kv_fp8_kind(layout.dtype);
      int64_t begin = 0, end = 0;
      kv_group_range(layout, u, &begin, &end);
      float amax = 0.0f;
      for (int64_t i = begin; i < end; ++i) amax = fmaxf(amax, kv_finite_abs(x[i]));
      const float scale = fp8_group_scale(amax, kind, fixed_scale);
      memcpy(slot + s.scale_offset + 4 * u, &scale, sizeof scale);
      for (int64_t i = begin; i < end; ++i) slot[i] = fp8_quantize(x[i], scale, kind);
      return;
    }
    case KvDtype::nvfp4: {
      if (u >= s.groups) {  // a rope value
        const int64_t i = layout.v_dim + (u - s.groups);
        slot[s.rope_offset + i - layout.v_dim] = fp8_encode(x[i], Fp8Kind::e4m3);
        return;
      }
      const float* block = x + u * kKvNvfp4Block;
      float amax = 0.0f;
      bool has_nan = false;
      for (int64_t i = 0; i < kKvNvfp4Block; ++i) {
        amax = fmaxf(amax, kv_finite_abs(block[i]));
        has_nan = has_nan || block[i] != block[i];
      }
      const uint8_t scale = nvfp4_block_scale(amax, has_nan);
      slot[s.scale_offset + u] = scale;
      for (int64_t i = 0; i < kKvNvfp4Block; i += 2)
        slot[(u * kKvNvfp4Block + i) / 2] =
            uint8_t(nvfp4_quantize(block[i], scale) | (nvfp4_quantize(block[i + 1], scale) << 4));
      return;
    }
  }
}

// The reference quantizer: a slot's s.values values x into `slot`, every byte of it (padding
// zeroed).
inline void kv_slot_encode(const KvLayout& layout, const KvSlotLayout& s, const float* x, float fixed_scale,
                           uint8_t* slot) {
  memset(slot, 0, size_t(s.bytes));
  const int64_t units = kv_slot_units(layout, s);
  for (int64_t u = 0; u < units; ++u) kv_encode_unit(layout, s, x, fixed_scale, slot, u);
}

}  // namespace moet
