/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for kvgate-simworker: tokenizer, block hashes, KV block cache, engine
 * scheduling and request parsing (with a failing allocator). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "fail_alloc.h"
#include "simworker.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static size_t tok(const char *text, uint32_t *ids, size_t max)
{
    sim_tokens t;
    sim_tokens_init(&t, 0);
    assert_int_equal(sim_tokenize(text, strlen(text), &t), 0);
    assert_true(t.n <= max);
    if (t.n)
        memcpy(ids, t.v, t.n * sizeof(*ids));
    size_t n = t.n;
    sim_tokens_done(&t);
    return n;
}

static uint32_t pid(const char *piece)
{
    return sim_piece_id(piece, strlen(piece));
}

static void fill_hash(sim_hash *h, uint32_t seed)
{
    for (size_t i = 0; i < sizeof(h->b); i++)
        h->b[i] = (uint8_t)(seed * 31u + i * 7u + (seed >> 8));
}

/* Hashes of a fake request whose blocks are named by (req, index). */
static void req_hashes(sim_hash *h, uint32_t req, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        fill_hash(&h[i], req * 1000u + i);
}

static void hex(const sim_hash *h, char *out)
{
    for (size_t i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", h->b[i]);
}

/* ---- tokenizer ------------------------------------------------------------------------------ */

static void test_tokenizer_pieces(void **state)
{
    (void)state;
    uint32_t ids[64];
    assert_int_equal(tok("", ids, 64), 0);

    /* Words cut into 4-byte pieces; a single space joins the word after it. */
    assert_int_equal(tok("hello world", ids, 64), 4);
    assert_int_equal(ids[0], pid("hell"));
    assert_int_equal(ids[1], pid("o"));
    assert_int_equal(ids[2], pid(" worl"));
    assert_int_equal(ids[3], pid("d"));

    /* Longer whitespace runs are their own pieces; punctuation runs too. */
    assert_int_equal(tok("a  b!!", ids, 64), 4);
    assert_int_equal(ids[0], pid("a"));
    assert_int_equal(ids[1], pid(" "));
    assert_int_equal(ids[2], pid(" b"));
    assert_int_equal(ids[3], pid("!!"));
    assert_int_equal(tok("\n the", ids, 64), 2);
    assert_int_equal(ids[0], pid("\n"));
    assert_int_equal(ids[1], pid(" the"));
    assert_int_equal(tok("!!!!!!", ids, 64), 2); /* runs are cut at 4 bytes too */

    /* Special tokens are single tokens, also inside punctuation. */
    assert_int_equal(tok("<|im_start|>user\nhi<|im_end|>", ids, 64), 5);
    assert_int_equal(ids[0], SIM_TOKEN_IM_START);
    assert_int_equal(ids[1], pid("user"));
    assert_int_equal(ids[2], pid("\n"));
    assert_int_equal(ids[3], pid("hi"));
    assert_int_equal(ids[4], SIM_TOKEN_IM_END);
    assert_int_equal(tok("</x><|endoftext|>", ids, 64), 4);
    assert_int_equal(ids[3], SIM_TOKEN_ENDOFTEXT);

    /* UTF-8 characters are never split: "h\xc3\xa9llo" -> "h\xc3\xa9l" + "lo". */
    assert_int_equal(tok("h\xc3\xa9llo", ids, 64), 2);
    assert_int_equal(ids[0], pid("h\xc3\xa9l"));
    assert_int_equal(ids[1], pid("lo"));

    /* Ordinary ids stay below the special ones; the same text gives the same ids. */
    uint32_t again[64];
    size_t n = tok("The quick brown fox, jumps over 13 lazy dogs.", ids, 64);
    assert_int_equal(tok("The quick brown fox, jumps over 13 lazy dogs.", again, 64), n);
    for (size_t i = 0; i < n; i++) {
        assert_true(ids[i] < SIM_TOKEN_ORDINARY);
        assert_int_equal(ids[i], again[i]);
    }
}

static void test_tokenizer_output_roundtrip(void **state)
{
    (void)state;
    /* Every generated token reads back as itself, and prompt + output text tokenizes to the
     * prompt's tokens followed by the output ids: a follow-up turn can hit output blocks. */
    for (uint32_t k = 1; k <= 200; k++) {
        uint32_t ids[4] = {0}; /* -O3 cannot see the tokenizer fill it */
        assert_int_equal(tok(sim_output_piece(k), ids, 4), 1);
        assert_int_equal(ids[0], sim_output_token(k));
    }
    static const char *const prompts[] = {
        "<|im_start|>assistant\n", "Hello", "Hello ", "x.", "a\n\n", "tab\t"};
    for (size_t p = 0; p < KVG_ARRAY_LEN(prompts); p++) {
        uint32_t base[64], all[256];
        size_t nb = tok(prompts[p], base, 64);
        kvg_buf text;
        kvg_buf_init(&text);
        kvg_buf_puts(&text, prompts[p]);
        sim_output_text(&text, 50);
        size_t na = tok(text.data, all, 256);
        kvg_buf_done(&text);
        if (prompts[p][strlen(prompts[p]) - 1] == ' ') {
            /* "Hello " + " the": the run "  " splits into " " and " the"; still a prefix. */
            assert_int_equal(na, nb + 50);
            for (size_t i = 0; i + 1 < nb; i++)
                assert_int_equal(all[i], base[i]);
        } else {
            assert_int_equal(na, nb + 50);
            for (size_t i = 0; i < nb; i++)
                assert_int_equal(all[i], base[i]);
        }
        for (uint32_t k = 1; k <= 50; k++)
            assert_int_equal(all[nb + k - 1], sim_output_token(k));
    }
}

static void test_tokenizer_limit_and_garbage(void **state)
{
    (void)state;
    sim_tokens t;
    sim_tokens_init(&t, 3);
    assert_int_equal(sim_tokenize("one two three four five", 23, &t), 0);
    assert_true(t.n > 3);
    assert_true(sim_tokens_truncated(&t));
    assert_true(t.cap <= 3);
    sim_tokens_done(&t);

    /* Arbitrary bytes (NUL, broken UTF-8, lone '<|') are accepted and fully consumed. */
    unsigned char buf[512];
    uint64_t x = 42;
    for (int round = 0; round < 200; round++) {
        size_t len = (size_t)(x % sizeof(buf));
        for (size_t i = 0; i < len; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            buf[i] = (unsigned char)(x >> 56);
        }
        sim_tokens_init(&t, 0);
        assert_int_equal(sim_tokenize((const char *)buf, len, &t), 0);
        assert_true(t.n <= len);
        assert_true(len == 0 || t.n > 0);
        sim_tokens_done(&t);
    }
}

static void test_chat_template(void **state)
{
    (void)state;
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}]}],"
                       "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}";
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *root;
    assert_int_equal(kvg_json_parse(body, strlen(body), &a, NULL, &root, NULL), 0);
    kvg_buf out;
    kvg_buf_init(&out);
    assert_int_equal(
        sim_chat_render(kvg_json_get(root, "messages"), kvg_json_get(root, "tools"), true, &out),
        0);
    assert_string_equal(
        out.data, "<|im_start|>system\nBe brief.\n\n# Tools\n\n<tools>\n"
                  "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n</tools><|im_end|>\n"
                  "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
    kvg_buf_done(&out);
    kvg_arena_done(&a);
}

