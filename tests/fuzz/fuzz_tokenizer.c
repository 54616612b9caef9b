/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the tokenizer. An input whose first byte is even is text for a small built-in
 * tokenizer (builtin_tokenizer.c): valid UTF-8 must encode, to ids below the vocabulary size, the
 * same way twice, with special tokens to BOS + the same ids, and through the pieces cache to the
 * same ids again; invalid UTF-8 must be refused. An odd
 * first byte: the rest is a tokenizer.json to load, and a loaded one must encode a fixed text. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "builtin_tokenizer.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvg_tokenizer *builtin;

static kvg_tokenizer *make_builtin(void)
{
    kvg_buf b;
    fuzz_builtin_tokenizer_json(&b);
    kvg_tokenizer *tok;
    char err[256];
    if (kvg_tokenizer_load(b.data, b.len, &tok, err, sizeof(err)) != 0)
        abort();
    kvg_buf_done(&b);
    return tok;
}

static bool utf8_ok(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = kvg_utf8_seq_len(s + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (!builtin)
        builtin = make_builtin();
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    kvg_tokens a, b;
    kvg_tokens_init(&a);
    kvg_tokens_init(&b);
    if (data[0] % 2 == 0) {
        int rc = kvg_tokenizer_encode(builtin, text, len, false, &a);
        if (!utf8_ok((const uint8_t *)text, len)) {
            if (rc != KVG_EPARSE || a.len != 0)
                abort();
        } else {
            if (rc != 0)
                abort();
            uint32_t vs = kvg_tokenizer_vocab_size(builtin);
            for (size_t i = 0; i < a.len; i++) {
                if (a.ids[i] >= vs)
                    abort();
            }
            size_t n = a.len;
            if (kvg_tokenizer_encode(builtin, text, len, false, &a) != 0 || a.len != 2 * n ||
                (n && memcmp(a.ids, a.ids + n, n * sizeof(uint32_t)) != 0))
                abort();
            if (kvg_tokenizer_encode(builtin, text, len, true, &b) != 0 || b.len != n + 1 ||
                b.ids[0] != 264 || (n && memcmp(b.ids + 1, a.ids, n * sizeof(uint32_t)) != 0))
                abort();
            /* Through the pieces cache (small: evictions; kept across inputs, so pieces of
             * earlier inputs are hits), twice: the ids of a plain encode each time. */
            static kvg_tokenizer_cache *cache;
            if (!cache && kvg_tokenizer_cache_new(256 * 1024, &cache) != 0)
                abort();
            for (int k = 0; k < 2; k++) {
                kvg_tokens_reset(&b);
                if (kvg_tokenizer_encode_cached(builtin, text, len, false, cache, "s", 1, &b) !=
                        0 ||
                    b.len != n || (n && memcmp(b.ids, a.ids, n * sizeof(uint32_t)) != 0))
                    abort();
            }
        }
    } else {
        kvg_tokenizer *tok;
        char err[256];
        if (kvg_tokenizer_load(text, len, &tok, err, sizeof(err)) == 0) {
            static const char sample[] = "Hello <|im_start|> world\r\n  123 日本 e\xcc\x81 😀";
            if (kvg_tokenizer_encode(tok, sample, sizeof(sample) - 1, true, &a) != 0)
                abort();
            uint32_t vs = kvg_tokenizer_vocab_size(tok);
            for (size_t i = 0; i < a.len; i++) {
                if (a.ids[i] >= vs)
                    abort();
            }
            kvg_tokenizer_free(tok);
        }
    }
    kvg_tokens_done(&a);
    kvg_tokens_done(&b);
    return 0;
}
