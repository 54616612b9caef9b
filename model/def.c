/* SPDX-License-Identifier: Apache-2.0 */
/* A model's definition: its one field table (every entry point decodes and encodes through it)
 * and the checks of its values. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "model.h"

static const char *const algo_names[] = {"sha256_cbor", "xxhash_cbor"};
_Static_assert(KVG_ARRAY_LEN(algo_names) == KVG_VLLM_ALGO_COUNT, "an algorithm has its name");

/* Files are named by absolute path: the gateway may run from any directory, and a relative
 * path would mean something else after a restart from elsewhere. */
static int check_path(const void *value, char *why, size_t len)
{
    const char *p = value;
    if (p[0] == '/')
        return 0;
    snprintf(why, len, "must be an absolute path");
    return KVG_EPARSE;
}

static const kvg_field model_fields[] = {
    {.name = "name",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG | KVG_SET_STATE | KVG_SET_ADMIN,
     .required_in = KVG_SET_CONFIG | KVG_SET_STATE,
     .flags = KVG_FIELD_NONEMPTY,
     .max = KVG_MODEL_DEF_NAME_MAX,
     .offset = offsetof(kvg_model_def, name)},
    {.name = "tokenizer",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY & ~KVG_SET_FLAG,
     .required_in = KVG_SET_CONFIG | KVG_SET_STATE | KVG_SET_ADMIN,
     .flags = KVG_FIELD_NONEMPTY,
     .max = 4096,
     .offset = offsetof(kvg_model_def, tokenizer),
     .check = check_path},
    {.name = "tokenizer_config",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY & ~KVG_SET_FLAG,
     .flags = KVG_FIELD_NONEMPTY | KVG_FIELD_NULLABLE,
     .max = 4096,
     .offset = offsetof(kvg_model_def, tokenizer_config),
     .check = check_path},
    {.name = "chat_template",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY & ~KVG_SET_FLAG,
     .flags = KVG_FIELD_NONEMPTY | KVG_FIELD_NULLABLE,
     .max = 4096,
     .offset = offsetof(kvg_model_def, chat_template),
     .check = check_path},
    {.name = "hash_algo",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_ANY & ~KVG_SET_FLAG,
     .offset = offsetof(kvg_model_def, hash_algo),
     .keywords = algo_names,
     .nkeywords = KVG_VLLM_ALGO_COUNT,
     .def.u = KVG_VLLM_SHA256_CBOR,
     .invalid = "{path}: must be sha256_cbor or xxhash_cbor, not \"{value}\" (vLLM's sha256 and "
                "xxhash hash Python pickle bytes, which nothing outside the engine can "
                "reproduce: start the engine with --prefix-caching-hash-algo sha256_cbor)"},
    /* Required: an engine started without PYTHONHASHSEED draws its NONE_HASH at random. */
    {.name = "hash_seed",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY & ~KVG_SET_FLAG,
     .required_in = KVG_SET_CONFIG | KVG_SET_STATE | KVG_SET_ADMIN,
     .max = 1024,
     .offset = offsetof(kvg_model_def, hash_seed)},
    {.name = "block_size",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_ANY & ~KVG_SET_FLAG,
     .offset = offsetof(kvg_model_def, block_size),
     .min = 1,
     .max = 4096,
     .def.u = 16},
    {.name = "token_cache_mib",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_ANY & ~KVG_SET_FLAG,
     .offset = offsetof(kvg_model_def, token_cache_mib),
     .max = 65536,
     .def.u = 64},
};

const kvg_fields kvg_model_fields = {"model", model_fields, KVG_ARRAY_LEN(model_fields), NULL};

int kvg_model_def_validate(const kvg_model_def *def, char *msg, size_t msg_len)
{
    char why[160];
#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        if (msg && msg_len)                                                                        \
            snprintf(msg, msg_len, __VA_ARGS__);                                                   \
        return (code);                                                                             \
    } while (0)
    if (!def->name || !def->name[0])
        FAIL(KVG_EPARSE, "name: required");
    size_t n = strlen(def->name);
    if (n > KVG_MODEL_DEF_NAME_MAX)
        FAIL(KVG_ELIMIT, "name: at most %d bytes", KVG_MODEL_DEF_NAME_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)def->name[i] < 0x20 || def->name[i] == 0x7f)
            FAIL(KVG_EPARSE, "name: must not contain control characters");
    if (!def->tokenizer)
        FAIL(KVG_EPARSE, "tokenizer: required");
    const char *paths[] = {def->tokenizer, def->tokenizer_config, def->chat_template};
    const char *names[] = {"tokenizer", "tokenizer_config", "chat_template"};
    for (size_t i = 0; i < 3; i++)
        if (paths[i] && check_path(paths[i], why, sizeof(why)) < 0)
            FAIL(KVG_EPARSE, "%s: %s", names[i], why);
    if ((unsigned)def->hash_algo >= KVG_VLLM_ALGO_COUNT)
        FAIL(KVG_EPARSE, "hash_algo: must be sha256_cbor or xxhash_cbor");
    if (!def->hash_seed)
        FAIL(KVG_EPARSE, "hash_seed: required (the engine's PYTHONHASHSEED)");
    if (def->block_size < 1 || def->block_size > 4096)
        FAIL(KVG_EPARSE, "block_size: must be an integer in 1..4096");
#undef FAIL
    return 0;
}
