/* SPDX-License-Identifier: Apache-2.0 */
/* Large copies without REP MOVSB. glibc (2.36 in Debian 12) copies 2 KiB and more with REP MOVSB,
 * and on AMD EPYC cores that instruction runs at 1.5-2 GB/s, instead of 35-45, whenever the
 * destination sits 1 to 31 bytes past the source modulo 64 (glibc bug 30994 is the page-aligned
 * case of the same fault). A body copied into a buffer of its own meets that alignment half
 * the time, so the copies on the request path go through this loop of unaligned 16-byte moves,
 * which runs at 22-45 GB/s whatever the alignment (docs/performance.md has the figures). */
#include "common.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>

void kvg_copy_large(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (n < 64) {
        memcpy(d, s, n);
        return;
    }
    /* The last 64 bytes are loaded first and stored last: the loop then never needs a tail. */
    __m128i t0 = _mm_loadu_si128((const __m128i *)(const void *)(s + n - 64));
    __m128i t1 = _mm_loadu_si128((const __m128i *)(const void *)(s + n - 48));
    __m128i t2 = _mm_loadu_si128((const __m128i *)(const void *)(s + n - 32));
    __m128i t3 = _mm_loadu_si128((const __m128i *)(const void *)(s + n - 16));
    for (size_t i = 0; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 48));
        _mm_storeu_si128((__m128i *)(void *)(d + i), a);
        _mm_storeu_si128((__m128i *)(void *)(d + i + 16), b);
        _mm_storeu_si128((__m128i *)(void *)(d + i + 32), c);
        _mm_storeu_si128((__m128i *)(void *)(d + i + 48), e);
        /* Keeps compilers from recognising the loop as a copy and calling memcpy. */
        __asm__ volatile("" : : : "memory");
    }
    _mm_storeu_si128((__m128i *)(void *)(d + n - 64), t0);
    _mm_storeu_si128((__m128i *)(void *)(d + n - 48), t1);
    _mm_storeu_si128((__m128i *)(void *)(d + n - 32), t2);
    _mm_storeu_si128((__m128i *)(void *)(d + n - 16), t3);
}
#else
void kvg_copy_large(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}
#endif
