/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for kvgate-loadgen's pure parts: workloads, bodies, SSE, usage, stats, reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fail_alloc.h"
#include "loadgen.h"
#include "simworker.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* An item flattened to one string, to compare items across calls and workloads. */
static char *item_text(const lg_workload *wl, uint64_t index)
{
    kvg_arena a;
    kvg_arena_init(&a, 0);
    lg_item it;
    assert_int_equal(lg_workload_item(wl, index, &a, &it), 0);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_printf(&b, "tenant=%u prefix=%u\n", it.tenant, it.prefix);
    for (size_t i = 0; i < it.n_messages; i++) {
        kvg_buf_printf(&b, "%s:", it.messages[i].role);
        kvg_buf_append(&b, it.messages[i].content, it.messages[i].len);
        kvg_buf_putc(&b, '\n');
    }
    kvg_arena_done(&a);
    assert_false(b.failed);
    return kvg_buf_steal(&b, NULL);
}

/* ---- workloads ---------------------------------------------------------------------------- */

static void test_workload_registry(void **state)
{
    (void)state;
    assert_true(lg_workload_count() >= 2);
    for (size_t i = 0; i < lg_workload_count(); i++) {
        lg_workload *wl = NULL;
        assert_int_equal(lg_workload_new(lg_workload_list_name(i), 7, &wl), 0);
        assert_string_equal(lg_workload_name(wl), lg_workload_list_name(i));
        assert_non_null(lg_workload_list_help(i));
        bool multi = strcmp(lg_workload_list_name(i), "multi-tenant") == 0;
        assert_int_equal(lg_workload_tenants(wl), multi ? LG_MT_DEFAULT_TENANTS : 1);
        lg_workload_free(wl);
    }
    assert_null(lg_workload_list_name(lg_workload_count()));
    lg_workload *wl = (lg_workload *)0x1;
    assert_int_equal(lg_workload_new("no-such-workload", 1, &wl), KVG_ENOTFOUND);
    assert_ptr_equal(wl, (lg_workload *)0x1); /* untouched on failure */
    lg_workload_free(NULL);
}

/* Request i depends only on (workload, seed, i): not on the order or number of calls. */
static void test_workload_deterministic(void **state)
{
    (void)state;
    enum { N = 64 };
    for (size_t w = 0; w < lg_workload_count(); w++) {
        const char *name = lg_workload_list_name(w);
        lg_workload *a = NULL, *b = NULL, *c = NULL;
        assert_int_equal(lg_workload_new(name, 42, &a), 0);
        assert_int_equal(lg_workload_new(name, 42, &b), 0);
        assert_int_equal(lg_workload_new(name, 43, &c), 0);
        char *fwd[N];
        for (size_t i = 0; i < N; i++)
            fwd[i] = item_text(a, i);
        size_t same_as_other_seed = 0;
        for (size_t k = N; k-- > 0;) {
            char *again = item_text(b, k);
            assert_string_equal(again, fwd[k]);
            free(again);
            char *other = item_text(c, k);
            same_as_other_seed += strcmp(other, fwd[k]) == 0;
            free(other);
        }
        assert_int_equal(same_as_other_seed, 0);
        /* Far-away indices work without generating the ones before. */
        char *far1 = item_text(a, 1000000007ull), *far2 = item_text(b, 1000000007ull);
        assert_string_equal(far1, far2);
        free(far1);
        free(far2);
        for (size_t i = 0; i < N; i++)
            free(fwd[i]);
        lg_workload_free(a);
        lg_workload_free(b);
        lg_workload_free(c);
    }
}

static void test_workload_shared_prefix(void **state)
{
    (void)state;
    lg_workload *wl = NULL;
    assert_int_equal(lg_workload_new("shared-prefix", 1, &wl), 0);
    uint32_t n_prefixes = lg_workload_prefixes(wl);
    assert_true(n_prefixes >= 2 && n_prefixes <= 16);
    const char *seen[16] = {0};
    size_t uses[16] = {0};
    kvg_arena a;
    kvg_arena_init(&a, 0);
    char prev_user[512] = "";
    for (uint64_t i = 0; i < 400; i++) {
        lg_item it;
        assert_int_equal(lg_workload_item(wl, i, &a, &it), 0);
        assert_int_equal(it.n_messages, 2);
        assert_string_equal(it.messages[0].role, "system");
        assert_string_equal(it.messages[1].role, "user");
        assert_true(it.prefix < n_prefixes);
        /* A few hundred tokens at ~4 bytes each. */
        size_t sys = it.messages[0].len;
        assert_true(sys >= 200 * LG_BYTES_PER_TOKEN && sys <= 600 * LG_BYTES_PER_TOKEN);
        assert_true(it.messages[1].len < 300);
        /* The same prefix index is always the same text (the same memory, even). */
        if (seen[it.prefix])
            assert_ptr_equal(seen[it.prefix], it.messages[0].content);
        seen[it.prefix] = it.messages[0].content;
        uses[it.prefix]++;
        /* The user turn differs from request to request. */
        char user[512];
        snprintf(user, sizeof(user), "%.*s", (int)it.messages[1].len, it.messages[1].content);
        assert_string_not_equal(user, prev_user);
        memcpy(prev_user, user, sizeof(user));
    }
    /* Every prompt is used, roughly evenly. */
    for (uint32_t k = 0; k < n_prefixes; k++)
        assert_true(uses[k] > 400 / n_prefixes / 3);
    /* Different prompts differ from their first bytes (no shared first block). */
    for (uint32_t k = 0; k < n_prefixes; k++)
        for (uint32_t j = k + 1; j < n_prefixes; j++)
            assert_true(memcmp(seen[k], seen[j], 48) != 0);
    kvg_arena_done(&a);
    lg_workload_free(wl);
}

