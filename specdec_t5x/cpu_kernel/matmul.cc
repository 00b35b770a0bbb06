// Weight-streaming small-M matmul for XLA:CPU, called through the XLA FFI.
//
//   y[rows, n] = x[rows, K] @ W          x, y float32 (row-major)
//   W packed as panels [P, K, 32] (P = ceil(n / 32), columns >= n zero), float32 or bfloat16.
//
// Why: XLA:CPU lowers a [M >= 2, K] x [K, N] dot to a GEMM that re-packs the weights on every call,
// which costs ~2x a one-row product when the weights come from DRAM (results/verify_cost/). With the
// weights packed once, every panel is read exactly once per call: for each panel, all rows are
// computed in chunks that keep their 32 output columns in registers (the panel stays in L1/L2 for
// the following chunks). bfloat16 weights are widened to float32 in registers (exact), so only the
// weights are rounded, never the activations; the products and sums are float32.
//
// CPU dispatch at run time (no -march=native): AVX-512F, AVX2+FMA, portable C++, chosen once with
// __builtin_cpu_supports. Buffers need no alignment (unaligned loads).
//
// Threads: no OpenMP. A large matrix (at least `g_split_bytes` of packed weights, tunable through
// SpecdecMatmulSetSplitBytes) is shared with XLA's own intra-op thread pool: its panels are handed
// out in blocks from an atomic counter, the calling thread takes blocks too, and it waits only for
// blocks a helper has already taken (XLA's Schedule may run a task late or inline, so a helper that
// starts after the work is gone finds nothing to do and touches only the shared counters).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECDEC_X86 1
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 32;

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline float load_scalar(const float* p) { return *p; }
inline float load_scalar(const uint16_t* p) { return bf16_to_f32(*p); }

// ------------------------------------------------------------------------------------------------
// Portable C++ (any CPU): rows m0..m0+mb of one panel.
template <int MB, typename W>
void chunk_portable(const float* x, int64_t K, const W* w, float* y, int64_t ldy, int64_t nv) {
  float acc[MB][kPanel] = {};
  for (int64_t k = 0; k < K; ++k) {
    float wk[kPanel];
    for (int j = 0; j < kPanel; ++j) wk[j] = load_scalar(w + k * kPanel + j);
    for (int m = 0; m < MB; ++m) {
      const float xv = x[m * K + k];
      for (int j = 0; j < kPanel; ++j) acc[m][j] += xv * wk[j];
    }
  }
  for (int m = 0; m < MB; ++m) std::memcpy(y + m * ldy, acc[m], nv * sizeof(float));
}

