/* SPDX-License-Identifier: Apache-2.0 */
/* Private entry points of the embedded prefix index, for its unit tests. */
#ifndef KVG_INDEX_INT_H
#define KVG_INDEX_INT_H

#include "router.h"

/** Walk every structure of the index (hash chains, per-worker LRU lists, free list, counters)
 *  and check that they agree with each other. Returns 0, or a negative number naming the first
 *  broken invariant (see index.c). Takes the read lock; O(entries + buckets). */
int kvg_index_check(kvg_prefix_index *idx);

#endif
