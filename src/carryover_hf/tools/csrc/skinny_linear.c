/* y = x @ w.T (+ bias) for a few rows of x, float32, AVX2 + FMA: each weight row is read from memory once.
 *
 * A speculative round on CPU verifies k = 2..12 rows; those products are bound by streaming the weights. General
 * matrix-multiply kernels read the weights more than once for so few rows (MKL) or more slowly than a
 * matrix-vector product does (oneDNN). Here a block of R weight rows meets up to 14 rows of x held in L1; more rows
 * take several passes, split evenly. R is 1 from 4 rows of x on; for 1-3 rows the caller picks 1 or 2 per row count
 * (`pairs`) by timing both on the machine at hand (two won on an Intel Xeon, one on an AMD EPYC by a quarter:
 * docs/cpu-kernels.md). The K loop runs 8 lanes at a time with a scalar tail, and prefetches the weight stream
 * PREFETCH floats ahead: without it the hardware prefetcher kept too few lines in flight once a K step carried more
 * than two FMAs (4 rows ran at 8 GB/s against 13 for one row; with it 10-11). Sums run in another order than MKL's:
 * results agree to float32 rounding; each output is the same sum whatever the rows and R.
 * Single-threaded (torch runs it only at one intra-op thread). Built by carryover_hf.cpu_kernels on first use
 * (cc -O3 -mavx2 -mfma) and called through ctypes.
 */
#include <immintrin.h>
#include <stdint.h>

#define MAX_ROWS_PER_PASS 14
#define MAX_WEIGHT_ROWS 2
#define PREFETCH 768 /* floats ahead of the weight row being read (3 KB) */

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* Output columns [n, n + R) for M rows of x. Always inlined with M and R constant: each (M, R) compiles to its own
 * loop with the M x R accumulators in registers. */
__attribute__((always_inline)) static inline void block(const float *x, const float *w, const float *bias, float *y,
                                                        int64_t n, int64_t N, int64_t K, const int M, const int R) {
  const int64_t K8 = K & ~(int64_t)7;
  const float *w0 = w + n * K;
  __m256 acc[MAX_WEIGHT_ROWS][MAX_ROWS_PER_PASS];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    /* The R rows are adjacent in memory: prefetching ahead of the last one keeps the whole stream ahead. */
    _mm_prefetch((const char *)(w0 + (R - 1) * K + k + PREFETCH), _MM_HINT_T0);
    __m256 v[MAX_WEIGHT_ROWS];
    for (int r = 0; r < R; ++r) v[r] = _mm256_loadu_ps(w0 + r * K + k);
    for (int m = 0; m < M; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] = _mm256_fmadd_ps(xv, v[r], acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = hsum(acc[r][m]);
      for (int64_t k = K8; k < K; ++k) s += x[m * K + k] * w0[r * K + k];
      y[m * N + n + r] = bias ? s + bias[n + r] : s;
    }
}

__attribute__((always_inline)) static inline void pass(const float *x, const float *w, const float *bias, float *y,
                                                       int64_t N, int64_t K, const int M, const int R) {
  int64_t n = 0;
  for (; n + R <= N; n += R) block(x, w, bias, y, n, N, K, M, R);
  for (; n < N; ++n) block(x, w, bias, y, n, N, K, M, 1);
}

/* Weight rows per block by rows of x: one from 4 rows on (two would leave too few registers); for 1-3 rows two where
 * bit (rows - 1) of `pairs` is set, else one. Every output is the same sum in the same order whatever M and R are. */
#define CASE(M, R) \
  case M: pass(x, w, bias, y, N, K, M, R); break;

static void columns(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t N, int64_t K,
                    int64_t pairs) {
  if (rows <= 3 && (pairs >> (rows - 1)) & 1) {
    switch (rows) { CASE(1, 2) CASE(2, 2) CASE(3, 2) }
    return;
  }
  switch (rows) {
    CASE(1, 1) CASE(2, 1) CASE(3, 1) CASE(4, 1) CASE(5, 1) CASE(6, 1) CASE(7, 1)
    CASE(8, 1) CASE(9, 1) CASE(10, 1) CASE(11, 1) CASE(12, 1) CASE(13, 1) CASE(14, 1)
  }
}

/* x: (M, K) row-major; w: (N, K) row-major; bias: (N,) or NULL; y: (M, N) row-major; pairs: see `columns`. */
void skinny_linear(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                   int64_t pairs) {
  const int64_t passes = (M + MAX_ROWS_PER_PASS - 1) / MAX_ROWS_PER_PASS;
  int64_t done = 0;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t rows = (M - done) / (passes - p);
    columns(x + done * K, w, bias, y + done * N, rows, N, K, pairs);
    done += rows;
  }
}