static void test_workload_unique(void **state)
{
    (void)state;
    lg_workload *wl = NULL;
    assert_int_equal(lg_workload_new("unique", 1, &wl), 0);
    assert_int_equal(lg_workload_prefixes(wl), 0);
    enum { N = 100 };
    char *firsts[N];
    kvg_arena a;
    kvg_arena_init(&a, 0);
    for (uint64_t i = 0; i < N; i++) {
        lg_item it;
        assert_int_equal(lg_workload_item(wl, i, &a, &it), 0);
        assert_int_equal(it.prefix, LG_NO_PREFIX);
        assert_true(it.messages[0].len >= 200 * LG_BYTES_PER_TOKEN);
        /* The first 16 tokens (~64 bytes) already differ: no block can be shared. */
        firsts[i] = strndup(it.messages[0].content, 40);
        for (uint64_t j = 0; j < i; j++)
            assert_string_not_equal(firsts[i], firsts[j]);
    }
    for (size_t i = 0; i < N; i++)
        free(firsts[i]);
    kvg_arena_done(&a);
    lg_workload_free(wl);
}

/* The kinds of multi-tenant requests, told apart by their messages. */
enum { MT_SINGLE, MT_DOC, MT_OPENER, MT_FOLLOW, MT_KINDS };

static int mt_kind(const lg_item *it)
{
    if (it->n_messages > 2)
        return MT_FOLLOW;
    const lg_message *u = &it->messages[1];
    if (u->len > 10 && memcmp(u->content, "Answer from", 11) == 0)
        return MT_DOC;
    if (u->len > 12 && memcmp(u->content, "Conversation", 12) == 0)
        return MT_OPENER;
    return MT_SINGLE;
}

/* Messages joined into one string (roles and contents), to match turns with earlier ones. */
static char *messages_text(const lg_message *m, size_t n)
{
    kvg_buf b;
    kvg_buf_init(&b);
    for (size_t i = 0; i < n; i++) {
        kvg_buf_printf(&b, "%s\x1f", m[i].role);
        kvg_buf_append(&b, m[i].content, m[i].len);
        kvg_buf_putc(&b, '\x1e');
    }
    assert_false(b.failed);
    return kvg_buf_steal(&b, NULL);
}

static void test_workload_multi_tenant(void **state)
{
    (void)state;
    enum { N = 4000 };
    lg_workload *wl = NULL;
    assert_int_equal(lg_workload_new("multi-tenant", 5, &wl), 0);
    uint32_t t_count = lg_workload_tenants(wl);
    assert_int_equal(t_count, 8);
    assert_int_equal(lg_workload_prefixes(wl), 8);
    for (uint32_t t = 0; t < t_count; t++)
        assert_int_equal(lg_workload_group(wl, t), t / 2);
    size_t kinds[MT_KINDS] = {0}, per_tenant[8] = {0}, turns[9] = {0};
    const char *sys[8] = {0};
    char **texts = calloc(N, sizeof(*texts));
    uint32_t *item_tenant = calloc(N, sizeof(*item_tenant));
    assert_non_null(texts);
    assert_non_null(item_tenant);
    size_t follow_found = 0, min_gap = SIZE_MAX;
    kvg_arena a;
    kvg_arena_init(&a, 0);
    for (uint64_t i = 0; i < N; i++) {
        lg_item it;
        assert_int_equal(lg_workload_item(wl, i, &a, &it), 0);
        assert_true(it.tenant < t_count);
        assert_int_equal(it.prefix, it.tenant);
        item_tenant[i] = it.tenant;
        per_tenant[it.tenant]++;
        /* Every request opens with its tenant's system prompt, ~1-2 KB. */
        assert_string_equal(it.messages[0].role, "system");
        size_t sys_len = it.messages[0].len;
        assert_true(sys_len >= 1000 && sys_len <= 2100);
        if (sys[it.tenant])
            assert_ptr_equal(sys[it.tenant], it.messages[0].content);
        sys[it.tenant] = it.messages[0].content;
        int kind = mt_kind(&it);
        kinds[kind]++;
        /* Alternating user and assistant turns, ending with the user's. */
        assert_true(it.n_messages % 2 == 0 && it.n_messages <= 16);
        for (size_t k = 1; k < it.n_messages; k++)
            assert_string_equal(it.messages[k].role, k % 2 ? "user" : "assistant");
        turns[(it.n_messages - 2) / 2]++;
        if (kind == MT_DOC) {
            /* A document of the tenant's group: 2-6 KB plus the question. */
            unsigned g, d;
            const char *u = it.messages[1].content;
            const char *doc = strstr(u, "Document ");
            assert_non_null(doc);
            assert_int_equal(sscanf(doc, "Document %u.%u:", &g, &d), 2);
            assert_int_equal(g, it.tenant / 2 + 1);
            assert_true(d >= 1 && d <= 4);
            assert_true(it.messages[1].len >= 2048 && it.messages[1].len <= 6144 + 400);
        }
        if (kind == MT_OPENER || kind == MT_FOLLOW)
            texts[i] = messages_text(it.messages, it.n_messages);
        if (kind == MT_FOLLOW) {
            /* The previous turn of the conversation was sent earlier: its whole prompt is
             * this one's opening, and a reply (the same every turn) follows it. */
            char *prev = messages_text(it.messages, it.n_messages - 2);
            for (uint64_t j = i; j-- > 0;)
                if (texts[j] && strcmp(texts[j], prev) == 0) {
                    assert_int_equal(item_tenant[j], it.tenant);
                    follow_found++;
                    min_gap = KVG_MIN(min_gap, (size_t)(i - j));
                    break;
                }
            free(prev);
            assert_ptr_equal(it.messages[it.n_messages - 2].content,
                             it.messages[2].content); /* one shared reply text */
        }
        kvg_arena_reset(&a);
    }
    /* Exactly 15% single questions, 25% document questions, 60% chat turns, most of those
     * follow-ups, some as deep as the eighth turn. */
    assert_int_equal(kinds[MT_SINGLE], N * 15 / 100);
    assert_int_equal(kinds[MT_DOC], N * 25 / 100);
    assert_int_equal(kinds[MT_OPENER] + kinds[MT_FOLLOW], N * 60 / 100);
    assert_true(kinds[MT_FOLLOW] > 2 * kinds[MT_OPENER]);
    assert_true(turns[7] > 0 && turns[8] == 0);
    assert_int_equal(follow_found, kinds[MT_FOLLOW]);
    assert_true(min_gap >= 60); /* time for the previous answer to arrive */
    /* Zipf over tenants: every tenant is used, the first far more than the last. */
    for (uint32_t t = 0; t < t_count; t++)
        assert_true(per_tenant[t] > 0);
    assert_true(per_tenant[0] > 2 * per_tenant[7]);
    assert_true(per_tenant[0] > per_tenant[1] && per_tenant[1] > per_tenant[3]);
    /* Tenants of one group share the preamble, other groups differ from the first bytes. */
    for (uint32_t t = 0; t < t_count; t++)
        for (uint32_t u = t + 1; u < t_count; u++) {
            if (t / 2 == u / 2)
                assert_memory_equal(sys[t], sys[u], 300);
            else
                assert_true(memcmp(sys[t], sys[u], 48) != 0);
            assert_string_not_equal(sys[t], sys[u]);
        }
    for (size_t i = 0; i < N; i++)
        free(texts[i]);
    free(texts);
    free(item_tenant);
    kvg_arena_done(&a);
    lg_workload_free(wl);
}

