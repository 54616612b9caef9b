/* SPDX-License-Identifier: Apache-2.0 */
/* bench/gpu/run.sh's figures: the CUDA backend (pinned copy bandwidth, kernels alone, end to
 * end through launch/finish) against the CPU backend on one core and on every core, over batch
 * size x job size, with the crossover and a single job's latency. Prints one table and checks
 * the goals; never fails on a figure (benchmarks are not tests). Without a device: says so and
 * exits 0. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_hash.h"
#include "hash_cuda.h"
#include "hash_device.h"

#define BLOCK 64 /* the default: 64 text bytes (or 16 tokens) per block */
#define DATA_BYTES ((size_t)256 << 20)
#define BATCH_BYTES ((size_t)256 << 20)
#define MIN_SECONDS 0.15 /* each figure: repeated until this long, to keep the run short */

static const size_t batches[] = {1, 16, 256, 4096};
static const size_t sizes[] = {1024, 32 << 10, 512 << 10};
#define NB (sizeof(batches) / sizeof(batches[0]))
#define NS (sizeof(sizes) / sizeof(sizes[0]))

static kvg_hash_device *dev;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A batch's share that fits one slot, from jobs[k]: how many jobs. */
static size_t chunk_jobs(const kvg_hash_job *jobs, size_t k, size_t n)
{
    size_t bytes = 0, keys = 0, c = 0;
    while (k + c < n && c < dev->max_batch_jobs) {
        size_t nk = jobs[k + c].len / BLOCK;
        if (c &&
            (bytes + jobs[k + c].len > dev->max_batch_bytes || keys + nk > dev->max_batch_keys))
            break;
        bytes += jobs[k + c].len, keys += nk, c++;
    }
    return c;
}

/* Every job through the device, in chunks over both slots: one packs while one runs. */
static int device_run(kvg_hash_job *jobs, size_t n)
{
    int busy[2] = {0, 0};
    unsigned slot = 0;
    for (size_t k = 0; k < n;) {
        if (busy[slot] && dev->ops->finish(dev, slot))
            return -EIO;
        busy[slot] = 0;
        size_t c = chunk_jobs(jobs, k, n);
        int rc = dev->ops->launch(dev, slot, jobs + k, c);
        if (rc)
            return rc;
        busy[slot] = 1, k += c, slot ^= 1;
    }
    for (unsigned s = 0; s < 2; s++)
        if (busy[s] && dev->ops->finish(dev, s))
            return -EIO;
    return 0;
}

struct cpu_part {
    kvg_hash_job *jobs;
    size_t n;
};

static void *cpu_thread(void *arg)
{
    struct cpu_part *p = arg;
    kvg_hash_batch(p->jobs, p->n);
    return NULL;
}

/* The CPU backend over every job, on nthreads threads (jobs split evenly; one job is never
 * split, as kvg_hash_batch does not). */
static void cpu_run(kvg_hash_job *jobs, size_t n, unsigned nthreads)
{
    if (nthreads <= 1 || n == 1) {
        kvg_hash_batch(jobs, n);
        return;
    }
    pthread_t th[256];
    struct cpu_part part[256];
    if (nthreads > n)
        nthreads = (unsigned)n;
    if (nthreads > 256)
        nthreads = 256;
    for (unsigned t = 0; t < nthreads; t++) {
        size_t a = n * t / nthreads, b = n * (t + 1) / nthreads;
        part[t] = (struct cpu_part){jobs + a, b - a};
        pthread_create(&th[t], NULL, cpu_thread, &part[t]);
    }
    for (unsigned t = 0; t < nthreads; t++)
        pthread_join(th[t], NULL);
}

typedef int run_fn(kvg_hash_job *jobs, size_t n, unsigned arg);

static int run_device(kvg_hash_job *jobs, size_t n, unsigned arg)
{
    (void)arg;
    return device_run(jobs, n);
}

static int run_cpu(kvg_hash_job *jobs, size_t n, unsigned threads)
{
    cpu_run(jobs, n, threads);
    return 0;
}

/* Seconds per run of fn, repeated for MIN_SECONDS; negative on error. */
static double timed(run_fn *fn, kvg_hash_job *jobs, size_t n, unsigned arg)
{
    if (fn(jobs, n, arg)) /* warm-up */
        return -1;
    int reps = 0;
    double t0 = now(), t;
    do {
        if (fn(jobs, n, arg))
            return -1;
        reps++;
    } while ((t = now() - t0) < MIN_SECONDS);
    return t / reps;
}

