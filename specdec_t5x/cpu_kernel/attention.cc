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
// CPU dispatch at run time (no -march=native): AVX-512F (D a multiple of 16), else portable C++.
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

// One (batch, head): queries q (row stride qs), cache k / v [S, D], bias rows (stride S), out rows
// (stride os). `work` holds Q x S floats.
void head_portable(const float* q, int64_t qs, int64_t Q, const float* k, const float* v, int64_t S,
                   int64_t D, const float* bias, float* out, int64_t os, float* work) {
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
// exp(x) for float32 lanes: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r, scaled by 2^n
// (vscalefps: no exponent-field arithmetic, and underflow goes to 0 / denormals as it should).
// Relative error ~1e-7 on [-87, 88]; large negative inputs (masked logits) give 0.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

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
__attribute__((target("avx512f"))) void head_avx512(const float* q, int64_t qs, int64_t Q,
                                                    const float* k, const float* v, int64_t S,
                                                    const float* bias, float* out, int64_t os,
                                                    float* work) {
  constexpr int64_t D = 16 * NV;
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
    for (int i = 0; i < rows; ++i) {
      float* row = work + (i0 + i) * S;
      const float* brow = bias + (i0 + i) * S;
      __m512 mx = _mm512_set1_ps(-INFINITY);
      j = 0;
      for (; j + 16 <= S; j += 16) {
        const __m512 x = _mm512_add_ps(_mm512_loadu_ps(row + j), _mm512_loadu_ps(brow + j));
        _mm512_storeu_ps(row + j, x);
        mx = _mm512_max_ps(mx, x);
      }
      if (j < S) {
        const __mmask16 m = static_cast<__mmask16>((1u << (S - j)) - 1);
        const __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(m, row + j),
                                       _mm512_maskz_loadu_ps(m, brow + j));
        _mm512_mask_storeu_ps(row + j, m, x);
        mx = _mm512_mask_max_ps(mx, m, mx, x);
      }
      const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
      __m512 sum = _mm512_setzero_ps();
      for (j = 0; j + 16 <= S; j += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(row + j), mxv));
        _mm512_storeu_ps(row + j, e);
        sum = _mm512_add_ps(sum, e);
      }
      if (j < S) {
        const __mmask16 m = static_cast<__mmask16>((1u << (S - j)) - 1);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), mxv));
        _mm512_mask_storeu_ps(row + j, m, e);
        sum = _mm512_mask_add_ps(sum, m, sum, e);
      }
      // p = e / sum, as jax.nn.softmax divides (not a multiply by the reciprocal).
      const __m512 den = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
      for (j = 0; j + 16 <= S; j += 16)
        _mm512_storeu_ps(row + j, _mm512_div_ps(_mm512_loadu_ps(row + j), den));
      if (j < S) {
        const __mmask16 m = static_cast<__mmask16>((1u << (S - j)) - 1);
        _mm512_mask_storeu_ps(row + j, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, row + j), den));
      }
    }
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
  const bool avx512 = SpecdecMatmulIsaCode() == 2 && D % 16 == 0 && D <= 128;
#endif
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t lb = l * B + b;
        const float* qh = qp + (lb * Q * H + h) * D;  // row i at + i * H * D
        const float* kh = kp + (lb * H + h) * S * D;
        const float* vh = vp + (lb * H + h) * S * D;
        const float* bh = bp + ((l * Bb + (Bb == 1 ? 0 : b)) * Hb + (Hb == 1 ? 0 : h)) * Q * S;
        float* oh = op + (lb * Q * H + h) * D;
#ifdef SPECDEC_X86
        if (avx512) {
          switch (D / 16) {
            case 1: head_avx512<1>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
            case 2: head_avx512<2>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
            case 3: head_avx512<3>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
            case 4: head_avx512<4>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
            case 5: head_avx512<5>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
            case 6: head_avx512<6>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
            case 7: head_avx512<7>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
            default: head_avx512<8>(qh, H * D, Q, kh, vh, S, bh, oh, H * D, work.data()); break;
          }
          continue;
        }
#endif
        head_portable(qh, H * D, Q, kh, vh, S, D, bh, oh, H * D, work.data());
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
