/* y = x @ w.T (+ bias) for a few rows of x, float32, AVX2 + FMA: each weight row is read from memory once.
 *
 * A speculative round on CPU verifies k = 2..12 rows; those products are bound by streaming the weights. General
 * matrix-multiply kernels read the weights more than once for so few rows (MKL) or more slowly than a
 * matrix-vector product does (oneDNN). Here a pass holds up to 6 rows of x against two weight rows at a time (the
 * x loads serve both), or 7-14 rows against one; more rows take several passes, split evenly. The K loop runs 8
 * lanes at a time with a scalar tail. Sums run in another order than MKL's: results agree to float32 rounding.
 * Single-threaded (torch runs it only at one intra-op thread). Built by carryover_hf.cpu_kernels on first use
 * (cc -O3 -mavx2 -mfma) and called through ctypes.
 */
#include <immintrin.h>
#include <stdint.h>

#define MAX_ROWS_PER_PASS 14

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* Output columns [n0, n1) for M rows; `pair` = two weight rows per step. Always inlined into the switch below,
 * where M is a constant: each case compiles to its own loop with the accumulators in registers. */
__attribute__((always_inline)) static inline void pass(const float *x, const float *w, const float *bias, float *y, int64_t n0, int64_t n1,
                        int64_t N, int64_t K, const int M, const int pair) {
  const int64_t K8 = K & ~(int64_t)7;
  int64_t n = n0;
  if (pair) {
    for (; n + 1 < n1; n += 2) {
      __m256 a0[MAX_ROWS_PER_PASS], a1[MAX_ROWS_PER_PASS];
      for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
      const float *w0 = w + n * K, *w1 = w0 + K;
      for (int64_t k = 0; k < K8; k += 8) {
        const __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        for (int m = 0; m < M; ++m) {
          const __m256 xv = _mm256_loadu_ps(x + m * K + k);
          a0[m] = _mm256_fmadd_ps(xv, v0, a0[m]);
          a1[m] = _mm256_fmadd_ps(xv, v1, a1[m]);
        }
      }
      for (int m = 0; m < M; ++m) {
        float s0 = hsum(a0[m]), s1 = hsum(a1[m]);
        for (int64_t k = K8; k < K; ++k) {
          s0 += x[m * K + k] * w0[k];
          s1 += x[m * K + k] * w1[k];
        }
        y[m * N + n] = bias ? s0 + bias[n] : s0;
        y[m * N + n + 1] = bias ? s1 + bias[n + 1] : s1;
      }
    }
  }
  for (; n < n1; ++n) {
    __m256 a0[MAX_ROWS_PER_PASS];
    for (int m = 0; m < M; ++m) a0[m] = _mm256_setzero_ps();
    const float *w0 = w + n * K;
    for (int64_t k = 0; k < K8; k += 8) {
      const __m256 v0 = _mm256_loadu_ps(w0 + k);
      for (int m = 0; m < M; ++m) a0[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k), v0, a0[m]);
    }
    for (int m = 0; m < M; ++m) {
      float s0 = hsum(a0[m]);
      for (int64_t k = K8; k < K; ++k) s0 += x[m * K + k] * w0[k];
      y[m * N + n] = bias ? s0 + bias[n] : s0;
    }
  }
}

#define CASE(R, P) \
  case R: pass(x, w, bias, y, n0, n1, N, K, R, P); break;

static void columns(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t n0, int64_t n1,
                    int64_t N, int64_t K) {
  switch (rows) {
    CASE(1, 1) CASE(2, 1) CASE(3, 1) CASE(4, 1) CASE(5, 1) CASE(6, 1) CASE(7, 0)
    CASE(8, 0) CASE(9, 0) CASE(10, 0) CASE(11, 0) CASE(12, 0) CASE(13, 0) CASE(14, 0)
  }
}

/* x: (M, K) row-major; w: (N, K) row-major; bias: (N,) or NULL; y: (M, N) row-major. */
void skinny_linear(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  const int64_t passes = (M + MAX_ROWS_PER_PASS - 1) / MAX_ROWS_PER_PASS;
  int64_t done = 0;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t rows = (M - done) / (passes - p);
    columns(x + done * K, w, bias, y + done * N, rows, 0, N, N, K);
    done += rows;
  }
}
