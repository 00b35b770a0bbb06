// Fused cached attention for XLA:CPU decode steps, called through the XLA FFI.
//
//   out[b, i, h, :] = softmax_j(q[b, i, h, :] . k[b, h, j, :] + bias[b, h, i, j]) @ v[b, h, :, :]
//
//   q    float32 [B, Q, H, D]   queries as projected (positions first)
//   k, v float32 [B, H, S, D]   the cache, heads first (`network.MultiHeadAttention`'s layout)
//   bias float32 [Bb, Hb, Q, S] additive (mask and relative-position bias); Bb in {1, B}, Hb in {1, H}
//   out  float32 [B, Q, H, D]
//
// Why: XLA:CPU runs the two batched dots of a k-token cached step as GEMMs that pack the whole K / V
// cache of every head on every call, plus separate fusions for the bias and the softmax. On a
// 256-token source this made the attention grow from ~0.23 to ~0.58 ms per decoder step between one
// and six query tokens, all of the verify step's growth (results/verify_cost/verify_cost_sum_shapes.md).
// Here each cache row is read once per call and used by every query row while it is in registers;
// the logits row, the softmax and P.V stay in L1.
//
// Numerics: the same operations as `jax.nn.softmax` (max subtracted, exp, sum, divide), in float32;
// summation order and the exp polynomial differ from XLA's (agreement ~1e-6 relative, tested).
//
// CPU dispatch at run time (no -march=native), following the matmul's path (`force_isa` included):
// AVX-512F (D a multiple of 16), AVX2 + FMA (D a multiple of 8), else portable C++; D <= 128.
// The softmax and its exp are written once (attention_simd.h) over a small vector-traits struct per
// ISA, compiled inside that ISA's `#pragma GCC target` region.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECDEC_X86 1
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

extern "C" int SpecdecMatmulIsaCode();  // matmul.cc: 0 portable, 1 avx2+fma, 2 avx512f

