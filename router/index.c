/* SPDX-License-Identifier: Apache-2.0 */
/* The embedded prefix index: which block keys each worker is believed to hold, with each
 * worker's KV capacity modelled by LRU eviction.
 *
 * Layout. Every (key, worker) pair the index holds is one 24-byte node in a pool addressed by
 * uint32 indices (key u64, worker slot u32, hash-chain next u32, LRU prev u28 with four bits
 * of flags above it, LRU next u32); no pointers, so the pool can grow by realloc and stays
 * dense. A hash table of uint32 bucket
 * heads chains every node whose key falls in a bucket, whatever its worker: one probe answers
 * "who holds this key", which is the question a lookup asks at each step. Each worker slot
 * has its own doubly-linked LRU list through its nodes (head = most recent), its capacity and
 * its count. Freed nodes go on a free list (through the chain link) and are reused first.
 *
 * Memory. The pool starts at 1024 nodes and doubles on demand up to max_entries; the bucket
 * array is the pool size rounded up to a power of two (load factor <= 1) and is rehashed when
 * the pool grows. So the index holds at most 24 bytes per entry for the pool plus 4 to 8 per
 * entry for buckets (4 when max_entries is a power of two): 28 bytes per entry at the default
 * 1 << 24 entries, 448 MiB when full. Growth is a realloc, so while the pool doubles it briefly
 * needs the old and the new array (1.5x). Per worker: under 100 bytes and its name.
 *
 * Locking. One index-wide pthread rwlock. A lookup takes the read lock once and writes nothing
 * shared (it does not refresh recency, so lookups from every thread run in parallel); record
 * and set_workers take the write lock. Per-key or striped locks would make a lookup take one
 * lock per key of the chain, and a record would have to order its LRU updates across stripes.
 * A record holds the write lock ~10 ns per key already held and ~300 ns per new key (measured
 * on a 4.2M-entry index, evicting as it goes): about 1.3 ms for a 4096-key new chain. The lock
 * prefers writers (glibc's default prefers readers, which lets a busy stream of lookups starve
 * recording indefinitely).
 *
 * Lookup. Everything rests on one fact: what a worker holds of a key chain is a prefix of it
 * (a key is only recorded with its predecessors, and recording touches keys last to first, so
 * eviction takes a chain's tail before its head). A lookup first walks the bucket of keys[0]:
 * nobody holding it is a cold request (one probe). When at most FEW_HOLDERS workers hold it,
 * each one's depth is found by doubling steps and bisection (depth_of: about 2 log2 n probes,
 * 24 for a 4096-key prompt instead of 4096). When more hold it (a popular opening), the
 * bisection runs on holder sets (match_batch, bisect_range): the workers holding a key shrink
 * along the chain, so a range whose two ends are held by the same set is skipped, and ranges
 * of a few keys are walked key by key; a shared system prompt held by every worker costs a few
 * probes of its bucket. Requested ids are mapped to their positions through a per-call table
 * keyed by slot, on the stack up to 64 workers and on the heap (bounded, 4096 at a time) above.
 * bench/route has the figures.
 *
 * Recording touches keys from the last to the first, so keys[0] ends most recently used: vLLM
 * frees a finished sequence's blocks tail first, so the head of a prompt outlives its tail.
 * Finding the (key, worker) entry walks the key's chain, which holds one node per worker that
 * has the key: a prefix every worker holds (a shared system prompt) costs O(workers) per key
 * to record, and a lookup of workers that all hold it O(workers) per step. That is the price
 * of answering "who holds this key" with one probe. Measured: re-recording a 4096-key chain
 * that only its worker holds, ~40 us; one that all 64 workers hold, ~3.5 ms (and ~3 ms to match
 * it for all 64): fine for shared system prompts of a few hundred blocks, worth revisiting
 * (a second (key, worker) hash) if fleets of thousands share long prefixes.
 *
 * Engine events (docs/kv-events.md). A BlockStored is recorded as a request's keys are (the same
 * touch_key, last to first); a BlockRemoved drops the worker's node of each key, found and
 * unlinked in one walk of its bucket; an AllBlocksCleared walks the worker's LRU list and
 * unlinks each node from its chain, which costs the worker's entries rather than a sweep of
 * every bucket (drop_worker's way, right when a worker leaves for good). Removed nodes go to the
 * free list, so memory per entry is unchanged. A batch holds the write lock once, let go every
 * RECORD_BATCH keys as a long record does. Removals can leave a hole inside a chain, which the
 * bisection of a lookup may step over (see docs/kv-events.md, "Known limit").
 *
 * Sources, speculative entries and tiers (docs/kv-events.md, "Sources"). A node's flags say on
 * which tiers the worker holds the block (F_GPU, F_CPU: a BlockRemoved of one tier clears its
 * bit, the node goes with its last), whether it is the gateway's guess (F_GUESS: recorded, never
 * confirmed by a BlockStored) and whether that guess has a deadline (F_SPEC: recorded for a
 * worker whose source is events); they sit in the LRU prev link's top bits, which lookups
 * never read. Deadlines live outside the node, in one ring per index of (key, deadline, node, slot,
 * the slot's epoch) for speculative entries only: the TTL is one constant, so insertion order
 * is deadline order and a sweep pops the head while it is due. A ring entry whose node has
 * since changed (confirmed, removed, reused; or the worker's guesses lost their deadlines,
 * which moves its epoch on) matches no node and is just dropped, so nothing ever searches the
 * ring. A lookup asks for the GPU depth only when some engine reported another tier
 * (cpu_entries), and then bisects each holder's chain a second time. */
#include "index_int.h"
#include "router_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NIL UINT32_MAX
/* Slot value of a node on the free list. */
#define FREE_SLOT UINT32_MAX

/* A node's flags, kept in the top four bits of its LRU prev link (a 28-bit node index): lookups
 * never read it, and neither does the walk from an LRU head (recent_run, next links), so
 * neither pays for the flags. Measured: in the slot field they cost a mask at every node a
 * lookup visits (+4 to +14% instructions on lookups where many workers hold the opening), and in
 * the next link a mask on the dependent chain of loads of recent_run (+17% on bench/route's
 * record of a chain already held). */
#define F_GPU 0x01u   /* the worker holds the block on its GPU */
#define F_CPU 0x02u   /* ... on a CPU (or other offloading) tier */
#define F_GUESS 0x04u /* from the gateway's own record, never confirmed by a BlockStored */
#define F_SPEC 0x08u  /* a guess with a deadline: it has an entry in the speculative ring */
#define F_TIERS (F_GPU | F_CPU)
#define LINK_BITS 28
#define LINK_MASK ((UINT32_C(1) << LINK_BITS) - 1) /* also "no node" in prev (NIL's bits) */

#define DEFAULT_SPECULATIVE_TTL_MS 5000u
/* Ring entries a record sweeps at most (the consumer's kvg_index_expire does the rest). */
#define SWEEP_PER_RECORD 1024u

#define DEFAULT_MAX_ENTRIES (UINT64_C(1) << 24)
#define DEFAULT_CAPACITY 65536u
/* Accepted up to the configuration's ceiling, 1 << 30; node indices must fit the prev link's 28
 * bits with LINK_MASK reserved, so more than LINK_MASK entries are taken as LINK_MASK (268M
 * entries, 7.5 GB: far beyond a gateway's index). */
#define MAX_ENTRIES_LIMIT (UINT64_C(1) << 30)
#define INITIAL_POOL 1024u
#define MIN_BUCKET_BITS 4
/* Most workers one set_workers call may list: slot numbers are uint32 and the id map doubles. */
#define MAX_WORKERS (UINT32_C(1) << 24)

/* Requested workers matched in one pass: stack scratch up to STACK_WORKERS, heap above, in
 * chunks of HEAP_WORKERS. */
#define STACK_WORKERS 64
#define HEAP_WORKERS 4096
/* Keys ahead of the current step whose node is prefetched (their bucket twice as far). */
#define PREFETCH_AHEAD 8
/* Keys recorded per hold of the write lock (see kvg_index_record). */
#define RECORD_BATCH 256

typedef struct node {
    uint64_t key;
    uint32_t slot;  /* worker slot; FREE_SLOT when on the free list */
    uint32_t hnext; /* next node of the bucket chain (or of the free list) */
    uint32_t prevf; /* LRU neighbours within the worker: prev (more recent), 28 bits, and the
                       flags above it (lru_prev(), node_flags()); */
    uint32_t next;  /* next (less recent) */
} node;

_Static_assert(sizeof(node) == 24, "a node is 24 bytes");

typedef struct wslot {
    uint64_t id;
    char *name;
    uint64_t count;
    uint32_t capacity; /* effective: the default already applied */
    uint32_t head;     /* most recently used */
    uint32_t tail;     /* least recently used */
    bool live;
    uint8_t source; /* kvg_index_source */
    double fresh;   /* entries added lately, decayed, as of idx->fresh_base (see fresh_add) */
    uint64_t nspec; /* entries with F_SPEC */
    uint64_t ncpu;  /* entries with F_CPU */
    uint32_t epoch; /* ring entries of an older epoch are void (see guesses_keep); kept across
                       the slot's reuse by another worker */
} wslot;

/* A speculative entry's deadline. The TTL is the same for all, so the ring is in deadline order
 * and sweeping takes from its head. An entry whose node has since been confirmed, removed or
 * reused no longer matches it (key, slot, F_SPEC and the slot's epoch) and is dropped when its
 * turn comes. */
typedef struct spec_ent {
    uint64_t key;
    uint64_t expiry_ms;
    uint32_t node;
    uint32_t slot;
    uint32_t epoch; /* the slot's epoch when the deadline was set */
} spec_ent;

