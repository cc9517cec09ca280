// CPU reference: linear layers, embedding, RMSNorm, residual scaling, activations, cross-entropy.
// Linear layers of 4 rows or more are products of cpu::gemm (gemm.h: one sequential fp32 sum per
// output element); decoding-sized ones (N < 4) and the norms use dot products with 8 partial sums
// in a fixed order. Either way results are identical for any thread count. Weights of other float
// dtypes are widened to fp32 once per call (row by row when decoding).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "core/parallel.h"

namespace zaya::cpu {

namespace {

inline float dot(const float* a, const float* b, int64_t K) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; j++) s[j] += a[k + j] * b[k + j];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; k < K; k++) r += a[k] * b[k];
  return r;
}

// Returns a pointer to W as fp32, converting into `tmp` when W is stored in another dtype.
const float* as_f32(const Tensor& w, int64_t numel, std::vector<float>& tmp) {
  ZAYA_CHECK(w.numel() >= numel, "weight of shape {} is smaller than expected ({} elements)",
             shape_str(w.shape()), numel);
  ZAYA_CHECK(w.is_contiguous(), "weight must be contiguous");
  if (w.dtype() == DType::F32) return static_cast<const float*>(w.raw());
  tmp.resize(size_t(numel));
  const char* src = static_cast<const char*>(w.raw());
  const size_t es = dtype_size(w.dtype());
  parallel_for(
      numel,
      [&](int64_t b, int64_t e) { convert_to_f32(tmp.data() + b, src + b * es, w.dtype(), e - b); },
      1 << 16);
  return tmp.data();
}

}  // namespace

void linear(float* y, const float* x, const Tensor& w, const float* bias, int64_t N, int64_t K,
            int64_t O, bool accumulate) {
  if (N < 4 && w.dtype() != DType::F32) {
    // Decoding: few rows, parallel over output rows; widen each weight row where it is used.
    const char* src = static_cast<const char*>(w.raw());
    const size_t es = dtype_size(w.dtype());
    parallel_for(
        O,
        [&](int64_t ob, int64_t oe) {
          std::vector<float> row(static_cast<size_t>(K));
          for (int64_t o = ob; o < oe; o++) {
            convert_to_f32(row.data(), src + size_t(o * K) * es, w.dtype(), K);
            for (int64_t n = 0; n < N; n++) {
              float v = dot(x + n * K, row.data(), K) + (bias ? bias[o] : 0.0f);
              y[n * O + o] = accumulate ? y[n * O + o] + v : v;
            }
          }
        },
        16);
    return;
  }
  std::vector<float> tmp;
  const float* W = as_f32(w, O * K, tmp);
  if (N < 4) {
    parallel_for(
        O,
        [&](int64_t ob, int64_t oe) {
          for (int64_t n = 0; n < N; n++)
            for (int64_t o = ob; o < oe; o++) {
              float v = dot(x + n * K, W + o * K, K) + (bias ? bias[o] : 0.0f);
              y[n * O + o] = accumulate ? y[n * O + o] + v : v;
            }
        },
        16);
    return;
  }
  // y[N,O] = x[N,K] · W^T
  gemm(y, O, rows_of(x, K), transpose_of(W, K), N, K, O, 1.0f, accumulate ? 1.0f : 0.0f, bias);
}

void linear_backward_input(float* dx, const float* dy, const Tensor& w, int64_t N, int64_t K,
                           int64_t O, bool accumulate) {
  std::vector<float> tmp;
  const float* W = as_f32(w, O * K, tmp);
  // dx[N,K] = dy[N,O] · W[O,K]
  gemm(dx, K, rows_of(dy, O), rows_of(W, K), N, O, K, 1.0f, accumulate ? 1.0f : 0.0f);
}

void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int64_t N,
                            int64_t K, int64_t O) {
  // dW[O,K] += dy^T[O,N] · x[N,K]: each element sums its N products in order, then adds to dW.
  gemm(dw, K, transpose_of(dy, O), rows_of(x, K), O, N, K, 1.0f, 1.0f);
  if (db) {
    // Σ_n dy[n,o] in n order for every o (rows are read contiguously).
    std::vector<float> s(size_t(O), 0.0f);
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < O; o++) s[size_t(o)] += dy[n * O + o];
    for (int64_t o = 0; o < O; o++) db[o] += s[size_t(o)];
  }
}

void embedding(float* y, const int32_t* ids, const Tensor& table, int64_t N, int64_t D) {
  const int64_t V = table.size(0);
  ZAYA_CHECK(table.size(1) == D, "embedding table has width {}, expected {}", table.size(1), D);
  for (int64_t n = 0; n < N; n++)
    ZAYA_CHECK(ids[n] >= 0 && ids[n] < V,
               "token id {} at position {} is outside the vocabulary (vocab_size {})", ids[n], n,
               V);
  const char* src = static_cast<const char*>(table.raw());
  const size_t es = dtype_size(table.dtype());
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++)
      convert_to_f32(y + n * D, src + size_t(ids[n]) * size_t(D) * es, table.dtype(), D);
  });
}

void embedding_backward(float* dtable, const float* dy, const int32_t* ids, int64_t N, int64_t D,
                        int64_t V) {
  // Parallel over column blocks keeps each row's accumulation order serial in n: deterministic.
  parallel_for(D, [&](int64_t cb, int64_t ce) {
    for (int64_t n = 0; n < N; n++) {
      float* r = dtable + int64_t(ids[n]) * D;
      const float* g = dy + n * D;
      for (int64_t c = cb; c < ce; c++) r[c] += g[c];
    }
  });
}

