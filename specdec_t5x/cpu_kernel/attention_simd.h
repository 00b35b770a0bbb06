// The fused attention's vector steps, written once over one ISA's vector traits (attention.cc).
//
// No include guard: attention.cc includes this file once per ISA, each time inside that ISA's
// `#pragma GCC target` region and namespace, after defining there `Isa`, the traits:
//   V, Mask              the float32 vector and the mask of its first lanes; kWidth lanes per V
//   load / store / set1 / setzero / add / sub / mul / div / max / min / fmadd / fnmadd
//   round_nearest(x)     round to nearest even, no exceptions
//   scale2n(p, n)        p * 2^n, n integral-valued (one rounding)
//   first_lanes(count)   lanes [0, count) on, count in [0, kWidth)
//   load_first / store_first (masked load and store; lanes off read 0 and are not written)
//   max_first(mx, m, x)  max in the lanes of m, mx elsewhere
//   add_first(s, m, x)   add in the lanes of m, s elsewhere
//   hsum / hmax          sum / max of the lanes
// so every function here is compiled for that ISA alone and inlines into its callers there.

// exp(x) for float32 lanes: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r, scaled by 2^n
// (`Isa::scale2n`: no exponent-field overflow, and underflow goes to 0 / denormals as it should).
// Relative error ~1e-7 on [-87, 88]; large negative inputs (masked logits) give 0.
__attribute__((always_inline)) inline Isa::V exp_v(Isa::V x) {
  x = Isa::max(x, Isa::set1(-104.0f));
  x = Isa::min(x, Isa::set1(88.7f));
  const Isa::V n = Isa::round_nearest(Isa::mul(x, Isa::set1(1.44269504088896341f)));
  Isa::V r = Isa::fnmadd(n, Isa::set1(0.693359375f), x);
  r = Isa::fnmadd(n, Isa::set1(-2.12194440e-4f), r);
  Isa::V p = Isa::set1(1.9875691500e-4f);
  p = Isa::fmadd(p, r, Isa::set1(1.3981999507e-3f));
  p = Isa::fmadd(p, r, Isa::set1(8.3334519073e-3f));
  p = Isa::fmadd(p, r, Isa::set1(4.1665795894e-2f));
  p = Isa::fmadd(p, r, Isa::set1(1.6666665459e-1f));
  p = Isa::fmadd(p, r, Isa::set1(5.0000001201e-1f));
  p = Isa::fmadd(p, Isa::mul(r, r), Isa::add(r, Isa::set1(1.0f)));
  return Isa::scale2n(p, n);
}

// One logits row in place: row[j] += brow[j], then the softmax over j < S (max subtracted, exp,
// sum, divide: p = e / sum as jax.nn.softmax divides, not a multiply by the reciprocal).
__attribute__((always_inline)) inline void softmax_row(float* row, const float* brow, int64_t S) {
  constexpr int W = Isa::kWidth;
  Isa::V mx = Isa::set1(-INFINITY);
  int64_t j = 0;
  for (; j + W <= S; j += W) {
    const Isa::V x = Isa::add(Isa::load(row + j), Isa::load(brow + j));
    Isa::store(row + j, x);
    mx = Isa::max(mx, x);
  }
  const int64_t tail = S - j;  // 0 to W - 1 lanes left
  const Isa::Mask m = Isa::first_lanes(tail);
  if (tail > 0) {
    const Isa::V x = Isa::add(Isa::load_first(m, row + j), Isa::load_first(m, brow + j));
    Isa::store_first(row + j, m, x);
    mx = Isa::max_first(mx, m, x);
  }
  const Isa::V mxv = Isa::set1(Isa::hmax(mx));
  Isa::V sum = Isa::setzero();
  for (j = 0; j + W <= S; j += W) {
    const Isa::V e = exp_v(Isa::sub(Isa::load(row + j), mxv));
    Isa::store(row + j, e);
    sum = Isa::add(sum, e);
  }
  if (tail > 0) {
    const Isa::V e = exp_v(Isa::sub(Isa::load_first(m, row + j), mxv));
    Isa::store_first(row + j, m, e);
    sum = Isa::add_first(sum, m, e);
  }
  const Isa::V den = Isa::set1(Isa::hsum(sum));
  for (j = 0; j + W <= S; j += W) Isa::store(row + j, Isa::div(Isa::load(row + j), den));
  if (tail > 0) Isa::store_first(row + j, m, Isa::div(Isa::load_first(m, row + j), den));
}