/* Open-addressed worker id -> slot map, rebuilt by set_workers. */
typedef struct id_ent {
    uint64_t id;
    uint32_t slot; /* NIL: empty */
} id_ent;

struct kvg_prefix_index {
    pthread_rwlock_t lock;
    uint64_t max_entries;
    uint32_t default_capacity;

    node *nodes;
    uint32_t pool_cap;  /* nodes allocated */
    uint32_t pool_used; /* nodes ever handed out: [0, pool_used) are live or free */
    uint32_t free_head;
    uint32_t *buckets;
    unsigned bucket_bits;

    wslot *slots;
    uint32_t nslots;   /* length of slots[] (live or not) */
    uint32_t *order;   /* the live slots in set_workers order, for metrics */
    uint32_t nworkers; /* live slots */
    id_ent *ids;
    unsigned id_bits;

    uint64_t entries;
    uint64_t evictions;
    uint64_t inserts;
    uint64_t horizon;    /* sum of the live workers' capacities (at least 1): turnover's scale */
    uint64_t fresh_base; /* idx->inserts when every slot's fresh was last brought up to date */

    /* Speculative entries (docs/kv-events.md, "Sources"). */
    uint64_t (*clock_ms)(void *);
    void *clock_arg;
    uint32_t spec_ttl_ms;
    spec_ent *ring; /* ring_cap (a power of two) entries, ring_len of them from ring_head */
    size_t ring_cap, ring_head, ring_len;
    uint64_t spec_entries, spec_inserted, spec_confirmed, spec_expired, spec_dropped;
    uint64_t cpu_entries; /* entries with F_CPU: 0 lets a lookup skip the GPU depth */
};

static uint64_t capacity_sum(const kvg_prefix_index *idx);
static void fresh_rebase(kvg_prefix_index *idx);

/* Fibonacci hashing: keys are normally hashes already, but this also spreads small sequential
 * ones (tests, a weak hash, worker ids) evenly over the high bits. */
static inline uint32_t id_hash(uint64_t id, unsigned bits)
{
    return (uint32_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - bits));
}

static inline uint32_t bucket_of(const kvg_prefix_index *idx, uint64_t key)
{
    return id_hash(key, idx->bucket_bits);
}

static uint32_t id_find(const kvg_prefix_index *idx, uint64_t id)
{
    uint32_t mask = (UINT32_C(1) << idx->id_bits) - 1;
    for (uint32_t h = id_hash(id, idx->id_bits);; h = (h + 1) & mask) {
        const id_ent *e = &idx->ids[h];
        if (e->slot == NIL)
            return NIL;
        if (e->id == id)
            return e->slot;
    }
}

/* Smallest bits with 1 << bits >= n (and >= 1 << min). */
static unsigned bits_for(uint64_t n, unsigned min)
{
    unsigned b = min;
    while ((UINT64_C(1) << b) < n)
        b++;
    return b;
}

/* ---- nodes, chains and LRU lists ------------------------------------------------------------- */

static inline uint32_t link_get(uint32_t f)
{
    uint32_t v = f & LINK_MASK;
    return v == LINK_MASK ? NIL : v;
}

static inline uint32_t lru_prev(const node *x)
{
    return link_get(x->prevf);
}

static inline uint32_t lru_next(const node *x)
{
    return x->next;
}

static inline void set_prev(node *x, uint32_t n)
{
    x->prevf = (x->prevf & ~LINK_MASK) | (n & LINK_MASK);
}

static inline void set_next(node *x, uint32_t n)
{
    x->next = n;
}

static inline unsigned node_flags(const node *x)
{
    return x->prevf >> LINK_BITS;
}

static inline void set_flags(node *x, unsigned f)
{
    x->prevf = (x->prevf & LINK_MASK) | (uint32_t)(f & 0xFu) << LINK_BITS;
}

static void lru_unlink(kvg_prefix_index *idx, wslot *w, uint32_t n)
{
    node *x = &idx->nodes[n];
    uint32_t p = lru_prev(x), q = lru_next(x);
    if (p != NIL)
        set_next(&idx->nodes[p], q);
    else
        w->head = q;
    if (q != NIL)
        set_prev(&idx->nodes[q], p);
    else
        w->tail = p;
}

static void lru_push_front(kvg_prefix_index *idx, wslot *w, uint32_t n)
{
    node *x = &idx->nodes[n];
    set_prev(x, NIL);
    set_next(x, w->head);
    if (w->head != NIL)
        set_prev(&idx->nodes[w->head], n);
    else
        w->tail = n;
    w->head = n;
}

static void chain_unlink(kvg_prefix_index *idx, uint32_t n)
{
    uint32_t *link = &idx->buckets[bucket_of(idx, idx->nodes[n].key)];
    while (*link != n)
        link = &idx->nodes[*link].hnext;
    *link = idx->nodes[n].hnext;
}

static void node_release(kvg_prefix_index *idx, uint32_t n)
{
    idx->nodes[n].slot = FREE_SLOT;
    set_flags(&idx->nodes[n], 0);
    idx->nodes[n].hnext = idx->free_head;
    idx->free_head = n;
    idx->entries--;
}

/* The counters of a node of w about to be released (its speculative deadline, its CPU tier). */
static void node_forget(kvg_prefix_index *idx, wslot *w, uint32_t n)
{
    unsigned f = node_flags(&idx->nodes[n]);
    if (f & F_SPEC) {
        w->nspec--;
        idx->spec_entries--;
        idx->spec_dropped++;
    }
    if (f & F_CPU) {
        w->ncpu--;
        idx->cpu_entries--;
    }
}

/* The same for every node of w at once (it is being emptied). */
static void slot_forget(kvg_prefix_index *idx, wslot *w)
{
    idx->spec_entries -= w->nspec;
    idx->spec_dropped += w->nspec;
    idx->cpu_entries -= w->ncpu;
    w->nspec = w->ncpu = 0;
}

/* Drop a worker's least recently used entry (it has one). */
static void evict_lru(kvg_prefix_index *idx, wslot *w)
{
    uint32_t n = w->tail;
    node_forget(idx, w, n);
    lru_unlink(idx, w, n);
    chain_unlink(idx, n);
    node_release(idx, n);
    w->count--;
    idx->evictions++;
}

static uint32_t find_node(const kvg_prefix_index *idx, uint64_t key, uint32_t slot)
{
    for (uint32_t n = idx->buckets[bucket_of(idx, key)]; n != NIL; n = idx->nodes[n].hnext)
        if (idx->nodes[n].key == key && idx->nodes[n].slot == slot)
            return n;
    return NIL;
}

/* ---- speculative entries --------------------------------------------------------------------- */