namespace {

// One (batch, head), the operands of every head function: queries q [Q, D] (row stride qs), the
// cache k / v [S, D], bias rows [Q, S] (stride S), out rows [Q, D] (stride os); `work` holds Q x S
// floats.
struct Head {
  const float* q;
  int64_t qs, Q;
  const float* k;
  const float* v;
  int64_t S, D;
  const float* bias;
  float* out;
  int64_t os;
  float* work;
};

void head_portable(const Head& h) {
  const auto [q, qs, Q, k, v, S, D, bias, out, os, work] = h;  // a copy: no aliasing with stores
  for (int64_t i = 0; i < Q; ++i) {
    float* row = work + i * S;
    const float* qi = q + i * qs;
    float mx = -INFINITY;
    for (int64_t j = 0; j < S; ++j) {
      float acc = 0.0f;
      for (int64_t d = 0; d < D; ++d) acc += qi[d] * k[j * D + d];
      acc += bias[i * S + j];
      row[j] = acc;
      mx = acc > mx ? acc : mx;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < S; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    float* oi = out + i * os;
    for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
    for (int64_t j = 0; j < S; ++j) {
      const float p = row[j] / sum;
      for (int64_t d = 0; d < D; ++d) oi[d] += p * v[j * D + d];
    }
  }
}

#ifdef SPECDEC_X86
#define SPECDEC_INLINE __attribute__((always_inline)) inline
// The traits' members common to the ISAs, whose intrinsics differ only in their prefix P (_mm512 /
// _mm256): vector type VT, mask type MT, and ROUND, the intrinsic rounding by an immediate mode.
#define SPECDEC_VECTOR_TRAITS(P, VT, MT, ROUND)                                     \
  using V = VT;                                                                     \
  using Mask = MT;                                                                  \
  static constexpr int kWidth = sizeof(V) / sizeof(float);                          \
  SPECDEC_INLINE static V load(const float* p) { return P##_loadu_ps(p); }          \
  SPECDEC_INLINE static void store(float* p, V x) { P##_storeu_ps(p, x); }          \
  SPECDEC_INLINE static V set1(float x) { return P##_set1_ps(x); }                  \
  SPECDEC_INLINE static V setzero() { return P##_setzero_ps(); }                    \
  SPECDEC_INLINE static V add(V a, V b) { return P##_add_ps(a, b); }                \
  SPECDEC_INLINE static V sub(V a, V b) { return P##_sub_ps(a, b); }                \
  SPECDEC_INLINE static V mul(V a, V b) { return P##_mul_ps(a, b); }                \
  SPECDEC_INLINE static V div(V a, V b) { return P##_div_ps(a, b); }                \
  SPECDEC_INLINE static V max(V a, V b) { return P##_max_ps(a, b); }                \
  SPECDEC_INLINE static V min(V a, V b) { return P##_min_ps(a, b); }                \
  SPECDEC_INLINE static V fmadd(V a, V b, V c) { return P##_fmadd_ps(a, b, c); }    \
  SPECDEC_INLINE static V fnmadd(V a, V b, V c) { return P##_fnmadd_ps(a, b, c); }  \
  SPECDEC_INLINE static V round_nearest(V x) {                                      \
    return ROUND(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                 \
  }

// The vector traits of each ISA (see attention_simd.h), and that file's steps compiled for it.
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
struct Isa {
  SPECDEC_VECTOR_TRAITS(_mm512, __m512, __mmask16, _mm512_roundscale_ps)
  // vscalefps: no exponent-field arithmetic.
  SPECDEC_INLINE static V scale2n(V p, V n) { return _mm512_scalef_ps(p, n); }
  SPECDEC_INLINE static Mask first_lanes(int64_t count) {
    return static_cast<Mask>((1u << count) - 1);
  }
  SPECDEC_INLINE static V load_first(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  SPECDEC_INLINE static void store_first(float* p, Mask m, V x) { _mm512_mask_storeu_ps(p, m, x); }
  SPECDEC_INLINE static V max_first(V mx, Mask m, V x) { return _mm512_mask_max_ps(mx, m, mx, x); }
  SPECDEC_INLINE static V add_first(V s, Mask m, V x) { return _mm512_mask_add_ps(s, m, s, x); }
  SPECDEC_INLINE static float hsum(V x) { return _mm512_reduce_add_ps(x); }
  SPECDEC_INLINE static float hmax(V x) { return _mm512_reduce_max_ps(x); }
};
#include "attention_simd.h"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
struct Isa {
  SPECDEC_VECTOR_TRAITS(_mm256, __m256, __m256i, _mm256_round_ps)
  // No vscalefps: 2^n as two exact power-of-two factors (2^(n >> 1) * 2^(n - (n >> 1)), each a
  // normal float for n in [-150, 128]), so the one rounding is scalef's and the lanes equal
  // AVX-512's.
  SPECDEC_INLINE static V scale2n(V p, V n) {
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }
  SPECDEC_INLINE static Mask first_lanes(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  SPECDEC_INLINE static V load_first(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  SPECDEC_INLINE static void store_first(float* p, Mask m, V x) { _mm256_maskstore_ps(p, m, x); }
  SPECDEC_INLINE static V max_first(V mx, Mask m, V x) {
    const __m256 off = _mm256_set1_ps(-INFINITY);
    return _mm256_max_ps(mx, _mm256_blendv_ps(off, x, _mm256_castsi256_ps(m)));
  }
  SPECDEC_INLINE static V add_first(V s, Mask m, V x) {
    return _mm256_add_ps(s, _mm256_and_ps(x, _mm256_castsi256_ps(m)));
  }
  SPECDEC_INLINE static float hsum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  SPECDEC_INLINE static float hmax(V a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
#include "attention_simd.h"
}  // namespace avx2
#pragma GCC pop_options

// Sums of 16 vectors in one: lane L of the result is the sum of the lanes of a[kSumLane^-1(L)]
// (a fixed permutation, undone by `sum16`). Four halving levels of shuffles and adds: 15 adds and 30
// shuffles for 16 sums, where 16 horizontal reductions take ~8 dependent steps each.
__attribute__((target("avx512f"), always_inline)) inline __m512 sum16_permuted(const __m512* a) {
  __m512 r[8], s[4], v[2];
  for (int i = 0; i < 8; ++i)  // 512 -> 256 bits: r[i] = [a[i] half-sums, a[i + 8] half-sums]
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], 0x44),
                         _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE));
  for (int i = 0; i < 4; ++i)  // 256 -> 128 bits
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[i], r[i + 4], 0x88),
                         _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)  // 128 -> 64 bits
    v[i] = _mm512_add_ps(_mm512_shuffle_ps(s[i], s[i + 2], 0x44),
                         _mm512_shuffle_ps(s[i], s[i + 2], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
}

// The permutation of `sum16_permuted`, found once by running it on a[j] = j.
__attribute__((target("avx512f"))) __m512i sum16_order() {
  __m512 a[16];
  for (int j = 0; j < 16; ++j) a[j] = _mm512_set1_ps(static_cast<float>(j));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum16_permuted(a));
  alignas(64) int32_t idx[16];
  for (int lane = 0; lane < 16; ++lane) idx[static_cast<int>(lanes[lane]) / 16] = lane;
  return _mm512_load_si512(idx);
}

// sum16(a)[j] = sum of the lanes of a[j].
__attribute__((target("avx512f"), always_inline)) inline __m512 sum16(const __m512* a,
                                                                      __m512i order) {
  return _mm512_permutexvar_ps(order, sum16_permuted(a));
}

// Query rows per chunk: NV = D / 16 vectors per row, the chunk's q rows and accumulators in registers.
template <int NV>
constexpr int kRows = NV <= 2 ? 8 : (NV <= 4 ? 6 : 3);

template <int NV>
__attribute__((target("avx512f"))) void head_avx512(const Head& h) {
  const auto [q, qs, Q, k, v, S, d, bias, out, os, work] = h;  // a copy: no aliasing with stores
  constexpr int64_t D = 16 * NV;  // == d
  constexpr int R = kRows<NV>;
  for (int64_t i0 = 0; i0 < Q; i0 += R) {
    const int rows = Q - i0 < R ? static_cast<int>(Q - i0) : R;
    __m512 qr[R][NV];
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < NV; ++c) qr[i][c] = _mm512_loadu_ps(q + (i0 + i) * qs + 16 * c);
    // Blocks of 16 cache rows: 16 dot products per query row, summed together by `sum16`.
    static const __m512i order = sum16_order();
    int64_t j = 0;
    for (; j + 16 <= S; j += 16) {
      for (int i = 0; i < rows; ++i) {
        __m512 a[16];
        for (int jj = 0; jj < 16; ++jj) {
          const float* kr = k + (j + jj) * D;
          a[jj] = _mm512_mul_ps(qr[i][0], _mm512_loadu_ps(kr));
          for (int c = 1; c < NV; ++c) a[jj] = _mm512_fmadd_ps(qr[i][c], _mm512_loadu_ps(kr + 16 * c), a[jj]);
        }
        _mm512_storeu_ps(work + (i0 + i) * S + j, sum16(a, order));
      }
    }
    for (; j < S; ++j) {  // the last S % 16 rows: one horizontal sum each
      __m512 kr[NV];
      for (int c = 0; c < NV; ++c) kr[c] = _mm512_loadu_ps(k + j * D + 16 * c);
      for (int i = 0; i < rows; ++i) {
        __m512 acc = _mm512_mul_ps(qr[i][0], kr[0]);
        for (int c = 1; c < NV; ++c) acc = _mm512_fmadd_ps(qr[i][c], kr[c], acc);
        work[(i0 + i) * S + j] = _mm512_reduce_add_ps(acc);
      }
    }
    // Bias, max, exp, sum, divide.
    for (int i = 0; i < rows; ++i) avx512::softmax_row(work + (i0 + i) * S, bias + (i0 + i) * S, S);
    // P.V: each value row loaded once, accumulated into every query row of the chunk.
    __m512 acc[R][NV];
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < NV; ++c) acc[i][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < S; ++j) {
      __m512 vr[NV];
      for (int c = 0; c < NV; ++c) vr[c] = _mm512_loadu_ps(v + j * D + 16 * c);
      for (int i = 0; i < rows; ++i) {
        const __m512 p = _mm512_set1_ps(work[(i0 + i) * S + j]);
        for (int c = 0; c < NV; ++c) acc[i][c] = _mm512_fmadd_ps(p, vr[c], acc[i][c]);
      }
    }
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out + (i0 + i) * os + 16 * c, acc[i][c]);
  }
}

// ------------------------------------------------------------------------------------------------
// AVX2 + FMA (8-wide, 16 ymm registers): the same steps as head_avx512. A query row's D / 8
// vectors do not fit in registers beside the accumulators, so each query row streams the K / V
// cache of its head from L1 (16 KiB at 64 positions of 64 floats); the accumulators stay in
// registers.

// sum8(a)[j] = sum of the lanes of a[j] (three levels of horizontal adds, then the two halves).
__attribute__((target("avx2,fma"), always_inline)) inline __m256 sum8(const __m256* a) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// P.V for `RB` query rows and `CB` of the D / 8 vectors from column vector c0: each value row's
// CB vectors loaded once for the RB rows.
template <int RB, int CB>
__attribute__((target("avx2,fma"), always_inline)) inline void pv_avx2(
    const float* p, int64_t S, const float* v, int64_t D, int rows, float* out, int64_t os) {
  __m256 acc[RB][CB];
  _Pragma("GCC unroll 8") for (int i = 0; i < RB; ++i)
    _Pragma("GCC unroll 4") for (int c = 0; c < CB; ++c) acc[i][c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < S; ++j) {
    __m256 vr[CB];
    _Pragma("GCC unroll 4") for (int c = 0; c < CB; ++c) vr[c] = _mm256_loadu_ps(v + j * D + 8 * c);
    _Pragma("GCC unroll 8") for (int i = 0; i < RB; ++i) {
      if (i < rows) {
        const __m256 pij = _mm256_broadcast_ss(p + i * S + j);
        _Pragma("GCC unroll 4") for (int c = 0; c < CB; ++c)
          acc[i][c] = _mm256_fmadd_ps(pij, vr[c], acc[i][c]);
      }
    }
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < RB; ++i)
    if (i < rows)
      _Pragma("GCC unroll 4") for (int c = 0; c < CB; ++c)
        _mm256_storeu_ps(out + i * os + 8 * c, acc[i][c]);
}

template <int NV>
__attribute__((target("avx2,fma"))) void head_avx2(const Head& h) {
  const auto [q, qs, Q, k, v, S, d, bias, out, os, work] = h;  // a copy: no aliasing with stores
  constexpr int64_t D = 8 * NV;  // == d
  for (int64_t i = 0; i < Q; ++i) {
    const float* qi = q + i * qs;
    float* row = work + i * S;
    // Logits in blocks of 8 cache rows: 8 dot products at once, summed together by `sum8`.
    int64_t j = 0;
    for (; j + 8 <= S; j += 8) {
      __m256 a[8];
      const __m256 q0 = _mm256_loadu_ps(qi);
      _Pragma("GCC unroll 8") for (int jj = 0; jj < 8; ++jj)
        a[jj] = _mm256_mul_ps(q0, _mm256_loadu_ps(k + (j + jj) * D));
      for (int c = 1; c < NV; ++c) {
        const __m256 qc = _mm256_loadu_ps(qi + 8 * c);
        _Pragma("GCC unroll 8") for (int jj = 0; jj < 8; ++jj)
          a[jj] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + (j + jj) * D + 8 * c), a[jj]);
      }
      _mm256_storeu_ps(row + j, sum8(a));
    }
    for (; j < S; ++j) {  // the last S % 8 rows: one horizontal sum each
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qi), _mm256_loadu_ps(k + j * D));
      for (int c = 1; c < NV; ++c)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 8 * c), _mm256_loadu_ps(k + j * D + 8 * c), acc);
      row[j] = avx2::Isa::hsum(acc);
    }
    // Bias, max, exp, sum, divide.
    avx2::softmax_row(row, bias + i * S, S);
  }
  // P.V: blocks of query rows x column vectors whose accumulators fit in registers (8-12).
  constexpr int CB = NV >= 4 ? 4 : NV;
  constexpr int RB = CB == 4 ? 2 : (CB == 2 ? 6 : 8);
  for (int64_t i0 = 0; i0 < Q; i0 += RB) {
    const int rows = Q - i0 < RB ? static_cast<int>(Q - i0) : RB;
    int c0 = 0;
    for (; c0 + CB <= NV; c0 += CB)
      pv_avx2<RB, CB>(work + i0 * S, S, v + 8 * c0, D, rows, out + i0 * os + 8 * c0, os);
    for (; c0 < NV; ++c0)  // NV not a multiple of 4: the last vectors one at a time
      pv_avx2<RB, 1>(work + i0 * S, S, v + 8 * c0, D, rows, out + i0 * os + 8 * c0, os);
  }
}
#endif

std::string dims_str(ffi::AnyBuffer::Dimensions d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Leading (vmap) axes: every operand has the same `lead` leading axes, of equal sizes
// (vmap_method="broadcast_all"); they fold into the batch.
ffi::Error AttentionImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer bias,
                         ffi::Result<ffi::AnyBuffer> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), bd = bias.dimensions(),
             od = out->dimensions();
  for (auto t : {q.element_type(), k.element_type(), v.element_type(), bias.element_type(),
                 out->element_type()})
    if (t != ffi::DataType::F32)
      return ffi::Error::InvalidArgument("specdec_attention: every operand must be float32.");
  const size_t r = qd.size();
  if (r < 4 || kd.size() != r || vd.size() != r || bd.size() != r || od.size() != r)
    return ffi::Error::InvalidArgument("specdec_attention: bad ranks q " + dims_str(qd) + ", k " +
                                       dims_str(kd) + ", bias " + dims_str(bd));
  const size_t lead = r - 4;
  int64_t L = 1;
  for (size_t i = 0; i < lead; ++i) {
    if (kd[i] != qd[i] || vd[i] != qd[i] || bd[i] != qd[i] || od[i] != qd[i])
      return ffi::Error::InvalidArgument("specdec_attention: leading axes differ");
    L *= qd[i];
  }
  const int64_t B = qd[lead], Q = qd[lead + 1], H = qd[lead + 2], D = qd[lead + 3];
  const int64_t S = kd[lead + 2], Bb = bd[lead], Hb = bd[lead + 1];
  bool ok = kd[lead] == B && kd[lead + 1] == H && kd[lead + 3] == D;
  for (size_t i = lead; i < r; ++i) ok = ok && vd[i] == kd[i] && od[i] == qd[i];
  ok = ok && (Bb == 1 || Bb == B) && (Hb == 1 || Hb == H) && bd[lead + 2] == Q &&
       bd[lead + 3] == S && B >= 1 && Q >= 1 && H >= 1 && D >= 1 && S >= 1;
  if (!ok)
    return ffi::Error::InvalidArgument("specdec_attention: shapes do not match: q " +
                                       dims_str(qd) + ", k " + dims_str(kd) + ", v " +
                                       dims_str(vd) + ", bias " + dims_str(bd));
  const float* qp = static_cast<const float*>(q.untyped_data());
  const float* kp = static_cast<const float*>(k.untyped_data());
  const float* vp = static_cast<const float*>(v.untyped_data());
  const float* bp = static_cast<const float*>(bias.untyped_data());
  float* op = static_cast<float*>(out->untyped_data());
  thread_local std::vector<float> work;
  if (static_cast<int64_t>(work.size()) < Q * S) work.resize(Q * S);
#ifdef SPECDEC_X86
  // The matmul's code path (forced or detected); an AVX-512 CPU runs AVX2 for D = 8 mod 16.
  const int code = SpecdecMatmulIsaCode();
  const bool avx512 = code == 2 && D % 16 == 0 && D <= 128;
  const bool avx2 = !avx512 && code >= 1 && D % 8 == 0 && D <= 128;
#endif
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t lb = l * B + b;
        const Head hd{qp + (lb * Q * H + h) * D,  // query row i at + i * H * D
                      H * D,
                      Q,
                      kp + (lb * H + h) * S * D,
                      vp + (lb * H + h) * S * D,
                      S,
                      D,
                      bp + ((l * Bb + (Bb == 1 ? 0 : b)) * Hb + (Hb == 1 ? 0 : h)) * Q * S,
                      op + (lb * Q * H + h) * D,
                      H * D,
                      work.data()};
#ifdef SPECDEC_X86
        if (avx512) {
          switch (D / 16) {
            case 1: head_avx512<1>(hd); break;
            case 2: head_avx512<2>(hd); break;
            case 3: head_avx512<3>(hd); break;
            case 4: head_avx512<4>(hd); break;
            case 5: head_avx512<5>(hd); break;
            case 6: head_avx512<6>(hd); break;
            case 7: head_avx512<7>(hd); break;
            default: head_avx512<8>(hd); break;
          }
          continue;
        }
        if (avx2) {
          switch (D / 8) {
#define SPECDEC_HEAD_AVX2(nv) \
  case nv:                    \
    head_avx2<nv>(hd);        \
    break;
            SPECDEC_HEAD_AVX2(1) SPECDEC_HEAD_AVX2(2) SPECDEC_HEAD_AVX2(3) SPECDEC_HEAD_AVX2(4)
            SPECDEC_HEAD_AVX2(5) SPECDEC_HEAD_AVX2(6) SPECDEC_HEAD_AVX2(7) SPECDEC_HEAD_AVX2(8)
            SPECDEC_HEAD_AVX2(9) SPECDEC_HEAD_AVX2(10) SPECDEC_HEAD_AVX2(11) SPECDEC_HEAD_AVX2(12)
            SPECDEC_HEAD_AVX2(13) SPECDEC_HEAD_AVX2(14) SPECDEC_HEAD_AVX2(15)
            default: head_avx2<16>(hd); break;
#undef SPECDEC_HEAD_AVX2
          }
          continue;
        }
#endif
        head_portable(hd);
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
