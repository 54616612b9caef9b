/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of tokenizer/tokenizer.c on small hand-built tokenizer.json files: each unsupported
 * part named in the load error, the order of merges, ignore_merges, the added tokens' flags, the
 * post-processor's template, and failing allocations on load and encode. The expected ids follow
 * from the BPE rules by hand; the Rust library itself checks the real files
 * (tests/integration/test_tokenizer_oracle.py). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"
#include "fail_alloc.h"
#include "tokenizer.h"

/* The vocabulary of every test file: a b c ab bc abc Ġ(space) < x > and y. Ids 0..10. */
#define VOCAB                                                                                      \
    "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"\\u0120\":6,\"<\":7,\"x\":8,\">\":9,"  \
    "\"y\":10}"
#define BYTELEVEL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}"
#define ADDED_FLAGS(sw, l, r, n, sp)                                                               \
    "\"single_word\":" sw ",\"lstrip\":" l ",\"rstrip\":" r ",\"normalized\":" n ",\"special\""    \
    ":" sp

typedef struct parts {
    const char *normalizer;    /* JSON value */
    const char *pre_tokenizer; /* JSON value */
    const char *model_extra;   /* members added to the model object, each with a leading comma */
    const char *merges;        /* JSON array */
    const char *added;         /* JSON array */
    const char *post;          /* JSON value */
    const char *top_extra;     /* members added to the top object, each with a leading comma */
} parts;

static char *make_json(const parts *p)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_printf(&b,
                   "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
                   "\"added_tokens\":%s,\"normalizer\":%s,\"pre_tokenizer\":%s,"
                   "\"post_processor\":%s,\"decoder\":null,\"model\":{\"type\":\"BPE\","
                   "\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
                   "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,"
                   "\"vocab\":" VOCAB ",\"merges\":%s%s}%s}",
                   p->added ? p->added : "[]", p->normalizer ? p->normalizer : "null",
                   p->pre_tokenizer ? p->pre_tokenizer : BYTELEVEL, p->post ? p->post : "null",
                   p->merges ? p->merges : "[]", p->model_extra ? p->model_extra : "",
                   p->top_extra ? p->top_extra : "");
    assert_false(b.failed);
    size_t len;
    return kvg_buf_steal(&b, &len);
}

static kvg_tokenizer *load(const parts *p)
{
    char *json = make_json(p);
    char err[256];
    kvg_tokenizer *tok = NULL;
    int rc = kvg_tokenizer_load(json, strlen(json), &tok, err, sizeof(err));
    if (rc)
        fail_msg("load: %s (%s)", err, kvg_strerror(rc));
    free(json);
    return tok;
}

/* Encode and compare with the expected ids (terminated by UINT32_MAX). */
static void check(const kvg_tokenizer *tok, const char *text, bool special, const uint32_t *want)
{
    kvg_tokens t;
    kvg_tokens_init(&t);
    assert_int_equal(kvg_tokenizer_encode(tok, text, strlen(text), special, &t), 0);
    size_t n = 0;
    while (want[n] != UINT32_MAX)
        n++;
    char got[256] = "", *w = got;
    for (size_t i = 0; i < t.len && w < got + sizeof(got) - 12; i++)
        w += sprintf(w, " %u", t.ids[i]);
    if (t.len != n || (n && memcmp(t.ids, want, n * sizeof(*want)) != 0))
        fail_msg("\"%s\": got%s", text, got);
    kvg_tokens_done(&t);
}

#define IDS(...) ((const uint32_t[]){__VA_ARGS__, UINT32_MAX})
#define NONE ((const uint32_t[]){UINT32_MAX})

static void expect_error(const parts *p, int want_rc, const char *want_msg)
{
    char *json = make_json(p);
    char err[256];
    kvg_tokenizer *tok = NULL;
    int rc = kvg_tokenizer_load(json, strlen(json), &tok, err, sizeof(err));
    free(json);
    assert_null(tok);
    if (rc != want_rc || !strstr(err, want_msg))
        fail_msg("want %s containing '%s'; got %s: %s", kvg_strerror(want_rc), want_msg,
                 kvg_strerror(rc), err);
    assert_true(strncmp(err, "tokenizer.json: ", 16) == 0);
}

