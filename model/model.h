/* SPDX-License-Identifier: Apache-2.0 */
/* Models: token-exact mode (issue 16). A model the operator defines with its tokenizer, chat
 * template and the engine's prefix-cache settings is routed on the engine's own block hashes:
 * the request is rendered and tokenized as vLLM does, and its blocks are named with vLLM's
 * sha256_cbor / xxhash_cbor chain (docs/hashing.md, docs/canonical.md "Token-exact mode").
 * Models without a definition (or without a tokenizer) stay in byte mode.
 *
 * Three parts: the definition (one field table for every entry point: config file, admin API,
 * state file, shared state, kvgate admin), the loaded model (files read, template compiled,
 * NONE_HASH computed; immutable, shared by every thread), and the registry of loaded models,
 * published as refcounted snapshots the gateway threads read without locks (as the worker
 * registry does). */
#ifndef KVG_MODEL_H
#define KVG_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "fields.h"
#include "gpu_hash.h"
#include "snapshot.h"
#include "template.h"
#include "tokenizer.h"

/* Same bound as a worker's model names (router.h KVG_MODEL_NAME_MAX). */
#define KVG_MODEL_DEF_NAME_MAX 256
/* Most models one source (config, admin) may define. */
#define KVG_MODELS_MAX 256

/* ---- the definition ------------------------------------------------------------------------ */

/* A model as the operator defines it. Strings borrowed; the registry copies what it keeps. */
typedef struct kvg_model_def {
    const char *name;             /* the requests' "model" (as workers list it), 1..256 bytes,
                                     no control characters */
    const char *tokenizer;        /* path of the model's tokenizer.json, absolute; read by the
                                     gateway process, on its host */
    const char *tokenizer_config; /* path of its tokenizer_config.json (chat_template, bos_token,
                                     eos_token), absolute; NULL: completions only (chat requests
                                     of the model stay in byte mode) */
    const char *chat_template;    /* path of a Jinja file that replaces tokenizer_config's
                                     chat_template (vLLM's --chat-template); NULL: none */
    kvg_vllm_algo hash_algo;      /* the engine's --prefix-caching-hash-algo; default
                                     sha256_cbor */
    const char *hash_seed;        /* the engine's PYTHONHASHSEED (required: without it the
                                     engine's NONE_HASH is random) */
    uint32_t block_size;          /* the engine's --block-size in tokens; default 16, 1..4096 */
    uint32_t token_cache_mib;     /* the pieces cache (tokenizer.h): MiB of token ids kept of
                                     the long text pieces between special tokens, per model;
                                     default 64, 0 = off */
} kvg_model_def;

/* The fields of a model definition, for every entry point (config "models: [...]", PUT
 * /admin/v1/models/{name}, the state file, the shared state, `kvgate admin models put`):
 * name, tokenizer, tokenizer_config, chat_template, hash_algo, hash_seed, block_size,
 * token_cache_mib. */
extern const kvg_fields kvg_model_fields;

/** Check a definition without reading files: 0, or KVG_EPARSE/KVG_ELIMIT with "field: problem"
 *  in msg (may be NULL). */
int kvg_model_def_validate(const kvg_model_def *def, char *msg, size_t msg_len);

/* ---- the loaded model ------------------------------------------------------------------------ */

/* A loaded model: immutable after kvg_model_load, read by every thread at once. */
typedef struct kvg_model kvg_model;

const char *kvg_model_name(const kvg_model *m);
uint32_t kvg_model_block_size(const kvg_model *m);
kvg_vllm_algo kvg_model_algo(const kvg_model *m);
/** Whether chat requests can be token-exact (the model has a chat template). */
bool kvg_model_has_template(const kvg_model *m);
/** The prefix index's root for this model's chains: a function of (name, algo, hash_seed,
 *  block_size) only, no salt (the scope salt is inside the engine's hashes as cache_salt), so
 *  that the engine's KV events can be filed under it (issue 17). */
uint64_t kvg_model_root(const kvg_model *m);
/** The definition it was loaded from (strings borrowed from the model), for the admin API. */
void kvg_model_get_def(const kvg_model *m, kvg_model_def *def);

/** Read and compile what def names: the tokenizer file, the config's chat_template (a string,
 *  or the "default" of a list of {name, template}) and special tokens (strings or {content}
 *  objects), the template file. 0 and *out; KVG_EPARSE/KVG_ELIMIT with msg naming the file and
 *  the problem ("tokenizer /x/tokenizer.json: ...", "chat_template: 3:7: ..."); -ENOENT/-EACCES
 *  with the path; -ENOMEM. May take a while (a tokenizer.json is ~10 MB): never on an event
 *  loop. */