static uint64_t monotonic_ms(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t index_now(const kvg_prefix_index *idx)
{
    return idx->clock_ms(idx->clock_arg);
}

/* Room for n more ring entries: doubles (never shrinks: the ring keeps its peak, 32 bytes per
 * speculative entry alive at once). 0 or -ENOMEM, with nothing changed. Write lock held. */
static int ring_reserve(kvg_prefix_index *idx, size_t n)
{
    if (idx->ring_cap - idx->ring_len >= n)
        return 0;
    size_t cap = idx->ring_cap ? idx->ring_cap : 64;
    while (cap - idx->ring_len < n) {
        if (cap > SIZE_MAX / 4 / sizeof(spec_ent))
            return -ENOMEM;
        cap *= 2;
    }
    spec_ent *r = malloc(cap * sizeof(*r));
    if (!r)
        return -ENOMEM;
    for (size_t i = 0; i < idx->ring_len; i++)
        r[i] = idx->ring[(idx->ring_head + i) & (idx->ring_cap - 1)];
    free(idx->ring);
    idx->ring = r;
    idx->ring_cap = cap;
    idx->ring_head = 0;
    return 0;
}

/* Make node n of slot s a speculative guess that expires at expiry; one ring entry must be
 * reserved. The slot's epoch tells this deadline from one set before the worker's guesses last
 * lost their deadlines (guesses_keep): an entry speculative, then a model entry, then
 * speculative again within one TTL keeps its second deadline. */
static void make_spec(kvg_prefix_index *idx, wslot *w, uint32_t s, uint32_t n, uint64_t expiry)
{
    node *x = &idx->nodes[n];
    unsigned f = node_flags(x);
    if (!(f & F_SPEC)) {
        w->nspec++;
        idx->spec_entries++;
    }
    set_flags(x, (f & F_TIERS) | F_GUESS | F_SPEC);
    /* Deadlines never go backwards in the ring (two records' clock readings may land in the
     * other order than their locks): a sweep from the head then never stops early. */
    if (idx->ring_len) {
        uint64_t last =
            idx->ring[(idx->ring_head + idx->ring_len - 1) & (idx->ring_cap - 1)].expiry_ms;
        expiry = KVG_MAX(expiry, last);
    }
    idx->ring[(idx->ring_head + idx->ring_len++) & (idx->ring_cap - 1)] =
        (spec_ent){.key = x->key, .expiry_ms = expiry, .node = n, .slot = s, .epoch = w->epoch};
    idx->spec_inserted++;
}

/* A BlockStored names the entry: it is the engine's word now, no longer a guess. */
static void confirm(kvg_prefix_index *idx, wslot *w, node *x)
{
    unsigned f = node_flags(x);
    if (f & F_SPEC) {
        w->nspec--;
        idx->spec_entries--;
        idx->spec_confirmed++;
    }
    set_flags(x, f & ~(F_SPEC | F_GUESS));
}

/* Whether ring entry e is the live deadline of its node. */
static bool ring_matches(const kvg_prefix_index *idx, const spec_ent *e)
{
    if (e->node >= idx->pool_used)
        return false;
    const node *x = &idx->nodes[e->node];
    return x->slot == e->slot && x->key == e->key && (node_flags(x) & F_SPEC) &&
           idx->slots[e->slot].epoch == e->epoch;
}

/* Drop the speculative entries whose deadline is not after now, taking at most max ring entries
 * (stale ones, whose node was confirmed, removed or reused meanwhile, are just dropped). The
 * ring entries taken. Write lock held. */
static size_t sweep_ring(kvg_prefix_index *idx, uint64_t now, size_t max)
{
    size_t done = 0;
    while (idx->ring_len && done < max) {
        spec_ent e = idx->ring[idx->ring_head];
        if (e.expiry_ms > now)
            break;
        idx->ring_head = (idx->ring_head + 1) & (idx->ring_cap - 1);
        idx->ring_len--;
        done++;
        if (!ring_matches(idx, &e))
            continue;
        wslot *w = &idx->slots[e.slot];
        node_forget(idx, w, e.node);
        idx->spec_dropped--; /* counted as expired, not dropped */
        idx->spec_expired++;
        lru_unlink(idx, w, e.node);
        chain_unlink(idx, e.node);
        node_release(idx, e.node);
        w->count--;
    }
    return done;
}

/* Relink every live node into a fresh bucket array of 1 << bits heads. */
static void rehash_into(kvg_prefix_index *idx, uint32_t *buckets, unsigned bits)
{
    memset(buckets, 0xff, sizeof(*buckets) << bits);
    idx->buckets = buckets;
    idx->bucket_bits = bits;
    for (uint32_t n = 0; n < idx->pool_used; n++) {
        node *x = &idx->nodes[n];
        if (x->slot == FREE_SLOT)
            continue;
        uint32_t b = bucket_of(idx, x->key);
        x->hnext = buckets[b];
        buckets[b] = n;
    }
}

/* Double the pool (up to max_entries) and grow the buckets to keep the load factor <= 1.
 * The free list is empty when this is called (it links through hnext, which rehashing
 * rewrites). 0 or -ENOMEM, with nothing changed. */
static int pool_grow(kvg_prefix_index *idx)
{
    uint64_t want = (uint64_t)idx->pool_cap * 2;
    if (want > idx->max_entries)
        want = idx->max_entries;
    uint32_t cap = (uint32_t)want;
    unsigned bits = bits_for(cap, MIN_BUCKET_BITS);
    uint32_t *buckets = NULL;
    if (bits != idx->bucket_bits) {
        buckets = malloc(sizeof(*buckets) << bits);
        if (!buckets)
            return -ENOMEM;
    }
    node *nodes = realloc(idx->nodes, sizeof(*nodes) * cap);
    if (!nodes) {
        free(buckets);
        return -ENOMEM;
    }
    idx->nodes = nodes;
    idx->pool_cap = cap;
    if (buckets) {
        free(idx->buckets);
        rehash_into(idx, buckets, bits);
    }
    return 0;
}

/* A node for a new entry of slot s: reuses the worker's own LRU entry when the index is at
 * max_entries. NIL when there is no room (the worker holds nothing to give up), -ENOMEM
 * in *rc when the pool could not grow. */
static uint32_t node_alloc(kvg_prefix_index *idx, wslot *w, int *rc)
{
    if (idx->entries >= idx->max_entries) {
        if (w->count == 0)
            return NIL;
        evict_lru(idx, w);
    }
    if (idx->free_head == NIL && idx->pool_used == idx->pool_cap) {
        int r = pool_grow(idx);
        if (r < 0) {
            *rc = r;
            return NIL;
        }
    }
    uint32_t n;
    if (idx->free_head != NIL) {
        n = idx->free_head;
        idx->free_head = idx->nodes[n].hnext;
    } else {
        n = idx->pool_used++;
    }
    return n;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

int kvg_index_new(const kvg_index_config *cfg, kvg_prefix_index **out)
{
    kvg_index_config c = cfg ? *cfg : (kvg_index_config){0};
    if (!out)
        return -EINVAL;
    if (c.max_entries == 0)
        c.max_entries = DEFAULT_MAX_ENTRIES;
    if (c.default_capacity == 0)
        c.default_capacity = DEFAULT_CAPACITY;
    if (c.max_entries > MAX_ENTRIES_LIMIT)
        return -EINVAL;
    c.max_entries = KVG_MIN(c.max_entries, (uint64_t)LINK_MASK); /* see MAX_ENTRIES_LIMIT */
    if (c.speculative_ttl_ms == 0)
        c.speculative_ttl_ms = DEFAULT_SPECULATIVE_TTL_MS;

    kvg_prefix_index *idx = calloc(1, sizeof(*idx));
    if (!idx)
        return -ENOMEM;
    idx->max_entries = c.max_entries;
    idx->default_capacity = c.default_capacity;
    idx->free_head = NIL;
    idx->pool_cap = (uint32_t)KVG_MIN((uint64_t)INITIAL_POOL, c.max_entries);
    idx->bucket_bits = bits_for(idx->pool_cap, MIN_BUCKET_BITS);
    idx->id_bits = 1;
    idx->spec_ttl_ms = c.speculative_ttl_ms;
    idx->clock_ms = c.clock_ms ? c.clock_ms : monotonic_ms;
    idx->clock_arg = c.clock_arg;

    int rc = -ENOMEM;
    idx->nodes = malloc(sizeof(*idx->nodes) * idx->pool_cap);
    if (!idx->nodes)
        goto fail_nodes;
    idx->buckets = malloc(sizeof(*idx->buckets) << idx->bucket_bits);
    if (!idx->buckets)
        goto fail_buckets;
    memset(idx->buckets, 0xff, sizeof(*idx->buckets) << idx->bucket_bits);
    idx->ids = malloc(sizeof(*idx->ids) << idx->id_bits);
    if (!idx->ids)
        goto fail_ids;
    for (size_t i = 0; i < (size_t)1 << idx->id_bits; i++)
        idx->ids[i].slot = NIL;

    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr) != 0)
        goto fail_attr;
#if defined(__GLIBC__)
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int lrc = pthread_rwlock_init(&idx->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (lrc != 0) {
        rc = -lrc;
        goto fail_attr;
    }
    *out = idx;
    return 0;

fail_attr:
    free(idx->ids);
fail_ids:
    free(idx->buckets);
fail_buckets:
    free(idx->nodes);
fail_nodes:
    free(idx);
    return rc;
}

void kvg_index_free(kvg_prefix_index *idx)
{
    if (!idx)
        return;
    pthread_rwlock_destroy(&idx->lock);
    for (uint32_t s = 0; s < idx->nslots; s++)
        free(idx->slots[s].name);
    free(idx->slots);
    free(idx->order);
    free(idx->ids);
    free(idx->buckets);
    free(idx->nodes);
    free(idx->ring);
    free(idx);
}

/* ---- set_workers ----------------------------------------------------------------------------- */

/* Unlink every node whose slot is FREE_SLOT from the chains and put it on the free list:
 * one pass over the buckets, cheaper than unlinking removed nodes one by one (each a chain
 * walk) when a big worker leaves. */
static void sweep_dead(kvg_prefix_index *idx)
{
    size_t nb = (size_t)1 << idx->bucket_bits;
    for (size_t b = 0; b < nb; b++) {
        uint32_t *link = &idx->buckets[b];
        while (*link != NIL) {
            uint32_t n = *link;
            if (idx->nodes[n].slot != FREE_SLOT) {
                link = &idx->nodes[n].hnext;
                continue;
            }
            *link = idx->nodes[n].hnext;
            idx->nodes[n].hnext = idx->free_head;
            idx->free_head = n;
        }
    }
}

/* Free every entry of a worker that leaves the index. Marks its nodes; the caller sweeps. */
static void drop_worker(kvg_prefix_index *idx, wslot *w)
{
    slot_forget(idx, w);
    for (uint32_t n = w->head; n != NIL; n = lru_next(&idx->nodes[n])) {
        idx->nodes[n].slot = FREE_SLOT;
        set_flags(&idx->nodes[n], 0);
    }
    idx->entries -= w->count;
    free(w->name);
    *w = (wslot){.head = NIL, .tail = NIL, .epoch = w->epoch + 1};
}

int kvg_index_set_workers(kvg_prefix_index *idx, const kvg_index_worker *ws, size_t n)
{
    if (!ws && n)
        return -EINVAL;
    if (n > MAX_WORKERS)
        return -EINVAL;

    /* Everything that can fail is allocated before anything changes. */
    unsigned id_bits = bits_for((uint64_t)n * 2, 1);
    id_ent *ids = malloc(sizeof(*ids) << id_bits);
    uint32_t *order = malloc(sizeof(*order) * (n ? n : 1));
    char **names = calloc(n ? n : 1, sizeof(*names));
    int rc = -ENOMEM;
    if (!ids || !order || !names)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        const char *nm = ws[i].name ? ws[i].name : "";
        size_t len = strlen(nm);
        names[i] = malloc(len + 1);
        if (!names[i])
            goto fail;
        memcpy(names[i], nm, len + 1);
    }
    uint32_t id_mask = (UINT32_C(1) << id_bits) - 1;
    for (size_t i = 0; i < ((size_t)1 << id_bits); i++)
        ids[i].slot = NIL;

    pthread_rwlock_wrlock(&idx->lock);

    /* Map every listed id to its current slot (NIL when new), rejecting duplicates. The new
     * map's slot fields hold the list position for now. */
    for (size_t i = 0; i < n; i++) {
        uint32_t h = id_hash(ws[i].id, id_bits);
        while (ids[h].slot != NIL) {
            if (ids[h].id == ws[i].id) {
                rc = -EINVAL;
                goto fail_locked;
            }
            h = (h + 1) & id_mask;
        }
        ids[h] = (id_ent){.id = ws[i].id, .slot = (uint32_t)i};
    }
    /* Kept workers keep their slots; new ones fill the slots freed here, then new ones at the
     * end: at most max(nslots, n) slots. */
    uint32_t need = (uint32_t)KVG_MAX((size_t)idx->nslots, n);
    if (need > idx->nslots) {
        wslot *slots = realloc(idx->slots, sizeof(*slots) * need);
        if (!slots)
            goto fail_locked;
        for (uint32_t s = idx->nslots; s < need; s++)
            slots[s] = (wslot){.head = NIL, .tail = NIL};
        idx->slots = slots;
        idx->nslots = need;
    }

    /* From here on nothing fails. Drop the workers that are not listed. */
    bool dropped = false;
    for (uint32_t s = 0; s < idx->nslots; s++) {
        wslot *w = &idx->slots[s];
        if (!w->live)
            continue;
        uint32_t h = id_hash(w->id, id_bits);
        while (ids[h].slot != NIL && ids[h].id != w->id)
            h = (h + 1) & id_mask;
        if (ids[h].slot != NIL)
            continue;
        dropped |= w->count > 0;
        drop_worker(idx, w);
    }
    if (dropped)
        sweep_dead(idx);

    uint32_t next_free = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = id_find(idx, ws[i].id);
        if (s == NIL || !idx->slots[s].live || idx->slots[s].id != ws[i].id) {
            while (idx->slots[next_free].live)
                next_free++;
            s = next_free;
            idx->slots[s] = (wslot){.id = ws[i].id,
                                    .head = NIL,
                                    .tail = NIL,
                                    .live = true,
                                    .epoch = idx->slots[s].epoch + 1};
        }
        wslot *w = &idx->slots[s];
        free(w->name);
        w->name = names[i];
        names[i] = NULL;
        w->capacity = ws[i].capacity ? ws[i].capacity : idx->default_capacity;
        while (w->count > w->capacity)
            evict_lru(idx, w);
        order[i] = s;
        uint32_t h = id_hash(ws[i].id, id_bits);
        while (ids[h].id != ws[i].id)
            h = (h + 1) & id_mask;
        ids[h].slot = s;
    }
    free(idx->ids);
    idx->ids = ids;
    idx->id_bits = id_bits;
    free(idx->order);
    idx->order = order;
    idx->nworkers = (uint32_t)n;
    if (idx->horizon)
        fresh_rebase(idx); /* under the old horizon, before it changes */
    idx->horizon = KVG_MAX(capacity_sum(idx), (uint64_t)1);
    pthread_rwlock_unlock(&idx->lock);
    free(names);
    return 0;

