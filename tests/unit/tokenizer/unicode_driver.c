/* SPDX-License-Identifier: Apache-2.0 */
/* Not a test: tests/integration/test_tokenizer_unicode.py drives it to compare tokenizer/'s
 * Unicode layer with the Rust tokenizers library.
 *   unicode_driver classes        -> 0x110000 bytes: each code point's KVG_UC_L/N/S bits
 *   unicode_driver pieces KIND    stdin: (u32 length, bytes)*  -> per text: u32 count, u32 lengths
 *   unicode_driver nfc            stdin: (u32 length, bytes)*  -> per text: u32 length, bytes
 *   unicode_driver valid          stdin: (u32 length, bytes)*  -> per text: '1' or '0'
 *   unicode_driver kind           stdin: (u32 length, bytes)*  -> per text: a line, the kind or -1
 * Integers are little-endian. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"
#include "unicode_tables.h"

static void put_u32(uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    fwrite(b, 1, 4, stdout);
}

/* The next text of stdin into *buf (NULL at the end). */
static char *next_text(char **buf, size_t *cap, size_t *len)
{
    unsigned char b[4];
    if (fread(b, 1, 4, stdin) != 4)
        return NULL;
    *len = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
    if (*len + 1 > *cap) {
        *cap = *len + 1;
        *buf = realloc(*buf, *cap);
        if (!*buf)
            exit(2);
    }
    if (fread(*buf, 1, *len, stdin) != *len)
        exit(3);
    return *buf;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "classes") == 0) {
        for (uint32_t cp = 0; cp < 0x110000; cp++)
            putchar((int)kvg_uc_class(cp));
        return 0;
    }
    char *buf = NULL;
    size_t cap = 0, len;
    if (argc >= 3 && strcmp(argv[1], "pieces") == 0) {
        int kind = -1;
        for (int k = 0; k < KVG_PRETOK_COUNT; k++)
            if (strcmp(argv[2], kvg_pretok_kind_str(k)) == 0)
                kind = k;
        if (kind < 0)
            return 2;
        uint32_t *lens = NULL;
        while (next_text(&buf, &cap, &len)) {
            if (!kvg_utf8_valid(buf, len))
                return 4;
            lens = realloc(lens, (len + 1) * sizeof *lens);
            if (!lens)
                return 2;
            uint32_t count = 0;
            for (size_t pos = 0; pos < len;) {
                size_t n = kvg_pretok_next(kind, buf, len, pos);
                if (n == 0 || n > len - pos)
                    return 5;
                lens[count++] = (uint32_t)n;
                pos += n;
            }
            put_u32(count);
            for (uint32_t k = 0; k < count; k++)
                put_u32(lens[k]);
        }
        free(lens);
    } else if (argc >= 2 && strcmp(argv[1], "nfc") == 0) {
        kvg_buf out;
        kvg_buf_init(&out);
        while (next_text(&buf, &cap, &len)) {
            kvg_buf_reset(&out);
            if (kvg_unicode_nfc(buf, len, &out) < 0)
                return 2;
            put_u32((uint32_t)out.len);
            fwrite(out.data, 1, out.len, stdout);
        }
        kvg_buf_done(&out);
    } else if (argc >= 2 && strcmp(argv[1], "valid") == 0) {
        while (next_text(&buf, &cap, &len))
            putchar(kvg_utf8_valid(buf, len) ? '1' : '0');
    } else if (argc >= 2 && strcmp(argv[1], "kind") == 0) {
        while (next_text(&buf, &cap, &len)) {
            int kind = kvg_pretok_kind_of(buf, len);
            printf("%s\n", kind < 0 ? "-1" : kvg_pretok_kind_str(kind));
        }
    } else {
        fprintf(stderr,
                "usage: unicode_driver classes | pieces qwen2|llama3 | nfc | valid | kind\n");
        return 2;
    }
    free(buf);
    return fflush(stdout) == 0 ? 0 : 1;
}
