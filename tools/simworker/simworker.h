/* SPDX-License-Identifier: Apache-2.0 */
/* Private interfaces between the files of kvgate-simworker, the simulated vLLM engine. */
#ifndef KVG_SIMWORKER_H
#define KVG_SIMWORKER_H

/* Names here are private to the tool, so they carry the short prefix sim_ rather than the
 * kvg_<mod>_ of module headers. Files and their one job:
 *   tokenizer.c  text -> token ids (own approximation, not the gateway's code)
 *   template.c   chat messages (+ tools) -> prompt text
 *   blockhash.c  chained SHA-256 block hashes, cache_salt in the first block
 *   kvcache.c    block table, refcounts, LRU of unreferenced blocks (pure, no I/O)
 *   request.c    request JSON -> prompts and parameters, with OpenAI-style errors
 *   engine.c     waiting queue, admission, prefill/decode timers
 *   metrics.c    counters, histograms, Prometheus text
 *   respond.c    response and SSE chunk JSON
 *   server.c     HTTP endpoints and request lifecycle (libevent evhttp)
 *   main.c       flags, event loop, signals */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

struct event_base;

/* ---- configuration ------------------------------------------------------------------------ */

#define SIM_MAX_MODELS 8
#define SIM_MAX_BATCH 64             /* prompts in one /v1/completions or /v1/embeddings call */
#define SIM_MAX_KV_BLOCKS (1u << 24) /* 16M blocks: ~1 GiB of block table */
#define SIM_MAX_BLOCK_TOKENS 1024
#define SIM_MAX_MODEL_LEN_DEFAULT 32768
#define SIM_MAX_EMBED_DIMS 4096

typedef struct sim_config {
    const char *listen_host; /* owned by main */
    uint16_t listen_port;
    const char *name;
    const char *models[SIM_MAX_MODELS]; /* served names; the first is the default */
    size_t n_models;
    uint32_t kv_blocks;
    uint32_t block_tokens;
    uint32_t max_model_len;
    uint32_t max_running;
    uint32_t max_waiting;
    uint32_t default_max_tokens;
    double prefill_us_per_token;
    double decode_us_per_token;
    double time_scale;
    double error_rate;
    double close_mid_stream_rate;
    uint32_t slow_headers_ms;
    uint32_t keep_alive_s;
    uint64_t max_body_bytes;
    uint64_t seed;
    const char *port_file;
} sim_config;

/** Fill cfg with the documented defaults (docs/simworker.md). */
void sim_config_defaults(sim_config *cfg);

/* ---- random numbers ----------------------------------------------------------------------- */

/** SplitMix64: the n-th value of the stream named by (seed, stream). Deterministic. */
uint64_t sim_rand(uint64_t seed, uint64_t stream, uint64_t n);
/** Same, as a double in [0, 1). */
double sim_rand_unit(uint64_t seed, uint64_t stream, uint64_t n);

/* ---- tokens ------------------------------------------------------------------------------- */

#define SIM_VOCAB_SIZE 151936u
#define SIM_TOKEN_ENDOFTEXT 151643u
#define SIM_TOKEN_IM_START 151644u
#define SIM_TOKEN_IM_END 151645u
#define SIM_TOKEN_ORDINARY 151643u /* ordinary pieces hash into [0, this) */

/* A growable token vector with a cap: past `limit` tokens are counted but not stored, so a
 * caller learns the true length of an oversized prompt without holding it. */
typedef struct sim_tokens {
    uint32_t *v;
    size_t n; /* tokens seen; v holds min(n, limit) */
    size_t cap;
    size_t limit; /* 0 = unlimited */
} sim_tokens;

/** Empty vector storing at most limit ids (0 = unlimited); allocates nothing yet. */
void sim_tokens_init(sim_tokens *t, size_t limit);
/** Free the ids; the vector is empty again (same limit). */
void sim_tokens_done(sim_tokens *t);
/** Append one token id; 0 or -ENOMEM. Past the limit only the count grows. */
int sim_tokens_push(sim_tokens *t, uint32_t id);
/** True when more tokens were seen than stored. */
bool sim_tokens_truncated(const sim_tokens *t);

