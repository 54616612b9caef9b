/* SPDX-License-Identifier: Apache-2.0 */
/* Private interfaces between the files of kvgate-simworker, the simulated vLLM engine. */
#ifndef KVG_SIMWORKER_H
#define KVG_SIMWORKER_H

/* Names here are private to the tool, so they carry the short prefix sim_ rather than the
 * kvg_<mod>_ of module headers. Files and their one job:
 *   tokenizer.c  text -> token ids (own approximation, not the gateway's code)
 *   template.c   chat messages (+ tools) -> prompt text
 *   blockhash.c  chained SHA-256 block hashes, cache_salt in the first block
 *   vllm_hash.c  vLLM's own block hash (sha256_cbor, xxhash_cbor), exactly
 *   exact.c      token-exact mode: the model's tokenizer and chat template, vLLM's block keys
 *   kvcache.c    block table, refcounts, LRU of unreferenced blocks (pure, no I/O)
 *   request.c    request JSON -> prompts and parameters, with OpenAI-style errors
 *   engine.c     waiting queue, admission, prefill/decode timers
 *   kvevents.c   the cache's events in vLLM's KV-event wire format, over ZeroMQ
 *   metrics.c    counters, histograms, Prometheus text
 *   respond.c    response and SSE chunk JSON
 *   server.c     HTTP endpoints and request lifecycle (libevent evhttp)
 *   main.c       flags, event loop, signals */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

struct event_base;
typedef struct sim_exact sim_exact;

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
    /* Token-exact mode (exact.c): the files and hash named on the command line, and what was
     * loaded from them at start-up. exact is NULL in the default (approximation) mode. */
    const char *tokenizer_path;
    const char *tokenizer_config_path; /* NULL: tokenizer_config.json beside the tokenizer */
    const char *chat_template_path;
    const char *hash_seed;
    int hash_algo; /* sim_vllm_algo */
    const sim_exact *exact;
    /* KV-cache events (kvevents.c, token-exact mode only): NULL endpoint = off. */
    const char *kv_events_endpoint;
    const char *kv_events_replay_endpoint;
    const char *kv_events_topic;
    const char *kv_events_port_file;
    uint32_t kv_events_buffer; /* batches kept for replay */
    double kv_events_drop_rate;
    uint32_t kv_events_delay_ms;
    int kv_events_format;            /* sim_kvev_format */
    uint32_t kv_events_heartbeat_ms; /* an empty batch after this long without one; 0 = never */
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

/** Called for each cached block evicted to make room, with its hash, before it is reused. */
typedef void (*sim_kvcache_evict_cb)(void *arg, const sim_hash *hash);
/** Set (or clear, with NULL) the eviction callback. */
void sim_kvcache_set_evict_cb(sim_kvcache *kv, sim_kvcache_evict_cb cb, void *arg);
/** Forget every cached hash (vLLM's reset_prefix_cache). Only when no block is referenced:
 *  0, or -EBUSY with nothing changed. Not counted as evictions. */
int sim_kvcache_reset(sim_kvcache *kv);

/* ---- KV-cache events ------------------------------------------------------------------------ */

#define SIM_KVEV_MEDIUM "GPU"
#define SIM_KVEV_BUFFER_DEFAULT 10000u /* vLLM's buffer_steps default */

/* How events are encoded: vLLM's positional arrays (msgspec array_like, vLLM before PR #42892,
 * 2026-06), or the named-field maps vLLM writes since. The batch is an array in both. */
typedef enum sim_kvev_format {
    SIM_KVEV_FORMAT_ARRAY = 0,
    SIM_KVEV_FORMAT_MAP,
    SIM_KVEV_FORMAT_COUNT,
} sim_kvev_format;

/** "array" or "map". */
const char *sim_kvev_format_str(sim_kvev_format f);
/** Parse a format name: 0 and *out, or -EINVAL. */
int sim_kvev_format_parse(const char *s, sim_kvev_format *out);