/* ---- block hashes --------------------------------------------------------------------------- */

static void test_block_hashes(void **state)
{
    (void)state;
    uint32_t tokens[40];
    for (uint32_t i = 0; i < 40; i++)
        tokens[i] = i;
    sim_hash h[2], s[2], m[2];
    char x[65];
    assert_int_equal(sim_block_hashes(tokens, 15, 16, NULL, 0, h), 0); /* no full block */
    assert_int_equal(sim_block_hashes(tokens, 40, 16, NULL, 0, h), 0);
    /* Vectors computed independently (docs/simworker.md, Python hashlib). */
    hex(&h[0], x);
    assert_string_equal(x, "fc39f56ee5f6d2d1c2e37ed696f089b2a2756d6f485f76e15c532190c8ffed5e");
    hex(&h[1], x);
    assert_string_equal(x, "daec556cca28d850a601d8282b6e97e90d24af933a9c95ea3d34cccdbcbd4eaa");
    assert_int_equal(sim_block_hashes(tokens, 32, 16, "tenant-a", 8, s), 0);
    hex(&s[0], x);
    assert_string_equal(x, "4a22361a5e6407388242cafa23d72cb9cf7272fa5631471c1b1bb59dc617882c");
    /* The salt changes the first block and, through the chain, every later one. */
    assert_memory_not_equal(s[1].b, h[1].b, 32);
    /* A change in block 1 leaves block 0 alone; a change in block 0 changes both. */
    tokens[20] = 999;
    assert_int_equal(sim_block_hashes(tokens, 32, 16, NULL, 0, m), 0);
    assert_memory_equal(m[0].b, h[0].b, 32);
    assert_memory_not_equal(m[1].b, h[1].b, 32);
    tokens[20] = 20;
    tokens[3] = 999;
    assert_int_equal(sim_block_hashes(tokens, 32, 16, NULL, 0, m), 0);
    assert_memory_not_equal(m[0].b, h[0].b, 32);
    assert_memory_not_equal(m[1].b, h[1].b, 32);
    assert_int_equal(sim_block_hashes(tokens, 32, 0, NULL, 0, m), -EINVAL);
}

/* ---- KV cache ------------------------------------------------------------------------------- */

