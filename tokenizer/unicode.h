/* SPDX-License-Identifier: Apache-2.0 */
/* The tokenizer's Unicode layer (private to tokenizer/): UTF-8 validity, NFC, and the
 * pre-tokenizer split of the model families kvgate implements natively. */
#ifndef KVG_TOKENIZER_UNICODE_H
#define KVG_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>

#include "common.h"

/* Pre-tokenizer split patterns that kvgate implements natively. */
typedef enum {
    /* Qwen2/2.5/3's Split regex:
     * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
     * \s*[\r\n]+|\s+(?!\S)|\s+ */
    KVG_PRETOK_QWEN2,
    /* Llama 3/3.1's Split regex: the same with \p{N}{1,3} for \p{N}. */
    KVG_PRETOK_LLAMA3,
    KVG_PRETOK_COUNT
} kvg_pretok_kind;

/** The kind's name for logs and errors ("qwen2", "llama3"); "?" for an unknown value. */
const char *kvg_pretok_kind_str(kvg_pretok_kind kind);
/** The kind whose pattern is exactly `pattern` (tokenizer.json's Split pre-tokenizer
 *  "pattern": {"Regex": "..."} after JSON unescaping), or -1 when kvgate has no native
 *  implementation of it. */
int kvg_pretok_kind_of(const char *pattern, size_t len);
/** Length in bytes (> 0) of the next piece of `text` starting at byte `pos` (pos < len), as
 *  the tokenizers library splits with Split(pattern, behavior "Isolated", invert false):
 *  every regex match is a piece, and so is every gap between matches. `text` is valid UTF-8. */
size_t kvg_pretok_next(kvg_pretok_kind kind, const char *text, size_t len, size_t pos);
/** Appends the NFC normalisation of valid UTF-8 `text` to `out`, exactly as the tokenizers
 *  library's NFC normalizer produces it. 0 or -ENOMEM. Text already in NFC (the usual case)
 *  is appended as is after a quick check. */
int kvg_unicode_nfc(const char *text, size_t len, kvg_buf *out);
/** Whether `text` is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF). */
bool kvg_utf8_valid(const char *text, size_t len);

#endif