#ifdef SPECDEC_X86
// ------------------------------------------------------------------------------------------------
// AVX-512F: 2 zmm accumulators per row; up to 12 rows per chunk (24 + 2 weight + 1 broadcast zmm).
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Software prefetch of the weights `kPrefetchBytes` ahead of the row being multiplied (the packed
// panels are one contiguous stream, so this runs on into the next panel). With several rows per
// chunk the loop is busy with FMAs and the hardware prefetcher falls behind: on a T5-small-shaped
// decoder (weights in L3) the 8-row verify step went from 1.8x to 1.25x the one-row step, and
// bfloat16 weights read ~1.5x faster at one row (results/verify_cost/README.md).
constexpr int64_t kPrefetchBytes = 4096;

template <typename W>
__attribute__((always_inline)) inline void prefetch_row(const W* wk) {
  const char* p = reinterpret_cast<const char*>(wk) + kPrefetchBytes;
  _mm_prefetch(p, _MM_HINT_T0);  // a row is 32 weights: one line (bfloat16) or two (float32)
  if (sizeof(W) * kPanel > 64) _mm_prefetch(p + 64, _MM_HINT_T0);
}

template <int MB, typename W>
__attribute__((target("avx512f"))) void chunk_avx512(const float* x, int64_t K, const W* w,
                                                     float* y, int64_t ldy, int64_t nv) {
  // Few rows: two accumulator sets (even / odd k) so the FMA latency is hidden.
  constexpr int S = MB <= 3 ? 2 : 1;
  __m512 a0[S][MB], a1[S][MB];
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < MB; ++m) a0[s][m] = a1[s][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + S <= K; k += S) {
    for (int s = 0; s < S; ++s) {
      const W* wk = w + (k + s) * kPanel;
      prefetch_row(wk);
      const __m512 w0 = load16(wk), w1 = load16(wk + 16);
      for (int m = 0; m < MB; ++m) {
        const __m512 xb = _mm512_set1_ps(x[m * K + k + s]);
        a0[s][m] = _mm512_fmadd_ps(xb, w0, a0[s][m]);
        a1[s][m] = _mm512_fmadd_ps(xb, w1, a1[s][m]);
      }
    }
  }
  for (; k < K; ++k) {
    const W* wk = w + k * kPanel;
    const __m512 w0 = load16(wk), w1 = load16(wk + 16);
    for (int m = 0; m < MB; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * K + k]);
      a0[0][m] = _mm512_fmadd_ps(xb, w0, a0[0][m]);
      a1[0][m] = _mm512_fmadd_ps(xb, w1, a1[0][m]);
    }
  }
  const __mmask16 m0 = nv >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nv) - 1);
  const __mmask16 m1 =
      nv >= 32 ? 0xFFFF : (nv <= 16 ? 0 : static_cast<__mmask16>((1u << (nv - 16)) - 1));
  for (int m = 0; m < MB; ++m) {
    __m512 r0 = a0[0][m], r1 = a1[0][m];
    if (S == 2) {
      r0 = _mm512_add_ps(r0, a0[S - 1][m]);
      r1 = _mm512_add_ps(r1, a1[S - 1][m]);
    }
    _mm512_mask_storeu_ps(y + m * ldy, m0, r0);
    _mm512_mask_storeu_ps(y + m * ldy + 16, m1, r1);
  }
}

// ------------------------------------------------------------------------------------------------
// AVX2 + FMA (16 ymm registers).
//   1-2 rows: the whole 32-column panel row per k (4 or 8 accumulators, 4 weight, 1 broadcast ymm).
//   3 or more: chunks of up to 6 rows, each on 16 columns at a time (2 accumulators per row: 6-12,
//   2 weight, 1 broadcast ymm), so a panel's lines are read from memory once per 6 rows where 32
//   columns at a time would fit only 3 rows in registers (and spill); see matmul_panels_avx2.
// Every output is one float32 FMA chain over k = 0, 1, ..., K - 1 whatever the chunk: a row's
// result does not depend on how many rows the call has (and equals the earlier 3-row AVX2 code's).
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Stores columns [0, nv) of a (8 columns) and b (the next 8); nv may be <= 0 or >= 16.
__attribute__((target("avx2,fma"), always_inline)) inline void store16(float* y, __m256 a, __m256 b,
                                                                       int64_t nv) {
  if (nv >= 16) {
    _mm256_storeu_ps(y, a);
    _mm256_storeu_ps(y + 8, b);
  } else if (nv > 0) {
    float tmp[16];
    _mm256_storeu_ps(tmp, a);
    _mm256_storeu_ps(tmp + 8, b);
    std::memcpy(y, tmp, nv * sizeof(float));
  }
}

// 1 or 2 rows: the whole panel row per k, prefetching 4 KiB ahead (as the AVX-512 path).
template <int MB, typename W>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, int64_t K, const W* w, float* y,
                                                   int64_t ldy, int64_t nv) {
  __m256 acc[MB][4];
  _Pragma("GCC unroll 8") for (int m = 0; m < MB; ++m)
    _Pragma("GCC unroll 8") for (int j = 0; j < 4; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const W* wk = w + k * kPanel;
    prefetch_row(wk);
    __m256 wv[4];
    _Pragma("GCC unroll 8") for (int j = 0; j < 4; ++j) wv[j] = load8(wk + 8 * j);
    _Pragma("GCC unroll 8") for (int m = 0; m < MB; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * K + k);
      _Pragma("GCC unroll 8") for (int j = 0; j < 4; ++j) acc[m][j] = _mm256_fmadd_ps(xb, wv[j], acc[m][j]);
    }
  }
  _Pragma("GCC unroll 8") for (int m = 0; m < MB; ++m) {
    store16(y + m * ldy, acc[m][0], acc[m][1], nv);
    store16(y + m * ldy + 16, acc[m][2], acc[m][3], nv - 16);
  }
}

