/* SPDX-License-Identifier: Apache-2.0 */
/* Inside tokenizer/: the pieces cache's lookups and inserts (tokenizer.c's encode uses them;
 * the public handle is in tokenizer.h). */
#ifndef KVG_TOKEN_CACHE_H
#define KVG_TOKEN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct kvg_piece_key {
    uint64_t lo, hi;
    size_t len;
} kvg_piece_key;

/** The key of a piece in a cache scope (a 128-bit hash seeded by the cache's random seed and
 *  the scope). */
kvg_piece_key kvg_piece_key_of(const kvg_tokenizer_cache *c, const void *scope, size_t scope_len,
                               const char *piece, size_t len);
/** 1 and take(ud, ids, n) called under the shard's lock when the piece is cached; 0 when not;
 *  take's negative result otherwise. */
int kvg_tokenizer_cache_get(kvg_tokenizer_cache *c, const kvg_piece_key *k,
                            int (*take)(void *ud, const uint32_t *ids, size_t n), void *ud);
/** Keep a copy of ids for k (an entry over a quarter of a shard's share is not kept; a failed
 *  allocation keeps nothing). */
void kvg_tokenizer_cache_put(kvg_tokenizer_cache *c, const kvg_piece_key *k, const uint32_t *ids,
                             size_t n);

#endif