static void test_kvcache_basic(void **state)
{
    (void)state;
    sim_kvcache *kv;
    assert_int_equal(sim_kvcache_new(0, &kv), -EINVAL);
    assert_int_equal(sim_kvcache_new(8, &kv), 0);
    assert_int_equal(sim_kvcache_num_free(kv), 8);
    sim_hash h[4];
    req_hashes(h, 1, 4);
    assert_int_equal(sim_kvcache_match(kv, h, 4), 0);
    uint32_t ids[4];
    assert_int_equal(sim_kvcache_acquire(kv, h, 0, 4, ids), 0);
    assert_int_equal(sim_kvcache_num_free(kv), 4);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            assert_int_not_equal(ids[i], ids[j]);
    /* Not findable before commit (KV not computed yet); only committed blocks are. */
    assert_int_equal(sim_kvcache_match(kv, h, 4), 0);
    sim_kvcache_commit(kv, ids, h, 0, 3);
    assert_int_equal(sim_kvcache_match(kv, h, 4), 3);
    assert_int_equal(sim_kvcache_num_cached(kv), 3);
    sim_kvcache_release(kv, ids, 4);
    assert_int_equal(sim_kvcache_num_free(kv), 8);
    /* Released cached blocks stay findable. */
    assert_int_equal(sim_kvcache_match(kv, h, 4), 3);
    /* A hit must be cached. */
    assert_int_equal(sim_kvcache_acquire(kv, h, 4, 4, ids), -EINVAL);
    assert_int_equal(sim_kvcache_acquire(kv, h, 2, 1, ids), -EINVAL);
    sim_kvcache_free(kv);
    sim_kvcache_free(NULL);
}

static void test_kvcache_lru_order(void **state)
{
    (void)state;
    sim_kvcache *kv;
    assert_int_equal(sim_kvcache_new(4, &kv), 0);
    sim_hash a[2], b[2], c[2];
    req_hashes(a, 1, 2);
    req_hashes(b, 2, 2);
    req_hashes(c, 3, 2);
    uint32_t ia[2], ib[2], ic[2];
    assert_int_equal(sim_kvcache_acquire(kv, a, 0, 2, ia), 0);
    sim_kvcache_commit(kv, ia, a, 0, 2);
    sim_kvcache_release(kv, ia, 2);
    assert_int_equal(sim_kvcache_acquire(kv, b, 0, 2, ib), 0);
    sim_kvcache_commit(kv, ib, b, 0, 2);
    sim_kvcache_release(kv, ib, 2);
    /* Never-used blocks went first; now only cached blocks are free, A older than B. One
     * fresh block evicts A's tail block (freed first), so A's head still matches. */
    uint32_t one;
    assert_int_equal(sim_kvcache_acquire(kv, c, 0, 1, &one), 0);
    assert_int_equal(one, ia[1]);
    assert_int_equal(sim_kvcache_match(kv, a, 2), 1);
    assert_int_equal(sim_kvcache_match(kv, b, 2), 2);
    assert_int_equal(sim_kvcache_evictions(kv), 1);
    sim_kvcache_release(kv, &one, 1);

    /* A hit moves A's head to the most recent end: the next evictions take B first. */
    uint32_t hit;
    assert_int_equal(sim_kvcache_acquire(kv, a, 1, 1, &hit), 0);
    assert_int_equal(hit, ia[0]);
    assert_int_equal(sim_kvcache_block_refs(kv, hit), 1);
    sim_kvcache_release(kv, &hit, 1);
    assert_int_equal(sim_kvcache_acquire(kv, c, 0, 2, ic), 0);
    assert_int_equal(sim_kvcache_match(kv, b, 2), 0);
    assert_int_equal(sim_kvcache_match(kv, a, 2), 1);
    sim_kvcache_release(kv, ic, 2);
    sim_kvcache_free(kv);
}

static void test_kvcache_capacity_and_refs(void **state)
{
    (void)state;
    sim_kvcache *kv;
    assert_int_equal(sim_kvcache_new(4, &kv), 0);
    sim_hash a[3], b[3];
    req_hashes(a, 1, 3);
    req_hashes(b, 2, 3);
    uint32_t ia[3], ia2[3], ib[3];
    assert_int_equal(sim_kvcache_acquire(kv, a, 0, 3, ia), 0);
    sim_kvcache_commit(kv, ia, a, 0, 3);
    /* A second request shares A's blocks (refcount 2) and adds nothing. */
    assert_int_equal(sim_kvcache_match(kv, a, 3), 3);
    assert_int_equal(sim_kvcache_acquire(kv, a, 3, 3, ia2), 0);
    assert_memory_equal(ia, ia2, sizeof(ia));
    assert_int_equal(sim_kvcache_block_refs(kv, ia[0]), 2);
    assert_int_equal(sim_kvcache_num_free(kv), 1);
    /* Too big: refused, and nothing changed. */
    assert_int_equal(sim_kvcache_acquire(kv, b, 0, 2, ib), KVG_ELIMIT);
    assert_int_equal(sim_kvcache_num_free(kv), 1);
    sim_kvcache_release(kv, ia2, 3);
    assert_int_equal(sim_kvcache_block_refs(kv, ia[0]), 1);
    /* Blocks in use are never evicted, however hard allocation pushes. */
    assert_int_equal(sim_kvcache_acquire(kv, b, 0, 1, ib), 0);
    assert_int_equal(sim_kvcache_acquire(kv, b, 0, 1, ib + 1), KVG_ELIMIT);
    assert_int_equal(sim_kvcache_match(kv, a, 3), 3);
    sim_kvcache_release(kv, ib, 1);
    sim_kvcache_release(kv, ia, 3);
    /* A hit on free blocks takes them off the free list: they do not count as room. */
    assert_int_equal(sim_kvcache_num_free(kv), 4);
    uint32_t ids[4];
    assert_int_equal(sim_kvcache_acquire(kv, a, 3, 4, ids), 0);
    assert_int_equal(sim_kvcache_num_free(kv), 0);
    assert_true(sim_kvcache_num_cached(kv) <= sim_kvcache_num_blocks(kv));
    sim_kvcache_release(kv, ids, 4);
    sim_kvcache_free(kv);
}

