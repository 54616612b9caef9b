/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate's tokenizer on one text, on one core: run by bench/tokenize next to the Rust library.
 * Prints one JSON line: the best and median time of an encode (after a warm-up one), the token
 * and byte counts, and the load time of the tokenizer.json. */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "tokenizer.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE [REPEAT]\n", argv[0]);
        return 2;
    }
    int repeat = argc > 3 ? atoi(argv[3]) : 10;
    if (repeat < 1 || repeat > 100000)
        repeat = 10;
    char err[256];
    kvg_tokenizer *tok;
    uint64_t t0 = kvg_now_ns();
    int rc = kvg_tokenizer_load_file(argv[1], &tok, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint64_t load_ns = kvg_now_ns() - t0;
    kvg_buf text;
    kvg_buf_init(&text);
    if ((rc = kvg_read_file(argv[2], SIZE_MAX - 1, &text.data, &text.len)) < 0) {
        fprintf(stderr, "%s: %s\n", argv[2], kvg_strerror(rc));
        return 1;
    }
    text.cap = text.len + 1;
    kvg_tokens t;
    kvg_tokens_init(&t);
    if ((rc = kvg_tokenizer_encode(tok, text.data, text.len, false, &t))) { /* warm-up */
        fprintf(stderr, "encode: %s\n", kvg_strerror(rc));
        return 1;
    }
    uint64_t *ns = calloc((size_t)repeat, sizeof(*ns));
    if (!ns)
        return 1;
    for (int i = 0; i < repeat; i++) {
        kvg_tokens_reset(&t);
        t0 = kvg_now_ns();
        rc = kvg_tokenizer_encode(tok, text.data, text.len, false, &t);
        ns[i] = kvg_now_ns() - t0;
        if (rc)
            return 1;
    }
    qsort(ns, (size_t)repeat, sizeof(*ns), cmp_u64);
    printf("{\"best_s\": %.9f, \"median_s\": %.9f, \"tokens\": %zu, \"bytes\": %zu, "
           "\"load_s\": %.3f}\n",
           (double)ns[0] / 1e9, (double)ns[repeat / 2] / 1e9, t.len, text.len,
           (double)load_ns / 1e9);
    free(ns);
    kvg_tokens_done(&t);
    kvg_buf_done(&text);
    kvg_tokenizer_free(tok);
    return 0;
}
