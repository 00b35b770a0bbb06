// This machine's roofline for the CPU kernel: FMA rate (ymm = AVX2, zmm = AVX-512; 1..24
// independent chains) and read bandwidth (1 and 2 threads, buffers from L2 to DRAM size).
//
//   g++ -O2 -std=c++17 -pthread roofline_probe.cc -o roofline_probe && ./roofline_probe
//
// Rates are per CPU-second of each thread (CLOCK_THREAD_CPUTIME_ID), so time the thread spent
// descheduled by other jobs on a shared machine does not count; cache and memory contention do.
// The clock is estimated from a chain of dependent integer adds (1 cycle each).
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

static double cpu() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

__attribute__((noinline)) long add_chain(long n) {
  long x = 0;
  for (long i = 0; i < n; ++i)
    asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  return x;
}

template <int C>
__attribute__((target("avx2,fma"), noinline)) float fma_ymm(long iters) {
  __m256 a[C];
  for (int i = 0; i < C; ++i) a[i] = _mm256_set1_ps(0.001f * i);
  const __m256 x = _mm256_set1_ps(0.9999f), y = _mm256_set1_ps(0.0001f);
  for (long t = 0; t < iters; ++t) {
#pragma GCC unroll 32
    for (int i = 0; i < C; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
  }
  __m256 s = a[0];
  for (int i = 1; i < C; ++i) s = _mm256_add_ps(s, a[i]);
  float o[8];
  _mm256_storeu_ps(o, s);
  return o[0];
}

template <int C>
__attribute__((target("avx512f"), noinline)) float fma_zmm(long iters) {
  __m512 a[C];
  for (int i = 0; i < C; ++i) a[i] = _mm512_set1_ps(0.001f * i);
  const __m512 x = _mm512_set1_ps(0.9999f), y = _mm512_set1_ps(0.0001f);
  for (long t = 0; t < iters; ++t) {
#pragma GCC unroll 32
    for (int i = 0; i < C; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
  }
  __m512 s = a[0];
  for (int i = 1; i < C; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2"), noinline)) float read_sum(const float* p, long n, int reps) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int r = 0; r < reps; ++r)
    for (long i = 0; i < n; i += 32) {
      s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
      s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
      s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
      s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
    }
  s0 = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  float o[8];
  _mm256_storeu_ps(o, s0);
  return o[0];
}

// Runs f(i) on `threads` threads; the largest per-thread CPU time.
template <class F>
double on_threads(int threads, F f) {
  std::vector<std::thread> ts;
  std::vector<double> c(threads);
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] {
      const double t0 = cpu();
      f(i);
      c[i] = cpu() - t0;
    });
  for (auto& t : ts) t.join();
  return *std::max_element(c.begin(), c.end());
}

volatile float sink;

int main() {
  const double t0 = cpu();
  const long n = 500000000;
  sink = add_chain(n);
  const double ghz = 4.0 * n / (cpu() - t0) / 1e9;
  printf("clock (dependent integer adds): %.2f GHz\n", ghz);
  const long it = 20000000;
#define YMM(C)                                                                          \
  {                                                                                     \
    const double t = on_threads(1, [&](int) { sink = fma_ymm<C>(it); });                \
    printf("ymm %2d chains: %.2f FMA/cycle, %.1f GFLOP/s per core\n", C,                \
           C * it / t / 1e9 / ghz, C * it * 16.0 / t / 1e9);                            \
  }
#define ZMM(C)                                                                          \
  {                                                                                     \
    const double t = on_threads(1, [&](int) { sink = fma_zmm<C>(it); });                \
    printf("zmm %2d chains: %.2f FMA/cycle, %.1f GFLOP/s per core\n", C,                \
           C * it / t / 1e9 / ghz, C * it * 32.0 / t / 1e9);                            \
  }
  YMM(1) YMM(4) YMM(8) YMM(12) ZMM(1) ZMM(4) ZMM(8) ZMM(12) ZMM(24)
  for (long mib : {1, 8, 24, 256}) {  // per thread
    const long floats = mib << 18;
    std::vector<std::vector<float>> bufs(2, std::vector<float>(floats, 1.0f));
    for (int threads : {1, 2}) {
      std::vector<double> r;
      const int reps = static_cast<int>(std::max(1L, 2048 / mib));
      for (int rep = 0; rep < 7; ++rep) {
        const double t = on_threads(threads, [&](int i) { sink = read_sum(bufs[i].data(), floats, reps); });
        r.push_back(threads * floats * 4.0 * reps / t / 1e9);
      }
      std::sort(r.begin(), r.end());
      printf("read %3ld MiB per thread, %d thread(s): %.1f GB/s (median of 7; max %.1f)\n", mib,
             threads, r[3], r[6]);
    }
  }
}