// Panel rows per block (16 KiB of float32 weights): every pass over a block reads it from L1.
// 128 measured best against 32, 64 and 256 (96 MiB of weights streamed: 6-8 rows ~10 % faster than
// 64 or 256); whole panels (no blocks) ran 6 rows at half the rate, the weight stream pausing while
// the later passes computed.
constexpr int64_t kBlockK = 128;

// MB (3-6) rows times the 16 columns at w (a panel's first or second half) for panel rows
// [0, kn): x rows at stride ldx; the sums start from `init` (rows at stride 32; null: zero) and go
// to `out` (rows at stride ldo, nv columns). Prefetch: with `own`, these panel rows 4 KiB ahead
// (both halves); with `pf`, the next block's bytes from pf on, spread evenly over the kn
// iterations (`step16`: bytes per iteration in 16.16 fixed point), so the weight stream keeps
// going while every pass over this block computes from L1.
template <int MB, typename W>
__attribute__((target("avx2,fma"))) void half_avx2(const float* x, int64_t ldx, int64_t kn,
                                                   const W* w, const float* init, float* out,
                                                   int64_t ldo, int64_t nv, bool own,
                                                   const char* pf, int64_t step16) {
  __m256 acc[MB][2];
  _Pragma("GCC unroll 8") for (int m = 0; m < MB; ++m) {
    acc[m][0] = init ? _mm256_loadu_ps(init + kPanel * m) : _mm256_setzero_ps();
    acc[m][1] = init ? _mm256_loadu_ps(init + kPanel * m + 8) : _mm256_setzero_ps();
  }
  const bool two = step16 > (int64_t{64} << 16);  // more than a line per iteration
  for (int64_t k = 0; k < kn; ++k) {
    const W* wk = w + k * kPanel;
    if (own) prefetch_row(wk);
    if (pf != nullptr) {
      const char* line = pf + ((k * step16) >> 16);
      _mm_prefetch(line, _MM_HINT_T0);
      if (two) _mm_prefetch(line + 64, _MM_HINT_T0);
    }
    const __m256 w0 = load8(wk), w1 = load8(wk + 8);
    _Pragma("GCC unroll 8") for (int m = 0; m < MB; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
      acc[m][0] = _mm256_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(xb, w1, acc[m][1]);
    }
  }
  _Pragma("GCC unroll 8") for (int m = 0; m < MB; ++m)
    store16(out + m * ldo, acc[m][0], acc[m][1], nv);
}

template <typename W>
using HalfFn = void (*)(const float*, int64_t, int64_t, const W*, const float*, float*, int64_t,
                        int64_t, bool, const char*, int64_t);
template <typename W>  // entry mb - 3: mb rows
const HalfFn<W> kHalfAvx2[] = {&half_avx2<3, W>, &half_avx2<4, W>, &half_avx2<5, W>,
                               &half_avx2<6, W>};

