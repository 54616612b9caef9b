/* SPDX-License-Identifier: Apache-2.0 */
/* The simulated engine's scheduler: FIFO waiting queue, admission under max_running and KV
 * capacity, prefix-cache lookups, and libevent timers standing in for prefill and decode. */
#include "simworker.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/event_struct.h>

typedef enum seq_state {
    SEQ_WAITING = 0,
    SEQ_PREFILL,
    SEQ_DECODE,
    SEQ_STATE_COUNT,
} seq_state;

static const char *seq_state_str(seq_state s)
{
    static const char *const names[SEQ_STATE_COUNT] = {"waiting", "prefill", "decode"};
    return s < SEQ_STATE_COUNT ? names[s] : "?";
}

struct sim_seq {
    sim_engine *eng;
    sim_seq *prev, *next; /* in the waiting or the running list */
    seq_state state;
    struct event timer; /* end of prefill, then one per decoded token */
    uint32_t *tokens;   /* prompt, then the ids of every token we will generate */
    uint32_t n_prompt;
    uint32_t max_tokens;
    uint32_t generated;
    sim_hash *hashes; /* full blocks of prompt + output */
    uint32_t n_hashes;
    uint32_t *blocks; /* held while running */
    uint32_t n_blocks;
    uint32_t hit_blocks;
    uint32_t committed; /* leading blocks already made findable */
    uint64_t submit_ns;
    uint64_t admit_ns;
    sim_seq_cb cb;
    void *arg;
    bool in_callback;
    bool cancel_requested;
};

typedef struct seq_list {
    sim_seq *head, *tail;
    uint32_t n;
} seq_list;

struct sim_engine {
    struct event_base *base;
    const sim_config *cfg;
    sim_kvcache *kv;
    seq_list waiting;
    seq_list running;
    const struct timeval *decode_tv; /* a common timeout when non-zero: O(1) re-arming */
    struct timeval decode_plain;
    bool closing;
    sim_kvev_pub *events; /* borrowed; NULL = no events */
    sim_stats stats;
};

static void list_append(seq_list *l, sim_seq *s)
{
    s->prev = l->tail;
    s->next = NULL;
    if (l->tail)
        l->tail->next = s;
    else
        l->head = s;
    l->tail = s;
    l->n++;
}

static void list_remove(seq_list *l, sim_seq *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        l->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        l->tail = s->prev;
    s->prev = s->next = NULL;
    l->n--;
}

/* Simulated durations: scaled, then clamped to an hour so absurd flags cannot overflow. */
static struct timeval duration(double us)
{
    if (!(us > 0.0))
        us = 0.0;
    if (us > 3600e6)
        us = 3600e6;
    uint64_t v = (uint64_t)llround(us);
    struct timeval tv = {.tv_sec = (time_t)(v / 1000000u), .tv_usec = (suseconds_t)(v % 1000000u)};
    return tv;
}

static double since_s(uint64_t start_ns)
{
    return (double)(kvg_now_ns() - start_ns) / 1e9;
}

static void seq_free(sim_seq *s)
{
    if (!s)
        return;
    event_del(&s->timer);
    free(s->blocks);
    free(s->hashes);
    free(s->tokens);
    free(s);
}

static void refresh_stats(sim_engine *eng)
{
    eng->stats.waiting = eng->waiting.n;
    eng->stats.running = eng->running.n;
    eng->stats.blocks_total = sim_kvcache_num_blocks(eng->kv);
    eng->stats.blocks_free = sim_kvcache_num_free(eng->kv);
    eng->stats.blocks_cached = sim_kvcache_num_cached(eng->kv);
    eng->stats.evicted_blocks = sim_kvcache_evictions(eng->kv);
}

/* Admit from the head of the queue while a slot and the blocks are there. Like vLLM's FCFS
 * scheduler, a head that does not fit blocks the ones behind it. Only arms timers: no
 * callback runs from here. */