static void test_merges_order(void **state)
{
    /* (a,b) first: a b c -> ab c, and no (ab,c) merge. */
    kvg_tokenizer *tok = load(&(parts){.merges = "[\"a b\",\"b c\",\"a bc\"]"});
    check(tok, "abc", false, IDS(3, 2));
    check(tok, "cab", false, IDS(2, 3));
    check(tok, "bcbc", false, IDS(4, 4));
    kvg_tokenizer_free(tok);
    /* (b,c) first: a b c -> a bc -> abc. */
    tok = load(&(parts){.merges = "[\"b c\",\"a b\",\"a bc\"]"});
    check(tok, "abc", false, IDS(5));
    /* Ties on rank go leftmost first: b c b c -> bc bc. */
    check(tok, "abcabc", false, IDS(5, 5));
    kvg_tokenizer_free(tok);
    /* The pair form gives the same. */
    tok = load(&(parts){.merges = "[[\"b\",\"c\"],[\"a\",\"b\"],[\"a\",\"bc\"]]"});
    check(tok, "abc", false, IDS(5));
    kvg_tokenizer_free(tok);
    /* A repeated merge takes its last rank: (a,b) ends after (b,c). */
    tok = load(&(parts){.merges = "[\"a b\",\"b c\",\"a bc\",\"a b\"]"});
    check(tok, "abc", false, IDS(5));
    kvg_tokenizer_free(tok);
}

static void test_long_pieces(void **state)
{
    /* Past the scanning merger's size, the priority queue takes over: same rules. */
    kvg_tokenizer *tok = load(&(parts){.merges = "[\"b c\",\"a b\",\"a bc\"]"});
    kvg_buf b;
    kvg_buf_init(&b);
    for (int i = 0; i < 200; i++)
        kvg_buf_puts(&b, "abc");
    kvg_buf_puts(&b, "ab");
    kvg_tokens t;
    kvg_tokens_init(&t);
    assert_int_equal(kvg_tokenizer_encode(tok, b.data, b.len, false, &t), 0);
    assert_int_equal(t.len, 201);
    for (int i = 0; i < 200; i++)
        assert_int_equal(t.ids[i], 5);
    assert_int_equal(t.ids[200], 3);
    /* Appends: a second encode adds to the ids already there. */
    assert_int_equal(kvg_tokenizer_encode(tok, "c", 1, false, &t), 0);
    assert_int_equal(t.len, 202);
    assert_int_equal(t.ids[201], 2);
    kvg_tokens_done(&t);
    kvg_buf_done(&b);
    kvg_tokenizer_free(tok);
}

static void test_ignore_merges(void **state)
{
    /* abc is in the vocabulary, but no merge makes it. */
    parts p = {.merges = "[\"a b\"]"};
    kvg_tokenizer *tok = load(&p);
    check(tok, "abc", false, IDS(3, 2));
    kvg_tokenizer_free(tok);
    p.model_extra = ",\"ignore_merges\":true";
    tok = load(&p);
    check(tok, "abc", false, IDS(5));
    check(tok, "abcb", false, IDS(3, 2, 1)); /* not in the vocabulary: merges as before */
    kvg_tokenizer_free(tok);
}