// rows x K times panels [p0, p1) (see matmul_panels) on AVX2. 1-2 rows: one pass per panel
// (rows_avx2). More: rows in balanced chunks of 3 to 6 (7 -> 4 + 3, 8 -> 4 + 4, 13 -> 5 + 4 + 4;
// 6 + 1 and 6 + 2 with whole-panel-row chunks measured no faster); each panel in blocks of kBlockK
// rows, each block half by half and chunk by chunk, the partial sums kept in `part` between blocks
// (float32 stored and reloaded: the same chain of FMAs). So the weights are read as one
// sequential stream, prefetched one block ahead, and every chunk after the first reads from L1.
template <typename W>
void matmul_panels_avx2(const float* x, int64_t rows, int64_t K, const W* w, int64_t p0,
                        int64_t p1, float* y, int64_t n) {
  if (rows <= 2) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t col = p * kPanel, nv = n - col < kPanel ? n - col : kPanel;
      (rows == 1 ? &rows_avx2<1, W> : &rows_avx2<2, W>)(x, K, w + p * K * kPanel, y + col, n, nv);
    }
    return;
  }
  constexpr int64_t kMaxChunks = 64;
  if (rows > 6 * kMaxChunks) {  // very many rows (a long source's set-up): groups of 384
    for (int64_t r = 0; r < rows; r += 6 * kMaxChunks) {
      const int64_t g = rows - r < 6 * kMaxChunks ? rows - r : 6 * kMaxChunks;
      matmul_panels_avx2(x + r * K, g, K, w, p0, p1, y + r * n, n);
    }
    return;
  }
  int64_t plan[kMaxChunks];
  const int64_t chunks = (rows + 5) / 6;
  for (int64_t c = 0, r = rows; c < chunks; r -= plan[c++])
    plan[c] = (r + chunks - c - 1) / (chunks - c);  // ceil(rows left / chunks left), 3 to 6
  thread_local std::vector<float> part_buf;
  if (K > kBlockK && static_cast<int64_t>(part_buf.size()) < rows * kPanel)
    part_buf.resize(rows * kPanel);
  float* part = part_buf.data();
  const char* end = reinterpret_cast<const char*>(w + p1 * K * kPanel);
  for (int64_t p = p0; p < p1; ++p) {
    const W* panel = w + p * K * kPanel;
    const int64_t col = p * kPanel;
    const int64_t nv = n - col < kPanel ? n - col : kPanel;
    const int64_t halves = nv > 16 ? 2 : 1, passes = chunks * halves;
    for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
      const int64_t kn = K - k0 < kBlockK ? K - k0 : kBlockK;
      const bool first = k0 == 0, last = k0 + kn == K;
      const W* block = panel + k0 * kPanel;
      // The next block of the stream (this panel's or the next one's), up to the range's end.
      const char* next = reinterpret_cast<const char*>(block + kn * kPanel);
      int64_t ahead = kBlockK * kPanel * static_cast<int64_t>(sizeof(W));
      if (ahead > end - next) ahead = end - next;
      const int64_t step16 = ahead > 0 ? (ahead << 16) / (passes * kn) : 0;
      int64_t pass = 0;
      for (int64_t h = 0; h < halves; ++h) {
        for (int64_t c = 0, r = 0; c < chunks; r += plan[c++], ++pass) {
          float* prow = part + r * kPanel + 16 * h;
          kHalfAvx2<W>[plan[c] - 3](x + r * K + k0, K, kn, block + 16 * h, first ? nullptr : prow,
                                    last ? y + r * n + col + 16 * h : prow, last ? n : kPanel,
                                    last ? nv - 16 * h : 16, p == p0 && first && pass == 0,
                                    ahead > 0 ? next + pass * ahead / passes : nullptr, step16);
        }
      }
    }
  }
}
#endif  // SPECDEC_X86

// ------------------------------------------------------------------------------------------------
// Chunk tables: entry mb - 1 handles a chunk of mb rows.
template <typename W>
using ChunkFn = void (*)(const float*, int64_t, const W*, float*, int64_t, int64_t);

template <typename W, template <int, typename> class Impl, int... Ms>
struct Table;

template <int MB, typename W>
struct Portable {
  static void run(const float* x, int64_t K, const W* w, float* y, int64_t ldy, int64_t nv) {
    chunk_portable<MB, W>(x, K, w, y, ldy, nv);
  }
};
#ifdef SPECDEC_X86
template <int MB, typename W>
struct Avx512 {
  static void run(const float* x, int64_t K, const W* w, float* y, int64_t ldy, int64_t nv) {
    chunk_avx512<MB, W>(x, K, w, y, ldy, nv);
  }
};
#endif

template <typename W>
struct Kernel {
  int max_rows;              // rows per chunk
  const ChunkFn<W>* chunks;  // chunks[mb - 1]
};