static void admit(sim_engine *eng)
{
    const sim_config *cfg = eng->cfg;
    while (!eng->closing && eng->waiting.head && eng->running.n < cfg->max_running) {
        sim_seq *s = eng->waiting.head;
        /* The last prompt token is always recomputed to get logits, and hits are whole
         * blocks: at most (prompt - 1) / block_tokens blocks can hit. */
        uint32_t max_hit = (s->n_prompt - 1) / cfg->block_tokens;
        uint32_t hit = sim_kvcache_match(eng->kv, s->hashes, KVG_MIN(max_hit, s->n_hashes));
        int rc = sim_kvcache_acquire(eng->kv, s->hashes, hit, s->n_blocks, s->blocks);
        if (rc == KVG_ELIMIT)
            break;
        if (rc < 0) {
            kvg_log_error("simworker: block acquisition failed: %s", kvg_strerror(rc));
            break;
        }
        list_remove(&eng->waiting, s);
        list_append(&eng->running, s);
        s->state = SEQ_PREFILL;
        s->hit_blocks = hit;
        s->committed = hit;
        s->admit_ns = kvg_now_ns();
        uint32_t cached = hit * cfg->block_tokens;
        eng->stats.prefix_queries += s->n_prompt;
        eng->stats.prefix_hits += cached;
        eng->stats.prompt_tokens += s->n_prompt;
        sim_hist_observe(&eng->stats.hist[SIM_HIST_QUEUE], since_s(s->submit_ns));
        struct timeval tv =
            duration((double)(s->n_prompt - cached) * cfg->prefill_us_per_token * cfg->time_scale);
        event_add(&s->timer, &tv);
        kvg_log_debug("simworker: admit seq %p prompt=%u cached=%u blocks=%u free=%u", (void *)s,
                      s->n_prompt, cached, s->n_blocks, sim_kvcache_num_free(eng->kv));
    }
    refresh_stats(eng);
}

/* vLLM's BlockPool.cache_full_blocks: one BlockStored for the blocks a step makes full, its
 * parent the hash of the block before them (None for a sequence's first block). */
static void publish_stored(sim_engine *eng, const sim_seq *s, uint32_t from, uint32_t to)
{
    const sim_exact *ex = eng->cfg->exact;
    uint32_t bt = eng->cfg->block_tokens;
    uint64_t stack[64];
    uint64_t *h = to - from <= KVG_ARRAY_LEN(stack) ? stack : malloc((to - from) * sizeof(*h));
    if (!h) {
        kvg_log_error("simworker: kv events: out of memory; BlockStored lost");
        return;
    }
    for (uint32_t i = from; i < to; i++)
        h[i - from] = sim_exact_key_u64(ex, &s->hashes[i]);
    uint64_t parent = from ? sim_exact_key_u64(ex, &s->hashes[from - 1]) : 0;
    sim_kvev_pub_stored(eng->events, h, to - from, from ? &parent : NULL,
                        s->tokens + (size_t)from * bt, (size_t)(to - from) * bt, bt);
    if (h != stack)
        free(h);
}

/* Blocks whose KV has been computed become findable. A sequence has computed its prompt
 * after prefill and every generated token but the last (which is never fed back). */
static void commit_computed(sim_engine *eng, sim_seq *s)
{
    uint32_t computed = 0;
    if (s->state == SEQ_DECODE || (s->state == SEQ_PREFILL && s->generated > 0))
        computed = s->n_prompt + (s->generated ? s->generated - 1 : 0);
    uint32_t full = KVG_MIN(computed / eng->cfg->block_tokens, s->n_hashes);
    if (full > s->committed) {
        if (eng->events)
            publish_stored(eng, s, s->committed, full);
        sim_kvcache_commit(eng->kv, s->blocks, s->hashes, s->committed, full);
        s->committed = full;
    }
}

/* Leave the running set: publish computed blocks, release every block, admit the next. */
static void retire(sim_engine *eng, sim_seq *s)
{
    commit_computed(eng, s);
    sim_kvcache_release(eng->kv, s->blocks, s->n_blocks);
    list_remove(&eng->running, s);
    admit(eng);
}

static void cancel_now(sim_engine *eng, sim_seq *s)
{
    event_del(&s->timer);
    eng->stats.finished_abort++; /* vLLM counts aborts whether queued or running */
    if (s->state == SEQ_WAITING) {
        list_remove(&eng->waiting, s);
        admit(eng); /* it may have been the head blocking the others */
    } else {
        retire(eng, s);
    }
    kvg_log_debug("simworker: cancel seq %p in %s after %u tokens", (void *)s,
                  seq_state_str(s->state), s->generated);
    seq_free(s);
}