static void test_kvcache_duplicates(void **state)
{
    (void)state;
    sim_kvcache *kv;
    assert_int_equal(sim_kvcache_new(4, &kv), 0);
    sim_hash a[1];
    req_hashes(a, 7, 1);
    uint32_t x, y, z[3];
    /* Two requests computed the same block concurrently: both blocks carry the hash. */
    assert_int_equal(sim_kvcache_acquire(kv, a, 0, 1, &x), 0);
    assert_int_equal(sim_kvcache_acquire(kv, a, 0, 1, &y), 0);
    sim_kvcache_commit(kv, &x, a, 0, 1);
    sim_kvcache_commit(kv, &y, a, 0, 1);
    assert_int_equal(sim_kvcache_num_cached(kv), 2);
    sim_kvcache_release(kv, &x, 1);
    sim_kvcache_release(kv, &y, 1);
    /* Evicting the older copy keeps the hash findable through the other. */
    sim_hash other[3];
    req_hashes(other, 8, 3);
    assert_int_equal(sim_kvcache_acquire(kv, other, 0, 3, z), 0);
    assert_int_equal(sim_kvcache_match(kv, a, 1), 1);
    sim_kvcache_release(kv, z, 3);
    sim_kvcache_free(kv);
}

/* ---- engine ---------------------------------------------------------------------------------- */

typedef struct probe {
    uint32_t cached;
    uint32_t generated;
    int calls;
    bool finished;
    bool cancel_at_first;
    sim_engine *eng;
} probe;

static void on_seq(void *arg, sim_seq *seq, uint32_t generated, bool finished)
{
    probe *p = arg;
    p->cached = sim_seq_cached_tokens(seq);
    p->generated = generated;
    p->finished = finished;
    p->calls++;
    if (p->cancel_at_first && !finished)
        sim_engine_cancel(p->eng, seq); /* from inside the callback: deferred */
}

static void engine_cfg(sim_config *cfg)
{
    sim_config_defaults(cfg);
    cfg->time_scale = 0.0; /* every timer fires on the next loop turn */
    cfg->max_model_len = 4096;
}

static probe run_one(struct event_base *base, sim_engine *eng, const uint32_t *t, size_t n,
                     uint32_t max_tokens, const char *salt)
{
    probe p = {0};
    sim_seq *s;
    assert_int_equal(
        sim_engine_submit(eng, t, n, max_tokens, salt, salt ? strlen(salt) : 0, on_seq, &p, &s), 0);
    event_base_dispatch(base);
    assert_true(p.finished);
    return p;
}

static void test_engine_hits(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sim_config cfg;
    engine_cfg(&cfg);
    sim_engine *eng;
    assert_int_equal(sim_engine_new(base, &cfg, &eng), 0);
    uint32_t t[80];
    for (uint32_t i = 0; i < 80; i++)
        t[i] = 1000 + i;
    /* Capping: the last prompt token is always recomputed, hits are whole blocks. */
    assert_int_equal(run_one(base, eng, t, 32, 4, NULL).cached, 0);
    assert_int_equal(run_one(base, eng, t, 32, 4, NULL).cached, 16);
    assert_int_equal(run_one(base, eng, t, 33, 4, NULL).cached, 32);
    assert_int_equal(run_one(base, eng, t, 16, 4, NULL).cached, 0);
    assert_int_equal(run_one(base, eng, t, 17, 4, NULL).cached, 16);
    /* Salts isolate: same tokens, other salt, nothing shared; the same salt hits. */
    assert_int_equal(run_one(base, eng, t, 33, 4, "tenant-a").cached, 0);
    assert_int_equal(run_one(base, eng, t, 33, 4, "tenant-b").cached, 0);
    assert_int_equal(run_one(base, eng, t, 33, 4, "tenant-a").cached, 32);
    /* Generated tokens are cached too (all but the last one computed): prompt 40 + 30 out
     * computes 69 tokens = 4 full blocks; the follow-up prompt hits all 4. */
    probe p = run_one(base, eng, t + 40, 40, 30, NULL);
    assert_int_equal(p.generated, 30);
    uint32_t follow[71];
    memcpy(follow, t + 40, 40 * sizeof(uint32_t));
    for (uint32_t k = 1; k <= 30; k++)
        follow[40 + k - 1] = sim_output_token(k);
    follow[70] = 7;
    assert_int_equal(run_one(base, eng, follow, 71, 1, NULL).cached, 64);
    /* Prefill only (embeddings): one callback, finished, nothing generated. */
    p = run_one(base, eng, t, 33, 0, NULL);
    assert_int_equal(p.calls, 1);
    assert_int_equal(p.generated, 0);
    const sim_stats *st = sim_engine_stats(eng);
    assert_int_equal(st->running, 0);
    assert_int_equal(st->blocks_free, st->blocks_total);
    assert_true(st->prefix_hits > 0 && st->prefix_hits < st->prefix_queries);
    assert_int_equal(st->finished_stop, 1);
    sim_engine_free(eng);
    event_base_free(base);
}