fail_locked:
    pthread_rwlock_unlock(&idx->lock);
fail:
    if (names)
        for (size_t i = 0; i < n; i++)
            free(names[i]);
    free(names);
    free(order);
    free(ids);
    return rc;
}

/* ---- lookup ---------------------------------------------------------------------------------- */

/* Per-call map from a worker slot to the position of its id in the request. */
typedef struct slot_pos {
    uint32_t slot; /* NIL: empty */
    uint32_t pos;
} slot_pos;

static inline uint32_t slot_pos_find(const slot_pos *tab, uint32_t mask, uint32_t slot)
{
    /* Slots are small dense integers: the low bits are a perfect hash until the table wraps. */
    for (uint32_t h = slot & mask;; h = (h + 1) & mask) {
        if (tab[h].slot == slot)
            return tab[h].pos;
        if (tab[h].slot == NIL)
            return NIL;
    }
}

/* Levels of match_batch's bisection: one bitset each (log2 of the longest chain, plus one). */
#define BISECT_LEVELS 34
/* Ranges this short are walked key by key. */
#define BISECT_LINEAR 8

/* What match_batch's bisection shares between its levels. */
typedef struct bisect {
    const kvg_prefix_index *idx;
    const uint64_t *keys;
    const slot_pos *tab;
    uint32_t mask;
    size_t words;
    uint32_t *matched;
} bisect;

/* Into out: the requested positions whose slot holds keys[d]. */
static void holders_at(const bisect *b, size_t d, uint64_t *out)
{
    const kvg_prefix_index *idx = b->idx;
    uint64_t k = b->keys[d];
    memset(out, 0, b->words * sizeof(*out));
    for (uint32_t x = idx->buckets[bucket_of(idx, k)]; x != NIL; x = idx->nodes[x].hnext) {
        const node *nd = &idx->nodes[x];
        if (nd->key != k)
            continue;
        uint32_t p = slot_pos_find(b->tab, b->mask, nd->slot);
        if (p != NIL)
            out[p / 64] |= UINT64_C(1) << (p % 64);
    }
}

/* Given hi_set (those holding keys[hi], or none when hi is the chain's end) within lo_set (those
 * holding keys[lo]), give every position of lo_set \ hi_set its depth, which lies in (lo, hi].
 * Holder sets shrink along a chain (what a worker holds of it is a prefix), so where the two
 * sets are equal nothing ends in between and the range is skipped: a popular opening held by
 * every worker costs a few probes, not one per key per worker. scratch has a bitset for each
 * level below. */
static void bisect_range(const bisect *b, size_t lo, size_t hi, const uint64_t *lo_set,
                         const uint64_t *hi_set, uint64_t *scratch)
{
    bool same = true;
    for (size_t w = 0; w < b->words && same; w++)
        same = lo_set[w] == hi_set[w];
    if (same)
        return;
    if (hi - lo <= BISECT_LINEAR) {
        /* A short range: key by key, as many probes as the bisection would make at most, and
         * none repeated (depths that all differ would make the bisection probe most keys of
         * the range several times). */
        uint64_t *cur = scratch, *next = scratch + b->words;
        memcpy(cur, lo_set, b->words * sizeof(*cur));
        for (size_t d = lo + 1; d < hi; d++) {
            holders_at(b, d, next);
            bool rest = false; /* anyone left beyond hi_set? */
            for (size_t w = 0; w < b->words; w++) {
                next[w] = (next[w] & cur[w]) | hi_set[w];
                for (uint64_t end = cur[w] & ~next[w]; end; end &= end - 1)
                    b->matched[w * 64 + (size_t)__builtin_ctzll(end)] = (uint32_t)d;
                cur[w] = next[w];
                rest |= (cur[w] & ~hi_set[w]) != 0;
            }
            if (!rest)
                return;
        }
        for (size_t w = 0; w < b->words; w++)
            for (uint64_t end = cur[w] & ~hi_set[w]; end; end &= end - 1)
                b->matched[w * 64 + (size_t)__builtin_ctzll(end)] = (uint32_t)hi;
        return;
    }
    size_t mid = lo + (hi - lo) / 2;
    uint64_t *mid_set = scratch;
    holders_at(b, mid, mid_set);
    /* Kept between its neighbours, so that keys that are not a chain still give bounded
     * answers (a holder of keys[mid] that lacks keys[lo] does not count). */
    for (size_t w = 0; w < b->words; w++)
        mid_set[w] = (mid_set[w] & lo_set[w]) | hi_set[w];
    bisect_range(b, lo, mid, lo_set, mid_set, scratch + b->words);
    bisect_range(b, mid, hi, mid_set, hi_set, scratch + b->words);
}

/* Match up to HEAP_WORKERS requested ids when more than a few hold keys[0]. The caller holds
 * the read lock. tab has 1 << bits entries (1 << bits >= 2n); scratch has
 * (BISECT_LEVELS + 2) x (n + 63) / 64 words. Ids listed twice are matched once and copied. */
static void match_batch(const kvg_prefix_index *idx, const uint64_t *keys, size_t nkeys,
                        const uint64_t *ids, size_t n, uint32_t *matched, slot_pos *tab,
                        unsigned bits, uint64_t *scratch)
{
    uint32_t mask = (UINT32_C(1) << bits) - 1;
    size_t words = (n + 63) / 64;
    memset(tab, 0xff, sizeof(*tab) << bits);
    bool dups = false;
    for (size_t p = 0; p < n; p++) {
        matched[p] = 0;
        uint32_t s = id_find(idx, ids[p]);
        if (s == NIL)
            continue;
        uint32_t h = s & mask;
        while (tab[h].slot != NIL && tab[h].slot != s)
            h = (h + 1) & mask;
        if (tab[h].slot == s) {
            dups = true;
            continue;
        }
        tab[h] = (slot_pos){.slot = s, .pos = (uint32_t)p};
    }

    /* Those holding keys[0], then the bisection of (0, nkeys] against "nobody holds the key
     * past the end". */
    bisect b = {idx, keys, tab, mask, words, matched};
    uint64_t *first = scratch, *none = scratch + words;
    holders_at(&b, 0, first);
    memset(none, 0, words * sizeof(*none));
    bisect_range(&b, 0, nkeys, first, none, scratch + 2 * words);

    if (!dups)
        return;
    for (size_t p = 0; p < n; p++) {
        uint32_t s = id_find(idx, ids[p]);
        if (s != NIL)
            matched[p] = matched[slot_pos_find(tab, mask, s)];
    }
}

/* Leading keys slot s holds, given that it holds keys[0]. What a slot holds of one key chain is
 * a prefix of it: key i + 1 is only ever recorded together with key i, a record touches its
 * keys last to first (key i ends more recent than key i + 1) and eviction takes the least
 * recent. So the end is found by doubling steps and then bisection, in 2 log2(n) probes rather
 * than n (a 4096-key prompt: 24 instead of 4096). Where the rule is broken for a moment (a long
 * record between its lock batches, or one cut short by memory) a gap can be stepped over: the
 * keys past it are ones the worker has just been sent, so the answer errs towards the truth. */
