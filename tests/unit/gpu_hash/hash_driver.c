/* SPDX-License-Identifier: Apache-2.0 */
/* Not a test: prints the root and block keys of one hashing job, so that
 * tests/integration/test_hashing.py can check them against a second implementation (Python's
 * xxhash) and docs/hashing.md's vectors can be regenerated.
 * Usage: hash_driver bytes|tokens BLOCK_SIZE SALT MODEL ADAPTER < data
 * (tokens: decimal ids separated by whitespace). Prints "root <hex16>" then one hex16 per key. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_hash.h"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: hash_driver bytes|tokens BLOCK SALT MODEL ADAPTER < data\n");
        return 2;
    }
    kvg_hash_job job = {0};
    job.unit = strcmp(argv[1], "tokens") == 0 ? KVG_HASH_TOKENS : KVG_HASH_BYTES;
    job.block_size = (uint32_t)strtoul(argv[2], NULL, 10);
    job.salt = argv[3];
    job.salt_len = strlen(argv[3]);
    job.model = argv[4];
    job.model_len = strlen(argv[4]);
    job.adapter = argv[5];
    job.adapter_len = strlen(argv[5]);
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    uint32_t *tokens = NULL;
    size_t ntok = 0;
    if (!buf)
        return 1;
    if (job.unit == KVG_HASH_BYTES) {
        size_t n;
        while ((n = fread(buf + len, 1, cap - len, stdin)) > 0) {
            len += n;
            if (len == cap) {
                unsigned char *nb = realloc(buf, cap *= 2);
                if (!nb)
                    return 1;
                buf = nb;
            }
        }
        job.data = buf;
        job.len = len;
    } else {
        tokens = malloc(cap * sizeof(*tokens));
        unsigned long v;
        while (tokens && ntok < cap && scanf("%lu", &v) == 1)
            tokens[ntok++] = (uint32_t)v;
        job.data = tokens;
        job.len = ntok;
    }
    job.max_blocks = job.block_size ? (uint32_t)(job.len / job.block_size) : 0;
    job.keys = calloc(job.max_blocks + 1, sizeof(uint64_t));
    if (!job.keys || kvg_hash_batch(&job, 1) < 0) {
        fprintf(stderr, "hash_driver: bad job\n");
        return 1;
    }
    printf("root %016" PRIx64 "\n", kvg_hash_root(&job));
    for (uint32_t i = 0; i < job.nkeys; i++)
        printf("%016" PRIx64 "\n", job.keys[i]);
    free(job.keys);
    free(tokens);
    free(buf);
    return 0;
}
