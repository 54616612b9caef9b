/* SPDX-License-Identifier: Apache-2.0 */
/* Not a test: hashes the cases tests/integration/test_vllm_hash.py sends, so that it can compare
 * them with vLLM's own functions (cbor2, hashlib, xxhash). Built twice: against gpu_hash's
 * kvg_vllm_* (the gateway's) and, with -DKVG_DRIVER_SIMWORKER, against the simulated worker's own
 * implementation (tools/simworker/vllm_hash.c).
 * One case per stdin line: ALGO BLOCK SEED LORA SALT NTOK TOK... where SEED, LORA and SALT are
 * "-" (none) or "x" followed by the string's bytes in hex ("x" alone: the empty string). One
 * line out per case: NONE_HASH in hex, then "HEX,U64" per full block; or "error CODE". */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#ifdef KVG_DRIVER_SIMWORKER
#include "simworker.h"
#else
#include "gpu_hash.h"
#endif

/* A string argument: NULL for "-", else decoded in place (hex is twice as long). */
static int arg_string(char *tok, const char **out, size_t *len)
{
    if (strcmp(tok, "-") == 0) {
        *out = NULL;
        *len = 0;
        return 0;
    }
    if (tok[0] != 'x')
        return -EINVAL;
    size_t n = strlen(tok + 1);
    if (n % 2)
        return -EINVAL;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = kvg_hex_digit(tok[1 + 2 * i]), lo = kvg_hex_digit(tok[2 + 2 * i]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        tok[i] = (char)(hi << 4 | lo);
    }
    *out = tok;
    *len = n / 2;
    return 0;
}

static void print_hex(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%02x", b[i]);
}

static int run_case(char *line)
{
    char *save = NULL;
    char *algo_s = strtok_r(line, " \n", &save), *block_s = strtok_r(NULL, " \n", &save);
    char *seed_s = strtok_r(NULL, " \n", &save), *lora_s = strtok_r(NULL, " \n", &save);
    char *salt_s = strtok_r(NULL, " \n", &save), *ntok_s = strtok_r(NULL, " \n", &save);
    if (!ntok_s)
        return -EINVAL;
    const char *seed, *lora, *salt;
    size_t seed_len, lora_len, salt_len;
    if (arg_string(seed_s, &seed, &seed_len) < 0 || arg_string(lora_s, &lora, &lora_len) < 0 ||
        arg_string(salt_s, &salt, &salt_len) < 0)
        return -EINVAL;
    unsigned long block = strtoul(block_s, NULL, 10);
    size_t ntok = strtoul(ntok_s, NULL, 10);
    uint32_t *tokens = malloc((ntok ? ntok : 1) * sizeof(*tokens));
    if (!tokens)
        return -ENOMEM;
    for (size_t i = 0; i < ntok; i++) {
        char *t = strtok_r(NULL, " \n", &save);
        if (!t) {
            free(tokens);
            return -EINVAL;
        }
        tokens[i] = (uint32_t)strtoul(t, NULL, 10);
    }
    size_t max = block ? ntok / block : 0;
    int rc;
#ifdef KVG_DRIVER_SIMWORKER
    sim_vllm_algo algo;
    rc = sim_vllm_algo_parse(algo_s, &algo);
    uint8_t none[SIM_VLLM_DIGEST_MAX];
    size_t dlen = 0;
    uint8_t *hashes = malloc((max ? max : 1) * SIM_VLLM_DIGEST_MAX);
    if (rc == 0 && !hashes)
        rc = -ENOMEM;
    if (rc == 0)
        rc = sim_vllm_none_hash(algo, seed, seed_len, none, &dlen);
    size_t n = 0;
    if (rc == 0)
        rc = sim_vllm_block_hashes(algo, none, dlen, tokens, ntok, (uint32_t)block, lora, lora_len,
                                   salt, salt_len, hashes, max, &n);
    if (rc == 0) {
        print_hex(none, dlen);
        for (size_t i = 0; i < n; i++) {
            putchar(' ');
            print_hex(hashes + i * dlen, dlen);
            printf(",%" PRIu64, sim_vllm_hash_u64(hashes + i * dlen, dlen));
        }
        putchar('\n');
    }
#else
    kvg_vllm_algo algo;
    rc = kvg_vllm_algo_parse(algo_s, strlen(algo_s), &algo);
    kvg_vllm_hash none;
    kvg_vllm_hash *hashes = malloc((max ? max : 1) * sizeof(*hashes));
    uint64_t *keys = malloc((max ? max : 1) * sizeof(*keys));
    if (rc == 0 && (!hashes || !keys))
        rc = -ENOMEM;
    if (rc == 0)
        rc = kvg_vllm_none_hash(algo, seed, seed_len, &none);
    size_t n = 0;
    if (rc == 0) {
        kvg_vllm_blocks in = {
            .algo = algo,
            .parent = &none,
            .tokens = tokens,
            .ntokens = ntok,
            .block_size = (uint32_t)block,
            .lora_name = lora,
            .lora_name_len = lora_len,
            .cache_salt = salt,
            .cache_salt_len = salt_len,
        };
        /* Both outputs, and once with keys alone, which must agree. */
        rc = kvg_vllm_block_hashes(&in, hashes, keys, max, &n);
        if (rc == 0 && n > 0) {
            uint64_t *only = malloc(n * sizeof(*only));
            size_t n2 = 0;
            if (!only || kvg_vllm_block_hashes(&in, NULL, only, n, &n2) < 0 || n2 != n ||
                memcmp(only, keys, n * sizeof(*only)) != 0) {
                fprintf(stderr, "vllm_hash_driver: keys-only run differs\n");
                rc = -EPROTO;
            }
            free(only);
        }
    }
    if (rc == 0) {
        print_hex(none.bytes, none.len);
        for (size_t i = 0; i < n; i++) {
            putchar(' ');
            print_hex(hashes[i].bytes, hashes[i].len);
            if (kvg_vllm_hash_u64(&hashes[i]) != keys[i])
                rc = -EPROTO;
            printf(",%" PRIu64, keys[i]);
        }
        putchar('\n');
    }
    free(keys);
#endif
    free(hashes);
    free(tokens);
    return rc;
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) > 0) {
        int rc = run_case(line);
        if (rc < 0)
            printf("error %d\n", rc);
        fflush(stdout);
    }
    free(line);
    return 0;
}