void rmsnorm(float* y, float* rstd, const float* x, const float* w, float eps, int64_t N,
             int64_t D) {
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++) {
      const float* xr = x + n * D;
      float ss = dot(xr, xr, D);
      float r = 1.0f / std::sqrt(ss / float(D) + eps);
      if (rstd) rstd[n] = r;
      for (int64_t i = 0; i < D; i++) y[n * D + i] = w[i] * (xr[i] * r);
    }
  });
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t D) {
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++) {
      const float* xr = x + n * D;
      const float* g = dy + n * D;
      const float r = rstd[n];
      // y = w x r;  dx = r (w g) - x r^3 / D Σ (w g x)
      float s = 0;
      for (int64_t i = 0; i < D; i++) s += w[i] * g[i] * xr[i];
      const float c = s * r * r * r / float(D);
      for (int64_t i = 0; i < D; i++) dx[n * D + i] = r * w[i] * g[i] - c * xr[i];
    }
  });
  parallel_for(D, [&](int64_t b, int64_t e) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = b; i < e; i++) dw[i] += dy[n * D + i] * x[n * D + i] * rstd[n];
  });
}

void residual_scale(float* out, const float* a, const float* h, const float* hs, const float* hb,
                    const float* rs, const float* rb, int64_t N, int64_t D) {
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++)
      for (int64_t i = 0; i < D; i++) {
        const int64_t j = n * D + i;
        out[j] = (a[j] + hb[i]) * hs[i] + (h[j] + rb[i]) * rs[i];
      }
  });
}

void residual_scale_backward(float* da, float* dh, float* dhs, float* dhb, float* drs, float* drb,
                             const float* dout, const float* a, const float* h, const float* hs,
                             const float* hb, const float* rs, const float* rb, int64_t N,
                             int64_t D) {
  parallel_for(D, [&](int64_t b, int64_t e) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = b; i < e; i++) {
        const int64_t j = n * D + i;
        const float g = dout[j];
        dhs[i] += g * (a[j] + hb[i]);
        dhb[i] += g * hs[i];
        drs[i] += g * (h[j] + rb[i]);
        drb[i] += g * rs[i];
      }
  });
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++)
      for (int64_t i = 0; i < D; i++) {
        const int64_t j = n * D + i;
        const float g = dout[j];
        da[j] = g * hs[i];
        dh[j] = g * rs[i];
      }
  });
}

void affine(float* y, const float* x, const float* s, const float* b, int64_t N, int64_t D) {
  parallel_for(N, [&](int64_t nb, int64_t ne) {
    for (int64_t n = nb; n < ne; n++)
      for (int64_t i = 0; i < D; i++) y[n * D + i] = (x[n * D + i] + b[i]) * s[i];
  });
}

// Elementwise ops split over blocks of this many elements (each computed by one thread).
constexpr int64_t kElementChunk = 4096;

void gelu(float* y, const float* x, int64_t n) {
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++)
          y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * float(M_SQRT1_2)));
      },
      kElementChunk);
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) {
          const float cdf = 0.5f * (1.0f + std::erf(x[i] * float(M_SQRT1_2)));
          const float pdf = std::exp(-0.5f * x[i] * x[i]) * 0.3989422804014327f;
          dx[i] = dy[i] * (cdf + x[i] * pdf);
        }
      },
      kElementChunk);
}

void swiglu(float* y, const float* gu, int64_t N, int64_t I) {
  parallel_for(
      N,
      [&](int64_t nb, int64_t ne) {
        for (int64_t n = nb; n < ne; n++)
          for (int64_t i = 0; i < I; i++) {
            const float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
            y[n * I + i] = g / (1.0f + std::exp(-g)) * u;
          }
      },
      std::max<int64_t>(1, kElementChunk / std::max<int64_t>(1, I)));
}

void swiglu_backward(float* dgu, const float* dy, const float* gu, int64_t N, int64_t I) {
  parallel_for(
      N,
      [&](int64_t nb, int64_t ne) {
        for (int64_t n = nb; n < ne; n++)
          for (int64_t i = 0; i < I; i++) {
            const float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
            const float sg = 1.0f / (1.0f + std::exp(-g));
            const float silu = g * sg;
            dgu[n * 2 * I + i] = dy[n * I + i] * u * (sg + silu * (1.0f - sg));
            dgu[n * 2 * I + I + i] = dy[n * I + i] * silu;
          }
      },
      std::max<int64_t>(1, kElementChunk / std::max<int64_t>(1, I)));
}

double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t N,
                     int64_t V) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; n++) {
    if (targets[n] < 0) continue;
    ZAYA_CHECK(targets[n] < V, "target id {} at position {} is outside the vocabulary of {}",
               targets[n], n, V);
    count++;
  }
  std::vector<double> loss(size_t(N), 0.0);
  parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; n++) {
      const float* l = logits + n * V;
      if (targets[n] < 0) {
        if (dlogits)
          for (int64_t v = 0; v < V; v++) dlogits[n * V + v] = 0;
        continue;
      }
      double mx = l[0];
      for (int64_t v = 1; v < V; v++) mx = std::max(mx, double(l[v]));
      double s = 0;
      for (int64_t v = 0; v < V; v++) s += std::exp(double(l[v]) - mx);
      const double lse = mx + std::log(s);
      loss[size_t(n)] = lse - l[targets[n]];
      if (dlogits) {
        const double inv = 1.0 / double(count);
        for (int64_t v = 0; v < V; v++)
          dlogits[n * V + v] = float(std::exp(double(l[v]) - lse) * inv);
        dlogits[n * V + targets[n]] -= float(inv);
      }
    }
  });
  double total = 0;
  for (double x : loss) total += x;
  return count ? total / double(count) : 0.0;
}

}  // namespace zaya::cpu