static uint32_t depth_of(const kvg_prefix_index *idx, const uint64_t *keys, size_t nkeys,
                         uint32_t s)
{
    size_t lo = 1, hi = nkeys; /* keys[0..lo) held; keys[hi] not (hi < nkeys) */
    for (size_t step = 1; lo < nkeys; step *= 2) {
        size_t probe = KVG_MIN(lo + step, nkeys) - 1;
        if (find_node(idx, keys[probe], s) == NIL) {
            hi = probe;
            break;
        }
        lo = probe + 1;
    }
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (find_node(idx, keys[mid], s) != NIL)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (uint32_t)lo;
}

/* The common cases without mapping every requested id to a slot: nobody holds keys[0] (a cold
 * request: one bucket walk), or a few workers do (walk each one's chain, then find its
 * positions in the request by comparing ids). Same answers as match_batch; false when more
 * than FEW_HOLDERS workers hold keys[0] (match_batch's shared walk is then cheaper). The
 * caller holds the read lock. */
#define FEW_HOLDERS 8
static inline __attribute__((always_inline)) bool match_few(const kvg_prefix_index *idx,
                                                            const uint64_t *keys, size_t nkeys,
                                                            const uint64_t *ids, size_t n,
                                                            uint32_t *matched)
{
    uint32_t holders[FEW_HOLDERS];
    size_t h = 0;
    uint64_t k0 = keys[0];
    for (uint32_t x = idx->buckets[bucket_of(idx, k0)]; x != NIL; x = idx->nodes[x].hnext) {
        if (idx->nodes[x].key != k0)
            continue;
        if (h == FEW_HOLDERS)
            return false;
        holders[h++] = idx->nodes[x].slot; /* one node per (key, slot): no repeats */
    }
    memset(matched, 0, n * sizeof(*matched));
    for (size_t j = 0; j < h; j++) {
        uint64_t id = idx->slots[holders[j]].id;
        uint32_t depth = 0;
        for (size_t p = 0; p < n; p++) {
            if (ids[p] != id)
                continue;
            if (!depth)
                depth = depth_of(idx, keys, nkeys, holders[j]);
            matched[p] = depth;
        }
    }
    return true;
}

/* Of the depth leading keys slot s holds, how many it holds on the GPU. Bisection, trusting
 * that what a worker holds on its GPU of a chain is a prefix of it, as for its depth. Read lock
 * held. */