static void test_engine_queue_and_cancel(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sim_config cfg;
    engine_cfg(&cfg);
    cfg.kv_blocks = 6;
    cfg.max_model_len = 64;
    cfg.max_running = 4;
    sim_engine *eng;
    assert_int_equal(sim_engine_new(base, &cfg, &eng), 0);
    uint32_t t[64];
    for (uint32_t i = 0; i < 64; i++)
        t[i] = i;
    /* 4 blocks each out of 6: the second cannot get its blocks and waits. */
    probe a = {0}, b = {0}, c = {0};
    sim_seq *sa, *sb, *sc;
    assert_int_equal(sim_engine_submit(eng, t, 40, 24, NULL, 0, on_seq, &a, &sa), 0);
    assert_int_equal(sim_engine_submit(eng, t + 1, 40, 24, NULL, 0, on_seq, &b, &sb), 0);
    assert_int_equal(sim_engine_submit(eng, t + 2, 4, 4, NULL, 0, on_seq, &c, &sc), 0);
    const sim_stats *st = sim_engine_stats(eng);
    assert_int_equal(st->running, 1);
    assert_int_equal(st->waiting, 2); /* FCFS: c waits behind b although it would fit */
    /* Cancelling the waiting b lets c in; cancelling a running one frees its blocks. */
    sim_engine_cancel(eng, sb);
    st = sim_engine_stats(eng);
    assert_int_equal(st->running, 2);
    assert_int_equal(st->waiting, 0);
    sim_engine_cancel(eng, sa);
    st = sim_engine_stats(eng);
    assert_int_equal(st->running, 1);
    assert_int_equal(st->finished_abort, 2);
    event_base_dispatch(base);
    assert_true(c.finished);
    assert_int_equal(a.calls + b.calls, 0);
    st = sim_engine_stats(eng);
    assert_int_equal(st->blocks_free, 6);

    /* Cancel from inside the callback: no further call, blocks back. */
    probe d = {.cancel_at_first = true, .eng = eng};
    sim_seq *sd;
    assert_int_equal(sim_engine_submit(eng, t, 20, 10, NULL, 0, on_seq, &d, &sd), 0);
    event_base_dispatch(base);
    assert_int_equal(d.calls, 1);
    assert_false(d.finished);
    st = sim_engine_stats(eng);
    assert_int_equal(st->blocks_free, 6);
    assert_int_equal(st->running, 0);

    /* Limits: too long, and a full waiting queue. */
    assert_int_equal(sim_engine_submit(eng, t, 60, 10, NULL, 0, on_seq, &d, &sd), -EINVAL);
    assert_int_equal(sim_engine_submit(eng, t, 0, 10, NULL, 0, on_seq, &d, &sd), -EINVAL);
    sim_engine_free(eng);

    cfg.max_running = 1;
    cfg.max_waiting = 1;
    assert_int_equal(sim_engine_new(base, &cfg, &eng), 0);
    assert_int_equal(sim_engine_submit(eng, t, 4, 4, NULL, 0, on_seq, &a, &sa), 0);
    assert_int_equal(sim_engine_submit(eng, t, 4, 4, NULL, 0, on_seq, &b, &sb), 0);
    assert_int_equal(sim_engine_waiting_room(eng), 0);
    assert_int_equal(sim_engine_submit(eng, t, 4, 4, NULL, 0, on_seq, &c, &sc), KVG_ELIMIT);
    sim_engine_free(eng); /* frees what is still queued or running, without callbacks */
    event_base_free(base);
}

/* ---- requests -------------------------------------------------------------------------------- */

static sim_config req_cfg(void)
{
    sim_config cfg;
    sim_config_defaults(&cfg);
    cfg.max_model_len = 64;
    cfg.models[1] = "alias";
    cfg.n_models = 2;
    return cfg;
}

