// CPU reference for the pieces of CCA attention (ZAYA1.md §3.1): mean skip, the two causal
// convolutions, QK-norm with temperature, partial NeoX RoPE, causal GQA attention (with an optional
// sliding window), and their backward passes. The grouped convolution is a per-group matrix product
// over the unfolded time window, and attention works on blocks of query rows whose scores,
// outputs and gradients are matrix products (cpu::gemm); it never materialises more than a
// block × keys score matrix, and backward recomputes probabilities from the saved log-sum-exp.
#include <cfloat>
#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "core/parallel.h"

namespace zaya::cpu {

void cca_mean_skip(float* mq, float* mk, const float* q0, const float* k0, int64_t N, int64_t Hq,
                   int64_t Hkv, int64_t d) {
  const int64_t G = Hq / Hkv;
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++) {
      for (int64_t h = 0; h < Hq; h++) {
        const float* q = q0 + (n * Hq + h) * d;
        const float* k = k0 + (n * Hkv + h / G) * d;
        float* o = mq + (n * Hq + h) * d;
        for (int64_t i = 0; i < d; i++) o[i] = (q[i] + k[i]) * 0.5f;
      }
      for (int64_t g = 0; g < Hkv; g++) {
        float* o = mk + (n * Hkv + g) * d;
        for (int64_t i = 0; i < d; i++) {
          float s = 0;
          for (int64_t j = 0; j < G; j++) s += mq[(n * Hq + g * G + j) * d + i];
          o[i] = s / float(G);
        }
      }
    }
  });
}

namespace {

// Grows a per-thread scratch buffer to n floats and returns it (contents unspecified). Training
// calls the same shapes every step, so the buffers are kept between calls ...
float* scratch(std::vector<float>& buf, int64_t n) {
  if (int64_t(buf.size()) < n) buf.resize(size_t(n));
  return buf.data();
}

// ... unless they are large (a long prefill of a big model), which would otherwise pin that much
// memory for the life of the thread.
void release_if_large(std::vector<float>& buf) {
  if (buf.size() > (size_t(8) << 20)) std::vector<float>().swap(buf);
}

// unf[n, c, j] = u[b, t + j, c] for token n = (b, t): the grouped convolution's inputs of every
// output step side by side, so that group g's convolution is the product of unf's columns
// [g·d·t1, (g+1)·d·t1) with the group's weight [d, d·t1] (laid out (ci, j) like unf).
void unfold(float* unf, const float* u, int64_t B, int64_t S, int64_t C, int64_t t1) {
  const int64_t M = S + t1 - 1;
  parallel_for(B * S, [&](int64_t nb, int64_t ne) {
    for (int64_t n = nb; n < ne; n++) {
      const int64_t b = n / S, t = n % S;
      float* dst = unf + n * C * t1;
      for (int64_t j = 0; j < t1; j++) {
        const float* src = u + (b * M + t + j) * C;
        for (int64_t c = 0; c < C; c++) dst[c * t1 + j] = src[c];
      }
    }
  });
}

}  // namespace

// The depthwise convolution is elementwise over channels (vectorised over c); the grouped one is,
// per group, a [B·S, d·t1] × [d·t1, d] product (cpu::gemm) of the unfolded depthwise output.
void cca_conv(float* y, float* mid, const float* x, const float* hist, const float* wdw,
              const float* bdw, const float* wg, const float* bg, int64_t B, int64_t S, int64_t C,
              int64_t d, int64_t t0, int64_t t1) {
  const int64_t P = (t0 - 1) + (t1 - 1);
  const int64_t M = S + t1 - 1;  // depthwise output length
  const int64_t groups = C / d, KU = d * t1;
  thread_local std::vector<float> ubuf, unfbuf, wtbuf;
  float* u = mid ? mid : scratch(ubuf, B * M * C);
  float* wt = scratch(wtbuf, t0 * C);  // wdw transposed to [t0, C]: unit stride over channels
  for (int64_t c = 0; c < C; c++)
    for (int64_t j = 0; j < t0; j++) wt[j * C + c] = wdw[c * t0 + j];
  // u[b,i,c] = bdw[c] + Σ_j wdw[c,j] · p[b,i+j,c] over the left-padded input p.
  parallel_for(B * M, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; r++) {
      const int64_t b = r / M, i = r % M;
      float* ur = u + r * C;
      for (int64_t c = 0; c < C; c++) ur[c] = bdw[c];
      for (int64_t j = 0; j < t0; j++) {
        const int64_t pi = i + j;
        const float* src = pi >= P ? x + (b * S + pi - P) * C
                           : hist  ? hist + (b * P + pi) * C
                                   : nullptr;
        if (!src) continue;  // zero padding adds nothing
        const float* w = wt + j * C;
        for (int64_t c = 0; c < C; c++) ur[c] += w[c] * src[c];
      }
    }
  });
  float* unf = scratch(unfbuf, B * S * C * t1);
  unfold(unf, u, B, S, C, t1);
  for (int64_t g = 0; g < groups; g++) {
    const int64_t c0 = g * d;
    gemm(y + c0, C, rows_of(unf + c0 * t1, C * t1), transpose_of(wg + c0 * KU, KU), B * S, KU, d,
         1.0f, 0.0f, bg + c0);
  }
  release_if_large(ubuf);
  release_if_large(unfbuf);
}