/** Append the tokens of text[0..len) to out. Pieces: the special tokens <|im_start|>,
 *  <|im_end|>, <|endoftext|>; runs of word bytes (ASCII alphanumerics, '_', UTF-8) cut into
 *  pieces of at most 4 bytes, the first one taking a single preceding space; runs of
 *  whitespace and of other bytes cut into pieces of at most 4 bytes. A piece's id is a 32-bit
 *  FNV-1a hash reduced to the ordinary vocabulary. Any bytes are accepted. 0 or -ENOMEM. */
int sim_tokenize(const char *text, size_t len, sim_tokens *out);
/** Token id of one piece of text (no splitting). */
uint32_t sim_piece_id(const char *piece, size_t len);
/** Text of the k-th generated token (k >= 1): a space and a short word, which the tokenizer
 *  reads back as exactly this one token, so prompt + output re-tokenizes to the same ids. */
const char *sim_output_piece(uint32_t k);
/** Id of the k-th generated token. */
uint32_t sim_output_token(uint32_t k);

/* ---- chat template ------------------------------------------------------------------------ */

/** Render validated chat messages (and optional tools) ChatML-style into out:
 *  tools as a system block first, then "<|im_start|>{role}\n{content}<|im_end|>\n" per
 *  message, then "<|im_start|>assistant\n" when add_generation_prompt. Messages must have
 *  been validated by request.c. Returns 0 or -ENOMEM. */
int sim_chat_render(const kvg_json *messages, const kvg_json *tools, bool add_generation_prompt,
                    kvg_buf *out);

/* ---- block hashes ------------------------------------------------------------------------- */

typedef struct sim_hash {
    uint8_t b[32];
} sim_hash;

/** Hashes of the full blocks of tokens[0..n): out[i] for i < n / block_tokens.
 *  out[0] = SHA-256(le32(salt_len) || salt || le32(tokens of block 0)),
 *  out[i] = SHA-256(out[i-1] || le32(tokens of block i)). salt may be NULL (length 0).
 *  Returns 0, -ENOMEM or KVG_ETLS (OpenSSL failure). */
int sim_block_hashes(const uint32_t *tokens, size_t n, uint32_t block_tokens, const void *salt,
                     size_t salt_len, sim_hash *out);

/* ---- KV block cache ----------------------------------------------------------------------- */

typedef struct sim_kvcache sim_kvcache;

/** A cache of num_blocks blocks, all free and uncached. 0, -EINVAL or -ENOMEM. */
int sim_kvcache_new(uint32_t num_blocks, sim_kvcache **out);
/** Free the cache; NULL is a no-op. Blocks still referenced are simply dropped. */
void sim_kvcache_free(sim_kvcache *kv);
/** Capacity in blocks. */
uint32_t sim_kvcache_num_blocks(const sim_kvcache *kv);
/** Blocks with no reference (on the LRU list), cached or not. */
uint32_t sim_kvcache_num_free(const sim_kvcache *kv);
/** Blocks that carry a hash and can be found (referenced or not). */
uint32_t sim_kvcache_num_cached(const sim_kvcache *kv);
/** Cached blocks evicted so far to make room. */
uint64_t sim_kvcache_evictions(const sim_kvcache *kv);
/** References held on a block (for tests). */
uint32_t sim_kvcache_block_refs(const sim_kvcache *kv, uint32_t id);
/** Number of leading hashes[0..n) found in the cache. Does not change LRU order. */
uint32_t sim_kvcache_match(const sim_kvcache *kv, const sim_hash *hashes, uint32_t n);
/** Take the blocks for a request: the cached blocks of hashes[0..hit) (hit must not exceed
 *  sim_kvcache_match) gain a reference and leave the LRU list; total - hit fresh blocks are
 *  taken from the LRU head, evicting their hashes. Writes the block ids to ids[0..total).
 *  Returns 0, or KVG_ELIMIT with nothing changed when the blocks do not fit now, or -EINVAL
 *  when hit > total or a hit block is not cached. */
int sim_kvcache_acquire(sim_kvcache *kv, const sim_hash *hashes, uint32_t hit, uint32_t total,
                        uint32_t *ids);
/** Make blocks ids[from..to) findable under hashes[from..to) (blocks that are already cached
 *  keep their hash). Several blocks may carry the same hash. */
