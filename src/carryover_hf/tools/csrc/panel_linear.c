/* y = x @ w.T (+ bias) for a few rows of x, float32, AVX2 + FMA, on a weight packed once into panels.
 *
 * The skinny kernel (skinny_linear.c) reads each weight row once, but for every 8 weights it loads 8 values of each
 * row of x and ends each output with a horizontal sum: from 4 rows on it runs out of load slots before the memory
 * stream does (on an AMD EPYC, 8 rows took 2.2x one row). Here the weight is packed once into panels of 16 output
 * columns (`pack_panels`: for each panel, K steps of 16 consecutive floats, one 64-byte line, the columns past N
 * zero). Each K step loads that line as two vectors, broadcasts one value of each row of x and adds 2 x M products
 * into M x 2 accumulators held in registers: one line of weights carries 2M fused multiply-adds for M + 2 loads.
 *
 * Every output is one sequential sum over K (`s = fma(x[k], w[k], s)` for k = 0, 1, ...) in its own vector lane:
 * the same bits whatever the rows of x, the passes, the vector width or the instruction set, and the same bits as
 * `panel_reference` below. The kernel needs M x 2 + 3 vector registers: 16 (AVX2) hold up to 6 rows in one pass over
 * a panel; from 7 rows the panel is read twice, 8 columns at a time (the second read from cache). Built with
 * AVX-512VL (-DPANEL_REGISTERS=32: 32 ymm registers, still 256-bit instructions), 14 rows fit in one pass. More
 * than 14 rows take several even passes. The weight stream is prefetched into L2 PANEL_PREFETCH floats ahead (into L1
 * it evicted the rows of x; measured on an AMD EPYC: docs/cpu-kernels.md).
 * Single-threaded (torch runs it only at one intra-op thread). Built by carryover_hf.tools.cpu_kernels on first use
 * and called through ctypes.
 */
#include <immintrin.h>
#include <stdint.h>

#ifndef PANEL_REGISTERS
#define PANEL_REGISTERS 16
#endif
#define PANEL 16               /* output columns per panel: one 64-byte line per K step */
#define MAX_ROWS_PER_PASS 14
#define PANEL_PREFETCH 2048    /* floats ahead in the panel stream (8 KB) */

/* Explicit registers: `ROWS_M(X)` expands X(0) ... X(M - 1). (Arrays of accumulators were spilled to the stack.) */
#define ROWS_1(X) X(0)
#define ROWS_2(X) ROWS_1(X) X(1)
#define ROWS_3(X) ROWS_2(X) X(2)
#define ROWS_4(X) ROWS_3(X) X(3)
#define ROWS_5(X) ROWS_4(X) X(4)
#define ROWS_6(X) ROWS_5(X) X(5)
#define ROWS_7(X) ROWS_6(X) X(6)
#define ROWS_8(X) ROWS_7(X) X(7)
#define ROWS_9(X) ROWS_8(X) X(8)
#define ROWS_10(X) ROWS_9(X) X(9)
#define ROWS_11(X) ROWS_10(X) X(10)
#define ROWS_12(X) ROWS_11(X) X(11)
#define ROWS_13(X) ROWS_12(X) X(12)
#define ROWS_14(X) ROWS_13(X) X(13)

#define ZERO2(m) __m256 a##m = _mm256_setzero_ps(), b##m = _mm256_setzero_ps();
#define STEP2(m)                                                   \
  {                                                                \
    const __m256 v = _mm256_broadcast_ss(x + (m) * K + k);         \
    a##m = _mm256_fmadd_ps(v, w0, a##m);                           \
    b##m = _mm256_fmadd_ps(v, w1, b##m);                           \
  }
#define STORE2(m) _mm256_storeu_ps(out + (m) * PANEL, a##m); _mm256_storeu_ps(out + (m) * PANEL + 8, b##m);
#define ZERO1(m) __m256 a##m = _mm256_setzero_ps();
#define STEP1(m) a##m = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (m) * K + k), w0, a##m);
#define STORE1(m) _mm256_storeu_ps(out + (m) * PANEL, a##m);

