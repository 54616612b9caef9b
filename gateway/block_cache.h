/* SPDX-License-Identifier: Apache-2.0 */
/* Per-thread free lists for libevent's and nghttp2's allocations (see block_cache.c for why). */
#ifndef KVG_GATEWAY_BLOCK_CACHE_H
#define KVG_GATEWAY_BLOCK_CACHE_H

#include <nghttp2/nghttp2.h>
#include <stddef.h>

/** malloc, realloc and free of blocks with a 16-byte header: a block must be freed (or
 *  reallocated) by these, on any thread. Blocks of up to 16 KiB are kept for reuse by the
 *  thread that freed them when it called kvg_block_cache_thread; other threads malloc and free. */
void *kvg_block_malloc(size_t n);
void *kvg_block_realloc(void *p, size_t n);
void kvg_block_free(void *p);

/** Route libevent's allocations through the block cache. Call before any other libevent call (a
 *  block libevent allocated earlier would reach the wrong free); once per process. */
void kvg_block_cache_install_libevent(void);
/** The same for an nghttp2 session: the allocator to pass to nghttp2_session_*_new3. */
nghttp2_mem *kvg_block_cache_nghttp2_mem(void);
/** Keep freed blocks on the calling thread for its next allocations (the event-loop threads);
 *  the thread's blocks are freed when it exits. */
void kvg_block_cache_thread(void);
/** Bytes of freed blocks the calling thread keeps (at most 256 KiB per size class). */
size_t kvg_block_cache_kept(void);

#endif