void cca_conv_backward(float* dx, float* dwdw, float* dbdw, float* dwg, float* dbg, const float* dy,
                       const float* x, const float* mid, const float* wdw, const float* wg,
                       int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1,
                       const float* hist, float* dhist) {
  const int64_t P = (t0 - 1) + (t1 - 1);
  const int64_t M = S + t1 - 1;
  const int64_t N = B * S, groups = C / d, KU = d * t1;
  thread_local std::vector<float> unfbuf, dunfbuf, dubuf;
  // Grouped convolution: dbg sums dy over tokens in order; per group, dW_g += dy_gᵀ · unf_g and
  // d(unf_g) = dy_g · W_g.
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) dbg[c] += dy[n * C + c];
  float* unf = scratch(unfbuf, N * C * t1);
  float* dunf = scratch(dunfbuf, N * C * t1);
  unfold(unf, mid, B, S, C, t1);
  for (int64_t g = 0; g < groups; g++) {
    const int64_t c0 = g * d;
    gemm(dwg + c0 * KU, KU, transpose_of(dy + c0, C), rows_of(unf + c0 * t1, C * t1), d, N, KU,
         1.0f, 1.0f);
    gemm(dunf + c0 * t1, C * t1, rows_of(dy + c0, C), rows_of(wg + c0 * KU, KU), N, d, KU);
  }
  // Fold the unfolded gradient back onto the depthwise output: du[b,i,c] = Σ_j dunf[b,i−j,c,j].
  float* du = scratch(dubuf, B * M * C);
  parallel_for(B * M, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; r++) {
      const int64_t b = r / M, i = r % M;
      float* dr = du + r * C;
      for (int64_t c = 0; c < C; c++) dr[c] = 0.0f;
      for (int64_t j = 0; j < t1; j++) {
        const int64_t t = i - j;
        if (t < 0 || t >= S) continue;
        const float* src = dunf + (b * S + t) * C * t1 + j;
        for (int64_t c = 0; c < C; c++) dr[c] += src[c * t1];
      }
    }
  });
  // Depthwise convolution, on [t0, C] copies of its weight and weight gradient (unit stride over
  // channels). The weight and bias gradients sum over (b, i) in order on one thread;
  // dx[b,t,c] = Σ_j du[b, t+P−j, c] · wdw[c,j] is independent per token.
  thread_local std::vector<float> wtbuf, dwtbuf;
  float* wt = scratch(wtbuf, t0 * C);
  float* dwt = scratch(dwtbuf, t0 * C);
  for (int64_t c = 0; c < C; c++)
    for (int64_t j = 0; j < t0; j++) {
      wt[j * C + c] = wdw[c * t0 + j];
      dwt[j * C + c] = 0.0f;
    }
  for (int64_t r = 0; r < B * M; r++) {
    const int64_t b = r / M, i = r % M;
    const float* dr = du + r * C;
    for (int64_t c = 0; c < C; c++) dbdw[c] += dr[c];
    for (int64_t j = 0; j < t0; j++) {
      const int64_t pi = i + j;       // padded index
      if (pi < P && !hist) continue;  // zero padding: no input, no weight gradient
      const float* xr = pi < P ? hist + (b * P + pi) * C : x + (b * S + pi - P) * C;
      float* dw = dwt + j * C;
      for (int64_t c = 0; c < C; c++) dw[c] += dr[c] * xr[c];
    }
  }
  for (int64_t c = 0; c < C; c++)
    for (int64_t j = 0; j < t0; j++) dwdw[c * t0 + j] += dwt[j * C + c];
  parallel_for(N, [&](int64_t nb, int64_t ne) {
    for (int64_t n = nb; n < ne; n++) {
      const int64_t b = n / S, t = n % S;
      float* dxr = dx + n * C;
      for (int64_t c = 0; c < C; c++) dxr[c] = 0.0f;
      for (int64_t j = t0 - 1; j >= 0; j--) {
        const int64_t i = t + P - j;
        if (i >= M) continue;
        const float* dr = du + (b * M + i) * C;
        const float* w = wt + j * C;
        for (int64_t c = 0; c < C; c++) dxr[c] += dr[c] * w[c];
      }
    }
  });
  // The history columns are padded indices 0..P-1: dhist[b,p,c] = Σ_j du[b, p−j, c] · wdw[c,j].
  if (hist && dhist)
    for (int64_t b = 0; b < B; b++)
      for (int64_t p = 0; p < P; p++) {
        float* dh = dhist + (b * P + p) * C;
        for (int64_t c = 0; c < C; c++) dh[c] = 0.0f;
        for (int64_t j = t0 - 1; j >= 0; j--) {
          const int64_t i = p - j;
          if (i < 0 || i >= M) continue;
          const float* dr = du + (b * M + i) * C;
          const float* w = wt + j * C;
          for (int64_t c = 0; c < C; c++) dh[c] += dr[c] * w[c];
        }
      }
  release_if_large(unfbuf);
  release_if_large(dunfbuf);
  release_if_large(dubuf);
}

