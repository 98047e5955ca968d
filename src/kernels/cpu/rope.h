// Rotary position embedding, applied in place. A RopeTable (core/op_params.h; models/rope_table.h
// builds it from the config) holds the per-pair inverse frequencies and the cos/sin scale;
// rope_apply() rotates the first `rot_dim` values of each head in place, either as halves
// (x[i], x[i + rot_dim/2]) (NeoX/Llama) or, for DeepSeek MLA, as interleaved pairs whose output
// is de-interleaved: out = [x0*c - x1*s, x2*c - x3*s, ..., x1*c + x0*s, x3*c + x2*s, ...], or,
// with pairs_in_place (DeepSeek-V4), interleaved pairs rotated where they are:
// out = [x0*c - x1*s, x1*c + x0*s, x2*c - x3*s, ...]. inverse rotates by minus the angles (the
// same cos, -sin: DeepSeek-V4 un-ropes its attention output so).
#pragma once

#include "core/op_params.h"
#include "core/thread_pool.h"

#include <cstdint>

namespace moet {

// x: [rows, heads, row_stride] with heads `head_stride` floats apart; rotates x[..., offset :
// offset + rot_dim] of every head of row t at position positions[t].
void rope_apply(const RopeTable& table, float* x, int64_t rows, int64_t heads, int64_t row_stride,
                int64_t head_stride, int64_t offset, const int32_t* positions, bool inverse = false);
// Rotates the first rot_dim values at v by the angles of `position`.
void rope_rotate(const RopeTable& table, float* v, float position, bool inverse = false);

}  // namespace moet
