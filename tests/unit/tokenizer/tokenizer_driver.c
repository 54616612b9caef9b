/* SPDX-License-Identifier: Apache-2.0 */
/* Not a test: tests/integration/test_tokenizer_oracle.py feeds it texts and compares its ids with
 * the Rust tokenizers library's (the records of tokenizer_oracle.js). With --cached each text is
 * encoded twice through a small pieces cache (1 MiB: evictions happen) and the second ids are
 * written: what a cache hit gives must be what an encode gives. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tokenizer.h"

static int put_ids(const uint32_t *ids, size_t n, int rc)
{
    uint32_t count = rc ? 0xffffffffu : (uint32_t)n;
    if (fwrite(&count, 4, 1, stdout) != 1 || (!rc && n && fwrite(ids, 4, n, stdout) != n))
        return -EIO;
    return 0;
}

int main(int argc, char **argv)
{
    bool cached = argc == 3 && strcmp(argv[1], "--cached") == 0;
    if (argc != 2 && !cached) {
        fprintf(stderr, "usage: %s [--cached] TOKENIZER_JSON < cases > ids\n", argv[0]);
        return 2;
    }
    kvg_tokenizer_cache *cache = NULL;
    if (cached && kvg_tokenizer_cache_new(1u << 20, &cache) < 0)
        return 1;
    char err[256];
    kvg_tokenizer *tok;
    int rc = kvg_tokenizer_load_file(argv[argc - 1], &tok, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    kvg_tokens out;
    kvg_tokens_init(&out);
    char *text = NULL;
    size_t cap = 0;
    uint32_t len;
    while (fread(&len, 4, 1, stdin) == 1) {
        if (len >= cap) {
            cap = (size_t)len + 1;
            free(text);
            text = malloc(cap);
            if (!text)
                return 1;
        }
        if (len && fread(text, 1, len, stdin) != len)
            return 1;
        for (int special = 0; special < 2; special++) {
            kvg_tokens_reset(&out);
            if (cached) {
                rc = kvg_tokenizer_encode_cached(tok, text, len, special, cache, "s", 1, &out);
                kvg_tokens_reset(&out);
                if (rc == 0)
                    rc = kvg_tokenizer_encode_cached(tok, text, len, special, cache, "s", 1, &out);
            } else {
                rc = kvg_tokenizer_encode(tok, text, len, special, &out);
            }
            if (put_ids(out.ids, out.len, rc))
                return 1;
        }
    }
    free(text);
    kvg_tokens_done(&out);
    if (cached) {
        uint64_t hits, misses;
        size_t bytes;
        kvg_tokenizer_cache_stats(cache, &hits, &misses, &bytes);
        fprintf(stderr, "cache: %llu hits, %llu misses, %zu bytes\n", (unsigned long long)hits,
                (unsigned long long)misses, bytes);
    }
    kvg_tokenizer_cache_free(cache);
    kvg_tokenizer_free(tok);
    return fflush(stdout) == 0 ? 0 : 1;
}
