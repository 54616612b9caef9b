/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the simulated worker's token-exact mode (tools/simworker/exact.c): reading
 * tokenizer_config.json, loading and its start-up errors, requests through a small hand-made
 * tokenizer and template, and the engine keyed by vLLM's block hashes, checked against the 25
 * hashes a real vLLM engine published for its prompt (tests/data/vllm/kv_event_base.json). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "fail_alloc.h"
#include "simworker.h"
#include "vllm_event_data.h"

static vllm_event_data ev;
static char dir[] = "/tmp/kvg-sim-exact-XXXXXX";

/* The generated words (tokenizer.c's list, in its order): the test tokenizer gives word k the
 * id k - 1, so generated token k must be k - 1. */
static const char *const words[] = {
    "the",  "of",   "and",  "to",   "in",   "is",   "that", "for",  "it",   "as",   "was",
    "with", "be",   "on",   "not",  "he",   "by",   "are",  "this", "from", "at",   "or",
    "have", "an",   "they", "you",  "were", "her",  "all",  "she",  "one",  "had",  "word",
    "but",  "we",   "can",  "said", "now",  "use",  "each", "when", "how",  "will", "up",
    "out",  "then", "them", "so",   "some", "make", "like", "him",  "into", "time", "has",
    "look", "two",  "more", "see",  "way",  "been", "call", "who",  "oil",
};
#define NWORDS 64u
#define ID_H 64u
#define ID_I 65u
#define ID_BOS 66u

/* A byte-level BPE file: "Ġ<word>" for each word (ignore_merges: a whole word in the vocabulary
 * is one token), "h", "i", and "<s>" as a special added token. skip_was leaves "Ġwas" out (and
 * none of its letters is in the vocabulary: " was" becomes no token at all). */
static char *tokenizer_json(bool skip_was)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":"
                     "[{\"id\":66,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,"
                     "\"rstrip\":false,\"normalized\":false,\"special\":true}],"
                     "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\","
                     "\"add_prefix_space\":false,\"use_regex\":false},\"post_processor\":null,"
                     "\"decoder\":null,\"model\":{\"type\":\"BPE\",\"dropout\":null,"
                     "\"unk_token\":null,\"continuing_subword_prefix\":null,"
                     "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,"
                     "\"ignore_merges\":true,\"vocab\":{");
    for (unsigned i = 0; i < NWORDS; i++)
        if (!skip_was || strcmp(words[i], "was") != 0)
            kvg_buf_printf(&b, "\"\\u0120%s\":%u,", words[i], i);
    kvg_buf_puts(&b, "\"h\":64,\"i\":65,\"<s>\":66},\"merges\":[]}}");
    assert_false(b.failed);
    return kvg_buf_steal(&b, NULL);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static char tok_path[128], cfg_path[128], tok_short_path[128], raise_path[128], bad_tpl_path[128],
    list_cfg_path[128];

static int setup(void **state)
{
    (void)state;
    if (vllm_event_load(&ev) < 0 || !mkdtemp(dir))
        return -1;
    snprintf(tok_path, sizeof(tok_path), "%s/tokenizer.json", dir);
    snprintf(cfg_path, sizeof(cfg_path), "%s/tokenizer_config.json", dir);
    snprintf(tok_short_path, sizeof(tok_short_path), "%s/short.json", dir);
    snprintf(raise_path, sizeof(raise_path), "%s/raise.jinja", dir);
    snprintf(bad_tpl_path, sizeof(bad_tpl_path), "%s/bad.jinja", dir);
    snprintf(list_cfg_path, sizeof(list_cfg_path), "%s/list_config.json", dir);
    char *j = tokenizer_json(false);
    write_file(tok_path, j);
    free(j);
    j = tokenizer_json(true);
    write_file(tok_short_path, j);
    free(j);
    write_file(cfg_path, "{\"bos_token\":{\"__type\":\"AddedToken\",\"content\":\"<s>\"},"
                         "\"eos_token\":\"</s>\",\"chat_template\":\"{{ bos_token }}{% for m in "
                         "messages %}{{ m['content'] }}{% endfor %}\"}");
    write_file(raise_path, "{{ raise_exception('no ' ~ messages[0]['role'] ~ ' here') }}");
    write_file(bad_tpl_path, "{% if messages %}never closed");
    write_file(list_cfg_path, "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"x\"}]}");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    const char *paths[] = {tok_path,   cfg_path,     tok_short_path,
                           raise_path, bad_tpl_path, list_cfg_path};
    for (size_t i = 0; i < KVG_ARRAY_LEN(paths); i++)
        unlink(paths[i]);
    rmdir(dir);
    return 0;
}