int kvg_model_load(const kvg_model_def *def, kvg_model **out, char *msg, size_t msg_len);
void kvg_model_free(kvg_model *m);

/* ---- the registry ---------------------------------------------------------------------------- */

typedef struct kvg_model_registry kvg_model_registry;
typedef struct kvg_model_set kvg_model_set; /* a snapshot: immutable, refcounted */

/* Where a definition came from, as for workers: the config file (replaced on reload) or the
 * admin API (kept across reloads; overrides a config model of the same name). */
typedef enum kvg_model_source {
    KVG_MODEL_SOURCE_CONFIG = 0,
    KVG_MODEL_SOURCE_ADMIN,
    KVG_MODEL_SOURCE_COUNT,
} kvg_model_source;

int kvg_model_registry_new(kvg_model_registry **out);
void kvg_model_registry_free(kvg_model_registry *reg);
/** Load def and publish it (replacing a model of that name from the same source). An identical
 *  definition keeps the loaded model (no file is read again). Returns 0, or the load's error
 *  with msg; nothing changes on error. Serialised internally; never on an event loop. */
int kvg_model_registry_put(kvg_model_registry *reg, const kvg_model_def *def,
                           kvg_model_source source, char *msg, size_t msg_len);
/** KVG_ENOTFOUND if absent. */
int kvg_model_registry_remove(kvg_model_registry *reg, const char *name);
/** Replace every CONFIG model by defs (a reload): all or nothing. */
int kvg_model_registry_replace_config(kvg_model_registry *reg, const kvg_model_def *defs, size_t n,
                                      char *msg, size_t msg_len);
/** ADMIN definitions as a JSON array sorted by name (state file, shared state), and back. */
void kvg_model_registry_admin_to_json(kvg_model_registry *reg, kvg_buf *out);
int kvg_model_registry_admin_from_json(kvg_model_registry *reg, const kvg_json *arr, char *msg,
                                       size_t msg_len);
/** The slot snapshots are published in (for a thread's kvg_snapshot_cache); its objects are
 *  model sets (kvg_model_set_of). */
kvg_snapshot_slot *kvg_model_registry_snapshots(kvg_model_registry *reg);
static inline kvg_model_set *kvg_model_set_of(kvg_snapshot *snap)
{
    return (kvg_model_set *)(void *)snap;
}
kvg_model_set *kvg_model_registry_acquire(kvg_model_registry *reg);
kvg_model_set *kvg_model_set_ref(kvg_model_set *set);
void kvg_model_set_unref(kvg_model_set *set);
size_t kvg_model_set_count(const kvg_model_set *set);
/** i-th model, sorted by name; its source into *source when not NULL. Borrowed. */
const kvg_model *kvg_model_set_at(const kvg_model_set *set, size_t i, kvg_model_source *source);
/** The model named name[0..len), borrowed from the snapshot; NULL when none (byte mode). A
 *  lookup per request: a hash table, no allocation. */
const kvg_model *kvg_model_set_find(const kvg_model_set *set, const char *name, size_t len);

/* ---- a request's token-exact block keys ------------------------------------------------------ */

typedef enum kvg_model_input {
    KVG_MODEL_INPUT_COMPLETIONS = 0, /* /v1/completions: "prompt" (string, or token ids) */
    KVG_MODEL_INPUT_CHAT,            /* /v1/chat/completions: "messages", "tools", ... */
    KVG_MODEL_INPUT_COUNT,
} kvg_model_input;

/* What kvg_model_keys found. */
typedef struct kvg_model_keys_out {
    uint64_t *keys; /* the event form of each full block's hash (kvg_vllm_hash_u64), arena */
    uint32_t nkeys;
    size_t ntokens;                /* the prompt's tokens, as the engine will count them */
    kvg_vllm_hash first_hashes[2]; /* the first blocks' full digests (explain), nkeys of them
                                      at most */
} kvg_model_keys_out;

/** The engine's block keys of a request body: chat bodies through kvg_template_prepare, the
 *  model's template and the tokenizer (no special tokens added: the template holds them);
 *  completions' string prompts through the tokenizer with its post-processor (BOS where the
 *  file adds one), token-id prompts as given; then vLLM's block hashes with cache_salt = salt
 *  (the scope salt the gateway injects; NULL: none). At most max_blocks keys. Render limits
 *  scale with the body's size. 0 and *out; KVG_EPARSE with err when the request is one
 *  token-exact mode does not cover (the caller routes it in byte mode, counted); -ENOMEM. */
int kvg_model_keys(const kvg_model *m, kvg_model_input input, const char *body, size_t len,
                   const char *salt, size_t max_blocks, kvg_arena *arena, kvg_model_keys_out *out,
                   char *err, size_t errlen);

#endif