void qk_norm(float* y, float* norm, const float* x, const float* temp, int64_t N, int64_t H,
             int64_t d) {
  const float sd = std::sqrt(float(d));
  parallel_for(N * H, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      const float* xr = x + r * d;
      float ss = 0;
      for (int64_t i = 0; i < d; i++) ss += xr[i] * xr[i];
      const float n = std::max(std::sqrt(ss), FLT_EPSILON);
      if (norm) norm[r] = n;
      const float a = sd * (temp ? temp[r % H] : 1.0f) / n;
      for (int64_t i = 0; i < d; i++) y[r * d + i] = xr[i] * a;
    }
  });
}

void qk_norm_backward(float* dx, float* dtemp, const float* dy, const float* x, const float* norm,
                      const float* temp, int64_t N, int64_t H, int64_t d) {
  const float sd = std::sqrt(float(d));
  parallel_for(N * H, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      const float* xr = x + r * d;
      const float* g = dy + r * d;
      const float n = norm[r];
      const float t = temp ? temp[r % H] : 1.0f;
      float xg = 0;
      for (int64_t i = 0; i < d; i++) xg += xr[i] * g[i];
      const bool clamped = n <= FLT_EPSILON;
      for (int64_t i = 0; i < d; i++)
        dx[r * d + i] = sd * t * (g[i] / n - (clamped ? 0.0f : xr[i] * xg / (n * n * n)));
    }
  });
  if (dtemp)
    for (int64_t r = 0; r < N * H; r++) {
      float xg = 0;
      for (int64_t i = 0; i < d; i++) xg += x[r * d + i] * dy[r * d + i];
      dtemp[r % H] += sd * xg / norm[r];
    }
}

