/* SPDX-License-Identifier: Apache-2.0 */
/* Throughput of the tokenizer's Unicode layer on one core: kvg_pretok_next (pieces/s, MB/s) for
 * each pattern, kvg_unicode_nfc and kvg_utf8_valid, over a 512 KB mixed text (English prose
 * with contractions, code, numbers, CJK, Cyrillic, accents, emoji; or the file given as
 * argv[1]). `pretok_bench --dump FILE` writes the generated text, so that the Rust library can
 * be timed on the same bytes. Run from a release build. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "unicode.h"

/* Parenthesised concatenations are one element each (clang's -Wstring-concatenation). */
static const char *const samples[] = {
    "The quick brown fox jumps over the lazy dog. ",
    "It's what we'd've done, isn't it? They'RE here and I'LL go. ",
    "    for (int i = 0; i < n; i++) {\n        total += values[i] * 3;\n    }\n",
    "Order #1234567 shipped 2024-11-05 at 13:45:07, total $1,299.99.\n\n",
    ("\xe4\xbb\x8a\xe5\xa4\xa9\xe5\xa4\xa9\xe6\xb0\x94\xe5\xbe\x88\xe5\xa5\xbd\xef\xbc\x8c\xe6\x88"
     "\x91\xe4\xbb\xac\xe5\x8e\xbb\xe5\x85\xac\xe5\x9b\xad\xe5\x90\xa7\xe3\x80\x82"),
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80! ",
    "Caf\xc3\xa9 cr\xc3\xa8me br\xc3\xbbl\xc3\xa9\x65, na\xc3\xafve r\xc3\xa9sum\xc3\xa9. ",
    "Great job \xf0\x9f\x98\x80\xf0\x9f\x8e\x89!\r\n",
    "{\"role\": \"user\", \"content\": \"Summarise the following text in 3 bullet points.\"}\n",
    "\t\t  \n",
};

static double mbps(size_t n, uint64_t ns)
{
    return ns ? (double)n * 1e3 / (double)ns : 0;
}

int main(int argc, char **argv)
{
    kvg_buf text;
    kvg_buf_init(&text);
    const char *dump = NULL;
    if (argc == 3 && strcmp(argv[1], "--dump") == 0) {
        dump = argv[2];
    } else if (argc == 2) {
        FILE *f = fopen(argv[1], "rb");
        if (!f)
            return perror(argv[1]), 1;
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
            kvg_buf_append(&text, chunk, n);
        fclose(f);
    }
    if (text.len == 0) {
        uint64_t x = 0x9e3779b97f4a7c15u; /* a fixed xorshift: the same text every run */
        while (text.len < 512 * 1024) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            kvg_buf_puts(&text, samples[x % KVG_ARRAY_LEN(samples)]);
        }
    }
    if (text.failed || !kvg_utf8_valid(text.data, text.len))
        return fprintf(stderr, "not valid UTF-8\n"), 1;
    if (dump) {
        FILE *f = fopen(dump, "wb");
        if (!f || fwrite(text.data, 1, text.len, f) != text.len || fclose(f) != 0)
            return perror(dump), 1;
        return 0;
    }
    enum { ROUNDS = 20 };
    printf("text: %zu bytes, best of %d rounds\n", text.len, ROUNDS);
    for (int kind = 0; kind < KVG_PRETOK_COUNT; kind++) {
        uint64_t best = UINT64_MAX;
        size_t pieces = 0;
        for (int r = 0; r < ROUNDS; r++) {
            uint64_t t0 = kvg_now_ns();
            size_t count = 0;
            for (size_t pos = 0; pos < text.len; count++)
                pos += kvg_pretok_next(kind, text.data, text.len, pos);
            uint64_t dt = kvg_now_ns() - t0;
            best = KVG_MIN(best, dt);
            pieces = count;
        }
        printf("pretok %-7s %8zu pieces  %7.1f M pieces/s  %7.1f MB/s\n", kvg_pretok_kind_str(kind),
               pieces, (double)pieces * 1e3 / (double)best, mbps(text.len, best));
    }
    kvg_buf out;
    kvg_buf_init(&out);
    uint64_t best = UINT64_MAX;
    for (int r = 0; r < ROUNDS; r++) {
        kvg_buf_reset(&out);
        uint64_t t0 = kvg_now_ns();
        if (kvg_unicode_nfc(text.data, text.len, &out) < 0)
            return 1;
        best = KVG_MIN(best, kvg_now_ns() - t0);
    }
    printf("nfc            %8zu bytes   %7.1f MB/s%s\n", out.len, mbps(text.len, best),
           out.len == text.len && memcmp(out.data, text.data, text.len) == 0 ? " (already NFC)"
                                                                             : "");
    best = UINT64_MAX;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t t0 = kvg_now_ns();
        bool ok = kvg_utf8_valid(text.data, text.len);
        __asm__ volatile("" : : "r"(ok) : "memory");
        best = KVG_MIN(best, kvg_now_ns() - t0);
    }
    printf("utf8_valid                       %7.1f MB/s\n", mbps(text.len, best));
    kvg_buf_done(&out);
    kvg_buf_done(&text);
    return 0;
}
