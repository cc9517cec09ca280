// CPU reference for the pieces of CCA attention (ZAYA1.md §3.1): mean skip, the two causal
// convolutions, QK-norm with temperature, partial NeoX RoPE, causal GQA attention (with an optional
// sliding window), and their backward passes. Attention never materialises an S×S matrix: each
// query row keeps its scores in a scratch row, and backward recomputes them from the saved
// log-sum-exp.
#include <cfloat>
#include <cmath>
#include <vector>

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

void cca_conv(float* y, float* mid, const float* x, const float* hist, const float* wdw,
              const float* bdw, const float* wg, const float* bg, int64_t B, int64_t S, int64_t C,
              int64_t d, int64_t t0, int64_t t1) {
  const int64_t P = (t0 - 1) + (t1 - 1);
  const int64_t M = S + t1 - 1;  // depthwise output length
  const int64_t groups = C / d;
  parallel_for(B * groups, [&](int64_t wb, int64_t we) {
    std::vector<float> u(static_cast<size_t>(M * d));
    for (int64_t w = wb; w < we; w++) {
      const int64_t b = w / groups, g = w % groups, c0 = g * d;
      auto padded = [&](int64_t i, int64_t c) -> float {  // p[i][c] over the left-padded input
        if (i >= P) return x[(b * S + i - P) * C + c];
        return hist ? hist[(b * P + i) * C + c] : 0.0f;
      };
      for (int64_t i = 0; i < M; i++)
        for (int64_t ci = 0; ci < d; ci++) {
          const int64_t c = c0 + ci;
          float s = bdw[c];
          for (int64_t j = 0; j < t0; j++) s += wdw[c * t0 + j] * padded(i + j, c);
          u[size_t(i * d + ci)] = s;
          if (mid) mid[(b * M + i) * C + c] = s;
        }
      for (int64_t t = 0; t < S; t++)
        for (int64_t co = 0; co < d; co++) {
          const int64_t c = c0 + co;
          float s = bg[c];
          for (int64_t ci = 0; ci < d; ci++)
            for (int64_t j = 0; j < t1; j++)
              s += wg[(c * d + ci) * t1 + j] * u[size_t((t + j) * d + ci)];
          y[(b * S + t) * C + c] = s;
        }
    }
  });
}

void cca_conv_backward(float* dx, float* dwdw, float* dbdw, float* dwg, float* dbg, const float* dy,
                       const float* x, const float* mid, const float* wdw, const float* wg,
                       int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1) {
  const int64_t P = (t0 - 1) + (t1 - 1);
  const int64_t M = S + t1 - 1;
  const int64_t groups = C / d;
  // One task per group: the group's weights are touched by that task only (deterministic sums).
  parallel_for(groups, [&](int64_t gb, int64_t ge) {
    std::vector<float> du(static_cast<size_t>(M * d));
    for (int64_t g = gb; g < ge; g++) {
      const int64_t c0 = g * d;
      for (int64_t b = 0; b < B; b++) {
        std::fill(du.begin(), du.end(), 0.0f);
        for (int64_t t = 0; t < S; t++)
          for (int64_t co = 0; co < d; co++) {
            const int64_t c = c0 + co;
            const float gy = dy[(b * S + t) * C + c];
            dbg[c] += gy;
            for (int64_t ci = 0; ci < d; ci++)
              for (int64_t j = 0; j < t1; j++) {
                dwg[(c * d + ci) * t1 + j] += gy * mid[(b * M + t + j) * C + c0 + ci];
                du[size_t((t + j) * d + ci)] += gy * wg[(c * d + ci) * t1 + j];
              }
          }
        for (int64_t ci = 0; ci < d; ci++) {
          const int64_t c = c0 + ci;
          for (int64_t t = 0; t < S; t++) dx[(b * S + t) * C + c] = 0.0f;
          for (int64_t i = 0; i < M; i++) {
            const float gu = du[size_t(i * d + ci)];
            dbdw[c] += gu;
            for (int64_t j = 0; j < t0; j++) {
              const int64_t pi = i + j;  // padded index
              if (pi < P) continue;      // zero padding: no input, no weight gradient
              const int64_t t = pi - P;
              dwdw[c * t0 + j] += gu * x[(b * S + t) * C + c];
              dx[(b * S + t) * C + c] += gu * wdw[c * t0 + j];
            }
          }
        }
      }
    }
  });
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
void rope_tables(std::vector<float>& inv, double theta, int64_t r) {
  inv.resize(size_t(r / 2));
  for (int64_t j = 0; j < r / 2; j++)
    inv[size_t(j)] = 1.0f / std::pow(float(theta), float(2 * j) / float(r));
}
}  // namespace