namespace {
// Rotates each (j, j + r/2) pair of the first r dims of every head by the angle pos · θ^(−2j/r),
// or by its negative (sign −1: the backward of the rotation is its inverse). Negating the sine is
// exact, so the backward's rounding is that of the direct formula.
void rotate_pairs(float* x, const int64_t* pos, double theta, int64_t N, int64_t H, int64_t d,
                  int64_t r, float sign) {
  std::vector<float> inv(size_t(r / 2));
  for (int64_t j = 0; j < r / 2; j++)
    inv[size_t(j)] = 1.0f / std::pow(float(theta), float(2 * j) / float(r));
  const int64_t h2 = r / 2;
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++)
      for (int64_t j = 0; j < h2; j++) {
        const float f = float(pos[n]) * inv[size_t(j)];
        const float c = std::cos(f), s = sign * std::sin(f);
        for (int64_t h = 0; h < H; h++) {
          float* v = x + (n * H + h) * d;
          const float a = v[j], bb = v[j + h2];
          v[j] = a * c - bb * s;
          v[j + h2] = bb * c + a * s;
        }
      }
  });
}
}  // namespace

void rope(float* x, const int64_t* pos, double theta, int64_t N, int64_t H, int64_t d, int64_t r) {
  rotate_pairs(x, pos, theta, N, H, d, r, 1.0f);
}

void rope_backward(float* dx, const int64_t* pos, double theta, int64_t N, int64_t H, int64_t d,
                   int64_t r) {
  rotate_pairs(dx, pos, theta, N, H, d, r, -1.0f);
}

// Attention works on blocks of kQBlock query rows of one head: the block's scores against every
// key it may see are one product (cpu::gemm), so are the outputs and, in backward, the gradients.
// Each score and output element is still a sequential sum over the head dimension, respectively
// the keys, so blocking changes no rounding.
namespace {
constexpr int64_t kQBlock = 64;
}  // namespace