static sim_config exact_cfg(void)
{
    sim_config cfg;
    sim_config_defaults(&cfg);
    cfg.tokenizer_path = tok_path; /* tokenizer_config.json is found beside it */
    cfg.hash_seed = "42";
    cfg.hash_algo = SIM_VLLM_SHA256_CBOR;
    cfg.time_scale = 0.0;
    cfg.max_model_len = 1024;
    return cfg;
}

static sim_exact *load_ok(const sim_config *cfg)
{
    char err[512] = "";
    sim_exact *ex = NULL;
    int rc = sim_exact_load(cfg, &ex, err, sizeof(err));
    if (rc < 0)
        fail_msg("load: %s (%s)", err, kvg_strerror(rc));
    return ex;
}

static void load_fails(const sim_config *cfg, const char *needle)
{
    char err[512] = "";
    sim_exact *ex = NULL;
    int rc = sim_exact_load(cfg, &ex, err, sizeof(err));
    if (rc >= 0)
        fail_msg("loaded; wanted an error naming '%s'", needle);
    assert_null(ex);
    if (!strstr(err, needle))
        fail_msg("'%s' does not name '%s'", err, needle);
}

/* ---- tokenizer_config.json ------------------------------------------------------------------ */

static void test_tokcfg(void **state)
{
    (void)state;
    sim_tokcfg tc;
    char err[256];
    static const char ok1[] = "{\"chat_template\":\"T\",\"bos_token\":\"<s>\",\"eos_token\":"
                              "{\"content\":\"</s>\",\"lstrip\":false},\"other\":[1,2]}";
    assert_int_equal(sim_tokcfg_parse(ok1, strlen(ok1), &tc, err, sizeof(err)), 0);
    assert_string_equal(tc.chat_template, "T");
    assert_string_equal(tc.bos_token, "<s>");
    assert_string_equal(tc.eos_token, "</s>");
    sim_tokcfg_done(&tc);
    assert_null(tc.chat_template);
    /* Named templates: "default" (the last one when repeated); nulls are absent. */
    static const char ok2[] = "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"A\"},"
                              "{\"name\":\"default\",\"template\":\"B\"},{\"name\":\"default\","
                              "\"template\":\"C\"}],\"bos_token\":null}";
    assert_int_equal(sim_tokcfg_parse(ok2, strlen(ok2), &tc, err, sizeof(err)), 0);
    assert_string_equal(tc.chat_template, "C");
    assert_null(tc.bos_token);
    assert_null(tc.eos_token);
    sim_tokcfg_done(&tc);
    assert_int_equal(sim_tokcfg_parse("{}", 2, &tc, err, sizeof(err)), 0);
    assert_null(tc.chat_template);
    sim_tokcfg_done(&tc);

    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{", "not JSON"},
        {"[]", "not a JSON object"},
        {"{\"chat_template\":42}", "\"chat_template\" must be"},
        {"{\"chat_template\":[{\"name\":\"x\",\"template\":\"y\"}]}", "without a \"default\""},
        {"{\"chat_template\":[{\"name\":\"default\"}]}", "\"chat_template\"[0]"},
        {"{\"bos_token\":7}", "\"bos_token\""},
        {"{\"eos_token\":{\"content\":null}}", "\"eos_token\""},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        memset(&tc, 0x5a, sizeof(tc));
        err[0] = '\0';
        assert_int_equal(sim_tokcfg_parse(bad[i].json, strlen(bad[i].json), &tc, err, sizeof(err)),
                         KVG_EPARSE);
        if (!strstr(err, bad[i].needle))
            fail_msg("%s: '%s'", bad[i].json, err);
    }

    /* Running out of memory anywhere: -ENOMEM, nothing leaked (ASan). */
    bool injected = true;
    for (long n = 0; injected && n < 100; n++) {
        fail_alloc_nth(n);
        int rc = sim_tokcfg_parse(ok1, strlen(ok1), &tc, err, sizeof(err));
        injected = fail_alloc_off();
        assert_int_equal(rc, injected ? -ENOMEM : 0);
        if (rc == 0)
            sim_tokcfg_done(&tc);
    }
    assert_false(injected);
}