template <typename W>
const ChunkFn<W> kPortable[] = {&Portable<1, W>::run, &Portable<2, W>::run, &Portable<3, W>::run,
                                &Portable<4, W>::run};
#ifdef SPECDEC_X86
template <typename W>
const ChunkFn<W> kAvx512[] = {
    &Avx512<1, W>::run, &Avx512<2, W>::run,  &Avx512<3, W>::run,  &Avx512<4, W>::run,
    &Avx512<5, W>::run, &Avx512<6, W>::run,  &Avx512<7, W>::run,  &Avx512<8, W>::run,
    &Avx512<9, W>::run, &Avx512<10, W>::run, &Avx512<11, W>::run, &Avx512<12, W>::run};
#endif

enum class Isa { kPortable, kAvx2, kAvx512 };

Isa detect_isa() {
#ifdef SPECDEC_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kPortable;
}

std::atomic<int> g_forced{-1};  // SpecdecMatmulForceIsa; -1 = detected

Isa isa() {
  static const Isa detected = detect_isa();
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Isa>(forced) : detected;
}

template <typename W>
Kernel<W> kernel_for(Isa which) {
#ifdef SPECDEC_X86
  if (which == Isa::kAvx512) return {12, kAvx512<W>};
#endif
  (void)which;
  return {4, kPortable<W>};
}

// rows x K times packed panels [p0, p1) of [P, K, 32] -> columns [32 p0, min(n, 32 p1)) of y [rows, n].
template <typename W>
void matmul_panels(const float* x, int64_t rows, int64_t K, const W* w, int64_t p0, int64_t p1,
                   float* y, int64_t n) {
  const Isa which = isa();
#ifdef SPECDEC_X86
  if (which == Isa::kAvx2) return matmul_panels_avx2(x, rows, K, w, p0, p1, y, n);
#endif
  const Kernel<W> kern = kernel_for<W>(which);
  for (int64_t p = p0; p < p1; ++p) {
    const W* panel = w + p * K * kPanel;
    const int64_t col = p * kPanel;
    const int64_t nv = n - col < kPanel ? n - col : kPanel;
    for (int64_t r = 0; r < rows; r += kern.max_rows) {
      const int64_t mb = rows - r < kern.max_rows ? rows - r : kern.max_rows;
      kern.chunks[mb - 1](x + r * K, K, panel, y + r * n + col, n, nv);
    }
  }
}

std::atomic<int64_t> g_split_bytes{int64_t{64} << 10};  // packed-weight bytes from which to split
std::atomic<int> g_max_helpers{7};                       // helper tasks per call, at most
std::atomic<int64_t> g_split_calls{0};                   // products split so far (tests)
std::atomic<int64_t> g_pool_threads{0};                  // XLA's intra-op threads, last seen

// Panels handed out in blocks; `done` counts finished panels.
struct Split {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t panels = 0, block = 1;
};

// Takes blocks of `split` until none is left, running `body(p0, p1)` on each.
template <typename Body>
void take_blocks(Split& split, const Body& body) {
  for (;;) {
    const int64_t p0 = split.next.fetch_add(split.block, std::memory_order_relaxed);
    if (p0 >= split.panels) return;
    const int64_t p1 = p0 + split.block < split.panels ? p0 + split.block : split.panels;
    body(p0, p1);
    split.done.fetch_add(p1 - p0, std::memory_order_release);
  }
}

// How a product uses threads: kAuto splits when W has at least `g_split_bytes` packed bytes, kOne
// keeps it on the calling thread, kSplit splits whatever its size (the `threads` attribute of
// `specdec_matmul_threads`, chosen per shape by measurement in cpu_kernel/choice.py). Every mode
// gives the same floats: each output column is summed by the same code in the same order.
enum ThreadMode : int32_t { kAuto = 0, kOne = 1, kSplit = 2 };