/* The kernels alone on the first chunk of the batch; *bytes gets the chunk's size. */
static double kernel_seconds(kvg_hash_job *jobs, size_t n, size_t *bytes)
{
    size_t c = chunk_jobs(jobs, 0, n);
    *bytes = 0;
    for (size_t k = 0; k < c; k++)
        *bytes += jobs[k].len;
    double ms = -1;
    if (dev->ops->launch(dev, 0, jobs, c))
        return -1;
    if (kvg_hash_cuda_kernel_ms(dev, 0, 5, &ms))
        ms = -1;
    if (dev->ops->finish(dev, 0))
        return -1;
    return ms * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    char why[200] = "";
    kvg_hash_device_config cfg = {.max_batch_jobs = 4096, .max_batch_bytes = BATCH_BYTES};
    if (kvg_hash_device_open_cuda(&cfg, &dev, why, sizeof(why))) {
        printf("gpu_bench: no CUDA device to measure: %s\n", why);
        return 0;
    }
    unsigned ncpu = (unsigned)sysconf(_SC_NPROCESSORS_ONLN);
    printf("device: %s; CPU: %u cores; blocks of %d bytes, every block keyed\n", dev->description,
           ncpu, BLOCK);

    double h2d = 0;
    if (kvg_hash_cuda_h2d_gbps(dev, (size_t)256 << 20, 8, &h2d))
        printf("pinned H2D: failed\n");
    printf("pinned H2D (256 MiB, cudaMemcpyAsync): %.1f GB/s\n\n", h2d);

    unsigned char *data = malloc(DATA_BYTES);
    kvg_hash_job *jobs = calloc(4096, sizeof(*jobs));
    uint64_t *keys = malloc(sizeof(uint64_t) * 4096 * ((512 << 10) / BLOCK));
    if (!data || !jobs || !keys) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < DATA_BYTES; i += 8)
        memcpy(data + i, &(uint64_t){i * 0x9E3779B97F4A7C15ull}, 8);

    double e2e[NB][NS], cpu1[NB][NS];
    double best_kernel_large = 0, best_e2e_large = 0;
    printf("%6s %8s | %12s %12s | %12s %12s | %9s\n", "jobs", "job", "kernel GB/s", "e2e GB/s",
           "cpu1 GB/s", "cpuN GB/s", "e2e/cpu1");
    for (size_t bi = 0; bi < NB; bi++)
        for (size_t si = 0; si < NS; si++) {
            size_t n = batches[bi], len = sizes[si], total = n * len;
            for (size_t k = 0; k < n; k++)
                jobs[k] = (kvg_hash_job){
                    .salt = "bench-salt",
                    .salt_len = 10,
                    .model = "bench-model",
                    .model_len = 11,
                    .unit = KVG_HASH_BYTES,
                    .data = data + (k * len) % (DATA_BYTES - len),
                    .len = len,
                    .block_size = BLOCK,
                    .max_blocks = (uint32_t)(len / BLOCK),
                    .keys = keys + k * (len / BLOCK),
                };
            size_t kbytes = 0;
            double tk = kernel_seconds(jobs, n, &kbytes);
            double te = timed(run_device, jobs, n, 0);
            double t1 = timed(run_cpu, jobs, n, 1);
            double tn = timed(run_cpu, jobs, n, ncpu);
            double gk = tk > 0 ? kbytes / tk / 1e9 : 0, ge = te > 0 ? total / te / 1e9 : 0;
            e2e[bi][si] = ge, cpu1[bi][si] = total / t1 / 1e9;
            if (n >= 256) {
                best_kernel_large = gk > best_kernel_large ? gk : best_kernel_large;
                best_e2e_large = ge > best_e2e_large ? ge : best_e2e_large;
            }
            printf("%6zu %7zuK | %12.1f %12.2f | %12.2f %12.2f | %8.2fx\n", n, len >> 10, gk, ge,
                   cpu1[bi][si], total / tn / 1e9, ge / cpu1[bi][si]);
        }

    printf("\ncrossover (smallest job where the device, end to end, beats one CPU core):\n");
    for (size_t bi = 0; bi < NB; bi++) {
        size_t si = 0;
        while (si < NS && e2e[bi][si] <= cpu1[bi][si])
            si++;
        if (si < NS)
            printf("  batch %4zu: from %zu KB jobs\n", batches[bi], sizes[si] >> 10);
        else
            printf("  batch %4zu: never, up to %zu KB jobs\n", batches[bi], sizes[NS - 1] >> 10);
    }

    /* One 32 KB job through launch and finish, as the batcher hands a lone job over. */
    enum { LAT_RUNS = 300 };
    double lat[LAT_RUNS];
    kvg_hash_job one = jobs[0];
    one.len = 32 << 10, one.max_blocks = (uint32_t)(one.len / BLOCK);
    for (int i = 0; i < LAT_RUNS; i++) {
        double t0 = now();
        if (dev->ops->launch(dev, 0, &one, 1) || dev->ops->finish(dev, 0))
            break;
        lat[i] = (now() - t0) * 1e6;
    }
    qsort(lat, LAT_RUNS, sizeof(double), cmp_double);
    double t0 = now();
    for (int i = 0; i < 100; i++)
        kvg_hash_batch(&one, 1);
    printf(
        "\nlatency of one 32 KB job, launch+finish: median %.1f us, p99 %.1f us (CPU: %.1f us)\n",
        lat[LAT_RUNS / 2], lat[LAT_RUNS * 99 / 100], (now() - t0) / 100 * 1e6);

    printf("\ngoals:\n");
    printf("  kernel > 1000 GB/s on batches of 256+ jobs: %.0f GB/s: %s\n", best_kernel_large,
           best_kernel_large > 1000 ? "met" : "MISSED");
    printf("  end to end >= 70%% of pinned H2D (%.1f GB/s) on batches of 256+: %.1f GB/s "
           "(%.0f%%): %s\n",
           h2d, best_e2e_large, h2d > 0 ? 100 * best_e2e_large / h2d : 0,
           best_e2e_large >= 0.7 * h2d && h2d > 0 ? "met" : "MISSED");
    dev->ops->close(dev);
    free(keys);
    free(jobs);
    free(data);
    return 0;
}