/* ---- loading -------------------------------------------------------------------------------- */

static void test_load(void **state)
{
    (void)state;
    sim_config cfg = exact_cfg();
    sim_exact *ex = load_ok(&cfg);
    assert_int_equal(sim_exact_algo(ex), SIM_VLLM_SHA256_CBOR);
    assert_int_equal(sim_exact_digest_len(ex), 32);
    assert_int_equal(sim_exact_vocab_size(ex), 67);
    for (uint32_t k = 1; k <= 2 * NWORDS; k++)
        assert_int_equal(sim_exact_output_token(ex, k), (k - 1) % NWORDS);
    uint32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sim_exact_encode(ex, "<s>hi", 5, false, &ids, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], ID_BOS);
    assert_int_equal(ids[1], ID_H);
    assert_int_equal(ids[2], ID_I);
    free(ids);
    sim_exact_free(ex);
    sim_exact_free(NULL);

    cfg.hash_algo = SIM_VLLM_XXHASH_CBOR;
    ex = load_ok(&cfg);
    assert_int_equal(sim_exact_digest_len(ex), 16);
    sim_exact_free(ex);

    /* Start-up errors name the file (or the flag) at fault. */
    cfg = exact_cfg();
    cfg.hash_seed = NULL;
    load_fails(&cfg, "--hash-seed");
    cfg = exact_cfg();
    cfg.hash_seed = "\xff";
    load_fails(&cfg, "--hash-seed");
    cfg = exact_cfg();
    cfg.tokenizer_path = "/nonexistent/tokenizer.json";
    load_fails(&cfg, "/nonexistent/tokenizer.json");
    cfg = exact_cfg();
    cfg.tokenizer_path = cfg_path; /* JSON, but no tokenizer */
    load_fails(&cfg, cfg_path);
    cfg = exact_cfg();
    cfg.tokenizer_path = tok_short_path; /* " was" is not one token */
    load_fails(&cfg, "\" was\"");
    cfg = exact_cfg();
    cfg.tokenizer_config_path = "/nonexistent/tokenizer_config.json";
    load_fails(&cfg, "/nonexistent/tokenizer_config.json");
    cfg = exact_cfg();
    cfg.tokenizer_config_path = list_cfg_path;
    load_fails(&cfg, list_cfg_path);
    cfg = exact_cfg();
    cfg.chat_template_path = bad_tpl_path;
    load_fails(&cfg, bad_tpl_path);
    cfg = exact_cfg();
    cfg.chat_template_path = "/nonexistent/t.jinja";
    load_fails(&cfg, "/nonexistent/t.jinja");

    /* Out of memory while loading: an error, nothing leaked. */
    cfg = exact_cfg();
    bool injected = true;
    for (long k = 0; injected && k < 100000; k += k < 200 ? 1 : 97) {
        char err[512];
        fail_alloc_nth(k);
        int rc = sim_exact_load(&cfg, &ex, err, sizeof(err));
        injected = fail_alloc_off();
        if (rc == 0)
            sim_exact_free(ex);
        else
            assert_true(injected);
    }
}

/* ---- requests ------------------------------------------------------------------------------- */

static int parse(const sim_config *cfg, sim_endpoint ep, const char *body, sim_request *r,
                 sim_error *err)
{
    memset(err, 0, sizeof(*err));
    return sim_request_parse(cfg, ep, body, strlen(body), r, err);
}

static void expect_ids(const sim_config *cfg, sim_endpoint ep, const char *body, const uint32_t *w,
                       size_t n)
{
    sim_request r;
    sim_error err;
    int rc = parse(cfg, ep, body, &r, &err);
    if (rc != 0)
        fail_msg("%s: %d %s", body, rc, err.message);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].n, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(r.prompts[0].tokens[i], w[i]);
    sim_request_done(&r);
}