/* All 16 columns of one panel for M rows: out[m * PANEL + c]. */
#define WHOLE(M)                                                                                           \
  static void whole_##M(const float *x, const float *panel, float *out, int64_t K) {                      \
    ROWS_##M(ZERO2)                                                                                        \
    for (int64_t k = 0; k < K; ++k) {                                                                      \
      _mm_prefetch((const char *)(panel + k * PANEL + PANEL_PREFETCH), _MM_HINT_T1);                       \
      const __m256 w0 = _mm256_load_ps(panel + k * PANEL), w1 = _mm256_load_ps(panel + k * PANEL + 8);     \
      ROWS_##M(STEP2)                                                                                      \
    }                                                                                                      \
    ROWS_##M(STORE2)                                                                                       \
  }
/* 8 columns (`half` 0 or 1) of one panel for M rows: out[m * PANEL + 8 * half + c]. */
#define HALF(M)                                                                                            \
  static void half_##M(const float *x, const float *panel, float *out, int64_t K, int half) {             \
    ROWS_##M(ZERO1)                                                                                        \
    panel += 8 * half;                                                                                     \
    out += 8 * half;                                                                                       \
    for (int64_t k = 0; k < K; ++k) {                                                                      \
      _mm_prefetch((const char *)(panel + k * PANEL + PANEL_PREFETCH), _MM_HINT_T1);                       \
      const __m256 w0 = _mm256_load_ps(panel + k * PANEL);                                                 \
      ROWS_##M(STEP1)                                                                                      \
    }                                                                                                      \
    ROWS_##M(STORE1)                                                                                       \
  }

WHOLE(1) WHOLE(2) WHOLE(3) WHOLE(4) WHOLE(5) WHOLE(6)
#if PANEL_REGISTERS >= 32
WHOLE(7) WHOLE(8) WHOLE(9) WHOLE(10) WHOLE(11) WHOLE(12) WHOLE(13) WHOLE(14)
#else
HALF(7) HALF(8) HALF(9) HALF(10) HALF(11) HALF(12) HALF(13) HALF(14)
#endif

static void one_panel(const float *x, const float *panel, float *out, int64_t rows, int64_t K) {
  switch (rows) {
#define W(M) case M: whole_##M(x, panel, out, K); return;
    W(1) W(2) W(3) W(4) W(5) W(6)
#if PANEL_REGISTERS >= 32
    W(7) W(8) W(9) W(10) W(11) W(12) W(13) W(14)
#else
#define H(M) case M: half_##M(x, panel, out, K, 0); half_##M(x, panel, out, K, 1); return;
    H(7) H(8) H(9) H(10) H(11) H(12) H(13) H(14)
#endif
  }
}

/* w: (N, K) row-major -> panels: ceil(N / 16) x K x 16 floats (64-byte aligned by the caller), zero past N. */
void pack_panels(const float *w, float *panels, int64_t N, int64_t K) {
  for (int64_t p = 0; p * PANEL < N; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t c = 0; c < PANEL; ++c) {
        const int64_t n = p * PANEL + c;
        panels[(p * K + k) * PANEL + c] = n < N ? w[n * K + k] : 0.0f;
      }
}

/* x: (M, K) row-major; panels: from pack_panels; bias: (N,) or NULL; y: (M, N) row-major. */
void panel_linear(const float *x, const float *panels, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  float out[MAX_ROWS_PER_PASS * PANEL];
  const int64_t passes = (M + MAX_ROWS_PER_PASS - 1) / MAX_ROWS_PER_PASS;
  int64_t done = 0;
  for (int64_t q = 0; q < passes; ++q) {
    const int64_t rows = (M - done) / (passes - q);
    for (int64_t p = 0; p * PANEL < N; ++p) {
      one_panel(x + done * K, panels + p * K * PANEL, out, rows, K);
      const int64_t n0 = p * PANEL, columns = N - n0 < PANEL ? N - n0 : PANEL;
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t c = 0; c < columns; ++c)
          y[(done + m) * N + n0 + c] = bias ? out[m * PANEL + c] + bias[n0 + c] : out[m * PANEL + c];
    }
    done += rows;
  }
}

/* The same sums one output at a time, without vectors (tests compare the kernel with it bit for bit). */
void panel_reference(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s = __builtin_fmaf(x[m * K + k], w[n * K + k], s);
      y[m * N + n] = bias ? s + bias[n] : s;
    }
}