static void notify(sim_seq *s, bool finished)
{
    s->in_callback = true;
    s->cb(s->arg, s, s->generated, finished);
    s->in_callback = false;
}

static void finish(sim_engine *eng, sim_seq *s)
{
    if (s->max_tokens)
        eng->stats.finished_length++;
    else
        eng->stats.finished_stop++;
    sim_hist_observe(&eng->stats.hist[SIM_HIST_E2E], since_s(s->submit_ns));
    retire(eng, s);
    notify(s, true);
    seq_free(s);
}

/* One token out: the first at the end of prefill, then one per decode interval. */
static void produce(sim_engine *eng, sim_seq *s)
{
    s->generated++;
    eng->stats.generation_tokens++;
    if (s->generated == 1)
        sim_hist_observe(&eng->stats.hist[SIM_HIST_TTFT], since_s(s->submit_ns));
    if (s->generated >= s->max_tokens) {
        finish(eng, s);
        return;
    }
    notify(s, false);
    if (s->cancel_requested) {
        cancel_now(eng, s);
        return;
    }
    event_add(&s->timer, eng->decode_tv);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    sim_seq *s = arg;
    sim_engine *eng = s->eng;
    (void)fd;
    (void)what;
    if (s->state == SEQ_PREFILL) {
        s->state = SEQ_DECODE;
        commit_computed(eng, s); /* the whole prompt is computed now */
        if (s->max_tokens == 0) {
            finish(eng, s);
            return;
        }
        produce(eng, s);
    } else if (s->state == SEQ_DECODE) {
        produce(eng, s);
    }
}

int sim_engine_new(struct event_base *base, const sim_config *cfg, sim_engine **out)
{
    if (!cfg->block_tokens || !cfg->max_running || !cfg->max_model_len ||
        (uint64_t)cfg->max_model_len > (uint64_t)cfg->kv_blocks * cfg->block_tokens)
        return -EINVAL;
    sim_engine *eng = calloc(1, sizeof(*eng));
    if (!eng)
        return -ENOMEM;
    int rc = sim_kvcache_new(cfg->kv_blocks, &eng->kv);
    if (rc < 0)
        goto fail_eng;
    eng->base = base;
    eng->cfg = cfg;
    eng->decode_plain = duration(cfg->decode_us_per_token * cfg->time_scale);
    eng->decode_tv = &eng->decode_plain;
    if (eng->decode_plain.tv_sec || eng->decode_plain.tv_usec) {
        /* Every decode step has the same length: a common timeout queue keeps hundreds of
         * streams from churning the timer heap. */
        const struct timeval *common = event_base_init_common_timeout(base, &eng->decode_plain);
        if (common)
            eng->decode_tv = common;
    }
    for (int k = 0; k < SIM_HIST_COUNT; k++)
        sim_hist_init(&eng->stats.hist[k], (sim_hist_kind)k);
    refresh_stats(eng);
    *out = eng;
    return 0;

fail_eng:
    free(eng);
    return rc;
}

void sim_engine_free(sim_engine *eng)
{
    if (!eng)
        return;
    eng->closing = true;
    sim_seq *s;
    while ((s = eng->running.head)) {
        list_remove(&eng->running, s);
        seq_free(s);
    }
    while ((s = eng->waiting.head)) {
        list_remove(&eng->waiting, s);
        seq_free(s);
    }
    sim_kvcache_free(eng->kv);
    free(eng);
}

