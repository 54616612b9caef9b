/* SPDX-License-Identifier: Apache-2.0 */
/* glibc's memcpy against kvg_copy (common/copy.c) for body-sized copies at every relative
 * alignment of destination and source modulo 64, in one process. Run by bench/copy; prints GB/s
 * per (size, offset) and the slowest of each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static double gbps(size_t n, uint64_t ns)
{
    return ns ? (double)n / (double)ns : 0;
}

int main(void)
{
    static const size_t sizes[] = {1024, 4096, 32 * 1024, 512 * 1024};
    enum { ALIGN = 4096, ROOM = 1 << 20 };
    unsigned char *src = aligned_alloc(ALIGN, ROOM + ALIGN);
    unsigned char *dst = aligned_alloc(ALIGN, ROOM + ALIGN);
    if (!src || !dst)
        return 1;
    for (size_t i = 0; i < ROOM + ALIGN; i++)
        src[i] = (unsigned char)(i * 31), dst[i] = 0;
    printf("%-8s %-6s %10s %10s\n", "bytes", "dst+", "memcpy", "kvg_copy");
    for (size_t si = 0; si < KVG_ARRAY_LEN(sizes); si++) {
        size_t n = sizes[si];
        unsigned iters = (unsigned)KVG_MAX((size_t)50, (size_t)(200u << 20) / n / 8);
        double worst[2] = {1e9, 1e9};
        for (size_t off = 0; off < 64; off += 8) {
            double r[2];
            for (int k = 0; k < 2; k++) {
                uint64_t t0 = kvg_now_ns();
                for (unsigned i = 0; i < iters; i++) {
                    if (k == 0)
                        memcpy(dst + off, src, n);
                    else
                        kvg_copy(dst + off, src, n);
                    __asm__ volatile("" : : "r"(dst) : "memory");
                }
                r[k] = gbps(n, (kvg_now_ns() - t0) / iters);
                worst[k] = KVG_MIN(worst[k], r[k]);
            }
            printf("%-8zu %-6zu %9.1f %9.1f   GB/s\n", n, off, r[0], r[1]);
        }
        printf("%-8zu %-6s %9.1f %9.1f   GB/s (slowest offset)\n", n, "worst", worst[0], worst[1]);
    }
    free(src);
    free(dst);
    return 0;
}