static int parse(const sim_config *cfg, sim_endpoint ep, const char *body, sim_request *out,
                 sim_error *err)
{
    memset(err, 0, sizeof(*err));
    return sim_request_parse(cfg, ep, body, strlen(body), out, err);
}

static void expect_error(const sim_config *cfg, sim_endpoint ep, const char *body, int status,
                         const char *param)
{
    sim_request r;
    sim_error err;
    int rc = parse(cfg, ep, body, &r, &err);
    if (rc != KVG_EPARSE || err.status != status || strcmp(err.param, param) != 0)
        fail_msg("%s: rc %d status %d param '%s' (%s)", body, rc, err.status, err.param,
                 err.message);
}

static void test_request_ok(void **state)
{
    (void)state;
    sim_config cfg = req_cfg();
    sim_request r;
    sim_error err;
    assert_int_equal(parse(&cfg, SIM_EP_COMPLETIONS,
                           "{\"model\":\"alias\",\"prompt\":\"hello world\",\"max_tokens\":5,"
                           "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                           "\"cache_salt\":\"s1\",\"n\":3}",
                           &r, &err),
                     0);
    assert_string_equal(r.model, "alias");
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].n, 4);
    assert_int_equal(r.max_tokens, 5);
    assert_true(r.stream && r.include_usage);
    assert_string_equal(r.cache_salt, "s1");
    sim_request_done(&r);

    /* Token ids as-is; batches of token lists; default max_tokens; no model = first name. */
    assert_int_equal(parse(&cfg, SIM_EP_COMPLETIONS, "{\"prompt\":[[1,2,3],[4,5]]}", &r, &err), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[1].n, 2);
    assert_int_equal(r.prompts[1].tokens[1], 5);
    assert_int_equal(r.max_tokens, 16);
    assert_string_equal(r.model, "sim-model");
    sim_request_done(&r);
    /* The default shrinks to fit the context; an explicit value would be refused. */
    assert_int_equal(parse(&cfg, SIM_EP_COMPLETIONS,
                           "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,"
                           "22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,"
                           "45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60]}",
                           &r, &err),
                     0);
    assert_int_equal(r.max_tokens, 4);
    sim_request_done(&r);

    /* A chat and its pre-rendered text give the same tokens. */
    sim_request c, p;
    assert_int_equal(parse(&cfg, SIM_EP_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi there\"}],"
                           "\"max_completion_tokens\":3,\"max_tokens\":9}",
                           &c, &err),
                     0);
    assert_int_equal(c.max_tokens, 3);
    assert_int_equal(parse(&cfg, SIM_EP_COMPLETIONS,
                           "{\"prompt\":\"<|im_start|>user\\nhi there<|im_end|>\\n"
                           "<|im_start|>assistant\\n\"}",
                           &p, &err),
                     0);
    assert_int_equal(c.prompts[0].n, p.prompts[0].n);
    assert_memory_equal(c.prompts[0].tokens, p.prompts[0].tokens, p.prompts[0].n * 4);
    sim_request_done(&c);
    sim_request_done(&p);

    assert_int_equal(parse(&cfg, SIM_EP_EMBEDDINGS,
                           "{\"input\":[\"a\",\"b c\"],\"encoding_format\":\"base64\","
                           "\"dimensions\":8}",
                           &r, &err),
                     0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.max_tokens, 0);
    assert_true(r.base64);
    assert_int_equal(r.dimensions, 8);
    sim_request_done(&r);
}

static void test_request_errors(void **state)
{
    (void)state;
    sim_config cfg = req_cfg();
    const sim_endpoint C = SIM_EP_COMPLETIONS, CH = SIM_EP_CHAT, E = SIM_EP_EMBEDDINGS;
    expect_error(&cfg, C, "{bad", 400, "");
    expect_error(&cfg, C, "[1]", 400, "");
    expect_error(&cfg, C, "{}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":5}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":\"\"}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":[]}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":[\"a\",1]}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":[1,-2]}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":[1,2.5]}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":[151936]}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"model\":7}", 400, "model");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"model\":\"gpt-x\"}", 404, "model");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 400, "max_tokens");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"max_tokens\":64}", 400, "prompt");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"stream\":1}", 400, "stream");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400,
                 "stream_options");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":[]}", 400,
                 "stream_options");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"cache_salt\":\"\"}", 400, "cache_salt");
    expect_error(&cfg, C, "{\"prompt\":\"a\",\"cache_salt\":5}", 400, "cache_salt");
    expect_error(&cfg, CH, "{\"prompt\":\"a\"}", 400, "messages");
    expect_error(&cfg, CH, "{\"messages\":{}}", 400, "messages");
    expect_error(&cfg, CH, "{\"messages\":[]}", 400, "messages");
    expect_error(&cfg, CH, "{\"messages\":[1]}", 400, "messages[0]");
    expect_error(&cfg, CH, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role");
    expect_error(&cfg, CH, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
                 "messages[0].content");
    expect_error(&cfg, CH,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                 "messages[0].content[0]");
    expect_error(&cfg, CH, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}",
                 400, "tools");
    expect_error(&cfg, E, "{\"input\":\"a\",\"encoding_format\":\"hex\"}", 400, "encoding_format");
    expect_error(&cfg, E, "{\"input\":\"a\",\"dimensions\":0}", 400, "dimensions");
    /* Over max_model_len (64): counted exactly, refused. */
    expect_error(&cfg, E,
                 "{\"input\":\""
                 "aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa "
                 "aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa "
                 "aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa "
                 "aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa "
                 "aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa aaaa\"}",
                 400, "input");
    /* A batch above the cap. */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"prompt\":[");
    for (int i = 0; i <= SIM_MAX_BATCH; i++)
        kvg_buf_puts(&b, i ? ",\"x\"" : "\"x\"");
    kvg_buf_puts(&b, "]}");
    expect_error(&cfg, C, b.data, 400, "prompt");
    kvg_buf_done(&b);
    /* Only one prompt for /tokenize. */
    expect_error(&cfg, SIM_EP_TOKENIZE, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
}

