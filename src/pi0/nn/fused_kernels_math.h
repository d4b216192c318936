// The per-element arithmetic of our fused kernels (nn/fused_kernels.h), one definition for the CPU loop and the CUDA
// kernel, so the CPU tests of the math against ATen's composite also test what the GPU computes.
#pragma once
#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

namespace pi0::nn::kernels {

/// One rotation pair of RoPE's split-half layout: (x1, x2) = (x[i], x[i + D/2]) by the angle with cosine c and sine
/// s, in T (float32 for bf16 and float32 input, float64 for float64): [x1·c − x2·s ; x2·c + x1·s]. The composite
/// (nn::apply_rope with rotary tables) forms the same two products and one sum per output (x·cos + roll(x)·(∓sin)),
/// but ATen's AVX2 and CUDA kernels contract its sum into an FMA: the two agree to one float32 ulp, not bit for bit.
template <class T>
C10_HOST_DEVICE inline void rope_pair(T x1, T x2, T c, T s, T& o1, T& o2) {
  o1 = x1 * c - x2 * s;
  o2 = x2 * c + x1 * s;
}

/// GeGLU's element: gelu_tanh(a) · b in T, rounded once by the caller. gelu_tanh as ATen computes it
/// (0.5·a·(1 + tanh(√(2/π)·(a + 0.044715·a³)))); the composite rounds gelu's output to the storage dtype before the
/// product, this does not (bf16: one rounding of 2^-9 relative instead of two).
template <class T>
C10_HOST_DEVICE inline T gelu_tanh_mul(T a, T b) {
  using std::tanh;
  const T beta = static_cast<T>(0.7978845608028654);  // √2 · 2/√π · 1/2 = √(2/π)
  const T kappa = static_cast<T>(0.044715);
  const T inner = beta * (a + kappa * (a * a * a));
  return static_cast<T>(0.5) * a * (static_cast<T>(1) + tanh(inner)) * b;
}

/// Shapes and element strides of one rope_scatter call (q, k, v heads of qkv; tables indexed by b, t, i).
struct RopeScatterLayout {
  int64_t n = 0, k = 0, g = 1, half = 0;  ///< q heads, kv heads (k and v each), q heads per kv head, D/2
  int64_t x[4] = {};                      ///< qkv [B,T,N+2K,D]
  int64_t tab[3] = {};                    ///< cos, sin [B,T,D/2] (the size-1 head dim dropped; broadcast = 0)
  int64_t q[5] = {};                      ///< q_out [B,K,T,G,D]
  int64_t kv[4] = {};                     ///< kv_out [B,T,2K,D]
};

/// Where head h of row (b, t) goes: q heads into q_out (null when q_out is), k and v heads into kv_out; `step` is
/// the destination's element stride along D.
template <class scalar_t>
C10_HOST_DEVICE inline scalar_t* rope_scatter_destination(const RopeScatterLayout& l, int64_t b, int64_t t,
                                                          int64_t h, scalar_t* q_out, scalar_t* kv_out,
                                                          int64_t& step) {
  if (h < l.n) {
    step = l.q[4];
    return q_out == nullptr ? nullptr : q_out + b * l.q[0] + (h / l.g) * l.q[1] + t * l.q[2] + (h % l.g) * l.q[3];
  }
  step = l.kv[3];
  return kv_out + b * l.kv[0] + t * l.kv[1] + (h - l.n) * l.kv[2];
}

/// Pair i < D/2 of head h of row (b, t): x[i] and x[i + D/2] rotated (q and k heads) or copied exactly (v heads)
/// into `out` (rope_scatter_destination's, with its `step`).
template <class scalar_t, class acc_t>
C10_HOST_DEVICE inline void rope_scatter_pair(const RopeScatterLayout& l, int64_t b, int64_t t, int64_t h,
                                              int64_t i, const scalar_t* qkv, const acc_t* cos, const acc_t* sin,
                                              scalar_t* out, int64_t step) {
  const scalar_t* x = qkv + b * l.x[0] + t * l.x[1] + h * l.x[2];
  const scalar_t a = x[i * l.x[3]], z = x[(i + l.half) * l.x[3]];
  if (h >= l.n + l.k) {  // a value head: passed through
    out[i * step] = a;
    out[(i + l.half) * step] = z;
    return;
  }
  const int64_t ti = b * l.tab[0] + t * l.tab[1] + i * l.tab[2];
  acc_t o1, o2;
  rope_pair<acc_t>(static_cast<acc_t>(a), static_cast<acc_t>(z), cos[ti], sin[ti], o1, o2);
  out[i * step] = static_cast<scalar_t>(o1);
  out[(i + l.half) * step] = static_cast<scalar_t>(o2);
}

}  // namespace pi0::nn::kernels
