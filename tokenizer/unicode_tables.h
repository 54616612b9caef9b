/* SPDX-License-Identifier: Apache-2.0 */
/* The generated Unicode tables (unicode_tables.c) and their inline lookups, for unicode.c and
 * pretok.c only. */
#ifndef KVG_TOKENIZER_UNICODE_TABLES_H
#define KVG_TOKENIZER_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

/* The pre-tokenizer's classes, Unicode 16.0.0, as the Oniguruma of the Rust tokenizers sees it. */
enum {
    KVG_UC_L = 1, /* \p{L} */
    KVG_UC_N = 2, /* \p{N} */
    KVG_UC_S = 4, /* \s */
};
extern const uint8_t kvg_uc_class_stage1[0x1100];
extern const uint8_t kvg_uc_class_stage2[];

/* NFC data, Unicode 9.0.0 as unicode-normalization-alignments sees it: bits 0-7 the canonical
 * combining class, then the quick-check answers and whether a canonical decomposition exists. */
enum {
    KVG_UC_QC_NO = 0x100,
    KVG_UC_QC_MAYBE = 0x200,
    KVG_UC_HAS_DECOMP = 0x400,
};
extern const uint8_t kvg_uc_nfc_stage1[0x1100];
extern const uint16_t kvg_uc_nfc_stage2[];
extern const size_t kvg_uc_decomp_count;
extern const uint32_t kvg_uc_decomp_cp[];
extern const uint16_t kvg_uc_decomp_at[];
extern const uint32_t kvg_uc_decomp_data[];
extern const size_t kvg_uc_comp_count;
extern const uint64_t kvg_uc_comp_key[];
extern const uint32_t kvg_uc_comp_val[];

/** The code point of valid UTF-8 at s (not ASCII: s[0] >= 0x80); its length in *n. */
static inline uint32_t kvg_uc_decode(const unsigned char *s, size_t *n)
{
    unsigned b = s[0];
    if (b < 0xe0) {
        *n = 2;
        return (b & 0x1f) << 6 | (s[1] & 0x3f);
    }
    if (b < 0xf0) {
        *n = 3;
        return (b & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    }
    *n = 4;
    return (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
           (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
}
/** The KVG_UC_L/N/S bits of code point cp (< 0x110000). */
static inline unsigned kvg_uc_class(uint32_t cp)
{
    return kvg_uc_class_stage2[(unsigned)kvg_uc_class_stage1[cp >> 8] << 8 | (cp & 0xff)];
}
/** The NFC bits of code point cp (< 0x110000). */
static inline unsigned kvg_uc_nfc(uint32_t cp)
{
    return kvg_uc_nfc_stage2[(unsigned)kvg_uc_nfc_stage1[cp >> 8] << 8 | (cp & 0xff)];
}

#endif