static void test_workload_multi_tenant_opts(void **state)
{
    (void)state;
    lg_workload *wl = NULL;
    lg_workload_opts o = {.tenants = LG_MT_MAX_TENANTS + 1};
    assert_int_equal(lg_workload_new_opts("multi-tenant", 1, &o, &wl), -EINVAL);
    assert_null(wl);
    /* Three tenants: groups {0, 1} and {2}; single-tenant workloads ignore the count. */
    o.tenants = 3;
    assert_int_equal(lg_workload_new_opts("shared-prefix", 1, &o, &wl), 0);
    assert_int_equal(lg_workload_tenants(wl), 1);
    assert_int_equal(lg_workload_group(wl, 0), 0);
    lg_workload_free(wl);
    assert_int_equal(lg_workload_new_opts("multi-tenant", 1, &o, &wl), 0);
    assert_int_equal(lg_workload_tenants(wl), 3);
    assert_int_equal(lg_workload_group(wl, 2), 1);
    kvg_arena a;
    kvg_arena_init(&a, 0);
    bool seen[3] = {false};
    for (uint64_t i = 0; i < 300; i++) {
        lg_item it;
        assert_int_equal(lg_workload_item(wl, i, &a, &it), 0);
        assert_true(it.tenant < 3);
        seen[it.tenant] = true;
    }
    assert_true(seen[0] && seen[1] && seen[2]);
    kvg_arena_done(&a);
    lg_workload_free(wl);
    o.tenants = 1;
    assert_int_equal(lg_workload_new_opts("multi-tenant", 1, &o, &wl), 0);
    lg_workload_free(wl);
}

/* Tokens the simulated worker would prefill for item: its body parsed and rendered by the
 * worker's own chat template and tokenizer. */
static void sim_prompt_tokens(const lg_item *it, uint32_t max_tokens, sim_tokens *out)
{
    lg_body_opts o = {.model = "m", .max_tokens = max_tokens};
    kvg_buf body, text;
    kvg_buf_init(&body);
    kvg_buf_init(&text);
    lg_body_build(&body, it, &o);
    assert_false(body.failed);
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *v;
    assert_int_equal(kvg_json_parse(body.data, body.len, &a, NULL, &v, NULL), 0);
    assert_int_equal(sim_chat_render(kvg_json_get(v, "messages"), NULL, true, &text), 0);
    sim_tokens_init(out, 0);
    assert_int_equal(sim_tokenize(text.data, text.len, out), 0);
    kvg_arena_done(&a);
    kvg_buf_done(&text);
    kvg_buf_done(&body);
}

/* A follow-up turn re-tokenizes, on the simulated worker, to the previous turn's prompt
 * followed by the tokens the worker generated for it: the blocks the previous turn filled
 * are hit. Checked for a reply shorter than the worker's word list and one that wraps it. */
static void test_workload_multi_tenant_follow_up_tokens(void **state)
{
    (void)state;
    static const uint32_t lengths[] = {10, 70};
    for (size_t l = 0; l < KVG_ARRAY_LEN(lengths); l++) {
        uint32_t max_tokens = lengths[l];
        lg_workload *wl = NULL;
        lg_workload_opts o = {.max_tokens = max_tokens};
        assert_int_equal(lg_workload_new_opts("multi-tenant", 9, &o, &wl), 0);
        kvg_arena a, b;
        kvg_arena_init(&a, 0);
        kvg_arena_init(&b, 0);
        size_t checked = 0;
        for (uint64_t i = 0; i < 1500 && checked < 5; i++) {
            lg_item it;
            assert_int_equal(lg_workload_item(wl, i, &a, &it), 0);
            if (it.n_messages < 4) {
                kvg_arena_reset(&a);
                continue;
            }
            /* The reply in the history is the worker's generated text. */
            kvg_buf want;
            kvg_buf_init(&want);
            sim_output_text(&want, max_tokens);
            assert_int_equal(it.messages[2].len, want.len);
            assert_memory_equal(it.messages[2].content, want.data, want.len);
            kvg_buf_done(&want);
            /* Find the previous turn among earlier requests. */
            char *prev_text = messages_text(it.messages, it.n_messages - 2);
            bool found = false;
            for (uint64_t j = i; j-- > 0 && !found;) {
                lg_item p;
                assert_int_equal(lg_workload_item(wl, j, &b, &p), 0);
                char *t = messages_text(p.messages, p.n_messages);
                if (strcmp(t, prev_text) == 0) {
                    found = true;
                    sim_tokens prev, cur;
                    sim_prompt_tokens(&p, max_tokens, &prev);
                    sim_prompt_tokens(&it, max_tokens, &cur);
                    assert_true(cur.n > prev.n + max_tokens);
                    assert_memory_equal(cur.v, prev.v, prev.n * sizeof(uint32_t));
                    for (uint32_t k = 1; k <= max_tokens; k++)
                        assert_int_equal(cur.v[prev.n + k - 1], sim_output_token(k));
                    sim_tokens_done(&prev);
                    sim_tokens_done(&cur);
                }
                free(t);
                kvg_arena_reset(&b);
            }
            free(prev_text);
            assert_true(found);
            checked++;
            kvg_arena_reset(&a);
        }
        assert_int_equal(checked, 5);
        kvg_arena_done(&a);
        kvg_arena_done(&b);
        lg_workload_free(wl);
    }
}