/* The msgpack encoder of one KVEventBatch (pure, no I/O): add events, then finish. */
typedef struct sim_kvev_enc sim_kvev_enc;

/** A new, empty encoder writing events in format. 0 or -ENOMEM. */
int sim_kvev_enc_new(sim_kvev_format format, sim_kvev_enc **out);
/** Free; NULL is a no-op. */
void sim_kvev_enc_free(sim_kvev_enc *e);
/** Events added since the last finish. */
uint32_t sim_kvev_enc_count(const sim_kvev_enc *e);
/** Add a BlockStored: hashes[0..n) (64-bit form), parent (NULL: None), the blocks' tokens,
 *  lora_id and lora_name None, medium "GPU", the later fields (extra_keys, group_idx,
 *  kv_cache_spec_kind, kv_cache_spec_sliding_window) None. 0 or -ENOMEM. */
int sim_kvev_enc_stored(sim_kvev_enc *e, const uint64_t *hashes, size_t n, const uint64_t *parent,
                        const uint32_t *tokens, size_t n_tokens, uint32_t block_size);
/** Add a BlockRemoved of hashes[0..n), medium "GPU", group_idx None. 0 or -ENOMEM. */
int sim_kvev_enc_removed(sim_kvev_enc *e, const uint64_t *hashes, size_t n);
/** Add an AllBlocksCleared. 0 or -ENOMEM. */
int sim_kvev_enc_cleared(sim_kvev_enc *e);
/** Append the batch [ts, [events...], dp_rank] to out and empty the encoder (also on
 *  failure). 0 or -ENOMEM. */
int sim_kvev_enc_finish(sim_kvev_enc *e, double ts, int64_t dp_rank, kvg_buf *out);

/* The publisher: events added during one turn of the event loop (one simulated engine step)
 * go out as one batch at the end of it, numbered from 0. */
typedef struct sim_kvev_pub sim_kvev_pub;

/** Bind cfg's PUB (and replay ROUTER) endpoints on base and write cfg->kv_events_port_file.
 *  cfg must outlive the publisher. 0, -EINVAL, -ENOMEM or a negative errno from ZeroMQ. */
int sim_kvev_pub_new(struct event_base *base, const sim_config *cfg, sim_kvev_pub **out);
/** Close the sockets and free; NULL is a no-op. Batches not yet sent are lost. */
void sim_kvev_pub_free(sim_kvev_pub *p);
/** The bound endpoint (tcp://HOST:PORT) of the PUB socket, or of the replay socket (NULL
 *  when there is none). */
const char *sim_kvev_pub_endpoint(const sim_kvev_pub *p, bool replay);
/** Queue a BlockStored (see sim_kvev_enc_stored) in the current batch. */
void sim_kvev_pub_stored(sim_kvev_pub *p, const uint64_t *hashes, size_t n, const uint64_t *parent,
                         const uint32_t *tokens, size_t n_tokens, uint32_t block_size);
/** Queue a BlockRemoved of one hash in the current batch. */
void sim_kvev_pub_removed(sim_kvev_pub *p, uint64_t hash);
/** Queue an AllBlocksCleared in the current batch. */
void sim_kvev_pub_cleared(sim_kvev_pub *p);
/** Stop (true) or resume (false) sending on the PUB socket, as if the network to every
 *  subscriber died: batches made meanwhile are numbered and kept in the replay buffer (which
 *  keeps answering), never sent live. Test control (POST /kv_events/pause), not vLLM's. */
void sim_kvev_pub_pause(sim_kvev_pub *p, bool paused);
/** Whether sim_kvev_pub_pause stopped it; the next sequence number it will give a batch. */
bool sim_kvev_pub_paused(const sim_kvev_pub *p, uint64_t *next_seq);

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
/** The block keys of the prompt's full blocks (the cache's keys for them): *keys and the count
 *  (prompt tokens / block_tokens). Valid while the sequence lives. */