static void test_bytelevel(void **state)
{
    kvg_tokenizer *tok = load(&(parts){0});
    /* The space is Ġ (U+0120) in the vocabulary; a byte outside it is dropped (no unk). */
    check(tok, "a b", false, IDS(0, 6, 1));
    check(tok, "aqb", false, IDS(0, 1));
    uint32_t id;
    assert_int_equal(kvg_tokenizer_token_id(tok, "\xc4\xa0", 2, &id), 0);
    assert_int_equal(id, 6);
    assert_int_equal(kvg_tokenizer_token_id(tok, " ", 1, &id), KVG_ENOTFOUND);
    assert_int_equal(kvg_tokenizer_token_id(tok, "abc", 3, &id), 0);
    assert_int_equal(id, 5);
    assert_int_equal(kvg_tokenizer_vocab_size(tok), 11);
    assert_int_equal(kvg_tokenizer_bos_id(tok, &id), KVG_ENOTFOUND);
    assert_int_equal(kvg_tokenizer_eos_id(tok, &id), KVG_ENOTFOUND);
    /* Invalid UTF-8 is refused and leaves the output as it was. */
    kvg_tokens t;
    kvg_tokens_init(&t);
    assert_int_equal(kvg_tokenizer_encode(tok, "a", 1, false, &t), 0);
    assert_int_equal(kvg_tokenizer_encode(tok, "a\xff", 2, false, &t), KVG_EPARSE);
    assert_int_equal(kvg_tokenizer_encode(tok, "\xed\xa0\x80", 3, false, &t), KVG_EPARSE);
    assert_int_equal(t.len, 1);
    kvg_tokens_done(&t);
    kvg_tokenizer_free(tok);
}

static void test_added_tokens(void **state)
{
    uint32_t id;
    /* Ids: "<x>" is not in the vocabulary (11 entries): 11, then 12; "ab" is: its id 3. */
    kvg_tokenizer *tok = load(
        &(parts){.added = "[{\"id\":99,\"content\":\"<x>\"," ADDED_FLAGS(
                     "false", "false", "false", "false",
                     "true") "},"
                             "{\"id\":98,\"content\":\"ab\"," ADDED_FLAGS(
                                 "false", "false", "false", "false",
                                 "false") "},"
                                          "{\"id\":97,\"content\":\"<x>>\"," ADDED_FLAGS(
                                              "false", "false", "false", "false", "false") "}]"});
    assert_int_equal(kvg_tokenizer_token_id(tok, "<x>", 3, &id), 0);
    assert_int_equal(id, 11);
    assert_int_equal(kvg_tokenizer_token_id(tok, "<x>>", 4, &id), 0);
    assert_int_equal(id, 12);
    assert_int_equal(kvg_tokenizer_vocab_size(tok), 13);
    /* Split out first, the longest at the leftmost start; the rest goes through BPE. */
    check(tok, "c<x>c", false, IDS(2, 11, 2));
    check(tok, "<x>>", false, IDS(12));
    check(tok, "<<x>", false, IDS(7, 11));
    check(tok, "<x", false, IDS(7, 8));
    check(tok, "abab", false, IDS(3, 3));
    kvg_tokenizer_free(tok);
}

static void test_added_flags(void **state)
{
    /* lstrip takes the whitespace before the token into it; rstrip the whitespace after. */
    kvg_tokenizer *tok =
        load(&(parts){.added = "[{\"id\":11,\"content\":\"<x>\"," ADDED_FLAGS(
                          "false", "true", "false", "false",
                          "true") "},"
                                  "{\"id\":12,\"content\":\"y\"," ADDED_FLAGS(
                                      "false", "false", "true", "false", "true") "}]"});
    check(tok, "a  <x>b", false, IDS(0, 11, 1));
    check(tok, "a<x> b", false, IDS(0, 11, 6, 1));
    /* "y" is in the vocabulary: the added token takes its id there, 10. */
    check(tok, "y  b", false, IDS(10, 1));
    check(tok, "a y", false, IDS(0, 6, 10));
    /* lstrip stops at the previous token's end. */
    check(tok, "y  <x>", false, IDS(10, 11));
    kvg_tokenizer_free(tok);
    /* single_word: only between non-word characters. */
    tok = load(&(parts){.added = "[{\"id\":11,\"content\":\"xy\"," ADDED_FLAGS(
                            "true", "false", "false", "false", "true") "}]"});
    check(tok, "axyb", false, IDS(0, 8, 10, 1));
    check(tok, "a xy b", false, IDS(0, 6, 11, 6, 1));
    check(tok, "xy", false, IDS(11));
    check(tok, "<xy>", false, IDS(7, 11, 9));
    check(tok, "xy_", false, IDS(8, 10));
    kvg_tokenizer_free(tok);
}