/* Every allocation failure is reported as -ENOMEM and leaks nothing (ASan checks). */
static void test_workload_alloc_failures(void **state)
{
    (void)state;
    for (size_t w = 0; w < lg_workload_count(); w++) {
        const char *name = lg_workload_list_name(w);
        bool done = false;
        for (long n = 0; n < 10000 && !done; n++) {
            lg_workload *wl = NULL;
            fail_alloc_nth(n);
            int rc = lg_workload_new(name, 3, &wl);
            if (rc == 0) {
                kvg_arena a;
                kvg_arena_init(&a, 0);
                lg_item it;
                rc = lg_workload_item(wl, 5, &a, &it);
                kvg_arena_done(&a);
                lg_workload_free(wl);
            }
            done = !fail_alloc_off();
            if (!done)
                assert_int_equal(rc, -ENOMEM);
            else
                assert_int_equal(rc, 0);
        }
        assert_true(done);
    }
}

/* ---- request bodies ------------------------------------------------------------------------ */

static void test_body_build(void **state)
{
    (void)state;
    static const lg_message msgs[] = {
        {"system", "Be \"brief\"\n", 11},
        {"user", "caf\xc3\xa9?", 6},
    };
    lg_item it = {.messages = msgs, .n_messages = 2, .prefix = 0};
    for (int stream = 0; stream < 2; stream++) {
        lg_body_opts o = {.model = "demo-model", .max_tokens = 7, .stream = stream};
        kvg_buf b;
        kvg_buf_init(&b);
        lg_body_build(&b, &it, &o);
        assert_false(b.failed);
        kvg_arena a;
        kvg_arena_init(&a, 0);
        kvg_json *v;
        assert_int_equal(kvg_json_parse(b.data, b.len, &a, NULL, &v, NULL), 0);
        assert_string_equal(kvg_json_get(v, "model")->u.str.ptr, "demo-model");
        assert_int_equal(kvg_json_get(v, "max_tokens")->u.num.ival, 7);
        const kvg_json *m = kvg_json_get(v, "messages");
        assert_int_equal(m->u.arr.count, 2);
        assert_string_equal(kvg_json_get(m->u.arr.items[0], "content")->u.str.ptr,
                            "Be \"brief\"\n");
        assert_string_equal(kvg_json_get(m->u.arr.items[1], "role")->u.str.ptr, "user");
        assert_string_equal(kvg_json_get(m->u.arr.items[1], "content")->u.str.ptr, "caf\xc3\xa9?");
        const kvg_json *s = kvg_json_get(v, "stream");
        const kvg_json *so = kvg_json_get(v, "stream_options");
        if (stream) {
            assert_int_equal(s->type, KVG_JSON_TRUE);
            assert_int_equal(kvg_json_get(so, "include_usage")->type, KVG_JSON_TRUE);
        } else {
            assert_null(s);
            assert_null(so);
        }
        kvg_arena_done(&a);
        kvg_buf_done(&b);
    }
}

/* ---- percentiles --------------------------------------------------------------------------- */

static void test_percentile(void **state)
{
    (void)state;
    assert_int_equal(lg_percentile(NULL, 0, 50), 0);
    uint64_t one[] = {42};
    assert_int_equal(lg_percentile(one, 1, 0.1), 42);
    assert_int_equal(lg_percentile(one, 1, 50), 42);
    assert_int_equal(lg_percentile(one, 1, 100), 42);
    uint64_t v[100];
    for (size_t i = 0; i < 100; i++)
        v[i] = i + 1;
    assert_int_equal(lg_percentile(v, 100, 50), 50);
    assert_int_equal(lg_percentile(v, 100, 90), 90);
    assert_int_equal(lg_percentile(v, 100, 99), 99);
    assert_int_equal(lg_percentile(v, 100, 99.5), 100);
    assert_int_equal(lg_percentile(v, 100, 100), 100);
    assert_int_equal(lg_percentile(v, 100, 0), 1);
    assert_int_equal(lg_percentile(v, 100, 0.5), 1);
    assert_int_equal(lg_percentile(v, 100, 1), 1);
    assert_int_equal(lg_percentile(v, 100, 1.01), 2);
    /* Ten values: p50 is the 5th, p90 the 9th, p99 the 10th (nearest rank). */
    assert_int_equal(lg_percentile(v, 10, 50), 5);
    assert_int_equal(lg_percentile(v, 10, 90), 9);
    assert_int_equal(lg_percentile(v, 10, 99), 10);
    uint64_t three[] = {10, 20, 30};
    assert_int_equal(lg_percentile(three, 3, 50), 20);
    assert_int_equal(lg_percentile(three, 3, 34), 20);
    assert_int_equal(lg_percentile(three, 3, 33), 10);
}

/* ---- SSE ----------------------------------------------------------------------------------- */

typedef struct events {
    char text[4096];
    size_t n;
    int fail_at; /* return an error from this event on (1-based), 0 = never */
} events;

static int collect(void *arg, const char *data, size_t len)
{
    events *e = arg;
    e->n++;
    if (e->fail_at && (int)e->n >= e->fail_at)
        return -EIO;
    assert_int_equal(strlen(data), len);
    size_t used = strlen(e->text);
    snprintf(e->text + used, sizeof(e->text) - used, "[%s]", data);
    return 0;
}