// rows x K times packed [P, K, 32] -> y [rows, n], split over `pool` as `mode` says.
template <typename W>
void matmul(const float* x, int64_t rows, int64_t K, const W* w, int64_t P, float* y, int64_t n,
            ffi::ThreadPool* pool, int32_t mode) {
  const int64_t bytes = P * K * kPanel * static_cast<int64_t>(sizeof(W));
  const int64_t threads = pool == nullptr ? 1 : pool->num_threads();
  g_pool_threads.store(threads, std::memory_order_relaxed);
  int64_t helpers = threads - 1;
  const int max_helpers = g_max_helpers.load(std::memory_order_relaxed);
  if (helpers > max_helpers) helpers = max_helpers;
  const bool small =
      mode == kAuto ? bytes < g_split_bytes.load(std::memory_order_relaxed) : mode != kSplit;
  if (helpers < 1 || P < 2 || small) {
    matmul_panels(x, rows, K, w, 0, P, y, n);
    return;
  }
  g_split_calls.fetch_add(1, std::memory_order_relaxed);
  auto split = std::make_shared<Split>();
  split->panels = P;
  // About four blocks per thread: late helpers still find work, and blocks stay >= 1 panel.
  split->block = P / (4 * (helpers + 1));
  if (split->block < 1) split->block = 1;
  auto body = [=](int64_t p0, int64_t p1) { matmul_panels(x, rows, K, w, p0, p1, y, n); };
  for (int64_t h = 0; h < helpers; ++h) {
    // The task owns a reference to the counters; it reads x, w, y only for blocks it takes, and
    // every block is taken before this call returns.
    pool->Schedule([split, body]() { take_blocks(*split, body); });
  }
  take_blocks(*split, body);
  while (split->done.load(std::memory_order_acquire) < P) {
#ifdef SPECDEC_X86
    _mm_pause();
#endif
  }
}