static void test_template(void **state)
{
    const char *tp = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
                     "\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
                     "{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"pair\":[],"
                     "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[7],\"tokens\":[\"<\"]},"
                     "\"</s>\":{\"id\":\"</s>\",\"ids\":[9,10],\"tokens\":[\">\",\"y\"]}}}";
    char post[1024];
    snprintf(post, sizeof(post),
             "{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\","
             "\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},%s]}",
             tp);
    kvg_tokenizer *tok = load(&(parts){.post = post});
    check(tok, "ab", false, IDS(0, 1));
    check(tok, "ab", true, IDS(7, 0, 1, 9, 10));
    check(tok, "", true, IDS(7, 9, 10));
    check(tok, "", false, NONE);
    uint32_t id;
    assert_int_equal(kvg_tokenizer_bos_id(tok, &id), 0);
    assert_int_equal(id, 7);
    assert_int_equal(kvg_tokenizer_eos_id(tok, &id), 0);
    assert_int_equal(id, 10);
    kvg_tokenizer_free(tok);
}

static void test_load_errors(void **state)
{
    expect_error(&(parts){.top_extra = ",\"model\":{\"type\":\"WordPiece\"}"}, KVG_ECONFIG,
                 "model.type \"WordPiece\" is not supported (BPE only)");
    /* A value in a message stays on one line and within bounds. */
    expect_error(&(parts){.top_extra = ",\"model\":{\"type\":\"Word\\nPiece\"}"}, KVG_ECONFIG,
                 "model.type \"Word?Piece\" is not supported");
    expect_error(&(parts){.top_extra =
                              ",\"model\":{\"type\":\"0123456789012345678901234567890123456789"
                              "01234567890123456789\u00e9\u00e9\"}"},
                 KVG_ECONFIG,
                 "model.type \"012345678901234567890123456789012345678901234567890123456789...\"");
    expect_error(&(parts){.model_extra = ",\"byte_fallback\":true"}, KVG_ECONFIG,
                 "model.byte_fallback true is not supported");
    expect_error(&(parts){.model_extra = ",\"dropout\":0.1"}, KVG_ECONFIG, "model.dropout");
    expect_error(&(parts){.model_extra = ",\"unk_token\":\"<unk>\""}, KVG_ECONFIG,
                 "model.unk_token \"<unk>\" is not supported");
    expect_error(&(parts){.model_extra = ",\"continuing_subword_prefix\":\"##\""}, KVG_ECONFIG,
                 "model.continuing_subword_prefix \"##\" is not supported");
    expect_error(&(parts){.model_extra = ",\"end_of_word_suffix\":\"</w>\""}, KVG_ECONFIG,
                 "model.end_of_word_suffix \"</w>\" is not supported");
    expect_error(&(parts){.normalizer = "{\"type\":\"Lowercase\"}"}, KVG_ECONFIG,
                 "normalizer.type \"Lowercase\" is not supported");
    expect_error(&(parts){.normalizer =
                              "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
                              "{\"type\":\"NFKC\"}]}"},
                 KVG_ECONFIG, "normalizer.normalizers[1].type \"NFKC\" is not supported");
    expect_error(&(parts){.pre_tokenizer = "{\"type\":\"Whitespace\"}"}, KVG_ECONFIG,
                 "pre_tokenizer.type \"Whitespace\" is not supported");
    expect_error(&(parts){.pre_tokenizer = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
                                           "\"use_regex\":false}"},
                 KVG_ECONFIG, "pre_tokenizer.add_prefix_space true is not supported");
    expect_error(&(parts){.pre_tokenizer = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                           "\"use_regex\":true}"},
                 KVG_ECONFIG, "pre_tokenizer.use_regex true is not supported");
    expect_error(
        &(parts){.pre_tokenizer = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                                  "\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},"
                                  "\"behavior\":\"Isolated\",\"invert\":false}," BYTELEVEL "]}"},
        KVG_ECONFIG, "pre_tokenizer.pretokenizers[0].pattern.Regex \"\\s+\" is not supported");
    expect_error(&(parts){.pre_tokenizer =
                              "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                              "\"Split\",\"pattern\":{\"String\":\" \"},"
                              "\"behavior\":\"Isolated\",\"invert\":false}," BYTELEVEL "]}"},
                 KVG_ECONFIG, "pre_tokenizer.pretokenizers[0].pattern is not supported");
    expect_error(&(parts){.pre_tokenizer = "{\"type\":\"Sequence\",\"pretokenizers\":[" BYTELEVEL
                                           "," BYTELEVEL "]}"},
                 KVG_ECONFIG, "pre_tokenizer.pretokenizers[0].type \"ByteLevel\" is not supported");
    expect_error(&(parts){.post = "{\"type\":\"RobertaProcessing\"}"}, KVG_ECONFIG,
                 "post_processor.type \"RobertaProcessing\" is not supported");
    expect_error(&(parts){.post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":"
                                  "{\"id\":\"B\",\"type_id\":0}}],\"special_tokens\":{}}"},
                 KVG_ECONFIG, "TemplateProcessing.single[0] is not supported");
    expect_error(&(parts){.post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                                  "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
                                  "\"type_id\":0}}],\"special_tokens\":{}}"},
                 KVG_EPARSE, "special token \"<s>\", which its special_tokens lack");
    expect_error(&(parts){.top_extra = ",\"truncation\":{\"max_length\":5}"}, KVG_ECONFIG,
                 "truncation object is not supported");
    expect_error(&(parts){.top_extra = ",\"padding\":{}"}, KVG_ECONFIG,
                 "padding object is not supported");
    expect_error(&(parts){.merges = "[\"a q\"]"}, KVG_EPARSE,
                 "model.merges[0] names \"q\", which is not in model.vocab");
    expect_error(&(parts){.merges = "[\"x y\"]"}, KVG_EPARSE,
                 "model.merges[0] names \"xy\", which is not in model.vocab");
    expect_error(&(parts){.merges = "[\"a b c\"]"}, KVG_EPARSE, "is not two tokens");
    expect_error(&(parts){.merges = "[1]"}, KVG_EPARSE, "model.merges[0] is neither");
    expect_error(&(parts){.added = "[{\"id\":11,\"content\":\"q\",\"special\":true}]"}, KVG_EPARSE,
                 "added_tokens[0].single_word is missing");
    expect_error(&(parts){.added = "[{\"id\":11,\"content\":\"q\"," ADDED_FLAGS(
                              "false", "false", "false", "false",
                              "true") "},{\"id\":12,"
                                      "\"content\":\"q\"," ADDED_FLAGS("false", "false", "false",
                                                                       "false", "true") "}]"},
                 KVG_ECONFIG, "added_tokens[1].content \"q\" repeats");
    /* Not JSON, and JSON that is not an object. */
    char err[256];
    kvg_tokenizer *tok = NULL;
    assert_int_equal(kvg_tokenizer_load("{\"model\":", 9, &tok, err, sizeof(err)), KVG_EPARSE);
    assert_non_null(strstr(err, "not valid JSON"));
    assert_int_equal(kvg_tokenizer_load("[]", 2, &tok, err, sizeof(err)), KVG_EPARSE);
    assert_non_null(strstr(err, "top level is array"));
    assert_int_equal(kvg_tokenizer_load("{}", 2, &tok, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "pre_tokenizer"));
    assert_null(tok);
    assert_int_equal(kvg_tokenizer_load_file("/nonexistent/tokenizer.json", &tok, err, sizeof(err)),
                     -ENOENT);
    assert_non_null(strstr(err, "/nonexistent/tokenizer.json"));
}