static const char sse_input[] = ": ping\r\n"
                                "data: {\"a\":1}\r\n\r\n"
                                "event: message\n"
                                "id: 7\n"
                                "data:two\n"
                                "data:  lines\n\n"
                                "data\n\n"
                                "retry: 10\r\r"
                                "data: x\rdata: y\r\r"
                                "\n\n"
                                ": only a comment\n\n"
                                "data: [DONE]\n\n"
                                "data: unterminated";
static const char sse_expected[] = "[{\"a\":1}][two\n lines][][x\ny][[DONE]]";

static void test_sse_whole_and_split(void **state)
{
    (void)state;
    size_t len = strlen(sse_input);
    /* One feed, then every split into two feeds. */
    for (size_t cut = 0; cut <= len; cut++) {
        lg_sse p;
        lg_sse_init(&p, 1024);
        events e = {0};
        assert_int_equal(lg_sse_feed(&p, sse_input, cut, collect, &e), 0);
        assert_int_equal(lg_sse_feed(&p, sse_input + cut, len - cut, collect, &e), 0);
        if (strcmp(e.text, sse_expected) != 0)
            fail_msg("split at %zu gave %s", cut, e.text);
        assert_int_equal(e.n, 5);
        lg_sse_done(&p);
    }
    /* Byte by byte. */
    lg_sse p;
    lg_sse_init(&p, 1024);
    events e = {0};
    for (size_t i = 0; i < len; i++)
        assert_int_equal(lg_sse_feed(&p, sse_input + i, 1, collect, &e), 0);
    assert_string_equal(e.text, sse_expected);
    /* The unterminated event is completed by what follows. */
    assert_int_equal(lg_sse_feed(&p, "\n\n", 2, collect, &e), 0);
    assert_int_equal(e.n, 6);
    lg_sse_done(&p);
}

static void test_sse_limits_and_errors(void **state)
{
    (void)state;
    lg_sse p;
    events e = {0};
    char big[200];
    memset(big, 'x', sizeof(big));
    /* A line longer than the limit, in one feed and across feeds. */
    lg_sse_init(&p, 64);
    assert_int_equal(lg_sse_feed(&p, big, sizeof(big), collect, &e), KVG_ELIMIT);
    lg_sse_done(&p);
    lg_sse_init(&p, 64);
    assert_int_equal(lg_sse_feed(&p, "data: ", 6, collect, &e), 0);
    assert_int_equal(lg_sse_feed(&p, big, 50, collect, &e), 0);
    assert_int_equal(lg_sse_feed(&p, big, 50, collect, &e), KVG_ELIMIT);
    lg_sse_done(&p);
    /* Many short data lines may not add up past the limit either. */
    lg_sse_init(&p, 64);
    int rc = 0;
    for (int i = 0; i < 20 && rc == 0; i++)
        rc = lg_sse_feed(&p, "data: 0123456789\n", 17, collect, &e);
    assert_int_equal(rc, KVG_ELIMIT);
    assert_int_equal(e.n, 0);
    lg_sse_done(&p);
    /* The callback's error stops the feed and comes back. */
    lg_sse_init(&p, 64);
    events f = {.fail_at = 2};
    assert_int_equal(lg_sse_feed(&p, "data: 1\n\ndata: 2\n\ndata: 3\n\n", 27, collect, &f), -EIO);
    assert_int_equal(f.n, 2);
    lg_sse_done(&p);
}

static void test_sse_alloc_failures(void **state)
{
    (void)state;
    size_t len = strlen(sse_input);
    bool done = false;
    for (long n = 0; n < 1000 && !done; n++) {
        lg_sse p;
        lg_sse_init(&p, 1024);
        events e = {0};
        fail_alloc_nth(n);
        int rc = lg_sse_feed(&p, sse_input, len / 2, collect, &e);
        if (rc == 0)
            rc = lg_sse_feed(&p, sse_input + len / 2, len - len / 2, collect, &e);
        done = !fail_alloc_off();
        if (done) {
            assert_int_equal(rc, 0);
            assert_string_equal(e.text, sse_expected);
        } else {
            assert_int_equal(rc, -ENOMEM);
        }
        lg_sse_done(&p);
    }
    assert_true(done);
}

/* ---- stream chunks and usage --------------------------------------------------------------- */

#define CHUNK_HEAD "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\","

static int event(lg_stream *s, const char *data)
{
    return lg_stream_event(s, data, strlen(data));
}

static void test_stream_vllm_sequence(void **state)
{
    (void)state;
    lg_stream s = {0};
    /* vLLM opens with the role and empty content: not yet a token. */
    assert_int_equal(event(&s,
                           CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                                      "\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}"),
                     0);
    assert_false(s.content_seen);
    assert_int_equal(event(&s,
                           CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" the\"},"
                                      "\"finish_reason\":null}]}"),
                     1);
    assert_true(s.content_seen);
    assert_int_equal(event(&s,
                           CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" of\"},"
                                      "\"finish_reason\":\"length\"}]}"),
                     0);
    assert_false(s.usage.present);
    assert_int_equal(
        event(&s, CHUNK_HEAD
              "\"choices\":[],\"usage\":{\"prompt_tokens\":500,\"total_tokens\":516,"
              "\"completion_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":480}}}"),
        0);
    assert_true(s.usage.present);
    assert_true(s.usage.cached_present);
    assert_int_equal(s.usage.prompt_tokens, 500);
    assert_int_equal(s.usage.completion_tokens, 16);
    assert_int_equal(s.usage.cached_tokens, 480);
    assert_false(s.done);
    assert_int_equal(event(&s, "[DONE]"), 0);
    assert_true(s.done);
    assert_int_equal(s.events, 5);
    /* Nothing may follow [DONE]. */
    assert_int_equal(event(&s, "[DONE]"), KVG_EPROTO);
}