static void test_requests(void **state)
{
    (void)state;
    sim_config cfg = exact_cfg();
    sim_exact *ex = load_ok(&cfg);
    cfg.exact = ex;
    /* Chat: the template (bos_token from the config's AddedToken) then the tokenizer. */
    static const uint32_t chat[] = {ID_BOS, ID_H, ID_I, ID_I};
    expect_ids(&cfg, SIM_EP_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":"
               "\"user\",\"content\":\"i\"}]}",
               chat, 4);
    expect_ids(&cfg, SIM_EP_TOKENIZE, "{\"messages\":[{\"role\":\"user\",\"content\":\"hii\"}]}",
               chat, 4);
    static const uint32_t the[] = {0};
    expect_ids(&cfg, SIM_EP_COMPLETIONS, "{\"prompt\":\" the\"}", the, 1);
    static const uint32_t ids[] = {5, 66, 3};
    expect_ids(&cfg, SIM_EP_COMPLETIONS, "{\"prompt\":[5,66,3]}", ids, 3);

    sim_request r;
    sim_error err;
    /* Ids past the tokenizer's vocabulary (67) are refused. */
    assert_int_equal(parse(&cfg, SIM_EP_COMPLETIONS, "{\"prompt\":[5,67]}", &r, &err), KVG_EPARSE);
    assert_int_equal(err.status, 400);
    assert_non_null(strstr(err.message, "size 67"));
    assert_int_equal(
        parse(&cfg, SIM_EP_COMPLETIONS, "{\"prompt\":\"x\",\"add_special_tokens\":1}", &r, &err),
        KVG_EPARSE);
    assert_string_equal(err.param, "add_special_tokens");
    /* What the template module does not cover: a 400 in OpenAI's shape. */
    assert_int_equal(parse(&cfg, SIM_EP_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"chat_template\":\"{{ 1 }}\"}",
                           &r, &err),
                     KVG_EPARSE);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.type, "BadRequestError");
    sim_exact_free(ex);

    /* A template that raises: 400 with its message. */
    cfg = exact_cfg();
    cfg.chat_template_path = raise_path;
    ex = load_ok(&cfg);
    cfg.exact = ex;
    assert_int_equal(parse(&cfg, SIM_EP_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r, &err),
                     KVG_EPARSE);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.message, "no user here"); /* the raised text itself, as vLLM */
    sim_exact_free(ex);

    /* No chat template at all: chat is 400, prompts still work. */
    cfg = exact_cfg();
    cfg.tokenizer_config_path = tok_short_path; /* an object without chat_template */
    ex = load_ok(&cfg);
    cfg.exact = ex;
    assert_int_equal(parse(&cfg, SIM_EP_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r, &err),
                     KVG_EPARSE);
    assert_non_null(strstr(err.message, "chat template"));
    expect_ids(&cfg, SIM_EP_COMPLETIONS, "{\"prompt\":\" the\"}", the, 1);
    sim_exact_free(ex);

    /* Out of memory through a chat request: -ENOMEM or 413, never a crash or a leak. */
    cfg = exact_cfg();
    ex = load_ok(&cfg);
    cfg.exact = ex;
    static const char body[] = "{\"messages\":[{\"role\":\"system\",\"content\":\"hi\"},{\"role\":"
                               "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"i\"}]}],"
                               "\"cache_salt\":\"s\"}";
    bool injected = true;
    for (long n = 0; injected && n < 2000; n++) {
        fail_alloc_nth(n);
        int rc = parse(&cfg, SIM_EP_CHAT, body, &r, &err);
        injected = fail_alloc_off();
        if (rc == 0)
            sim_request_done(&r);
        else if (!(rc == -ENOMEM || (rc == KVG_EPARSE && err.status == 413)))
            fail_msg("alloc %ld: rc %d (%s)", n, rc, err.message);
        if (!injected)
            assert_int_equal(rc, 0);
    }
    assert_false(injected);
    sim_exact_free(ex);
}

/* ---- the engine, keyed by vLLM's block hashes ----------------------------------------------- */