static void test_failing_allocator(void **state)
{
    char *json = make_json(&(parts){
        .merges = "[\"b c\",\"a b\",\"a bc\"]",
        .added = "[{\"id\":11,\"content\":\"<x>\"," ADDED_FLAGS("false", "false", "false", "false",
                                                                "true") "}]",
        .post = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\","
                "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":"
                "{\"<s>\":{\"id\":\"<s>\",\"ids\":[7],\"tokens\":[\"<\"]}}}"});
    long injections = 0;
    kvg_tokenizer *tok = NULL;
    for (long n = 0;; n++) {
        char err[256];
        fail_alloc_nth(n);
        int rc = kvg_tokenizer_load(json, strlen(json), &tok, err, sizeof(err));
        bool injected = fail_alloc_off();
        injections += injected;
        if (!injected) {
            assert_int_equal(rc, 0);
            break;
        }
        if (rc == 0)
            kvg_tokenizer_free(tok);
        else
            assert_int_equal(rc, -ENOMEM);
        tok = NULL;
    }
    assert_true(injections > 5);
    free(json);
    /* Encode: a long text, so that the ids and the scratch grow more than once. */
    kvg_buf text;
    kvg_buf_init(&text);
    for (int i = 0; i < 300; i++)
        kvg_buf_puts(&text, "abc<x>");
    kvg_buf_puts(&text, "abcabcabcabcabcabcabcabcabcabcabcabcabcabcabc");
    long enc_injections = 0;
    for (long n = 0;; n++) {
        kvg_tokens t;
        kvg_tokens_init(&t);
        fail_alloc_nth(n);
        int rc = kvg_tokenizer_encode(tok, text.data, text.len, true, &t);
        bool injected = fail_alloc_off();
        enc_injections += injected;
        if (!injected) {
            assert_int_equal(rc, 0);
            assert_int_equal(t.len, 1 + 600 + 15);
            kvg_tokens_done(&t);
            break;
        }
        if (rc)
            assert_int_equal(rc, -ENOMEM);
        if (rc)
            assert_int_equal(t.len, 0);
        kvg_tokens_done(&t);
    }
    assert_true(enc_injections >= 3);
    print_message("# %ld allocation failures injected while loading, %ld while encoding\n",
                  injections, enc_injections);
    kvg_buf_done(&text);
    kvg_tokenizer_free(tok);
}