void rope(float* x, const int64_t* pos, double theta, int64_t N, int64_t H, int64_t d, int64_t r) {
  std::vector<float> inv;
  rope_tables(inv, theta, r);
  const int64_t h2 = r / 2;
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++)
      for (int64_t j = 0; j < h2; j++) {
        const float f = float(pos[n]) * inv[size_t(j)];
        const float c = std::cos(f), s = std::sin(f);
        for (int64_t h = 0; h < H; h++) {
          float* v = x + (n * H + h) * d;
          const float a = v[j], bb = v[j + h2];
          v[j] = a * c - bb * s;
          v[j + h2] = bb * c + a * s;
        }
      }
  });
}

void rope_backward(float* dx, const int64_t* pos, double theta, int64_t N, int64_t H, int64_t d,
                   int64_t r) {
  std::vector<float> inv;
  rope_tables(inv, theta, r);
  const int64_t h2 = r / 2;
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++)
      for (int64_t j = 0; j < h2; j++) {
        const float f = float(pos[n]) * inv[size_t(j)];
        const float c = std::cos(f), s = std::sin(f);
        for (int64_t h = 0; h < H; h++) {
          float* v = dx + (n * H + h) * d;
          const float a = v[j], bb = v[j + h2];
          v[j] = a * c + bb * s;
          v[j + h2] = bb * c - a * s;
        }
      }
  });
}

void attention(float* o, float* lse, const float* q, const float* k, const float* v, int64_t B,
               int64_t Sq, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
               int64_t window) {
  const int64_t G = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(float(d));
  parallel_for(B * Hq * Sq, [&](int64_t wb, int64_t we) {
    std::vector<float> p(static_cast<size_t>(Sk));
    for (int64_t w = wb; w < we; w++) {
      const int64_t t = w % Sq, h = (w / Sq) % Hq, b = w / (Sq * Hq), g = h / G;
      const int64_t hi = q_start + t;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, hi - window + 1) : 0;
      const float* qr = q + ((b * Sq + t) * Hq + h) * d;
      float mx = -INFINITY;
      for (int64_t j = lo; j <= hi; j++) {
        const float* kr = k + ((b * Sk + j) * Hkv + g) * d;
        float s = 0;
        for (int64_t i = 0; i < d; i++) s += qr[i] * kr[i];
        s *= scale;
        p[size_t(j)] = s;
        mx = std::max(mx, s);
      }
      float sum = 0;
      for (int64_t j = lo; j <= hi; j++) {
        p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        sum += p[size_t(j)];
      }
      float* out = o + ((b * Sq + t) * Hq + h) * d;
      for (int64_t i = 0; i < d; i++) out[i] = 0;
      for (int64_t j = lo; j <= hi; j++) {
        const float pj = p[size_t(j)] / sum;
        const float* vr = v + ((b * Sk + j) * Hkv + g) * d;
        for (int64_t i = 0; i < d; i++) out[i] += pj * vr[i];
      }
      if (lse) lse[(b * Hq + h) * Sq + t] = mx + std::log(sum);
    }
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* o,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t S, int64_t Hq, int64_t Hkv, int64_t d, int64_t window) {
  const int64_t G = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(float(d));
  // One task per (batch, KV head): it owns dk/dv of that head and dq of its G query heads.
  parallel_for(B * Hkv, [&](int64_t wb, int64_t we) {
    for (int64_t w = wb; w < we; w++) {
      const int64_t b = w / Hkv, g = w % Hkv;
      for (int64_t j = 0; j < S; j++)
        for (int64_t i = 0; i < d; i++) {
          dk[((b * S + j) * Hkv + g) * d + i] = 0;
          dv[((b * S + j) * Hkv + g) * d + i] = 0;
        }
      for (int64_t h = g * G; h < (g + 1) * G; h++)
        for (int64_t t = 0; t < S; t++) {
          const int64_t lo = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
          const float* qr = q + ((b * S + t) * Hq + h) * d;
          const float* go = dout + ((b * S + t) * Hq + h) * d;
          const float* orow = o + ((b * S + t) * Hq + h) * d;
          float* dqr = dq + ((b * S + t) * Hq + h) * d;
          const float L = lse[(b * Hq + h) * S + t];
          float Dt = 0;
          for (int64_t i = 0; i < d; i++) Dt += go[i] * orow[i];
          for (int64_t i = 0; i < d; i++) dqr[i] = 0;
          for (int64_t j = lo; j <= t; j++) {
            const float* kr = k + ((b * S + j) * Hkv + g) * d;
            const float* vr = v + ((b * S + j) * Hkv + g) * d;
            float s = 0, dp = 0;
            for (int64_t i = 0; i < d; i++) {
              s += qr[i] * kr[i];
              dp += go[i] * vr[i];
            }
            const float p = std::exp(s * scale - L);
            const float ds = p * (dp - Dt) * scale;
            float* dkr = dk + ((b * S + j) * Hkv + g) * d;
            float* dvr = dv + ((b * S + j) * Hkv + g) * d;
            for (int64_t i = 0; i < d; i++) {
              dqr[i] += ds * kr[i];
              dkr[i] += ds * qr[i];
              dvr[i] += p * go[i];
            }
          }
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