static void test_stream_variants_and_errors(void **state)
{
    (void)state;
    lg_stream s = {0};
    /* Legacy completions stream text, not deltas. */
    assert_int_equal(event(&s, "{\"choices\":[{\"index\":0,\"text\":\"hi\"}]}"), 1);
    /* A tool call's first fragment counts as the first output. */
    lg_stream t = {0};
    assert_int_equal(event(&t, "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}"), 1);
    /* A usage without details (vLLM without prefix-caching stats). */
    lg_stream u = {0};
    assert_int_equal(
        event(&u,
              "{\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":null}}"),
        0);
    assert_true(u.usage.present);
    assert_false(u.usage.cached_present);
    assert_int_equal(u.usage.prompt_tokens, 9);
    /* Errors. */
    lg_stream e = {0};
    assert_int_equal(event(&e, "{\"error\":{\"message\":\"overloaded\",\"code\":503}}"),
                     KVG_EPROTO);
    assert_int_equal(event(&e, "not json"), KVG_EPARSE);
    assert_int_equal(event(&e, "[1,2]"), KVG_EPROTO);
    assert_int_equal(event(&e, "{\"usage\":{\"prompt_tokens\":\"9\"}}"), KVG_ETYPE);
    assert_int_equal(event(&e, "{\"usage\":{\"prompt_tokens\":-1}}"), KVG_ETYPE);
    assert_int_equal(event(&e, "{\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":1.5}}}"),
                     KVG_ETYPE);
    assert_int_equal(event(&e, "{\"usage\":[]}"), KVG_ETYPE);
    assert_false(e.usage.present); /* failed reads leave the usage alone */
}

static void test_response_parse(void **state)
{
    (void)state;
    const char *ok =
        "{\"id\":\"chatcmpl-f8\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"demo-"
        "model\","
        "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\" the of\","
        "\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],"
        "\"usage\":{\"prompt_tokens\":14,\"total_tokens\":18,\"completion_tokens\":4,"
        "\"prompt_tokens_details\":{\"cached_tokens\":0}}}";
    lg_usage u = {0};
    assert_int_equal(lg_response_parse(ok, strlen(ok), &u), 0);
    assert_true(u.present);
    assert_true(u.cached_present);
    assert_int_equal(u.prompt_tokens, 14);
    assert_int_equal(u.completion_tokens, 4);
    assert_int_equal(u.cached_tokens, 0);

    lg_usage none = {0};
    const char *no_usage = "{\"choices\":[]}";
    assert_int_equal(lg_response_parse(no_usage, strlen(no_usage), &none), 0);
    assert_false(none.present);

    const char *err = "{\"error\":{\"message\":\"x\"},\"choices\":[]}";
    assert_int_equal(lg_response_parse(err, strlen(err), &none), KVG_EPROTO);
    assert_int_equal(lg_response_parse("{}", 2, &none), KVG_EPROTO);
    assert_int_equal(lg_response_parse("[]", 2, &none), KVG_EPROTO);
    assert_int_equal(lg_response_parse("{\"choices\":[", 12, &none), KVG_EPARSE);
    assert_int_equal(lg_response_parse("", 0, &none), KVG_EPARSE);
    assert_int_equal(lg_response_parse(NULL, 0, &none), KVG_EPARSE);
}

/* ---- statistics and reports ---------------------------------------------------------------- */

static lg_result result(lg_outcome o, int status, const char *worker, uint64_t lat_us,
                        uint64_t prompt, uint64_t cached)
{
    lg_result r = {.outcome = o, .status = status, .latency_us = lat_us};
    snprintf(r.worker, sizeof(r.worker), "%s", worker);
    if (o == LG_OK) {
        r.usage = (lg_usage){.present = true,
                             .cached_present = true,
                             .prompt_tokens = prompt,
                             .cached_tokens = cached,
                             .completion_tokens = 4};
        r.has_ttft = true;
        r.ttft_us = lat_us / 2;
    }
    return r;
}

static void fill_stats(lg_stats *s)
{
    lg_stats_init(s);
    for (int i = 0; i < 90; i++) {
        lg_result r = result(LG_OK, 200, i % 3 == 0 ? "w1" : "w2", (uint64_t)(100 - i) * 1000, 500,
                             i % 3 == 0 ? 480 : 400);
        lg_stats_add(s, &r);
    }
    lg_result e = result(LG_HTTP_STATUS, 503, "w1", 5000, 0, 0);
    e.detail = "{\"error\":\n\"busy\"}";
    e.detail_len = strlen(e.detail);
    lg_stats_add(s, &e);
    lg_result t = result(LG_TIMEOUT, 0, "", 30000000, 0, 0);
    lg_stats_add(s, &t);
    lg_result n = result(LG_OK, 200, "", 1000, 0, 0);
    n.usage.present = false;
    n.has_ttft = false;
    lg_stats_add(s, &n);
    lg_stats_finish(s);
}