/* One tokenizer, several threads encoding at once, each with its own kvg_tokens: the same ids
 * as one thread alone (the tokenizer is read-only after load). */
typedef struct enc_arg {
    const kvg_tokenizer *tok;
    const char *text;
    size_t len;
    const kvg_tokens *want;
    kvg_tokenizer_cache *cache; /* NULL: plain encode */
    bool ok;
} enc_arg;

static void *encode_many(void *p)
{
    enc_arg *a = p;
    kvg_tokens t;
    kvg_tokens_init(&t);
    a->ok = true;
    for (int i = 0; i < 50 && a->ok; i++) {
        kvg_tokens_reset(&t);
        a->ok =
            kvg_tokenizer_encode_cached(a->tok, a->text, a->len, true, a->cache, "s", 1, &t) == 0 &&
            t.len == a->want->len &&
            (!t.len || memcmp(t.ids, a->want->ids, t.len * sizeof(uint32_t)) == 0);
    }
    kvg_tokens_done(&t);
    return NULL;
}

static void test_threads(void **state)
{
    kvg_tokenizer *tok = load(&(parts){.normalizer = "{\"type\":\"NFC\"}",
                                       .merges = "[\"b c\",\"a b\",\"a bc\"]",
                                       .added = "[{\"id\":11,\"content\":\"<x>\"," ADDED_FLAGS(
                                           "false", "true", "true", "false", "true") "}]"});
    kvg_buf text;
    kvg_buf_init(&text);
    for (int i = 0; i < 400; i++)
        kvg_buf_printf(&text, "abc <x> %s%s",
                       i % 3 ? "abcabcabcabcabcabcabcabcabc abcabcabcabcabcabcabcabcabc "
                               "abcabcabcabcabcabcabcabcabc"
                             : "b",
                       i % 5 ? "e\xcc\x81" : "x");
    kvg_tokens want;
    kvg_tokens_init(&want);
    assert_int_equal(kvg_tokenizer_encode(tok, text.data, text.len, true, &want), 0);
    enum { N = 4 };
    pthread_t th[N];
    enc_arg args[N];
    kvg_tokenizer_cache *cache;
    assert_int_equal(kvg_tokenizer_cache_new(1u << 20, &cache), 0);
    for (int i = 0; i < N; i++) {
        args[i] = (enc_arg){.tok = tok,
                            .text = text.data,
                            .len = text.len,
                            .want = &want,
                            .cache = i % 2 ? cache : NULL}; /* two share a pieces cache */
        assert_int_equal(pthread_create(&th[i], NULL, encode_many, &args[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    uint64_t hits, misses;
    size_t bytes;
    kvg_tokenizer_cache_stats(cache, &hits, &misses, &bytes);
    assert_true(hits > 0 && bytes > 0);
    kvg_tokenizer_cache_free(cache);
    kvg_tokens_done(&want);
    kvg_buf_done(&text);
    kvg_tokenizer_free(tok);
}

/* The pieces cache: the ids of encode; a scope's pieces are not another scope's; short pieces
 * are not kept; the bytes kept stay within the bound, the oldest going first. */
static void test_pieces_cache(void **state)
{
    (void)state;
    kvg_tokenizer *tok = load(&(parts){.merges = "[\"b c\",\"a b\",\"a bc\"]",
                                       .added = "[{\"id\":11,\"content\":\"<x>\"," ADDED_FLAGS(
                                           "false", "false", "false", "false", "true") "}]"});
    kvg_tokenizer_cache *c;
    assert_int_equal(kvg_tokenizer_cache_new(64 * 1024, &c), 0);
    char text[400];
    kvg_tokens plain, got;
    kvg_tokens_init(&plain);
    kvg_tokens_init(&got);
    uint64_t hits, misses;
    size_t bytes;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 200; i++) {
            /* A long piece unique to i, an added token, a short piece. */
            int n = snprintf(text, sizeof(text), "%0*d<x>ab", 80 + i, i);
            for (int k = 0; k < n - 5; k++)
                text[k] = "abc "[(text[k] + k) % 4];
            kvg_tokens_reset(&plain);
            kvg_tokens_reset(&got);
            assert_int_equal(kvg_tokenizer_encode(tok, text, (size_t)n, false, &plain), 0);
            assert_int_equal(
                kvg_tokenizer_encode_cached(tok, text, (size_t)n, false, c, "s1", 2, &got), 0);
            assert_int_equal(got.len, plain.len);
            assert_memory_equal(got.ids, plain.ids, plain.len * sizeof(uint32_t));
        }
        kvg_tokenizer_cache_stats(c, &hits, &misses, &bytes);
        assert_true(bytes <= 64 * 1024);
    }
    /* 600 lookups of 200 long pieces; the short "ab" pieces were never looked up. */
    assert_int_equal(hits + misses, 600);
    assert_true(hits > 0);
    uint64_t h0 = hits;
    kvg_tokens_reset(&got);
    int n = snprintf(text, sizeof(text), "%0*d<x>ab", 80 + 199, 199);
    for (int k = 0; k < n - 5; k++)
        text[k] = "abc "[(text[k] + k) % 4];
    assert_int_equal(kvg_tokenizer_encode_cached(tok, text, (size_t)n, false, c, "s2", 2, &got), 0);
    kvg_tokenizer_cache_stats(c, &hits, &misses, &bytes);
    assert_int_equal(hits, h0); /* another scope: a miss */
    kvg_tokens_done(&plain);
    kvg_tokens_done(&got);
    kvg_tokenizer_cache_free(c);
    kvg_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_order),      cmocka_unit_test(test_long_pieces),
        cmocka_unit_test(test_ignore_merges),     cmocka_unit_test(test_bytelevel),
        cmocka_unit_test(test_added_tokens),      cmocka_unit_test(test_added_flags),
        cmocka_unit_test(test_template),          cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_failing_allocator), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_pieces_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