static uint32_t gpu_depth_of(const kvg_prefix_index *idx, const uint64_t *keys, uint32_t depth,
                             uint32_t s)
{
    uint32_t lo = 0, hi = depth; /* keys[0..lo) on the GPU; keys[hi] not (hi < depth) */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint32_t n = find_node(idx, keys[mid], s);
        if (n != NIL && (node_flags(&idx->nodes[n]) & F_GPU))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The GPU depths, once matched[] holds the depths on any tier: false (gpu not written) when
 * they are the same, as while no engine reports another tier. Read lock held. */
static bool match_gpu(const kvg_prefix_index *idx, const uint64_t *keys, const uint64_t *worker_ids,
                      size_t nworkers, const uint32_t *matched, uint32_t *gpu)
{
    if (!gpu || __builtin_expect(!idx->cpu_entries, 1))
        return false;
    bool differ = false;
    for (size_t p = 0; p < nworkers; p++) {
        uint32_t s = matched[p] ? id_find(idx, worker_ids[p]) : NIL;
        gpu[p] =
            s == NIL || !idx->slots[s].ncpu ? matched[p] : gpu_depth_of(idx, keys, matched[p], s);
        differ |= gpu[p] != matched[p];
    }
    return differ;
}

/* Both lookups: inlined into each, so that kvg_index_match pays nothing for the tiers. */
static inline __attribute__((always_inline)) bool
match_tiers(kvg_prefix_index *idx, const uint64_t *keys, size_t nkeys, const uint64_t *worker_ids,
            size_t nworkers, uint32_t *matched, uint32_t *matched_gpu)
{
    if (nworkers == 0)
        return false;
    if (nkeys > UINT32_MAX)
        nkeys = UINT32_MAX;
    if (nkeys == 0) {
        memset(matched, 0, nworkers * sizeof(*matched));
        return false;
    }
    /* One read hold for the whole answer, so both paths see the same state. */
    pthread_rwlock_rdlock(&idx->lock);
    if (match_few(idx, keys, nkeys, worker_ids, nworkers, matched)) {
        bool differ = match_gpu(idx, keys, worker_ids, nworkers, matched, matched_gpu);
        pthread_rwlock_unlock(&idx->lock);
        return differ;
    }

    slot_pos stack_tab[2 * STACK_WORKERS];
    uint64_t stack_scratch[(BISECT_LEVELS + 2) * (STACK_WORKERS / 64)];
    slot_pos *tab = stack_tab;
    uint64_t *scratch = stack_scratch;
    size_t batch = STACK_WORKERS;
    void *heap = NULL;
    if (nworkers > STACK_WORKERS) {
        /* Without the memory, smaller batches on the stack give the same answer, slower. */
        size_t b = KVG_MIN(nworkers, (size_t)HEAP_WORKERS);
        size_t words = (b + 63) / 64;
        unsigned bits = bits_for(2 * b, 1);
        heap = malloc((sizeof(*tab) << bits) + (BISECT_LEVELS + 2) * words * sizeof(*scratch));
        if (heap) {
            tab = heap;
            scratch = (uint64_t *)(void *)(tab + ((size_t)1 << bits));
            batch = b;
        }
    }

    for (size_t off = 0; off < nworkers; off += batch) {
        size_t m = KVG_MIN(batch, nworkers - off);
        match_batch(idx, keys, nkeys, worker_ids + off, m, matched + off, tab, bits_for(2 * m, 1),
                    scratch);
    }
    bool differ = match_gpu(idx, keys, worker_ids, nworkers, matched, matched_gpu);
    pthread_rwlock_unlock(&idx->lock);
    free(heap);
    return differ;
}

void kvg_index_match(kvg_prefix_index *idx, const uint64_t *keys, size_t nkeys,
                     const uint64_t *worker_ids, size_t nworkers, uint32_t *matched)
{
    match_tiers(idx, keys, nkeys, worker_ids, nworkers, matched, NULL);
}

bool kvg_index_match_tiers(kvg_prefix_index *idx, const uint64_t *keys, size_t nkeys,
                           const uint64_t *worker_ids, size_t nworkers, uint32_t *matched,
                           uint32_t *matched_gpu)
{
    return match_tiers(idx, keys, nkeys, worker_ids, nworkers, matched, matched_gpu);
}

/* ---- recording ------------------------------------------------------------------------------- */

/* How many of keys[0..] are the worker's most recent entries, in this order (at most max),
 * with their nodes into nodes[] when it is not NULL: a walk of the LRU list from its head,
 * where a key probe would cost a hash-bucket miss. The caller holds the lock. */
static size_t recent_run(const kvg_prefix_index *idx, const wslot *w, const uint64_t *keys,
                         size_t max, uint32_t *nodes)
{
    size_t j = 0;
    for (uint32_t x = w->head; j < max && x != NIL; x = idx->nodes[x].next, j++) {
        if (idx->nodes[x].key != keys[j])
            break;
        if (nodes)
            nodes[j] = x;
    }
    return j;
}

/* Nodes a record remembers from its recent_run (the stack it can spare). */
#define RECORD_RUN 512

/* Turnover. A worker's entries added lately: each entry added anywhere in the index ages the
 * sum by exp(-1 / horizon), so an entry counts fully while the fleet adds few others and has
 * faded to 1/e once the fleet has added as many entries as all workers hold together: a count
 * over the fleet's own residence time, with no clock. Over the worker's capacity it says how
 * fast the worker's cache turns over (docs/admin-api.md, turnover_cost_per_block).
 *
 * Kept as forward decay (Cormode et al. 2009): a slot's fresh is its count as of fresh_base, an
 * entry added at t counts exp((t - fresh_base) / horizon), and the count now is fresh x
 * exp(-(inserts - fresh_base) / horizon): one exp per decision, whatever the number of
 * workers, where decaying each slot would take one per worker. fresh_rebase brings every slot
 * to the present before the factors grow large (and before the horizon changes). */
#define FRESH_REBASE 32.0 /* horizons between rebases: e^32 ~ 8e13 keeps doubles exact enough */

static double fresh_age(const kvg_prefix_index *idx)
{
    return (double)(idx->inserts - idx->fresh_base) / (double)idx->horizon;
}

/* Write lock held. */
static void fresh_rebase(kvg_prefix_index *idx)
{
    double decay = exp(-fresh_age(idx));
    for (uint32_t i = 0; i < idx->nslots; i++)
        idx->slots[i].fresh *= decay;
    idx->fresh_base = idx->inserts;
}

/* Write lock held; added entries were just added to w (idx->inserts counts them). */
static void fresh_add(kvg_prefix_index *idx, wslot *w, uint64_t added)
{
    if (!added)
        return;
    if (fresh_age(idx) > FRESH_REBASE)
        fresh_rebase(idx);
    w->fresh += (double)added * exp(fresh_age(idx));
}

void kvg_index_turnover(kvg_prefix_index *idx, const uint64_t *worker_ids, size_t n, float *out)
{
    pthread_rwlock_rdlock(&idx->lock);
    double decay = exp(-fresh_age(idx));
    for (size_t i = 0; i < n; i++) {
        uint32_t s = id_find(idx, worker_ids[i]);
        const wslot *w = s == NIL ? NULL : &idx->slots[s];
        out[i] = w && w->capacity ? (float)(w->fresh * decay / w->capacity) : 0.0f;
    }
    pthread_rwlock_unlock(&idx->lock);
}

/* Who says the worker holds a key (touch_key). */
typedef enum touch_by {
    BY_RECORD, /* the gateway's record, a model entry (sources model, events_stale) */
    BY_SPEC,   /* the gateway's record, speculative (source events): expires at the deadline */
    BY_GPU,    /* a BlockStored on the GPU (medium GPU or absent) */
    BY_CPU,    /* a BlockStored on another tier (CPU, or a connector's disk) */
} touch_by;

/* Make key the worker's most recent entry, adding it when it is new (evicting the worker's
 * least recent one beyond its capacity). A record never changes a held entry's flags (what the
 * engine confirmed stays confirmed, and a guess keeps its first deadline: a burst that keeps
 * re-recording a prefix the engine never confirms, e.g. keys that do not match its own, must
 * not keep it alive); a BlockStored confirms it and adds its tier. A store on another tier does
 * not move a held entry in the LRU (offloading a block is not using it). 1 added, 0 it was
 * held, -1 no room (the worker holds nothing to give up at max_entries, or -ENOMEM into *rc).
 * Write lock held. */
static int touch_key(kvg_prefix_index *idx, wslot *w, uint32_t s, uint64_t k, int *rc, touch_by by,
                     uint64_t expiry)
{
    uint32_t n = find_node(idx, k, s);
    if (n != NIL) {
        node *x = &idx->nodes[n];
        if (by == BY_GPU) {
            confirm(idx, w, x);
            set_flags(x, node_flags(x) | F_GPU);
        } else if (by == BY_CPU) {
            /* The gateway guessed the GPU; the engine speaks of another tier only. */
            if (node_flags(x) & F_GUESS)
                set_flags(x, node_flags(x) & ~F_GPU);
            confirm(idx, w, x);
            if (!(node_flags(x) & F_CPU)) {
                set_flags(x, node_flags(x) | F_CPU);
                w->ncpu++;
                idx->cpu_entries++;
            }
            return 0;
        }
        if (w->head != n) {
            lru_unlink(idx, w, n);
            lru_push_front(idx, w, n);
        }
        return 0;
    }
    if (by == BY_SPEC && ring_reserve(idx, 1) < 0) {
        *rc = -ENOMEM;
        return -1;
    }
    /* Evicting before inserting reuses the node at once; the result is the same as
     * inserting and then trimming the tail, since the new entry is the most recent. */
    if (w->count >= w->capacity)
        evict_lru(idx, w);
    n = node_alloc(idx, w, rc);
    if (n == NIL)
        return -1;
    node *x = &idx->nodes[n];
    uint32_t b = bucket_of(idx, k);
    x->key = k;
    x->slot = s;
    set_flags(x, by == BY_CPU ? F_CPU : by == BY_RECORD ? F_GPU | F_GUESS : F_GPU);
    x->hnext = idx->buckets[b];
    idx->buckets[b] = n;
    lru_push_front(idx, w, n);
    w->count++;
    idx->entries++;
    idx->inserts++;
    if (by == BY_SPEC)
        make_spec(idx, w, s, n, expiry);
    if (by == BY_CPU) {
        w->ncpu++;
        idx->cpu_entries++;
    }
    return 1;
}

int kvg_index_record(kvg_prefix_index *idx, uint64_t worker_id, const uint64_t *keys, size_t nkeys)
{
    if (!keys && nkeys)
        return -EINVAL;
    /* A request sent again to the worker that just answered it (the same prompt, a retry): its
     * keys are already the worker's most recent entries in order, and recording them would
     * change nothing. One walk under the read lock finds that, without the write lock. */
    pthread_rwlock_rdlock(&idx->lock);
    uint32_t s = id_find(idx, worker_id);
    bool unchanged = s != NIL && recent_run(idx, &idx->slots[s], keys, nkeys, NULL) == nkeys;
    pthread_rwlock_unlock(&idx->lock);
    if (unchanged)
        return 0;

    uint64_t now = index_now(idx);
    pthread_rwlock_wrlock(&idx->lock);
    /* Deadlines passed since the last sweep go first (a bounded share; kvg_index_expire from
     * the consumer's loop takes the rest), so a stale guess does not outlive its TTL by much
     * on a gateway whose consumer is idle. */
    sweep_ring(idx, now, SWEEP_PER_RECORD + nkeys);
    s = id_find(idx, worker_id);
    if (s == NIL) {
        pthread_rwlock_unlock(&idx->lock);
        return KVG_ENOTFOUND;
    }
    wslot *w = &idx->slots[s];
    int rc = 0;
    uint64_t expiry = now + idx->spec_ttl_ms;
    /* A conversation's next turn: its opening keys[0..run) are the worker's most recent entries
     * already, in order. The keys after them are recorded as usual, and then those nodes are
     * moved to the front directly, without probing for them: the same result, provided that
     * nothing evicts them meanwhile (no eviction can happen: room checked) and the lock is
     * held throughout (fewer than RECORD_BATCH keys to record). */
    uint64_t added = 0; /* entries added to w since fresh_add last counted them */
    uint32_t run_nodes[RECORD_RUN];
    size_t run = recent_run(idx, w, keys, KVG_MIN(nkeys, (size_t)RECORD_RUN), run_nodes);
    size_t fresh = nkeys - run;
    if (fresh > RECORD_BATCH || w->count + fresh > w->capacity ||
        idx->entries + fresh > idx->max_entries)
        run = 0;
    /* Last to first: keys[0] ends the most recently used. */
    for (size_t i = nkeys; i-- > run;) {
        /* A long new prompt costs ~0.3 us a key on a large index: let the lookups of every
         * other thread in between every RECORD_BATCH keys rather than stall them for a
         * millisecond. Readers then see the chain's tail before its head, which matches
         * nothing (matches are leading keys) until the head lands: never a false hit. */
        if (i + 1 < nkeys && (nkeys - 1 - i) % RECORD_BATCH == 0) {
            fresh_add(idx, w, added);
            added = 0;
            pthread_rwlock_unlock(&idx->lock);
            pthread_rwlock_wrlock(&idx->lock);
            s = id_find(idx, worker_id); /* set_workers may have run meanwhile */
            if (s == NIL) {
                pthread_rwlock_unlock(&idx->lock);
                return KVG_ENOTFOUND;
            }
            w = &idx->slots[s];
        }
        touch_by by = w->source == KVG_INDEX_SOURCE_EVENTS ? BY_SPEC : BY_RECORD;
        /* As in the lookup: the keys ahead are independent probes, start their misses now. */
        if (i >= 2 * PREFETCH_AHEAD)
            __builtin_prefetch(&idx->buckets[bucket_of(idx, keys[i - 2 * PREFETCH_AHEAD])]);
        if (i >= PREFETCH_AHEAD) {
            uint32_t h = idx->buckets[bucket_of(idx, keys[i - PREFETCH_AHEAD])];
            if (h != NIL)
                __builtin_prefetch(&idx->nodes[h]);
        }
        int t = touch_key(idx, w, s, keys[i], &rc, by, expiry);
        if (t < 0) {
            run = 0; /* the keys before this one stay as they were */
            break;
        }
        added += (uint64_t)t;
    }
    fresh_add(idx, w, added);
    for (size_t t = run; t-- > 0;) {
        if (w->head != run_nodes[t]) {
            lru_unlink(idx, w, run_nodes[t]);
            lru_push_front(idx, w, run_nodes[t]);
        }
    }
    pthread_rwlock_unlock(&idx->lock);
    return rc;
}

/* ---- engine events: removal, clearing, applying a batch ------------------------------------ */

/* The worker no longer holds key on the tiers given (F_GPU, F_CPU or both): true when it held
 * it on one of them. The entry goes when no tier is left. Write lock held. One walk of the
 * key's bucket finds the node and the link to it. */
static bool remove_key(kvg_prefix_index *idx, wslot *w, uint32_t s, uint64_t key, unsigned tiers)
{
    uint32_t *link = &idx->buckets[bucket_of(idx, key)];
    for (uint32_t n; (n = *link) != NIL; link = &idx->nodes[n].hnext) {
        node *x = &idx->nodes[n];
        if (x->key == key && x->slot == s) {
            unsigned f = node_flags(x);
            if (!(f & tiers))
                return false;
            if (f & F_TIERS & ~tiers) { /* still held on another tier */
                if (tiers & F_CPU) {
                    w->ncpu--;
                    idx->cpu_entries--;
                }
                set_flags(x, f & ~tiers);
                return true;
            }
            node_forget(idx, w, n);
            *link = x->hnext;
            lru_unlink(idx, w, n);
            node_release(idx, n);
            w->count--;
            return true;
        }
    }
    return false;
}

/* Drop every entry of a worker that stays listed. Node by node (each a short chain walk at a
 * load factor <= 1) rather than drop_worker's mark and sweep of every bucket: an engine
 * restart costs its own entries, not the whole index's. Write lock held. */
static void clear_slot(kvg_prefix_index *idx, wslot *w)
{
    slot_forget(idx, w);
    for (uint32_t n = w->head, next; n != NIL; n = next) {
        next = lru_next(&idx->nodes[n]);
        chain_unlink(idx, n);
        node_release(idx, n);
    }
    w->head = w->tail = NIL;
    w->count = 0;
}

/* Let the other threads in between two stretches of work, as kvg_index_record does every
 * RECORD_BATCH keys: the worker's slot is looked up again (set_workers may have run). NULL when
 * the worker left; the lock is then released. */
static wslot *relock(kvg_prefix_index *idx, uint64_t worker_id, uint32_t *s)
{
    pthread_rwlock_unlock(&idx->lock);
    pthread_rwlock_wrlock(&idx->lock);
    *s = id_find(idx, worker_id);
    if (*s == NIL) {
        pthread_rwlock_unlock(&idx->lock);
        return NULL;
    }
    return &idx->slots[*s];
}

int kvg_index_remove(kvg_prefix_index *idx, uint64_t worker_id, const uint64_t *keys, size_t nkeys,
                     uint64_t *removed)
{
    if (!keys && nkeys)
        return -EINVAL;
    uint64_t count = 0;
    pthread_rwlock_wrlock(&idx->lock);
    uint32_t s = id_find(idx, worker_id);
    if (s == NIL) {
        pthread_rwlock_unlock(&idx->lock);
        return KVG_ENOTFOUND;
    }
    wslot *w = &idx->slots[s];
    for (size_t i = 0; i < nkeys; i++) {
        if (i && i % RECORD_BATCH == 0 && !(w = relock(idx, worker_id, &s))) {
            if (removed)
                *removed = count;
            return KVG_ENOTFOUND;
        }
        count += remove_key(idx, w, s, keys[i], F_TIERS);
    }
    pthread_rwlock_unlock(&idx->lock);
    if (removed)
        *removed = count;
    return 0;
}

int kvg_index_clear_worker(kvg_prefix_index *idx, uint64_t worker_id)
{
    pthread_rwlock_wrlock(&idx->lock);
    uint32_t s = id_find(idx, worker_id);
    if (s == NIL) {
        pthread_rwlock_unlock(&idx->lock);
        return KVG_ENOTFOUND;
    }
    clear_slot(idx, &idx->slots[s]);
    pthread_rwlock_unlock(&idx->lock);
    return 0;
}

int kvg_index_apply_events(kvg_prefix_index *idx, uint64_t worker_id, const kvg_kv_batch *batch,
                           kvg_index_apply_stats *st)
{
    kvg_index_apply_stats acc = {0};
    if (!batch || (!batch->events && batch->nevents))
        return -EINVAL;
    int rc = 0;
    uint64_t added = 0; /* entries added to w since fresh_add last counted them */
    size_t work = 0;    /* keys handled since the lock was last taken */
    pthread_rwlock_wrlock(&idx->lock);
    uint32_t s = id_find(idx, worker_id);
    wslot *w = s == NIL ? NULL : &idx->slots[s];
    /* One hold of the lock for a batch of small events (the usual: a few blocks each); every
     * RECORD_BATCH keys, other threads get their turn. */
#define YIELD()                                                                                    \
    do {                                                                                           \
        if (++work >= RECORD_BATCH) {                                                              \
            fresh_add(idx, w, added);                                                              \
            added = 0;                                                                             \
            work = 0;                                                                              \
            if (!(w = relock(idx, worker_id, &s)))                                                 \
                goto gone;                                                                         \
        }                                                                                          \
    } while (0)
    if (!w)
        goto gone_locked;
    for (size_t e = 0; e < batch->nevents && rc == 0; e++) {
        const kvg_kv_event *ev = &batch->events[e];
        /* Tiers: the GPU (or no medium: engines before mediums), and every other one as the CPU
         * (an offloading connector's tier the engine loads from rather than recomputes). */
        bool gpu = ev->medium != KVG_KV_MEDIUM_CPU && ev->medium != KVG_KV_MEDIUM_OTHER;
        switch (ev->kind) {
        case KVG_KV_BLOCK_STORED:
            /* Chain order, recorded last to first as kvg_index_record does: the first block
             * ends the most recent, and a reader let in between two stretches sees a chain's
             * tail before its head, which matches nothing until the head lands. */
            for (size_t i = ev->nhashes; i-- > 0;) {
                YIELD();
                int t = touch_key(idx, w, s, ev->hashes[i], &rc, gpu ? BY_GPU : BY_CPU, 0);
                if (t < 0)
                    break; /* no room: the rest of this event is not recorded */
                added += (uint64_t)t;
                acc.stored++;
            }
            break;
        case KVG_KV_BLOCK_REMOVED:
            for (size_t i = 0; i < ev->nhashes; i++) {
                YIELD();
                acc.removed += remove_key(idx, w, s, ev->hashes[i], gpu ? F_GPU : F_CPU);
            }
            break;
        case KVG_KV_ALL_BLOCKS_CLEARED:
            work += w->count / 8; /* a clear is cheap per entry, but not free */
            clear_slot(idx, w);
            acc.cleared++;
            break;
        default:
            break;
        }
    }
#undef YIELD
    fresh_add(idx, w, added);
    pthread_rwlock_unlock(&idx->lock);
    if (st)
        *st = acc;
    return rc;
gone_locked:
    pthread_rwlock_unlock(&idx->lock);
gone:
    if (st)
        *st = acc;
    return KVG_ENOTFOUND;
}

/* ---- statistics and metrics ------------------------------------------------------------------ */

static uint64_t capacity_sum(const kvg_prefix_index *idx)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < idx->nworkers; i++)
        sum += idx->slots[idx->order[i]].capacity;
    return KVG_MIN(sum, idx->max_entries);
}

