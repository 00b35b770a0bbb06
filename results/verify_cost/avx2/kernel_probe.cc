// The matmul kernel alone, one thread, per-call CPU time: the earlier AVX2 code (3-row chunks on
// whole 32-column panel rows, copied below), the current AVX2 path and the AVX-512 path, each
// product on its own copy of the weights (copies totalling `stream_mib`: DRAM or L3 resident).
// Checks first that the current AVX2 path gives the earlier code's bits for every M.
//
//   INC=$(python -c "import jaxlib, os; print(os.path.join(os.path.dirname(jaxlib.__file__), 'include'))")
//   g++ -O3 -std=c++17 -Wno-return-type -I$INC -I specdec_t5x/cpu_kernel \
//       results/verify_cost/avx2/kernel_probe.cc -o /tmp/kernel_probe
//   /tmp/kernel_probe K N [stream_mib=96] [bf16=0] [rounds=9] [Ms=1,2,4,6,8,12,16]
//
// Prints one markdown row per M: µs per product and GFLOP/s for each path (median of rounds,
// the paths interleaved round by round).
#include "matmul.cc"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {
template <int MB, typename W>
__attribute__((target("avx2,fma"))) void chunk_avx2_before(const float* x, int64_t K, const W* w,
                                                           float* y, int64_t ldy, int64_t nv) {
  __m256 acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const W* wk = w + k * kPanel;
    prefetch_row(wk);
    __m256 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = load8(wk + 8 * j);
    for (int m = 0; m < MB; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * K + k);
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm256_fmadd_ps(xb, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    float tmp[kPanel];
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(tmp + 8 * j, acc[m][j]);
    std::memcpy(y + m * ldy, tmp, nv * sizeof(float));
  }
}

template <typename W>
const ChunkFn<W> kBefore[] = {&chunk_avx2_before<1, W>, &chunk_avx2_before<2, W>,
                              &chunk_avx2_before<3, W>};

template <typename W>
void run_path(int path, const float* x, int64_t M, int64_t K, const W* w, int64_t P, float* y,
              int64_t n) {
  if (path == 0) {  // the earlier AVX2 code
    for (int64_t p = 0; p < P; ++p)
      for (int64_t r = 0; r < M; r += 3) {
        const int64_t mb = M - r < 3 ? M - r : 3, nv = n - p * 32 < 32 ? n - p * 32 : 32;
        kBefore<W>[mb - 1](x + r * K, K, w + p * K * 32, y + r * n + p * 32, n, nv);
      }
    return;
  }
  g_forced.store(path == 1 ? 1 : 2);
  matmul_panels(x, M, K, w, 0, P, y, n);
}

double cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s K N [stream_mib] [bf16] [rounds] [Ms]\n", argv[0]);
    return 2;
  }
  const int64_t K = atoi(argv[1]), N = atoi(argv[2]);
  const int stream_mib = argc > 3 ? atoi(argv[3]) : 96;
  const bool bf16 = argc > 4 && atoi(argv[4]);
  const int rounds = argc > 5 ? atoi(argv[5]) : 9;
  std::vector<int> Ms;
  for (const char* c = argc > 6 ? argv[6] : "1,2,4,6,8,12,16"; *c;) {
    Ms.push_back(atoi(c));
    while (*c && *c != ',') ++c;
    if (*c) ++c;
  }
  const int64_t P = (N + 31) / 32, wsize = P * K * 32;
  const size_t wbytes = wsize * (bf16 ? 2 : 4);
  const int64_t copies = std::max<int64_t>(1, (int64_t{stream_mib} << 20) / wbytes);
  std::mt19937 rng(0);
  std::normal_distribution<float> nd;
  std::vector<float> w(wsize), W32;
  std::vector<uint16_t> W16;
  for (auto& v : w) v = nd(rng);
  if (bf16) {
    W16.resize(wsize * copies);
    for (int64_t i = 0; i < wsize * copies; ++i) W16[i] = f32_to_bf16(w[i % wsize]);
  } else {
    W32.resize(wsize * copies);
    for (int64_t i = 0; i < wsize * copies; ++i) W32[i] = w[i % wsize];
  }
  const int maxM = *std::max_element(Ms.begin(), Ms.end());
  std::vector<float> x(maxM * K), y(maxM * N), y2(maxM * N);
  for (auto& v : x) v = nd(rng);
  auto call = [&](int path, int M, int64_t c, float* out) {
    if (bf16)
      run_path(path, x.data(), M, K, W16.data() + c * wsize, P, out, N);
    else
      run_path(path, x.data(), M, K, W32.data() + c * wsize, P, out, N);
  };
  for (int M : Ms) {
    call(0, M, 0, y.data());
    call(1, M, 0, y2.data());
    if (std::memcmp(y.data(), y2.data(), M * N * sizeof(float)))
      std::printf("M=%d: the AVX2 path's bits differ from the earlier code's\n", M);
  }
  std::printf("| %ldx%ld %s, %.0f MiB | M | earlier AVX2 | AVX2 | AVX-512 |\n", K, N,
              bf16 ? "bf16" : "f32", copies * wbytes / 1048576.0);
  for (int M : Ms) {
    std::vector<double> t[3];
    for (int r = 0; r <= rounds; ++r)
      for (int path = 0; path < 3; ++path) {
        const double t0 = cpu_s();
        for (int64_t c = 0; c < copies; ++c) call(path, M, c, y.data());
        if (r > 0) t[path].push_back((cpu_s() - t0) / copies);  // round 0 warms up
      }
    std::printf("| | %d", M);
    for (auto& tp : t) {
      std::sort(tp.begin(), tp.end());
      const double s = tp[tp.size() / 2];
      std::printf(" | %.1f µs, %.0f GFLOP/s", s * 1e6, 2.0 * M * K * N / s / 1e9);
    }
    std::printf(" |\n");
  }
  g_forced.store(-1);
}
