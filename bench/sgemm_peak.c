/* sgemm_peak: the machine's practical fp32 matrix-multiply peak, in GFLOP/s.
 *
 * bench/cpu_vs_peers divides tilewise's convolution throughput by this figure:
 * a convolution lowered to GEMM cannot beat a large square SGEMM of a tuned
 * BLAS on the same cores, so the ratio says how much of the machine the CPU
 * backend uses. OpenBLAS is called through cblas_sgemm on square N x N
 * matrices; the best of several runs is reported (others share the machine).
 *
 *   cc -O2 -o sgemm_peak bench/sgemm_peak.c -lopenblas
 *   sgemm_peak [N=2048] [threads=2] [runs=5]
 *
 * Prints one line: "sgemm N=2048 threads=2 best_s=... gflops=...".
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

/* OpenBLAS's own entry point; declared here so that the netlib cblas.h that
 * Debian's alternatives may put first still compiles. */
void openblas_set_num_threads(int num_threads);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_arg(const char *text, const char *what, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "sgemm_peak: %s must be an integer in %ld..%ld, got '%s'\n", what, lo, hi,
                text);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    long n = 2048, threads = 2, runs = 5;
    if ((argc > 1 && parse_arg(argv[1], "N", 64, 16384, &n) != 0) ||
        (argc > 2 && parse_arg(argv[2], "threads", 1, 1024, &threads) != 0) ||
        (argc > 3 && parse_arg(argv[3], "runs", 1, 1000, &runs) != 0)) {
        return 2;
    }
    size_t count = (size_t)n * (size_t)n;
    float *a = malloc(count * sizeof *a);
    float *b = malloc(count * sizeof *b);
    float *c = malloc(count * sizeof *c);
    if (a == NULL || b == NULL || c == NULL) {
        fprintf(stderr, "sgemm_peak: cannot allocate three %ld x %ld float matrices\n", n, n);
        free(a);
        free(b);
        free(c);
        return 1;
    }
    /* Values in [-1, 1): no denormals, no overflow over many accumulations. */
    unsigned s = 1;
    for (size_t i = 0; i < count; i++) {
        s = s * 1664525u + 1013904223u;
        a[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
        s = s * 1664525u + 1013904223u;
        b[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    }
    memset(c, 0, count * sizeof *c);
    openblas_set_num_threads((int)threads);

    int ni = (int)n;
    /* one untimed call: thread start-up and page faults on c */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a, ni, b, ni, 0.0f, c,
                ni);
    double best = 1e300;
    for (long r = 0; r < runs; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a, ni, b, ni, 0.0f,
                    c, ni);
        double dt = now_s() - t0;
        if (dt < best) {
            best = dt;
        }
    }
    double flops = 2.0 * (double)n * (double)n * (double)n;
    /* print one element so the compiler and BLAS cannot treat c as dead */
    printf("sgemm N=%ld threads=%ld best_s=%.6f gflops=%.2f check=%.3f\n", n, threads, best,
           flops / best * 1e-9, (double)c[count / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}