void attention(float* o, float* lse, const float* q, const float* k, const float* v, int64_t B,
               int64_t Sq, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
               int64_t window) {
  const int64_t G = Hq / Hkv, qs = Hq * d, ks = Hkv * d;
  const int64_t nqb = (Sq + kQBlock - 1) / kQBlock;
  const float scale = 1.0f / std::sqrt(float(d));
  parallel_for(B * Hq * nqb, [&](int64_t wb, int64_t we) {
    thread_local std::vector<float> pbuf;
    for (int64_t w = wb; w < we; w++) {
      const int64_t qb = w % nqb, h = (w / nqb) % Hq, b = w / (nqb * Hq), g = h / G;
      const int64_t t0 = qb * kQBlock, mq = std::min(kQBlock, Sq - t0);
      // Keys any row of the block may see: [lo, hi).
      const int64_t hi = q_start + t0 + mq;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, q_start + t0 - window + 1) : 0;
      const int64_t nk = hi - lo;
      float* p = scratch(pbuf, mq * nk);
      const float* Q = q + ((b * Sq + t0) * Hq + h) * d;
      const float* K = k + ((b * Sk + lo) * Hkv + g) * d;
      gemm(p, nk, rows_of(Q, qs), transpose_of(K, ks), mq, d, nk, scale);
      for (int64_t r = 0; r < mq; r++) {
        const int64_t t = t0 + r, last = q_start + t;  // keys lo_r..last are visible
        const int64_t lo_r = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
        float* pr = p + r * nk;
        float mx = -INFINITY;
        for (int64_t j = lo_r; j <= last; j++) mx = std::max(mx, pr[j - lo]);
        float sum = 0;
        for (int64_t j = lo_r; j <= last; j++) {
          pr[j - lo] = std::exp(pr[j - lo] - mx);
          sum += pr[j - lo];
        }
        for (int64_t jj = 0; jj < nk; jj++) {
          const int64_t j = lo + jj;
          pr[jj] = j < lo_r || j > last ? 0.0f : pr[jj] / sum;
        }
        if (lse) lse[(b * Hq + h) * Sq + t] = mx + std::log(sum);
      }
      const float* V = v + ((b * Sk + lo) * Hkv + g) * d;
      gemm(o + ((b * Sq + t0) * Hq + h) * d, qs, rows_of(p, nk), rows_of(V, ks), mq, nk, d);
    }
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* o,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t S, int64_t Hq, int64_t Hkv, int64_t d, int64_t window) {
  attention_backward(dq, dk, dv, dout, o, lse, q, k, v, B, S, S, 0, Hq, Hkv, d, window);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* o,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t Sq, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
                        int64_t window) {
  const int64_t G = Hq / Hkv, qs = Hq * d, ks = Hkv * d;
  const float scale = 1.0f / std::sqrt(float(d));
  // One task per (batch, KV head): it owns dk/dv of that head and dq of its G query heads, and
  // adds the query blocks' contributions to dk/dv in a fixed order.
  parallel_for(B * Hkv, [&](int64_t wb, int64_t we) {
    thread_local std::vector<float> pbuf, dpbuf;
    for (int64_t w = wb; w < we; w++) {
      const int64_t b = w / Hkv, g = w % Hkv;
      for (int64_t j = 0; j < Sk; j++)
        for (int64_t i = 0; i < d; i++) {
          dk[((b * Sk + j) * Hkv + g) * d + i] = 0;
          dv[((b * Sk + j) * Hkv + g) * d + i] = 0;
        }
      for (int64_t h = g * G; h < (g + 1) * G; h++)
        for (int64_t t0 = 0; t0 < Sq; t0 += kQBlock) {
          const int64_t mq = std::min(kQBlock, Sq - t0), a0 = q_start + t0;  // a0: absolute
          const int64_t lo = window > 0 ? std::max<int64_t>(0, a0 - window + 1) : 0;
          const int64_t nk = a0 + mq - lo;
          float* p = scratch(pbuf, mq * nk);
          float* ds = scratch(dpbuf, mq * nk);
          const int64_t qoff = ((b * Sq + t0) * Hq + h) * d, koff = ((b * Sk + lo) * Hkv + g) * d;
          // p = scale · Q Kᵀ, ds = dO Vᵀ, then p ← exp(p − lse), ds ← p (ds − D) · scale.
          gemm(p, nk, rows_of(q + qoff, qs), transpose_of(k + koff, ks), mq, d, nk, scale);
          gemm(ds, nk, rows_of(dout + qoff, qs), transpose_of(v + koff, ks), mq, d, nk);
          for (int64_t r = 0; r < mq; r++) {
            const int64_t t = a0 + r;
            const int64_t lo_r = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
            const float* go = dout + qoff + r * qs;
            const float* orow = o + qoff + r * qs;
            float Dt = 0;
            for (int64_t i = 0; i < d; i++) Dt += go[i] * orow[i];
            const float L = lse[(b * Hq + h) * Sq + t0 + r];
            float* pr = p + r * nk;
            float* dr = ds + r * nk;
            for (int64_t jj = 0; jj < nk; jj++) {
              const int64_t j = lo + jj;
              if (j < lo_r || j > t) {
                pr[jj] = 0.0f;
                dr[jj] = 0.0f;
              } else {
                pr[jj] = std::exp(pr[jj] - L);
                dr[jj] = pr[jj] * (dr[jj] - Dt) * scale;
              }
            }
          }
          // dQ = dS K;  dK += dSᵀ Q;  dV += Pᵀ dO.
          gemm(dq + qoff, qs, rows_of(ds, nk), rows_of(k + koff, ks), mq, nk, d);
          gemm(dk + koff, ks, transpose_of(ds, nk), rows_of(q + qoff, qs), nk, mq, d, 1.0f, 1.0f);
          gemm(dv + koff, ks, transpose_of(p, nk), rows_of(dout + qoff, qs), nk, mq, d, 1.0f, 1.0f);
        }
    }
  });
}

void router_select(float* probs, int32_t* choice, float* gate, const float* logits,
                   const float* bias, int64_t N, int64_t E1) {
  for (int64_t n = 0; n < N; n++) {
    const float* l = logits + n * E1;
    float* p = probs + n * E1;
    float mx = l[0];
    for (int64_t e = 1; e < E1; e++) mx = std::max(mx, l[e]);
    float s = 0;
    for (int64_t e = 0; e < E1; e++) {
      p[e] = std::exp(l[e] - mx);
      s += p[e];
    }
    for (int64_t e = 0; e < E1; e++) p[e] /= s;
    int32_t best = 0;
    float bv = p[0] + (bias ? bias[0] : 0.0f);
    for (int64_t e = 1; e < E1; e++) {
      const float v = p[e] + (bias ? bias[e] : 0.0f);
      if (v > bv) {
        bv = v;
        best = int32_t(e);
      }
    }
    choice[n] = best;
    gate[n] = p[best];
  }
}

}  // namespace zaya::cpu