static void test_stats(void **state)
{
    (void)state;
    lg_stats s;
    fill_stats(&s);
    assert_int_equal(s.requests, 93);
    assert_int_equal(s.by_outcome[LG_OK], 91);
    assert_int_equal(s.by_outcome[LG_HTTP_STATUS], 1);
    assert_int_equal(s.by_outcome[LG_TIMEOUT], 1);
    assert_int_equal(s.by_status[200], 91);
    assert_int_equal(s.by_status[503], 1);
    assert_int_equal(s.latency.n, 91); /* successes only */
    assert_int_equal(s.ttft.n, 90);
    assert_int_equal(s.latency.v[0], 1000);
    assert_int_equal(s.latency.v[90], 100000);
    assert_int_equal(s.n_workers, 2);
    assert_string_equal(s.workers[0].name, "w1");
    assert_int_equal(s.workers[0].requests, 31);
    assert_int_equal(s.workers[0].ok, 30);
    assert_int_equal(s.workers[0].cached_tokens, 30 * 480);
    assert_int_equal(s.workers[1].requests, 60);
    assert_int_equal(s.unnamed.requests, 1); /* a response without a worker header */
    assert_int_equal(s.prompt_tokens, 90 * 500);
    assert_int_equal(s.cached_tokens, 30 * 480 + 60 * 400);
    assert_int_equal(s.usage_missing, 1);
    assert_string_equal(s.first_error, "http_status 503: {\"error\": \"busy\"}");
    lg_stats_done(&s);

    /* More distinct names than tracked fall into "(other)". */
    lg_stats_init(&s);
    for (int i = 0; i < LG_MAX_WORKERS + 5; i++) {
        char name[16];
        snprintf(name, sizeof(name), "w%d", i);
        lg_result r = result(LG_OK, 200, name, 10, 1, 0);
        lg_stats_add(&s, &r);
    }
    assert_int_equal(s.n_workers, LG_MAX_WORKERS);
    assert_int_equal(s.other.requests, 5);
    lg_stats_done(&s);
}

static void test_reports(void **state)
{
    (void)state;
    lg_stats s;
    fill_stats(&s);
    lg_report_meta m = {.url = "http://127.0.0.1:8080",
                        .model = "demo-model",
                        .workload = "shared-prefix",
                        .seed = 1,
                        .concurrency = 16,
                        .max_tokens = 16,
                        .stream = true,
                        .requests_planned = 93,
                        .elapsed_ns = 2000000000ull};
    kvg_buf b;
    kvg_buf_init(&b);
    lg_report_text(&b, &s, &m);
    assert_false(b.failed);
    assert_non_null(strstr(b.data, "93 finished, 91 ok, 2 failed in 2.00 s: 46.5 req/s"));
    assert_non_null(strstr(b.data, "HTTP 503 x1, timeout x1"));
    assert_non_null(strstr(b.data, "ttft ms"));
    assert_non_null(strstr(b.data, "cached 38400 (85.3%)"));
    assert_non_null(strstr(b.data, "w1 "));
    assert_non_null(strstr(b.data, "(none)"));
    size_t lines = 0;
    for (const char *p = b.data; *p; p++)
        lines += *p == '\n';
    assert_true(lines <= 24); /* one screen */

    kvg_buf_reset(&b);
    lg_report_json(&b, &s, &m);
    assert_false(b.failed);
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *v;
    kvg_json_limits strict = {.reject_duplicate_keys = true};
    assert_int_equal(kvg_json_parse(b.data, b.len, &a, &strict, &v, NULL), 0);
    assert_int_equal(kvg_json_get(v, "requests")->u.num.ival, 93);
    assert_int_equal(kvg_json_get(v, "failed")->u.num.ival, 2);
    assert_int_equal(kvg_json_get(kvg_json_get(v, "status"), "503")->u.num.ival, 1);
    assert_int_equal(kvg_json_get(kvg_json_get(v, "errors"), "timeout")->u.num.ival, 1);
    assert_true(kvg_json_get(kvg_json_get(v, "latency_ms"), "p50")->u.num.value > 0);
    const kvg_json *lat = kvg_json_get(v, "latency_ms");
    double mean = kvg_json_get(lat, "mean")->u.num.value;
    assert_true(mean > 0 && mean <= kvg_json_get(lat, "max")->u.num.value);
    assert_non_null(kvg_json_get(kvg_json_get(v, "tokens"), "prompt"));
    assert_non_null(kvg_json_get(v, "tenants"));
    assert_non_null(kvg_json_get(kvg_json_get(v, "workers")->u.arr.items[0], "requests"));
    assert_int_equal(kvg_json_get(v, "workers")->u.arr.count, 3);
    assert_int_equal(kvg_json_get(kvg_json_get(v, "tokens"), "cached")->u.num.ival, 38400);
    kvg_arena_done(&a);
    kvg_buf_done(&b);
    lg_stats_done(&s);

    /* Nothing finished: no division by zero, still valid JSON. */
    lg_stats_init(&s);
    lg_stats_finish(&s);
    m.elapsed_ns = 0;
    kvg_buf_init(&b);
    lg_report_text(&b, &s, &m);
    assert_non_null(strstr(b.data, "none answered"));
    kvg_buf_reset(&b);
    lg_report_json(&b, &s, &m);
    kvg_arena_init(&a, 0);
    assert_int_equal(kvg_json_parse(b.data, b.len, &a, NULL, &v, NULL), 0);
    assert_int_equal(kvg_json_get(v, "latency_ms")->type, KVG_JSON_NULL);
    kvg_arena_done(&a);
    kvg_buf_done(&b);
    lg_stats_done(&s);
}

/* Several --url: connections round robin over them, requests counted by URL, both reports
 * list every URL with its connections. */