/* Bodies that are not JSON a tokenizer can take (Python decodes "\ud800" into a string no UTF-8
 * encoder accepts; vLLM answers 400): each is a 400 BadRequestError naming no field, in every
 * place a string may stand. A NUL escape is a character like any other. */
static void test_request_bad_strings(void **state)
{
    (void)state;
    sim_config cfg = req_cfg();
    static const struct {
        sim_endpoint ep;
        const char *body;
        const char *msg;
    } cases[] = {
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\\ud800\"}",
         "Invalid JSON at byte 17: unpaired surrogate in \\u escape"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\\udc00\"}",
         "Invalid JSON at byte 17: unpaired surrogate in \\u escape"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"a\\udc00\\ud800b\"}",
         "Invalid JSON at byte 18: unpaired surrogate in \\u escape"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\\ud800\\u0041\"}",
         "Invalid JSON at byte 23: unpaired surrogate in \\u escape"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":[\"a\",\"\\uDBFF\"]}",
         "Invalid JSON at byte 22: unpaired surrogate in \\u escape"},
        {SIM_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
         "Invalid JSON at byte 45: unpaired surrogate in \\u escape"},
        {SIM_EP_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
         "\"\\udfff\"}]}]}",
         "Invalid JSON at byte 68: unpaired surrogate in \\u escape"},
        {SIM_EP_EMBEDDINGS, "{\"input\":\"x\",\"\\ud800\":1}",
         "Invalid JSON at byte 20: unpaired surrogate in \\u escape"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\xed\xa0\x80\"}",
         "Invalid JSON at byte 11: invalid UTF-8 in string"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\xff\"}",
         "Invalid JSON at byte 11: invalid UTF-8 in string"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\\u00\"}",
         "Invalid JSON at byte 13: bad hex digit in \\u escape"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\\u00", "Invalid JSON at byte 15: unterminated string"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":\"\\x\"}",
         "Invalid JSON at byte 12: invalid escape in string"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        sim_request r;
        sim_error err;
        int rc = parse(&cfg, cases[i].ep, cases[i].body, &r, &err);
        if (rc != KVG_EPARSE || err.status != 400 || strcmp(err.type, "BadRequestError") != 0 ||
            err.param[0] || strcmp(err.message, cases[i].msg) != 0)
            fail_msg("%s: rc %d status %d type %s param '%s' message '%s'", cases[i].body, rc,
                     err.status, err.type ? err.type : "", err.param, err.message);
        /* The answer is JSON in OpenAI's shape. */
        kvg_buf b;
        kvg_buf_init(&b);
        sim_respond_error(&b, &err);
        kvg_arena a;
        kvg_json *v;
        kvg_arena_init(&a, 0);
        assert_int_equal(kvg_json_parse(b.data, b.len, &a, NULL, &v, NULL), 0);
        const kvg_json *e = kvg_json_get(v, "error");
        assert_non_null(e);
        assert_string_equal(kvg_json_get(e, "message")->u.str.ptr, cases[i].msg);
        assert_string_equal(kvg_json_get(e, "type")->u.str.ptr, "BadRequestError");
        assert_int_equal(kvg_json_get(e, "param")->type, KVG_JSON_NULL);
        assert_int_equal(kvg_json_get(e, "code")->u.num.ival, 400);
        kvg_arena_done(&a);
        kvg_buf_done(&b);
    }
    /* vLLM (Python) takes "\u0000" in a prompt, in a message and in a key. */
    sim_request r;
    sim_error err;
    assert_int_equal(
        parse(&cfg, SIM_EP_COMPLETIONS, "{\"prompt\":\"a\\u0000b\",\"x\\u0000\":1}", &r, &err), 0);
    sim_request_done(&r);
    assert_int_equal(parse(&cfg, SIM_EP_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"\\u0000\"}]}", &r,
                           &err),
                     0);
    sim_request_done(&r);
}