int sim_engine_submit(sim_engine *eng, const uint32_t *tokens, size_t n, uint32_t max_tokens,
                      const void *salt, size_t salt_len, sim_seq_cb cb, void *arg, sim_seq **out)
{
    const sim_config *cfg = eng->cfg;
    if (n == 0 || !cb || n > cfg->max_model_len || max_tokens > cfg->max_model_len - n)
        return -EINVAL;
    if (eng->waiting.n >= cfg->max_waiting)
        return KVG_ELIMIT;
    int rc = -ENOMEM;
    sim_seq *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    uint32_t total = (uint32_t)n + max_tokens;
    s->eng = eng;
    s->n_prompt = (uint32_t)n;
    s->max_tokens = max_tokens;
    s->n_hashes = total / cfg->block_tokens;
    s->n_blocks = (total + cfg->block_tokens - 1) / cfg->block_tokens;
    s->tokens = malloc((size_t)total * sizeof(*s->tokens));
    s->hashes = malloc((size_t)KVG_MAX(s->n_hashes, 1u) * sizeof(*s->hashes));
    s->blocks = malloc((size_t)s->n_blocks * sizeof(*s->blocks));
    if (!s->tokens || !s->hashes || !s->blocks)
        goto fail_seq;
    memcpy(s->tokens, tokens, n * sizeof(*tokens));
    /* Output is deterministic, so its block hashes are known up front; they are published
     * only as the tokens are computed. */
    for (uint32_t k = 1; k <= max_tokens; k++)
        s->tokens[n + k - 1] =
            cfg->exact ? sim_exact_output_token(cfg->exact, k) : sim_output_token(k);
    if (cfg->exact)
        rc = sim_exact_block_keys(cfg->exact, s->tokens, total, cfg->block_tokens, salt, salt_len,
                                  s->hashes);
    else
        rc = sim_block_hashes(s->tokens, total, cfg->block_tokens, salt, salt_len, s->hashes);
    if (rc < 0)
        goto fail_seq;
    event_assign(&s->timer, eng->base, -1, 0, on_timer, s);
    s->cb = cb;
    s->arg = arg;
    s->state = SEQ_WAITING;
    s->submit_ns = kvg_now_ns();
    list_append(&eng->waiting, s);
    admit(eng);
    *out = s;
    return 0;

fail_seq:
    free(s->blocks);
    free(s->hashes);
    free(s->tokens);
    free(s);
    return rc;
}

void sim_engine_cancel(sim_engine *eng, sim_seq *seq)
{
    if (!seq)
        return;
    if (seq->in_callback) {
        seq->cancel_requested = true; /* produce() acts on it when the callback returns */
        return;
    }
    cancel_now(eng, seq);
}

uint32_t sim_seq_cached_tokens(const sim_seq *seq)
{
    return seq->hit_blocks * seq->eng->cfg->block_tokens;
}

uint32_t sim_seq_prompt_tokens(const sim_seq *seq)
{
    return seq->n_prompt;
}

uint32_t sim_seq_prompt_keys(const sim_seq *seq, const sim_hash **keys)
{
    *keys = seq->hashes;
    return KVG_MIN(seq->n_prompt / seq->eng->cfg->block_tokens, seq->n_hashes);
}

/* vLLM's BlockPool._maybe_evict_cached_block: one BlockRemoved per evicted block. */
static void on_evict(void *arg, const sim_hash *hash)
{
    sim_engine *eng = arg;
    sim_kvev_pub_removed(eng->events, sim_exact_key_u64(eng->cfg->exact, hash));
}

void sim_engine_set_events(sim_engine *eng, sim_kvev_pub *pub)
{
    eng->events = eng->cfg->exact ? pub : NULL;
    sim_kvcache_set_evict_cb(eng->kv, eng->events ? on_evict : NULL, eng);
}

int sim_engine_reset_prefix_cache(sim_engine *eng)
{
    int rc = sim_kvcache_reset(eng->kv);
    if (rc == 0 && eng->events)
        sim_kvev_pub_cleared(eng->events);
    refresh_stats(eng);
    return rc;
}

uint32_t sim_engine_waiting_room(const sim_engine *eng)
{
    return eng->waiting.n >= eng->cfg->max_waiting ? 0 : eng->cfg->max_waiting - eng->waiting.n;
}

const sim_stats *sim_engine_stats(sim_engine *eng)
{
    refresh_stats(eng);
    return &eng->stats;
}

void sim_engine_count_fault(sim_engine *eng, bool cut_stream)
{
    if (cut_stream)
        eng->stats.streams_cut++;
    else
        eng->stats.http_errors_injected++;
}