uint32_t sim_seq_prompt_keys(const sim_seq *seq, const sim_hash **keys);
/** Publish the cache's events on pub (NULL: stop); token-exact mode only (the 64-bit event form
 *  of a key needs vLLM's hash). The engine borrows pub. */
void sim_engine_set_events(sim_engine *eng, sim_kvev_pub *pub);
/** Forget every cached block, as vLLM's POST /reset_prefix_cache: 0 and an AllBlocksCleared
 *  event, or -EBUSY (some sequence holds blocks) with nothing changed. */
int sim_engine_reset_prefix_cache(sim_engine *eng);
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
/** The KV-event publisher that POST /kv_events/pause and /kv_events/resume control (borrowed;
 *  NULL: those answer 404). */
void sim_server_set_events(sim_server *srv, sim_kvev_pub *events);
/** Abort every request in flight, close every connection, free; NULL is a no-op. */
void sim_server_free(sim_server *srv);

/* ---- vLLM's block hash (vllm_hash.c) ------------------------------------------------------- */
/* vLLM v1's prefix-cache hash for --prefix-caching-hash-algo sha256_cbor / xxhash_cbor, the
 * simulated engine's own implementation (docs/hashing.md, "vLLM's block hash"); the block keys
 * of token-exact mode (exact.c). */

#define SIM_VLLM_DIGEST_MAX 32

typedef enum sim_vllm_algo {
    SIM_VLLM_SHA256_CBOR = 0, /* SHA-256 of the canonical CBOR: 32 bytes */
    SIM_VLLM_XXHASH_CBOR,     /* XXH3-128 of the canonical CBOR, big-endian: 16 bytes */
    SIM_VLLM_ALGO_COUNT,
} sim_vllm_algo;

const char *sim_vllm_algo_str(sim_vllm_algo algo);
/** "sha256_cbor" or "xxhash_cbor" (NUL-terminated) into *out; 0 or -EINVAL. */
int sim_vllm_algo_parse(const char *name, sim_vllm_algo *out);
/** NONE_HASH = H(cbor(seed)), seed the engine's PYTHONHASHSEED string (UTF-8), into out and
 *  *out_len (32 or 16). 0, -EINVAL, -EILSEQ (not UTF-8), -ENOMEM or KVG_ETLS. */
int sim_vllm_none_hash(sim_vllm_algo algo, const char *seed, size_t seed_len,
                       uint8_t out[SIM_VLLM_DIGEST_MAX], size_t *out_len);
/** Hashes of the full blocks of tokens[0..ntokens), at most max_blocks, packed into out (room
 *  for max_blocks digests of none_len bytes): block i = H(cbor([parent, [tokens of block i],
 *  extra])), parent of block 0 = none_hash, extra = [lora (NULL: none), cache_salt (block 0
 *  only; NULL or empty: none)] or null when empty. *nblocks = the count. 0, -EINVAL, -EILSEQ,
 *  -ENOMEM or KVG_ETLS. */
int sim_vllm_block_hashes(sim_vllm_algo algo, const uint8_t *none_hash, size_t none_len,
                          const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                          const char *lora, size_t lora_len, const char *salt, size_t salt_len,
                          uint8_t *out, size_t max_blocks, size_t *nblocks);
/** The 64-bit form of a KV event: int.from_bytes(h, "big") & (2**64 - 1). */
uint64_t sim_vllm_hash_u64(const uint8_t *h, size_t len);

/* ---- token-exact mode (exact.c) ------------------------------------------------------------ */
/* With --tokenizer the worker names a request's blocks as vLLM does with
 * --prefix-caching-hash-algo sha256_cbor|xxhash_cbor and a fixed PYTHONHASHSEED: token ids from
 * the model's tokenizer.json and chat template, block keys from vllm_hash.c. */

