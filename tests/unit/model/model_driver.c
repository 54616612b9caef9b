/* SPDX-License-Identifier: Apache-2.0 */
/* Not a test: tests/integration/test_model_keys.py runs it. Loads a model from the files named
 * on the command line, then reads one request body per line from stdin and prints, per line,
 * {"ntokens":N,"keys":["<u64>",...],"first":["<hex digest>",...]} or {"error":"...","code":C}.
 *   model_driver --tokenizer F [--tokenizer-config F] [--chat-template F] --seed S
 *                [--algo sha256_cbor|xxhash_cbor] [--block N] [--salt S] [--chat]
 *                [--max-blocks N] [--token-cache-mib N] */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

int main(int argc, char **argv)
{
    kvg_model_def def = {.name = "m", .hash_algo = KVG_VLLM_SHA256_CBOR, .block_size = 16};
    const char *salt = NULL;
    kvg_model_input input = KVG_MODEL_INPUT_COMPLETIONS;
    size_t max_blocks = SIZE_MAX;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--chat") == 0) {
            input = KVG_MODEL_INPUT_CHAT;
            continue;
        }
        if (!v) {
            fprintf(stderr, "%s: needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--tokenizer") == 0)
            def.tokenizer = v;
        else if (strcmp(a, "--tokenizer-config") == 0)
            def.tokenizer_config = v;
        else if (strcmp(a, "--chat-template") == 0)
            def.chat_template = v;
        else if (strcmp(a, "--seed") == 0)
            def.hash_seed = v;
        else if (strcmp(a, "--algo") == 0) {
            if (kvg_vllm_algo_parse(v, strlen(v), &def.hash_algo) < 0) {
                fprintf(stderr, "bad --algo %s\n", v);
                return 2;
            }
        } else if (strcmp(a, "--block") == 0)
            def.block_size = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--salt") == 0)
            salt = v;
        else if (strcmp(a, "--token-cache-mib") == 0)
            def.token_cache_mib = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--max-blocks") == 0)
            max_blocks = strtoul(v, NULL, 10);
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
    }
    kvg_model *m = NULL;
    char msg[512];
    int rc = kvg_model_load(&def, &m, msg, sizeof(msg));
    if (rc < 0) {
        fprintf(stderr, "load: %s (%s)\n", msg, kvg_strerror(rc));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    kvg_buf out;
    kvg_buf_init(&out);
    while ((n = getline(&line, &cap, stdin)) > 0) {
        if (line[n - 1] == '\n')
            n--;
        kvg_arena arena;
        kvg_arena_init(&arena, 0);
        kvg_model_keys_out k;
        char err[512];
        rc = kvg_model_keys(m, input, line, (size_t)n, salt, max_blocks, &arena, &k, err,
                            sizeof(err));
        out.len = 0;
        if (rc < 0) {
            kvg_buf_append(&out, "{\"error\":", 9);
            kvg_buf_json_string(&out, err, strlen(err));
            kvg_buf_printf(&out, ",\"code\":%d}\n", rc);
        } else {
            kvg_buf_printf(&out, "{\"ntokens\":%zu,\"keys\":[", k.ntokens);
            for (uint32_t i = 0; i < k.nkeys; i++)
                kvg_buf_printf(&out, "%s\"%" PRIu64 "\"", i ? "," : "", k.keys[i]);
            kvg_buf_append(&out, "],\"first\":[", 11);
            for (uint32_t i = 0; i < k.nkeys && i < KVG_ARRAY_LEN(k.first_hashes); i++) {
                char hex[2 * KVG_VLLM_HASH_MAX];
                kvg_hex_encode(k.first_hashes[i].bytes, k.first_hashes[i].len, hex);
                kvg_buf_printf(&out, "%s\"%.*s\"", i ? "," : "", 2 * k.first_hashes[i].len, hex);
            }
            kvg_buf_append(&out, "]}\n", 3);
        }
        fwrite(out.data, 1, out.len, stdout);
        kvg_arena_done(&arena);
    }
    kvg_buf_done(&out);
    free(line);
    kvg_model_free(m);
    return 0;
}