uint32_t kvg_index_default_capacity(const kvg_prefix_index *idx)
{
    return idx->default_capacity;
}

void kvg_index_stats_get(kvg_prefix_index *idx, kvg_index_stats *out)
{
    pthread_rwlock_rdlock(&idx->lock);
    *out = (kvg_index_stats){
        .entries = idx->entries,
        .capacity = capacity_sum(idx),
        .evictions = idx->evictions,
        .inserts = idx->inserts,
        .workers = idx->nworkers,
        .speculative = idx->spec_entries,
        .spec_inserted = idx->spec_inserted,
        .spec_confirmed = idx->spec_confirmed,
        .spec_expired = idx->spec_expired,
        .spec_dropped = idx->spec_dropped,
        .cpu_entries = idx->cpu_entries,
    };
    pthread_rwlock_unlock(&idx->lock);
}

/* Leaving events: the speculative guesses become model entries (the fallback keeps what the
 * gateway routed there). Their ring entries no longer match and go when their turn comes. */
static void guesses_keep(kvg_prefix_index *idx, wslot *w)
{
    if (!w->nspec)
        return;
    for (uint32_t n = w->head; n != NIL; n = lru_next(&idx->nodes[n]))
        set_flags(&idx->nodes[n], node_flags(&idx->nodes[n]) & ~F_SPEC);
    idx->spec_entries -= w->nspec;
    w->nspec = 0;
    w->epoch++; /* their ring entries are void: a new deadline may come before theirs */
}

/* Entering events: every guess (a model entry no BlockStored confirmed) gets a deadline, a
 * fresh TTL from now, so that what the engine does not confirm goes. Without the memory for
 * their ring entries the guesses go at once: the index then knows less than the engine, never
 * more. Walks the LRU list tail first so that the ring stays in deadline order whatever the
 * order (all deadlines are equal). */
static void guesses_expire(kvg_prefix_index *idx, wslot *w, uint32_t s, uint64_t expiry)
{
    uint64_t guesses = 0;
    for (uint32_t n = w->head; n != NIL; n = lru_next(&idx->nodes[n]))
        guesses += (node_flags(&idx->nodes[n]) & (F_GUESS | F_SPEC)) == F_GUESS;
    if (!guesses)
        return;
    bool room = ring_reserve(idx, guesses) == 0;
    for (uint32_t n = w->tail, prev; n != NIL; n = prev) {
        prev = lru_prev(&idx->nodes[n]);
        if ((node_flags(&idx->nodes[n]) & (F_GUESS | F_SPEC)) != F_GUESS)
            continue;
        if (room) {
            make_spec(idx, w, s, n, expiry);
            continue;
        }
        node_forget(idx, w, n);
        lru_unlink(idx, w, n);
        chain_unlink(idx, n);
        node_release(idx, n);
        w->count--;
    }
}

int kvg_index_set_source(kvg_prefix_index *idx, uint64_t worker_id, kvg_index_source src)
{
    if ((unsigned)src >= KVG_INDEX_SOURCE_COUNT)
        return -EINVAL;
    uint64_t now = index_now(idx);
    pthread_rwlock_wrlock(&idx->lock);
    uint32_t s = id_find(idx, worker_id);
    if (s != NIL) {
        wslot *w = &idx->slots[s];
        bool was = w->source == KVG_INDEX_SOURCE_EVENTS, is = src == KVG_INDEX_SOURCE_EVENTS;
        if (was && !is)
            guesses_keep(idx, w);
        else if (!was && is)
            guesses_expire(idx, w, s, now + idx->spec_ttl_ms);
        w->source = (uint8_t)src;
    }
    pthread_rwlock_unlock(&idx->lock);
    return s == NIL ? KVG_ENOTFOUND : 0;
}

uint64_t kvg_index_expire(kvg_prefix_index *idx, uint64_t now_ms)
{
    if (!now_ms)
        now_ms = index_now(idx);
    /* The usual poll finds nothing due: a read hold answers that. */
    pthread_rwlock_rdlock(&idx->lock);
    bool due = idx->ring_len && idx->ring[idx->ring_head].expiry_ms <= now_ms;
    pthread_rwlock_unlock(&idx->lock);
    if (!due)
        return 0;
    pthread_rwlock_wrlock(&idx->lock);
    uint64_t before = idx->spec_expired;
    /* Other threads get their turn every RECORD_BATCH ring entries. */
    while (sweep_ring(idx, now_ms, RECORD_BATCH) == RECORD_BATCH) {
        pthread_rwlock_unlock(&idx->lock);
        pthread_rwlock_wrlock(&idx->lock);
    }
    uint64_t expired = idx->spec_expired - before;
    pthread_rwlock_unlock(&idx->lock);
    return expired;
}