/* Most block hashes one response lists in x-simworker-block-hashes (docs/simworker.md). */
#define SIM_BLOCK_HASH_HEADER_MAX 256

/* What tokenizer_config.json contributes: heap strings, NULL when absent. */
typedef struct sim_tokcfg {
    char *chat_template;
    char *bos_token;
    char *eos_token;
} sim_tokcfg;

/** Read a tokenizer_config.json held in [json, json+len): chat_template (a string, or a list of
 *  {"name", "template"} of which "default" is taken, as transformers does), bos_token and
 *  eos_token (a string, or an object with "content"; null: absent). On success returns 0 and
 *  fills *out (release with sim_tokcfg_done); KVG_EPARSE with err saying which field is wrong,
 *  or -ENOMEM. */
int sim_tokcfg_parse(const char *json, size_t len, sim_tokcfg *out, char *err, size_t errlen);
/** Free a sim_tokcfg's strings; it is zeroed. */
void sim_tokcfg_done(sim_tokcfg *tc);

/** Load the token-exact mode cfg names (cfg->tokenizer_path set): the tokenizer, the
 *  tokenizer config, the template (compiled), NONE_HASH from cfg->hash_seed, the ids of the
 *  generated words. 0 and *out, or a negative error with a one-line message in err naming the
 *  file at fault. */
int sim_exact_load(const sim_config *cfg, sim_exact **out, char *err, size_t errlen);
/** Free; NULL is a no-op. */
void sim_exact_free(sim_exact *ex);
/** Algorithm and digest length (32 or 16) of the block keys. */
sim_vllm_algo sim_exact_algo(const sim_exact *ex);
size_t sim_exact_digest_len(const sim_exact *ex);
/** Size of the vocabulary token-id prompts must fall in. */
uint32_t sim_exact_vocab_size(const sim_exact *ex);
/** Token ids of text as the tokenizers library's encode(text, add_special_tokens): a new heap
 *  array in *ids (free()), its length in *n. 0, KVG_EPARSE (not UTF-8) or -ENOMEM. */
int sim_exact_encode(const sim_exact *ex, const char *text, size_t len, bool add_special,
                     uint32_t **ids, size_t *n);
/** A /v1/chat/completions (or /tokenize) body as vLLM tokenizes it: kvg_template_prepare, the
 *  model's template, then encode with add_special (vLLM's add_special_tokens, false unless the
 *  body says). 0 with *ids and *n as sim_exact_encode; KVG_EPARSE when the request cannot be
 *  rendered (no chat template, media parts, the template raised): err says why; -ENOMEM. */
int sim_exact_chat(const sim_exact *ex, const kvg_json *body, bool add_special, uint32_t **ids,
                   size_t *n, char *err, size_t errlen);
/** Block keys of the full blocks of tokens[0..n): out[i] for i < n / block_tokens holds vLLM's
 *  digest of block i (its first sim_exact_digest_len bytes; the rest zero), cache_salt (may be
 *  NULL or empty: none) in block 0's extra keys, no LoRA. 0, -ENOMEM or KVG_ETLS. */
int sim_exact_block_keys(const sim_exact *ex, const uint32_t *tokens, size_t n,
                         uint32_t block_tokens, const char *salt, size_t salt_len, sim_hash *out);
/** The 64-bit KV-event form of a key made by sim_exact_block_keys. */
uint64_t sim_exact_key_u64(const sim_exact *ex, const sim_hash *key);
/** Id of the k-th generated token (k >= 1) in token-exact mode: the model's id for
 *  sim_output_piece(k). */
uint32_t sim_exact_output_token(const sim_exact *ex, uint32_t k);
/** Append x-simworker-block-hashes' value for keys[0..n) (at most SIM_BLOCK_HASH_HEADER_MAX):
 *  16 hex digits per key, comma-separated. */
void sim_exact_hash_header(const sim_exact *ex, const sim_hash *keys, size_t n, kvg_buf *out);

#endif