typedef struct probe {
    uint32_t cached;
    bool finished;
    uint64_t keys[VLLM_EVENT_MAX_BLOCKS];
    uint32_t nkeys;
    const sim_exact *ex;
} probe;

static void on_seq(void *arg, sim_seq *seq, uint32_t generated, bool finished)
{
    probe *p = arg;
    (void)generated;
    p->cached = sim_seq_cached_tokens(seq);
    p->finished = finished;
    const sim_hash *keys;
    p->nkeys = sim_seq_prompt_keys(seq, &keys);
    for (uint32_t i = 0; i < p->nkeys && i < VLLM_EVENT_MAX_BLOCKS; i++)
        p->keys[i] = sim_exact_key_u64(p->ex, &keys[i]);
}

static probe run_one(struct event_base *base, sim_engine *eng, const sim_exact *ex,
                     const char *salt)
{
    probe p = {.ex = ex};
    sim_seq *s;
    assert_int_equal(sim_engine_submit(eng, ev.tokens, ev.ntokens, 1, salt, salt ? strlen(salt) : 0,
                                       on_seq, &p, &s),
                     0);
    event_base_dispatch(base);
    assert_true(p.finished);
    return p;
}

static void test_engine_real_keys(void **state)
{
    (void)state;
    sim_config cfg = exact_cfg();
    cfg.hash_seed = ev.seed;
    cfg.block_tokens = ev.block_size;
    sim_exact *ex = load_ok(&cfg);
    cfg.exact = ex;
    struct event_base *base = event_base_new();
    sim_engine *eng;
    assert_int_equal(sim_engine_new(base, &cfg, &eng), 0);
    /* The real engine's prompt names its blocks as the real engine did. */
    probe p = run_one(base, eng, ex, NULL);
    assert_int_equal(p.cached, 0);
    assert_int_equal(p.nkeys, ev.nhashes);
    for (size_t i = 0; i < ev.nhashes; i++)
        assert_int_equal(p.keys[i], ev.hashes[i]);
    /* The header's value: the same hashes in hex. */
    kvg_buf b, want;
    kvg_buf_init(&b);
    kvg_buf_init(&want);
    sim_hash keys[VLLM_EVENT_MAX_BLOCKS];
    assert_int_equal(sim_exact_block_keys(ex, ev.tokens, ev.ntokens, ev.block_size, NULL, 0, keys),
                     0);
    sim_exact_hash_header(ex, keys, ev.nhashes, &b);
    for (size_t i = 0; i < ev.nhashes; i++)
        kvg_buf_printf(&want, "%s%016llx", i ? "," : "", (unsigned long long)ev.hashes[i]);
    assert_int_equal(b.len, want.len);
    assert_memory_equal(b.data, want.data, b.len);
    kvg_buf_done(&b);
    kvg_buf_done(&want);
    /* A repeat hits every full block but the one holding the last prompt token. */
    p = run_one(base, eng, ex, NULL);
    assert_int_equal(p.cached, (ev.ntokens - 1) / ev.block_size * ev.block_size);
    /* A salt shares nothing, and changes every key. */
    p = run_one(base, eng, ex, "tenant-a");
    assert_int_equal(p.cached, 0);
    for (size_t i = 0; i < ev.nhashes; i++)
        assert_int_not_equal(p.keys[i], ev.hashes[i]);
    assert_int_equal(run_one(base, eng, ex, "tenant-a").cached,
                     (ev.ntokens - 1) / ev.block_size * ev.block_size);
    sim_engine_free(eng);
    sim_exact_free(ex);

    /* xxhash_cbor: other keys (none of the sha256 ones), the cache works the same. */
    cfg.hash_algo = SIM_VLLM_XXHASH_CBOR;
    cfg.exact = ex = load_ok(&cfg);
    assert_int_equal(sim_engine_new(base, &cfg, &eng), 0);
    p = run_one(base, eng, ex, NULL);
    for (size_t i = 0; i < ev.nhashes; i++)
        assert_int_not_equal(p.keys[i], ev.hashes[i]);
    assert_int_equal(run_one(base, eng, ex, NULL).cached,
                     (ev.ntokens - 1) / ev.block_size * ev.block_size);
    sim_engine_free(eng);
    sim_exact_free(ex);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokcfg),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_engine_real_keys),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
