/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: tokenizer/'s Unicode layer on any bytes. kvg_utf8_valid decides; on valid text,
 * each pattern's pieces are non-empty, end on code point boundaries and cover the text exactly,
 * and NFC gives valid UTF-8 that NFC leaves as it is. (Exactness against the Rust library is
 * tests/integration/test_tokenizer_unicode.py's job.) */
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    if (!kvg_utf8_valid(text, size))
        return 0;
    for (int kind = 0; kind < KVG_PRETOK_COUNT; kind++) {
        for (size_t pos = 0; pos < size;) {
            size_t n = kvg_pretok_next(kind, text, size, pos);
            check(n > 0 && n <= size - pos);
            check(kvg_utf8_valid(text + pos, n));
            pos += n;
        }
    }
    kvg_buf once, twice;
    kvg_buf_init(&once);
    kvg_buf_init(&twice);
    check(kvg_unicode_nfc(text, size, &once) == 0);
    check(kvg_utf8_valid(once.data ? once.data : "", once.len));
    check(kvg_unicode_nfc(once.data ? once.data : "", once.len, &twice) == 0);
    check(twice.len == once.len && (once.len == 0 || memcmp(twice.data, once.data, once.len) == 0));
    kvg_buf_done(&once);
    kvg_buf_done(&twice);
    return 0;
}