static void test_urls(void **state)
{
    (void)state;
    /* 10 connections over 4 URLs: 3, 3, 2, 2 (slot j goes to URL j mod 4). */
    assert_int_equal(lg_url_connections(0, 4, 10), 3);
    assert_int_equal(lg_url_connections(1, 4, 10), 3);
    assert_int_equal(lg_url_connections(2, 4, 10), 2);
    assert_int_equal(lg_url_connections(3, 4, 10), 2);
    assert_int_equal(lg_url_connections(4, 4, 10), 0);
    assert_int_equal(lg_url_connections(0, 1, 7), 7);
    assert_int_equal(lg_url_connections(1, 2, 1), 0);
    assert_int_equal(lg_url_connections(0, 0, 8), 0);

    lg_stats s;
    lg_stats_init(&s);
    for (size_t i = 0; i < 30; i++) {
        lg_result r = result(i % 10 == 9 ? LG_HTTP_STATUS : LG_OK, i % 10 == 9 ? 503 : 200, "w",
                             1000, 100, 50);
        r.url = i % 3 == 2 ? 2 : 0; /* URL 1 answers nothing */
        lg_stats_add(&s, &r);
    }
    lg_result far = result(LG_OK, 200, "w", 1000, 100, 50);
    far.url = LG_MAX_URLS; /* out of range: counted as a request, in no URL */
    lg_stats_add(&s, &far);
    lg_stats_finish(&s);
    assert_int_equal(s.requests, 31);
    assert_int_equal(s.url_requests[0], 20);
    assert_int_equal(s.url_requests[1], 0);
    assert_int_equal(s.url_requests[2], 10);
    assert_int_equal(s.url_ok[0], 18);
    assert_int_equal(s.url_ok[2], 9);

    const char *urls[] = {"http://127.0.0.1:8080", "http://127.0.0.1:8081",
                          "http://127.0.0.1:8082"};
    lg_report_meta m = {.url = urls[0],
                        .urls = urls,
                        .n_urls = 3,
                        .model = "demo-model",
                        .workload = "shared-prefix",
                        .seed = 1,
                        .concurrency = 8,
                        .max_tokens = 16,
                        .requests_planned = 31,
                        .elapsed_ns = 1000000000ull};
    kvg_buf b;
    kvg_buf_init(&b);
    lg_report_text(&b, &s, &m);
    assert_false(b.failed);
    assert_non_null(strstr(b.data, "http://127.0.0.1:8080 and 2 more URLs"));
    assert_non_null(strstr(b.data, "connections"));
    assert_non_null(strstr(b.data, "http://127.0.0.1:8081"));
    const char *row = strstr(b.data, "\n               http://127.0.0.1:8082 ");
    assert_non_null(row);
    unsigned conn = 0, req = 0, ok = 0;
    double share = 0;
    assert_int_equal(sscanf(row, " http://127.0.0.1:8082 %u %u %lf%% %u", &conn, &req, &share, &ok),
                     4);
    assert_int_equal(conn, 2);
    assert_int_equal(req, 10);
    assert_int_equal(ok, 9);
    assert_true(share > 32.25 && share < 32.35);

    kvg_buf_reset(&b);
    lg_report_json(&b, &s, &m);
    assert_false(b.failed);
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *v;
    kvg_json_limits strict = {.reject_duplicate_keys = true};
    assert_int_equal(kvg_json_parse(b.data, b.len, &a, &strict, &v, NULL), 0);
    const kvg_json *list = kvg_json_get(v, "urls");
    assert_int_equal(list->u.arr.count, 3);
    uint64_t conns[] = {3, 3, 2}, reqs[] = {20, 0, 10}, oks[] = {18, 0, 9};
    for (size_t i = 0; i < 3; i++) {
        const kvg_json *u = list->u.arr.items[i];
        assert_string_equal(kvg_json_get(u, "url")->u.str.ptr, urls[i]);
        assert_int_equal(kvg_json_get(u, "connections")->u.num.ival, conns[i]);
        assert_int_equal(kvg_json_get(u, "requests")->u.num.ival, reqs[i]);
        assert_int_equal(kvg_json_get(u, "ok")->u.num.ival, oks[i]);
    }
    assert_string_equal(kvg_json_get(v, "url")->u.str.ptr, urls[0]);
    kvg_arena_done(&a);

    /* Fewer requests than connections: one connection per request (the runner's rule). */
    m.requests_planned = 2;
    kvg_buf_reset(&b);
    lg_report_json(&b, &s, &m);
    kvg_arena_init(&a, 0);
    assert_int_equal(kvg_json_parse(b.data, b.len, &a, &strict, &v, NULL), 0);
    list = kvg_json_get(v, "urls");
    assert_int_equal(kvg_json_get(list->u.arr.items[0], "connections")->u.num.ival, 1);
    assert_int_equal(kvg_json_get(list->u.arr.items[1], "connections")->u.num.ival, 1);
    assert_int_equal(kvg_json_get(list->u.arr.items[2], "connections")->u.num.ival, 0);
    kvg_arena_done(&a);

    /* One URL (the meta of older callers: no list): no urls table in the text, a list of one
     * in JSON holding every request. */
    m = (lg_report_meta){.url = urls[1],
                         .model = "demo-model",
                         .workload = "shared-prefix",
                         .concurrency = 8,
                         .requests_planned = 31};
    kvg_buf_reset(&b);
    lg_report_text(&b, &s, &m);
    assert_null(strstr(b.data, "more URLs"));
    assert_null(strstr(b.data, "connections"));
    kvg_buf_reset(&b);
    lg_report_json(&b, &s, &m);
    kvg_arena_init(&a, 0);
    assert_int_equal(kvg_json_parse(b.data, b.len, &a, &strict, &v, NULL), 0);
    list = kvg_json_get(v, "urls");
    assert_int_equal(list->u.arr.count, 1);
    assert_string_equal(kvg_json_get(list->u.arr.items[0], "url")->u.str.ptr, urls[1]);
    assert_int_equal(kvg_json_get(list->u.arr.items[0], "connections")->u.num.ival, 8);
    kvg_arena_done(&a);
    kvg_buf_done(&b);
    lg_stats_done(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workload_registry),
        cmocka_unit_test(test_workload_deterministic),
        cmocka_unit_test(test_workload_shared_prefix),
        cmocka_unit_test(test_workload_unique),
        cmocka_unit_test(test_workload_multi_tenant),
        cmocka_unit_test(test_workload_multi_tenant_opts),
        cmocka_unit_test(test_workload_multi_tenant_follow_up_tokens),
        cmocka_unit_test(test_workload_alloc_failures),
        cmocka_unit_test(test_body_build),
        cmocka_unit_test(test_percentile),
        cmocka_unit_test(test_sse_whole_and_split),
        cmocka_unit_test(test_sse_limits_and_errors),
        cmocka_unit_test(test_sse_alloc_failures),
        cmocka_unit_test(test_stream_vllm_sequence),
        cmocka_unit_test(test_stream_variants_and_errors),
        cmocka_unit_test(test_response_parse),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_reports),
        cmocka_unit_test(test_urls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