void sim_kvcache_commit(sim_kvcache *kv, const uint32_t *ids, const sim_hash *hashes, uint32_t from,
                        uint32_t to);
/** Drop one reference from each of ids[0..n). Blocks left unreferenced join the LRU tail,
 *  last block first, so a request's tail blocks are evicted before its head (as vLLM does);
 *  cached ones stay findable until evicted. */
void sim_kvcache_release(sim_kvcache *kv, const uint32_t *ids, uint32_t n);

/* ---- metrics ------------------------------------------------------------------------------ */

#define SIM_HIST_MAX_BUCKETS 24

typedef struct sim_hist {
    const double *bounds; /* upper bounds in seconds, ascending; +Inf implicit */
    size_t n_bounds;
    uint64_t counts[SIM_HIST_MAX_BUCKETS + 1]; /* per bucket, last one above every bound */
    double sum;
    uint64_t count;
} sim_hist;

typedef enum sim_hist_kind {
    SIM_HIST_TTFT = 0,
    SIM_HIST_E2E,
    SIM_HIST_QUEUE,
    SIM_HIST_COUNT,
} sim_hist_kind;

/** Empty histogram with vLLM's bucket bounds for kind. */
void sim_hist_init(sim_hist *h, sim_hist_kind kind);
/** Count one observation (seconds). */
void sim_hist_observe(sim_hist *h, double seconds);

/* Everything /metrics reports. Written by the engine only. */
typedef struct sim_stats {
    uint32_t running;
    uint32_t waiting;
    uint32_t blocks_total;
    uint32_t blocks_free;
    uint32_t blocks_cached;
    uint64_t evicted_blocks;
    uint64_t prefix_queries; /* tokens, like vLLM v1 */
    uint64_t prefix_hits;    /* tokens */
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    uint64_t finished_length;
    uint64_t finished_stop; /* prefill-only (embedding) requests */
    uint64_t finished_abort;
    uint64_t http_errors_injected;
    uint64_t streams_cut;
    sim_hist hist[SIM_HIST_COUNT];
} sim_stats;

/** Append the Prometheus text exposition of stats to out. */
void sim_metrics_render(const sim_config *cfg, const sim_stats *stats, kvg_buf *out);

/* ---- engine ------------------------------------------------------------------------------- */

typedef struct sim_engine sim_engine;
typedef struct sim_seq sim_seq;

/* Progress of one sequence, called from the engine's timers only (never from inside an
 * engine call). generated is the number of tokens produced so far (the first token comes
 * with the end of prefill, as in vLLM); finished is true on the last call, after which the
 * sequence is freed by the engine. The callback may call sim_engine_cancel on this
 * sequence; it takes effect when the callback returns. */
typedef void (*sim_seq_cb)(void *arg, sim_seq *seq, uint32_t generated, bool finished);

/** Create the engine on base. cfg must outlive it. 0, -ENOMEM or -EINVAL. */
int sim_engine_new(struct event_base *base, const sim_config *cfg, sim_engine **out);
/** Cancel every sequence (no callbacks) and free the engine; NULL is a no-op. Free the
 *  server first: its requests are the sequences' callback arguments. */
void sim_engine_free(sim_engine *eng);
/** Queue a sequence: prompt tokens[0..n) (copied), then up to max_tokens generated tokens
 *  (0: prefill only, as for embeddings). salt (may be NULL) goes into the first block hash.
 *  n + max_tokens must not exceed max_model_len. Returns 0 and *out, -EINVAL, -ENOMEM,
 *  KVG_ELIMIT (waiting queue full) or KVG_ETLS. */
int sim_engine_submit(sim_engine *eng, const uint32_t *tokens, size_t n, uint32_t max_tokens,
                      const void *salt, size_t salt_len, sim_seq_cb cb, void *arg, sim_seq **out);
/** Drop a sequence: it leaves the queue, its blocks are released (the computed full blocks
 *  stay cached) and no callback follows. */
