/* The skinny and panel kernels over SmolLM2-135M's linear shapes (30 layers of q, k, v, o, gate, up, down and the
 * 49,152 x 576 LM head: 538 MB of float32 weights, streamed from memory), 1-8 rows of x, the two alternating; the
 * best of N sweeps each, and the largest difference between their outputs on the LM head.
 *
 *   S=src/carryover_hf/tools/csrc
 *   cc -O3 -mavx2 -mfma experiments/cpu_kernels/panel_vs_skinny.c $S/skinny_linear.c $S/panel_linear.c -lm -o /tmp/pvs
 *   cc -O3 -mavx2 -mfma -mavx512f -mavx512vl -DPANEL_REGISTERS=32 experiments/cpu_kernels/panel_vs_skinny.c \
 *       $S/skinny_linear.c $S/panel_linear.c -lm -o /tmp/pvs512      # 32 vector registers (AVX-512VL)
 *   /tmp/pvs 5
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void skinny_linear(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                   int64_t pairs);
void pack_panels(const float *w, float *p, int64_t N, int64_t K);
void panel_linear(const float *x, const float *p, const float *bias, float *y, int64_t M, int64_t N, int64_t K);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const int layers = 30, sweeps = argc > 1 ? atoi(argv[1]) : 5;
  const int64_t shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  const int count = layers * 7 + 1;
  int64_t *N = malloc(count * sizeof *N), *K = malloc(count * sizeof *K);
  float **W = malloc(count * sizeof *W), **P = malloc(count * sizeof *P);
  size_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    N[i] = i < layers * 7 ? shapes[i % 7][0] : 49152;
    K[i] = i < layers * 7 ? shapes[i % 7][1] : 576;
    const size_t n = (size_t)N[i] * K[i], padded = (size_t)((N[i] + 15) / 16) * 16 * K[i];
    W[i] = aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    P[i] = aligned_alloc(64, padded * 4);
    for (size_t j = 0; j < n; ++j) W[i][j] = (float)((j * 2654435761u) % 1000) / 1000.f - 0.5f;
    pack_panels(W[i], P[i], N[i], K[i]);
    bytes += n * 4;
  }
  float *x = aligned_alloc(64, 16 * 1536 * 4), *y1 = aligned_alloc(64, 16 * 49152 * 4), *y2 = aligned_alloc(64, 16 * 49152 * 4);
  for (int i = 0; i < 16 * 1536; ++i) x[i] = (float)(i % 97) / 97.f - 0.3f;
  printf("%.1f MB of weights, best of %d sweeps\n", bytes / 1e6, sweeps);
  for (int M = 1; M <= 8; ++M) {
    double skinny = 1e9, panel = 1e9;
    for (int s = 0; s < sweeps; ++s) {
      double t = now();
      for (int i = 0; i < count; ++i) skinny_linear(x, W[i], NULL, y1, M, N[i], K[i], 0);
      t = now() - t;
      skinny = t < skinny ? t : skinny;
      t = now();
      for (int i = 0; i < count; ++i) panel_linear(x, P[i], NULL, y2, M, N[i], K[i]);
      t = now() - t;
      panel = t < panel ? t : panel;
    }
    double largest = 0;
    for (int i = 0; i < M * 49152; ++i) largest = fmax(largest, fabs(y1[i] - y2[i]));
    printf("rows %d: skinny %.2f ms (%.1f GB/s), panel %.2f ms (%.1f GB/s), %.2fx; largest difference %.1e\n", M,
           skinny * 1e3, bytes / skinny / 1e9, panel * 1e3, bytes / panel / 1e9, skinny / panel, largest);
  }
  return 0;
}
