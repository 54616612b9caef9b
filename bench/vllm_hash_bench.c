/* SPDX-License-Identifier: Apache-2.0 */
/* vLLM's block hash (gpu_hash/vllm_hash.c) on a 32 K-token prompt, block size 16, for both
 * algorithms, with and without LoRA name and cache salt: prints ns per prompt, wall clock and
 * the thread's CPU time (best of 7 runs of 20 prompts each), and blocks per CPU second. Run from a
 * release build:
 *   meson setup build-release --buildtype=release && meson compile -C build-release \
 *     bench/vllm_hash_bench && build-release/bench/vllm_hash_bench [TOKENS [BLOCK [ALGO]]]
 * ALGO (sha256_cbor or xxhash_cbor) runs one algorithm alone, e.g. under
 * `valgrind --tool=callgrind --toggle-collect=kvg_vllm_block_hashes` for instructions per block,
 * which a loaded host does not change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "gpu_hash.h"

/* The thread's CPU time: on a shared host the wall clock also counts the time other processes
 * held the core, which this does not (cache contention still shows). */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    size_t ntok = argc > 1 ? strtoul(argv[1], NULL, 10) : 32768;
    uint32_t block = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 16;
    int only = -1;
    if (argc > 3) {
        kvg_vllm_algo a;
        if (kvg_vllm_algo_parse(argv[3], strlen(argv[3]), &a) < 0)
            return 2;
        only = (int)a;
    }
    if (ntok == 0 || block == 0)
        return 2;
    uint32_t *tokens = malloc(ntok * sizeof(*tokens));
    size_t nb = ntok / block;
    uint64_t *keys = malloc((nb ? nb : 1) * sizeof(*keys));
    if (!tokens || !keys)
        return 1;
    /* Ids spread over a 152 K vocabulary (Qwen's), as real prompts: mostly 3-byte CBOR heads. */
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < ntok; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tokens[i] = (uint32_t)(x % 151936);
    }
    printf("%zu tokens, block %u: %zu blocks per prompt\n", ntok, block, nb);
    printf("%-12s %-12s %12s %12s %14s\n", "algo", "extra keys", "wall ns", "cpu ns",
           "blocks/s (cpu)");
    static const char salt[] = "Kq3n0vX4m2bYw8Zc1LrT5uHs7JdPf9GaEeWiOkNyQxU"; /* 43, base64url */
    for (int a = 0; a < KVG_VLLM_ALGO_COUNT; a++) {
        if (only >= 0 && a != only)
            continue;
        for (int extra = 0; extra < 2; extra++) {
            kvg_vllm_hash none;
            if (kvg_vllm_none_hash((kvg_vllm_algo)a, "42", 2, &none) < 0)
                return 1;
            kvg_vllm_blocks in = {
                .algo = (kvg_vllm_algo)a,
                .parent = &none,
                .tokens = tokens,
                .ntokens = ntok,
                .block_size = block,
                .lora_name = extra ? "tenant-adapter" : NULL,
                .lora_name_len = extra ? 14 : 0,
                .cache_salt = extra ? salt : NULL,
                .cache_salt_len = extra ? sizeof(salt) - 1 : 0,
            };
            uint64_t best = UINT64_MAX, best_cpu = UINT64_MAX;
            for (int run = 0; run < 7; run++) {
                unsigned iters = 20;
                uint64_t t0 = kvg_now_ns(), c0 = cpu_ns();
                for (unsigned i = 0; i < iters; i++) {
                    size_t n = 0;
                    if (kvg_vllm_block_hashes(&in, NULL, keys, nb, &n) < 0 || n != nb)
                        return 1;
                    __asm__ volatile("" : : "r"(keys) : "memory");
                }
                uint64_t per = (kvg_now_ns() - t0) / iters, per_cpu = (cpu_ns() - c0) / iters;
                best = KVG_MIN(best, per);
                best_cpu = KVG_MIN(best_cpu, per_cpu);
            }
            printf("%-12s %-12s %12llu %12llu %14.0f\n", kvg_vllm_algo_str((kvg_vllm_algo)a),
                   extra ? "lora + salt" : "none", (unsigned long long)best,
                   (unsigned long long)best_cpu, (double)nb * 1e9 / (double)best_cpu);
        }
    }
    free(keys);
    free(tokens);
    return 0;
}
