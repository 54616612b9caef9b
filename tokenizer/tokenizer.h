/* SPDX-License-Identifier: Apache-2.0 */
/* A model's own tokenizer, loaded from its Hugging Face tokenizer.json: the token ids the Rust
 * `tokenizers` library (0.22) gives, for the byte-level BPE files of Qwen2/2.5/3 and Llama
 * 3/3.1 (docs/tokenizer.md). */
#ifndef KVG_TOKENIZER_H
#define KVG_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A loaded tokenizer: immutable after load, so any number of threads may encode with it at
 * once (each with its own kvg_tokens). */
typedef struct kvg_tokenizer kvg_tokenizer;

/* Largest tokenizer.json kvg_tokenizer_load_file reads (real files are 7-12 MB). */
#define KVG_TOKENIZER_FILE_MAX (256u << 20)

/* Token ids out of an encode, and the encoder's scratch memory: one per thread (or per request),
 * reused from call to call so that an encode allocates nothing once it has grown. */
typedef struct kvg_tokens_scratch kvg_tokens_scratch;
typedef struct kvg_tokens {
    uint32_t *ids;
    size_t len;
    size_t cap;
    kvg_tokens_scratch *scratch; /* private */
} kvg_tokens;

/** Initialise an empty kvg_tokens (allocates nothing yet). */
void kvg_tokens_init(kvg_tokens *t);
/** Free the ids and the scratch; t can be initialised again. */
void kvg_tokens_done(kvg_tokens *t);
/** Forget the ids (len = 0) and keep the memory. */
void kvg_tokens_reset(kvg_tokens *t);

/** Load a tokenizer.json held in memory ([json, json+len)). Returns 0 and *out (free with
 *  kvg_tokenizer_free), or: KVG_EPARSE (not JSON, or a part of the file malformed),
 *  KVG_ECONFIG (a part kvgate does not support, e.g. `model.type "WordPiece" is not supported
 *  (BPE only)`), KVG_ELIMIT (a count past kvgate's bounds), -ENOMEM. err (errlen bytes; may
 *  be NULL) receives a one-line message naming the part and the value, prefixed
 *  "tokenizer.json: ". */
int kvg_tokenizer_load(const char *json, size_t len, kvg_tokenizer **out, char *err, size_t errlen);
/** kvg_tokenizer_load on the file at path (at most KVG_TOKENIZER_FILE_MAX bytes); -errno when it
 *  cannot be read, with err naming the path. */
int kvg_tokenizer_load_file(const char *path, kvg_tokenizer **out, char *err, size_t errlen);
/** Free a tokenizer; NULL is a no-op. No encode may be running with it. */
void kvg_tokenizer_free(kvg_tokenizer *tok);

/** Append the token ids of [text, text+len) to out->ids, as the tokenizers library's
 *  `encode(text, add_special_tokens)` gives them: added tokens split out first (longest match),
 *  the normalizer, the pre-tokenizer's split, byte-level BPE, and with add_special_tokens the
 *  post-processor's template (Llama 3.1: <|begin_of_text|> first; Qwen: nothing). Returns 0,
 *  KVG_EPARSE when text is not valid UTF-8 (out unchanged), or -ENOMEM (out->len as before the
 *  call). Thread-safe for distinct outs. */
int kvg_tokenizer_encode(const kvg_tokenizer *tok, const char *text, size_t len,
                         bool add_special_tokens, kvg_tokens *out);

/* A cache of the token ids of long text pieces (the runs between added tokens, at least
 * KVG_TOKENIZER_CACHE_MIN bytes): a chat template puts every message between special tokens, so
 * the next turn of a conversation, or another question on the same document, encodes only what
 * is new. Thread-safe (64 locked shards), bounded in bytes (LRU per shard). One cache serves
 * one tokenizer. */
typedef struct kvg_tokenizer_cache kvg_tokenizer_cache;
#define KVG_TOKENIZER_CACHE_MIN 64

/** A cache keeping at most about max_bytes of ids. 0 and *out, -ENOMEM, or the random seed's
 *  error. */
int kvg_tokenizer_cache_new(size_t max_bytes, kvg_tokenizer_cache **out);
/** NULL is a no-op. No encode may be using it. */
void kvg_tokenizer_cache_free(kvg_tokenizer_cache *c);
/** Lookups that found their piece, lookups that did not, bytes kept. c may be NULL (zeros). */
void kvg_tokenizer_cache_stats(const kvg_tokenizer_cache *c, uint64_t *hits, uint64_t *misses,
                               size_t *bytes);
/** kvg_tokenizer_encode, the same ids, with long pieces' ids taken from cache when an earlier
 *  call of the same scope ([scope, scope+scope_len): pieces are never shared between scopes, so
 *  that timing reveals nothing across them) kept them, and kept for later calls otherwise.
 *  cache NULL: exactly kvg_tokenizer_encode. */
int kvg_tokenizer_encode_cached(const kvg_tokenizer *tok, const char *text, size_t len,
                                bool add_special_tokens, kvg_tokenizer_cache *cache,
                                const void *scope, size_t scope_len, kvg_tokens *out);

/** The id of the token whose text is [s, s+len), as the library's `token_to_id`: an added
 *  token's content (e.g. "<|im_start|>"), or a vocabulary entry in its byte-level form (e.g.
 *  "Ġthe"). 0 and *id, or KVG_ENOTFOUND. */
int kvg_tokenizer_token_id(const kvg_tokenizer *tok, const char *s, size_t len, uint32_t *id);
/** One more than the largest id of the vocabulary, the added tokens and the template: the size of
 * the model's embedding table as far as the tokenizer knows. */
uint32_t kvg_tokenizer_vocab_size(const kvg_tokenizer *tok);
/** The id the post-processor puts first when special tokens are added (Llama 3.1's
 *  <|begin_of_text|>): 0 and *id, or KVG_ENOTFOUND (Qwen, whose files add none). */
int kvg_tokenizer_bos_id(const kvg_tokenizer *tok, uint32_t *id);
/** The id the post-processor puts last when special tokens are added: 0 and *id, or
 *  KVG_ENOTFOUND (both families add none). A model's end-of-sequence token for generation is
 *  named in its tokenizer_config.json ("eos_token"): look it up with kvg_tokenizer_token_id. */
int kvg_tokenizer_eos_id(const kvg_tokenizer *tok, uint32_t *id);

#endif