kvg_index_source kvg_index_get_source(kvg_prefix_index *idx, uint64_t worker_id)
{
    pthread_rwlock_rdlock(&idx->lock);
    uint32_t s = id_find(idx, worker_id);
    kvg_index_source src =
        s == NIL ? KVG_INDEX_SOURCE_MODEL : (kvg_index_source)idx->slots[s].source;
    pthread_rwlock_unlock(&idx->lock);
    return src;
}

const char *kvg_index_source_name(kvg_index_source src)
{
    static const char *const names[KVG_INDEX_SOURCE_COUNT] = {"model", "events", "events_stale"};
    return (unsigned)src < KVG_INDEX_SOURCE_COUNT ? names[src] : "unknown";
}

uint64_t kvg_index_worker_entries(kvg_prefix_index *idx, uint64_t worker_id)
{
    pthread_rwlock_rdlock(&idx->lock);
    uint32_t s = id_find(idx, worker_id);
    uint64_t count = s == NIL ? 0 : idx->slots[s].count;
    pthread_rwlock_unlock(&idx->lock);
    return count;
}

void kvg_index_write_metrics(kvg_prefix_index *idx, kvg_buf *out)
{
    /* Written under the read lock so the series agree with each other; this only holds back
     * recording for the time it takes to format a few lines per worker. */
    pthread_rwlock_rdlock(&idx->lock);
    kvg_prom_put_scalar_u64(out, "kvgate_index_entries", KVG_PROM_GAUGE,
                            "(worker, block) entries the prefix index holds.", idx->entries);
    kvg_prom_put_scalar_u64(out, "kvgate_index_capacity_entries", KVG_PROM_GAUGE,
                            "Entries the prefix index may hold: the sum of the workers' KV "
                            "capacities in blocks, capped by the index's own limit.",
                            capacity_sum(idx));
    kvg_prom_put_scalar_u64(out, "kvgate_index_evictions_total", KVG_PROM_COUNTER,
                            "Entries the prefix index evicted as least recently used to stay "
                            "within a worker's capacity or its own limit.",
                            idx->evictions);
    kvg_prom_put_scalar_u64(out, "kvgate_index_inserts_total", KVG_PROM_COUNTER,
                            "Entries added to the prefix index by recording what workers hold.",
                            idx->inserts);
    kvg_prom_put_scalar_u64(out, "kvgate_index_speculative_entries", KVG_PROM_GAUGE,
                            "Entries the gateway recorded for a worker whose KV events flow, "
                            "not yet confirmed by a BlockStored: they expire after the "
                            "speculative TTL.",
                            idx->spec_entries);
    kvg_prom_put_header(out, "kvgate_index_speculative_total", KVG_PROM_COUNTER,
                        "Speculative entries by outcome: inserted, confirmed by a BlockStored, "
                        "expired after the TTL, dropped otherwise (evicted, removed, cleared, "
                        "or the worker left); those made model entries when the worker's "
                        "events went stale are in none of the last four.");
    kvg_prom_put_u64(out, "kvgate_index_speculative_total",
                     KVG_PROM_LABELS({"outcome", "inserted"}), idx->spec_inserted);
    kvg_prom_put_u64(out, "kvgate_index_speculative_total",
                     KVG_PROM_LABELS({"outcome", "confirmed"}), idx->spec_confirmed);
    kvg_prom_put_u64(out, "kvgate_index_speculative_total", KVG_PROM_LABELS({"outcome", "expired"}),
                     idx->spec_expired);
    kvg_prom_put_u64(out, "kvgate_index_speculative_total", KVG_PROM_LABELS({"outcome", "dropped"}),
                     idx->spec_dropped);
    kvg_prom_put_scalar_u64(out, "kvgate_index_cpu_entries", KVG_PROM_GAUGE,
                            "Entries the engines hold on a CPU (or other offloading) tier, "
                            "whether or not on the GPU too.",
                            idx->cpu_entries);
    kvg_prom_put_header(out, "kvgate_index_worker_entries", KVG_PROM_GAUGE,
                        "Blocks the prefix index believes the worker holds.");
    for (uint32_t i = 0; i < idx->nworkers; i++) {
        const wslot *w = &idx->slots[idx->order[i]];
        kvg_prom_put_u64(out, "kvgate_index_worker_entries", KVG_PROM_LABELS({"worker", w->name}),
                         w->count);
    }
    kvg_prom_put_header(out, "kvgate_index_worker_source", KVG_PROM_GAUGE,
                        "Where the index learns what the worker holds: 1 for the current "
                        "source (model, events, events_stale).");
    for (uint32_t i = 0; i < idx->nworkers; i++) {
        const wslot *w = &idx->slots[idx->order[i]];
        for (unsigned src = 0; src < KVG_INDEX_SOURCE_COUNT; src++)
            kvg_prom_put_u64(
                out, "kvgate_index_worker_source",
                KVG_PROM_LABELS({"worker", w->name}, {"source", kvg_index_source_name(src)}),
                w->source == src);
    }
    pthread_rwlock_unlock(&idx->lock);
}

/* ---- self-check for tests -------------------------------------------------------------------- */

int kvg_index_check(kvg_prefix_index *idx)
{
    int rc = 0;
    pthread_rwlock_rdlock(&idx->lock);
    size_t nb = (size_t)1 << idx->bucket_bits;
    uint64_t chained = 0, counted = 0, spec_total = 0, cpu_total = 0;
    uint32_t live = 0;

    if (idx->pool_used > idx->pool_cap || (uint64_t)idx->pool_cap > idx->max_entries ||
        nb < idx->pool_cap) {
        rc = -1;
        goto out;
    }
    if (idx->entries > idx->max_entries) {
        rc = -2;
        goto out;
    }
    /* Chains: live nodes only, in their own bucket, each (key, slot) once. */
    for (size_t b = 0; b < nb; b++) {
        for (uint32_t n = idx->buckets[b]; n != NIL; n = idx->nodes[n].hnext) {
            const node *x = &idx->nodes[n];
            if (n >= idx->pool_used || ++chained > idx->pool_used) {
                rc = -3;
                goto out;
            }
            if (x->slot >= idx->nslots || !idx->slots[x->slot].live ||
                bucket_of(idx, x->key) != b) {
                rc = -4;
                goto out;
            }
            if (find_node(idx, x->key, x->slot) != n) {
                rc = -5;
                goto out;
            }
        }
    }
    if (chained != idx->entries) {
        rc = -6;
        goto out;
    }
    /* LRU lists: well linked, counts right, within capacity. */
    for (uint32_t s = 0; s < idx->nslots; s++) {
        const wslot *w = &idx->slots[s];
        if (!w->live) {
            if (w->count || w->head != NIL || w->tail != NIL) {
                rc = -7;
                goto out;
            }
            continue;
        }
        live++;
        uint64_t c = 0;
        uint32_t prev = NIL;
        for (uint32_t n = w->head; n != NIL; prev = n, n = lru_next(&idx->nodes[n])) {
            if (n >= idx->pool_used || idx->nodes[n].slot != s ||
                lru_prev(&idx->nodes[n]) != prev || ++c > w->count) {
                rc = -8;
                goto out;
            }
        }
        if (c != w->count || w->tail != prev || c > w->capacity || id_find(idx, w->id) != s) {
            rc = -9;
            goto out;
        }
        /* Flags: a tier each, a deadline only on a guess, the counters right. */
        uint64_t nspec = 0, ncpu = 0;
        for (uint32_t n = w->head; n != NIL; n = lru_next(&idx->nodes[n])) {
            unsigned f = node_flags(&idx->nodes[n]);
            if (!(f & F_TIERS) || ((f & F_SPEC) && !(f & F_GUESS))) {
                rc = -14;
                goto out;
            }
            nspec += (f & F_SPEC) != 0;
            ncpu += (f & F_CPU) != 0;
        }
        if (nspec != w->nspec || ncpu != w->ncpu ||
            (nspec && w->source != KVG_INDEX_SOURCE_EVENTS)) {
            rc = -15;
            goto out;
        }
        spec_total += nspec;
        cpu_total += ncpu;
        counted += c;
    }
    if (counted != idx->entries || live != idx->nworkers) {
        rc = -10;
        goto out;
    }
    if (spec_total != idx->spec_entries || cpu_total != idx->cpu_entries) {
        rc = -16;
        goto out;
    }
    /* The ring: in deadline order, and every speculative entry has its (matching) entry. */
    if (idx->ring_len > idx->ring_cap || (idx->ring_cap & (idx->ring_cap - 1))) {
        rc = -17;
        goto out;
    }
    uint64_t matching = 0;
    for (size_t i = 0; i < idx->ring_len; i++) {
        const spec_ent *e = &idx->ring[(idx->ring_head + i) & (idx->ring_cap - 1)];
        if (i &&
            e->expiry_ms < idx->ring[(idx->ring_head + i - 1) & (idx->ring_cap - 1)].expiry_ms) {
            rc = -18;
            goto out;
        }
        matching += e->slot < idx->nslots && ring_matches(idx, e);
    }
    if (matching < idx->spec_entries) {
        rc = -19;
        goto out;
    }
    for (uint32_t i = 0; i < idx->nworkers; i++) {
        if (idx->order[i] >= idx->nslots || !idx->slots[idx->order[i]].live) {
            rc = -11;
            goto out;
        }
    }
    /* Free list: free nodes only; with the live ones, every node handed out. */
    uint64_t nfree = 0;
    for (uint32_t n = idx->free_head; n != NIL; n = idx->nodes[n].hnext) {
        if (n >= idx->pool_used || idx->nodes[n].slot != FREE_SLOT || ++nfree > idx->pool_used) {
            rc = -12;
            goto out;
        }
    }
    if (nfree + idx->entries != idx->pool_used)
        rc = -13;
out:
    pthread_rwlock_unlock(&idx->lock);
    return rc;
}