static void test_request_alloc_failures(void **state)
{
    (void)state;
    sim_config cfg = req_cfg();
    static const struct {
        sim_endpoint ep;
        const char *body;
    } cases[] = {
        {SIM_EP_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
                      "\"content\":[{\"type\":\"text\",\"text\":\"hello there\"}]}],\"tools\":"
                      "[{\"type\":\"function\"}],\"cache_salt\":\"abc\",\"max_tokens\":4}"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":[\"one two\",\"three\"],\"max_tokens\":2}"},
        {SIM_EP_COMPLETIONS, "{\"prompt\":[[1,2],[3]]}"},
        {SIM_EP_EMBEDDINGS, "{\"input\":\"x y z\"}"},
    };
    for (size_t c = 0; c < KVG_ARRAY_LEN(cases); c++) {
        bool injected = true;
        for (long n = 0; injected && n < 500; n++) {
            sim_request r;
            sim_error err;
            fail_alloc_nth(n);
            int rc = parse(&cfg, cases[c].ep, cases[c].body, &r, &err);
            injected = fail_alloc_off();
            if (rc == 0)
                sim_request_done(&r);
            else if (!(rc == -ENOMEM || (rc == KVG_EPARSE && err.status == 413)))
                fail_msg("case %zu alloc %ld: rc %d (%s)", c, n, rc, err.message);
            if (!injected)
                assert_int_equal(rc, 0);
        }
        assert_false(injected);
    }

    /* The cache and the engine under failing allocations: errors, never crashes or leaks. */
    for (long n = 0; n < 8; n++) {
        sim_kvcache *kv = NULL;
        fail_alloc_nth(n);
        int rc = sim_kvcache_new(64, &kv);
        bool injected = fail_alloc_off();
        assert_int_equal(rc, injected ? -ENOMEM : 0);
        sim_kvcache_free(kv);
    }
    struct event_base *base = event_base_new();
    sim_config ecfg;
    engine_cfg(&ecfg);
    sim_engine *eng;
    assert_int_equal(sim_engine_new(base, &ecfg, &eng), 0);
    uint32_t t[40] = {0};
    for (long n = 0; n < 32; n++) {
        probe p = {0};
        sim_seq *s;
        fail_alloc_nth(n);
        int rc = sim_engine_submit(eng, t, 40, 8, "salt", 4, on_seq, &p, &s);
        bool injected = fail_alloc_off();
        if (rc == 0)
            event_base_dispatch(base);
        else
            assert_true(injected && (rc == -ENOMEM || rc == KVG_ETLS));
    }
    sim_engine_free(eng);
    event_base_free(base);
}

/* ---- metrics --------------------------------------------------------------------------------- */

static void test_metrics_text(void **state)
{
    (void)state;
    sim_config cfg;
    sim_config_defaults(&cfg);
    sim_stats st;
    memset(&st, 0, sizeof(st));
    for (int k = 0; k < SIM_HIST_COUNT; k++)
        sim_hist_init(&st.hist[k], (sim_hist_kind)k);
    st.prefix_queries = 100;
    st.prefix_hits = 48;
    st.blocks_total = 4;
    st.blocks_free = 3;
    sim_hist_observe(&st.hist[SIM_HIST_TTFT], 0.003);
    kvg_buf b;
    kvg_buf_init(&b);
    sim_metrics_render(&cfg, &st, &b);
    assert_non_null(strstr(b.data, "# TYPE vllm:prefix_cache_queries counter\n"));
    assert_non_null(strstr(
        b.data, "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"sim-model\"} 100\n"));
    assert_non_null(
        strstr(b.data, "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"sim-model\"} 48\n"));
    assert_non_null(
        strstr(b.data, "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"sim-model\"} 0.25\n"));
    assert_non_null(strstr(b.data, "vllm:time_to_first_token_seconds_bucket{engine=\"0\","
                                   "model_name=\"sim-model\",le=\"0.001\"} 0\n"));
    assert_non_null(strstr(b.data, "vllm:time_to_first_token_seconds_bucket{engine=\"0\","
                                   "model_name=\"sim-model\",le=\"0.005\"} 1\n"));
    assert_non_null(strstr(b.data, "le=\"+Inf\"} 1\n"));
    kvg_buf_done(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_pieces),
        cmocka_unit_test(test_tokenizer_output_roundtrip),
        cmocka_unit_test(test_tokenizer_limit_and_garbage),
        cmocka_unit_test(test_chat_template),
        cmocka_unit_test(test_block_hashes),
        cmocka_unit_test(test_kvcache_basic),
        cmocka_unit_test(test_kvcache_lru_order),
        cmocka_unit_test(test_kvcache_capacity_and_refs),
        cmocka_unit_test(test_kvcache_duplicates),
        cmocka_unit_test(test_engine_hits),
        cmocka_unit_test(test_engine_queue_and_cancel),
        cmocka_unit_test(test_request_ok),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_request_bad_strings),
        cmocka_unit_test(test_request_alloc_failures),
        cmocka_unit_test(test_metrics_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