void sim_engine_cancel(sim_engine *eng, sim_seq *seq);
/** Prompt tokens that were found in the prefix cache (valid once prefill has started). */
uint32_t sim_seq_cached_tokens(const sim_seq *seq);
/** Prompt length in tokens. */
uint32_t sim_seq_prompt_tokens(const sim_seq *seq);
/** Free waiting slots (max_waiting - waiting). */
uint32_t sim_engine_waiting_room(const sim_engine *eng);
/** Current counters; valid until the next engine call. */
const sim_stats *sim_engine_stats(sim_engine *eng);
/** Count an injected fault in the stats (server-side events shown on /metrics). */
void sim_engine_count_fault(sim_engine *eng, bool cut_stream);

/* ---- request parsing ---------------------------------------------------------------------- */

typedef enum sim_endpoint {
    SIM_EP_COMPLETIONS = 0,
    SIM_EP_CHAT,
    SIM_EP_EMBEDDINGS,
    SIM_EP_TOKENIZE,
    SIM_EP_COUNT,
} sim_endpoint;

/** Name of an endpoint for logs; never NULL. */
const char *sim_endpoint_str(sim_endpoint ep);

typedef struct sim_prompt {
    uint32_t *tokens; /* heap */
    size_t n;
} sim_prompt;

typedef struct sim_request {
    sim_endpoint ep;
    const char *model; /* the served name to echo (points into the config) */
    uint32_t max_tokens;
    bool stream;
    bool include_usage;
    char *cache_salt; /* heap, NULL when absent */
    size_t cache_salt_len;
    sim_prompt *prompts; /* heap array */
    size_t n_prompts;
    uint32_t dimensions; /* embeddings */
    bool base64;         /* embeddings encoding_format */
} sim_request;

typedef struct sim_error {
    int status;       /* HTTP status */
    const char *type; /* "BadRequestError", ... */
    char param[64];   /* offending field, "" for none */
    char message[320];
} sim_error;

/** Parse and validate a request body for ep. On success returns 0 and fills *out (release
 *  with sim_request_done); on a client error returns KVG_EPARSE and fills *err (400, 404 or
 *  413); -ENOMEM on allocation failure. */
int sim_request_parse(const sim_config *cfg, sim_endpoint ep, const char *body, size_t len,
                      sim_request *out, sim_error *err);
/** Free what sim_request_parse allocated; the request is zeroed. */
void sim_request_done(sim_request *req);

/* ---- responses ---------------------------------------------------------------------------- */

/* What a response needs to know about one finished (or running) sequence. */
typedef struct sim_choice {
    uint32_t prompt_tokens;
    uint32_t cached_tokens;
    uint32_t generated;
} sim_choice;

/** {"error":{"message":...,"type":...,"param":...,"code":status}} */
void sim_respond_error(kvg_buf *out, const sim_error *err);
/** Full non-streaming body for a completion or chat request. */
void sim_respond_completion(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                            const sim_choice *choices, size_t n);
/** One SSE event "data: {...}\n\n" for choice index: the role delta (chat, before the first
 *  token) when token == 0, else the token-th generated token, finish_reason set when last. */
void sim_respond_chunk(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                       size_t index, uint32_t token, bool last);
/** The usage SSE event sent before [DONE] when stream_options.include_usage. */
void sim_respond_usage_chunk(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                             const sim_choice *choices, size_t n);
/** Full body for /v1/embeddings. */
void sim_respond_embeddings(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                            const sim_choice *choices, size_t n);
/** Body for /tokenize (first prompt only). */
void sim_respond_tokenize(kvg_buf *out, const sim_config *cfg, const sim_request *req);
/** Body for /v1/models. */
void sim_respond_models(kvg_buf *out, const sim_config *cfg, uint64_t created);
/** Text of generated tokens 1..n, concatenated. */
void sim_output_text(kvg_buf *out, uint32_t n);

/* ---- server ------------------------------------------------------------------------------- */

typedef struct sim_server sim_server;

/** Bind cfg's address on base, serve, and write the port file if configured. cfg and eng
 *  must outlive the server. 0 or a negative error (bind, port file). */
int sim_server_new(struct event_base *base, const sim_config *cfg, sim_engine *eng,
                   sim_server **out);
/** The bound port (useful with port 0). */
uint16_t sim_server_port(const sim_server *srv);
/** Abort every request in flight, close every connection, free; NULL is a no-op. */
void sim_server_free(sim_server *srv);

#endif
