/* SPDX-License-Identifier: Apache-2.0 */
/* UTF-8 validity and NFC normalisation for the tokenizer, as the Rust tokenizers library's
 * NFC normalizer (unicode-normalization-alignments 0.1.12, Unicode 9.0.0) produces it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"
#include "unicode_tables.h"

bool kvg_utf8_valid(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            /* Eight ASCII bytes at a time: most prompts are mostly ASCII. */
            uint64_t w;
            while (i + 8 <= len && (memcpy(&w, s + i, 8), (w & 0x8080808080808080u) == 0))
                i += 8;
            if (i < len && s[i] < 0x80)
                i++;
            continue;
        }
        size_t n;
        unsigned cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            n = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            n = 2, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (len - i <= n)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += n + 1;
    }
    return true;
}

enum {
    S_BASE = 0xac00,
    L_BASE = 0x1100,
    V_BASE = 0x1161,
    T_BASE = 0x11a7,
    L_COUNT = 19,
    V_COUNT = 21,
    T_COUNT = 28,
    N_COUNT = V_COUNT * T_COUNT,
    S_COUNT = L_COUNT * N_COUNT,
};

/* The most code points one code point decomposes into (U+1F82 and kin: 4). */
#define MAX_DECOMP 4
/* A segment of up to this many code points is normalised on the stack. */
#define STACK_CPS 128

static unsigned ccc_of(uint32_t cp)
{
    return kvg_uc_nfc(cp) & 0xff;
}

/* Appends cp's full canonical decomposition at out; returns how many code points. */
static size_t decompose(uint32_t cp, uint32_t *out)
{
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t si = cp - S_BASE;
        out[0] = L_BASE + si / N_COUNT;
        out[1] = V_BASE + si % N_COUNT / T_COUNT;
        if (si % T_COUNT == 0)
            return 2;
        out[2] = T_BASE + si % T_COUNT;
        return 3;
    }
    if (!(kvg_uc_nfc(cp) & KVG_UC_HAS_DECOMP)) {
        out[0] = cp;
        return 1;
    }
    size_t lo = 0, hi = kvg_uc_decomp_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (kvg_uc_decomp_cp[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* HAS_DECOMP is set exactly for the code points of kvg_uc_decomp_cp. */
    unsigned at = kvg_uc_decomp_at[lo];
    size_t n = at & 7;
    memcpy(out, kvg_uc_decomp_data + (at >> 3), n * sizeof *out);
    return n;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
        b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    uint64_t key = (uint64_t)a << 21 | b;
    size_t lo = 0, hi = kvg_uc_comp_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (kvg_uc_comp_key[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < kvg_uc_comp_count && kvg_uc_comp_key[lo] == key ? kvg_uc_comp_val[lo] : 0;
}

/* Stable sort of cps[0..n) by combining class (n >= 2, all classes non-zero). Insertion sort
 * for the short runs of real text; a counting sort through tmp for long ones, so that a
 * request of nothing but combining marks costs linear time. */
static void sort_by_ccc(uint32_t *cps, size_t n, uint32_t *tmp)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cps[i];
            unsigned cc = ccc_of(c);
            size_t j = i;
            for (; j > 0 && ccc_of(cps[j - 1]) > cc; j--)
                cps[j] = cps[j - 1];
            cps[j] = c;
        }
        return;
    }
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++)
        count[ccc_of(cps[i]) + 1]++;
    for (size_t k = 1; k < 257; k++)
        count[k] += count[k - 1];
    for (size_t i = 0; i < n; i++)
        tmp[count[ccc_of(cps[i])]++] = cps[i];
    memcpy(cps, tmp, n * sizeof *cps);
}

static void put_utf8(kvg_buf *out, uint32_t cp)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    } else {
        b[0] = (char)(0xf0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 0x3f));
        b[2] = (char)(0x80 | (cp >> 6 & 0x3f)), b[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    }
    kvg_buf_append(out, b, n);
}

/* NFC of the segment s[0..len) of `count` code points: decompose, order, compose (UAX #15). */
static int nfc_segment(const unsigned char *s, size_t len, size_t count, kvg_buf *out)
{
    uint32_t stack[2 * MAX_DECOMP * STACK_CPS];
    uint32_t *cps = stack;
    if (count > STACK_CPS) {
        if (count > SIZE_MAX / (2 * MAX_DECOMP * sizeof *cps))
            return -ENOMEM;
        cps = malloc(2 * MAX_DECOMP * count * sizeof *cps);
        if (!cps)
            return -ENOMEM;
    }
    uint32_t *tmp = cps + MAX_DECOMP * count;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t k = 1;
        uint32_t cp = s[i] < 0x80 ? s[i] : kvg_uc_decode(s + i, &k);
        n += decompose(cp, cps + n);
        i += k;
    }
    for (size_t i = 0; i < n;) {
        if (ccc_of(cps[i]) == 0) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && ccc_of(cps[j]) != 0)
            j++;
        if (j - i > 1)
            sort_by_ccc(cps + i, j - i, tmp);
        i = j;
    }
    /* Compose: each code point joins the last starter unless a code point between them has a
     * class of 0 or one at least its own (it is blocked). */
    size_t o = 0;
    long starter = -1;
    int last_cc = -1; /* the class of the last code point kept after the starter; -1: none */
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cps[i];
        int cc = (int)ccc_of(c);
        if (starter >= 0 && last_cc < cc) {
            uint32_t comp = compose(cps[starter], c);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            starter = (long)o;
            last_cc = -1;
        } else {
            last_cc = cc;
        }
        cps[o++] = c;
    }
    for (size_t i = 0; i < o; i++)
        put_utf8(out, cps[i]);
    if (cps != stack)
        free(cps);
    return out->failed ? -ENOMEM : 0;
}

/* Quick check (UAX #15): text passes as is while every code point is NFC_QC=Yes and the
 * combining classes do not decrease. Where one fails, the segment around it, from the last
 * "boundary" (class 0, QC Yes: nothing before it can change it or combine with it) to the next,
 * is normalised alone; the rest is copied. */
int kvg_unicode_nfc(const char *text, size_t len, kvg_buf *out)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t copied = 0, boundary = 0, i = 0;
    unsigned last_cc = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            boundary = i++;
            last_cc = 0;
            continue;
        }
        size_t n;
        unsigned p = kvg_uc_nfc(kvg_uc_decode(s + i, &n));
        unsigned cc = p & 0xff;
        if (!(p & (KVG_UC_QC_NO | KVG_UC_QC_MAYBE)) && (cc == 0 || cc >= last_cc)) {
            if (cc == 0)
                boundary = i;
            last_cc = cc;
            i += n;
            continue;
        }
        size_t end = i + n, count = 0;
        for (size_t k = boundary; k < end; count++)
            k += s[k] < 0x80 ? 1 : (kvg_uc_decode(s + k, &n), n);
        while (end < len) {
            if (s[end] < 0x80)
                break;
            p = kvg_uc_nfc(kvg_uc_decode(s + end, &n));
            if ((p & 0xff) == 0 && !(p & (KVG_UC_QC_NO | KVG_UC_QC_MAYBE)))
                break;
            end += n;
            count++;
        }
        kvg_buf_append(out, text + copied, boundary - copied);
        int rc = nfc_segment(s + boundary, end - boundary, count, out);
        if (rc < 0)
            return rc;
        copied = boundary = i = end;
        last_cc = 0;
    }
    kvg_buf_append(out, text + copied, len - copied);
    return out->failed ? -ENOMEM : 0;
}