std::string dims_str(ffi::AnyBuffer::Dimensions d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// x: [lead..., rows, K] float32; w: [lead..., P, K, 32]; y: [lead..., rows, n]. Leading (vmap)
// axes of x and w are either 1 or the output's size (vmap_method="expand_dims").
ffi::Error MatmulModeImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                          ffi::Result<ffi::AnyBuffer> y, int32_t n, int32_t mode) {
  if (mode != kAuto && mode != kOne && mode != kSplit)
    return ffi::Error::InvalidArgument("specdec_matmul_threads: threads must be 0, 1 or 2; got " +
                                       std::to_string(mode));
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (x.element_type() != ffi::DataType::F32 || y->element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("specdec_matmul: x and y must be float32.");
  const bool bf16 = w.element_type() == ffi::DataType::BF16;
  if (!bf16 && w.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("specdec_matmul: packed weights must be float32 or bfloat16.");
  if (xd.size() < 2 || wd.size() < 3 || yd.size() != xd.size() || wd.size() != xd.size() + 1)
    return ffi::Error::InvalidArgument("specdec_matmul: bad ranks x " + dims_str(xd) + ", w " +
                                       dims_str(wd) + ", y " + dims_str(yd));
  const size_t lead = xd.size() - 2;
  const int64_t rows = xd[lead], K = xd[lead + 1], P = wd[lead];
  if (wd[lead + 1] != K || wd[lead + 2] != kPanel || yd[lead] != rows || yd[lead + 1] != n ||
      n <= (P - 1) * kPanel || n > P * kPanel || rows < 1 || K < 1)
    return ffi::Error::InvalidArgument("specdec_matmul: shapes do not match: x " + dims_str(xd) +
                                       ", w " + dims_str(wd) + ", y " + dims_str(yd) +
                                       ", n = " + std::to_string(n));
  int64_t batches = 1;
  bool w_shared = true;
  for (size_t i = 0; i < lead; ++i) {
    if ((xd[i] != 1 && xd[i] != yd[i]) || (wd[i] != 1 && wd[i] != yd[i]))
      return ffi::Error::InvalidArgument("specdec_matmul: leading axes do not broadcast: x " +
                                         dims_str(xd) + ", w " + dims_str(wd));
    batches *= yd[i];
    w_shared = w_shared && wd[i] == 1;
  }
  const float* xp = static_cast<const float*>(x.untyped_data());
  float* yp = static_cast<float*>(y->untyped_data());
  const int64_t x_size = rows * K, w_size = P * K * kPanel, y_size = rows * n;
  auto run = [&](const float* xb, int64_t nrows, const void* wb, float* yb) {
    if (bf16)
      matmul(xb, nrows, K, static_cast<const uint16_t*>(wb), P, yb, n, &pool, mode);
    else
      matmul(xb, nrows, K, static_cast<const float*>(wb), P, yb, n, &pool, mode);
  };
  const size_t wbytes = bf16 ? 2 : 4;
  bool x_full = true;
  for (size_t i = 0; i < lead; ++i) x_full = x_full && xd[i] == yd[i];
  if (w_shared && x_full) {  // one weight pass for every row of every batch
    run(xp, rows * batches, w.untyped_data(), yp);
    return ffi::Error::Success();
  }
  for (int64_t b = 0; b < batches; ++b) {
    // Offsets of batch b in x and w (axes of size 1 broadcast).
    int64_t rem = b, xo = 0, wo = 0, xs = 1, ws = 1;
    for (size_t i = lead; i-- > 0;) {
      const int64_t idx = rem % yd[i];
      rem /= yd[i];
      if (xd[i] != 1) xo += idx * xs;
      if (wd[i] != 1) wo += idx * ws;
      xs *= xd[i];
      ws *= wd[i];
    }
    run(xp + xo * x_size, rows,
        static_cast<const char*>(w.untyped_data()) + wo * w_size * wbytes, yp + b * y_size);
  }
  return ffi::Error::Success();
}

ffi::Error MatmulImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                      ffi::Result<ffi::AnyBuffer> y, int32_t n) {
  return MatmulModeImpl(pool, x, w, y, n, kAuto);
}

// float32 -> bfloat16, round to nearest even (as XLA's convert), NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline void put(float* d, float v) { *d = v; }
inline void put(uint16_t* d, float v) { *d = f32_to_bf16(v); }

// Copies one full 32-column panel row. float32 on x86: non-temporal stores (the packed copy is
// written once and read later, so skipping the read-for-ownership of each line saves a third of the
// memory traffic); panel rows are 128 bytes and XLA buffers 64-byte aligned, as _mm_stream_ps needs.
inline void put_row(float* dst, const float* src) {
#if defined(SPECDEC_X86)
  for (int64_t j = 0; j < kPanel; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
#else
  std::memcpy(dst, src, kPanel * sizeof(float));
#endif
}
inline void put_row(uint16_t* dst, const float* src) {
  for (int64_t j = 0; j < kPanel; ++j) dst[j] = f32_to_bf16(src[j]);
}

// Asks for transparent huge pages on the 2 MiB-aligned interior of a large fresh output: first-touch
// page faults (one per 4 KiB) otherwise cost more than the copy. A hint only; errors are ignored.
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t huge = uintptr_t{2} << 20;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(huge - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#endif
}

// w [K, N] row-major -> panels [P, K, 32] (zero past N), one pass over w: blocks of 8 panels, so each
// row is read 1 KiB at a time and the output is written as 8 sequential streams.
template <typename W>
void pack(const float* w, int64_t K, int64_t N, int64_t P, W* out) {
  constexpr int64_t kBlock = 8;
  for (int64_t p0 = 0; p0 < P; p0 += kBlock) {
    const int64_t p1 = p0 + kBlock < P ? p0 + kBlock : P;
    for (int64_t k = 0; k < K; ++k) {
      const float* row = w + k * N;
      for (int64_t p = p0; p < p1; ++p) {
        W* dst = out + (p * K + k) * kPanel;
        const int64_t nv = N - p * kPanel < kPanel ? N - p * kPanel : kPanel;
        if (nv == kPanel) {
          put_row(dst, row + p * kPanel);
        } else {
          for (int64_t j = 0; j < nv; ++j) put(dst + j, row[p * kPanel + j]);
          for (int64_t j = nv; j < kPanel; ++j) put(dst + j, 0.0f);
        }
      }
    }
  }
#if defined(SPECDEC_X86)
  _mm_sfence();  // order the non-temporal stores before XLA reads the buffer
#endif
}

// w: float32 [lead..., K, N]; out: float32 or bfloat16 [lead..., P, K, 32].
ffi::Error PackImpl(ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out) {
  const auto wd = w.dimensions(), od = out->dimensions();
  const bool bf16 = out->element_type() == ffi::DataType::BF16;
  if (w.element_type() != ffi::DataType::F32 ||
      (!bf16 && out->element_type() != ffi::DataType::F32))
    return ffi::Error::InvalidArgument("specdec_pack: float32 in, float32/bfloat16 out.");
  if (wd.size() < 2 || od.size() != wd.size() + 1)
    return ffi::Error::InvalidArgument("specdec_pack: bad ranks w " + dims_str(wd) + ", out " +
                                       dims_str(od));
  const size_t lead = wd.size() - 2;
  const int64_t K = wd[lead], N = wd[lead + 1], P = od[lead];
  int64_t batches = 1;
  for (size_t i = 0; i < lead; ++i) {
    if (wd[i] != od[i]) return ffi::Error::InvalidArgument("specdec_pack: leading axes differ");
    batches *= wd[i];
  }
  if (od[lead + 1] != K || od[lead + 2] != kPanel || P != (N + kPanel - 1) / kPanel || K < 1 ||
      N < 1)
    return ffi::Error::InvalidArgument("specdec_pack: shapes do not match: w " + dims_str(wd) +
                                       ", out " + dims_str(od));
  const float* wp = static_cast<const float*>(w.untyped_data());
  advise_huge_pages(out->untyped_data(), out->size_bytes());
  for (int64_t b = 0; b < batches; ++b) {
    if (bf16)
      pack(wp + b * K * N, K, N, P, static_cast<uint16_t*>(out->untyped_data()) + b * P * K * kPanel);
    else
      pack(wp + b * K * N, K, N, P, static_cast<float*>(out->untyped_data()) + b * P * K * kPanel);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPack, PackImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecMatmul, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("n"));

// The same product with its thread use fixed by the `threads` attribute: 0 the size rule, 1 the
// calling thread only, 2 split over XLA's intra-op pool (same floats whatever the value).
XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecMatmulThreads, MatmulModeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("n")
                                  .Attr<int32_t>("threads"));

// Which code path this CPU runs: "avx512f", "avx2+fma" or "portable".
extern "C" const char* SpecdecMatmulIsa() {
  switch (isa()) {
    case Isa::kAvx512:
      return "avx512f";
    case Isa::kAvx2:
      return "avx2+fma";
    default:
      return "portable";
  }
}

// The same as a number (attention.cc): 0 portable, 1 avx2+fma, 2 avx512f.
extern "C" int SpecdecMatmulIsaCode() { return static_cast<int>(isa()); }

// Forces a code path (tests and A/B timing): 0 portable, 1 avx2+fma, 2 avx512f, -1 back to the
// detected one. Returns 1 if done, 0 if this CPU cannot run that path (nothing changes).
extern "C" int SpecdecMatmulForceIsa(int which) {
  if (which < -1 || which > 2) return 0;
  if (which > static_cast<int>(detect_isa())) return 0;
  g_forced.store(which, std::memory_order_relaxed);
  return 1;
}

// Packed-weight bytes from which a product is split over XLA's intra-op threads (tests and A/B
// timing; a huge value keeps every product on the calling thread). Returns the previous value.
extern "C" int64_t SpecdecMatmulSetSplitBytes(int64_t bytes) {
  return g_split_bytes.exchange(bytes < 0 ? 0 : bytes, std::memory_order_relaxed);
}

// How many products have been split over threads so far, and how many threads XLA's intra-op
// pool reported to the last call (tests: the split path must really run).
extern "C" int64_t SpecdecMatmulSplitCalls() { return g_split_calls.load(); }
extern "C" int64_t SpecdecMatmulPoolThreads() { return g_pool_threads.load(); }
