/* SPDX-License-Identifier: Apache-2.0 */
/* The tokenizer proper: tokenizer.json loading, added tokens, byte-level BPE and the
 * post-processor, following the Rust `tokenizers` library step by step (docs/tokenizer.md). */
#include "tokenizer.h"
#include "token_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "tokenizer_word.h"
#include "unicode.h"

/* Bounds on what a file may hold, far above real files (Qwen3: 151,643 entries and 151,387
 * merges; Llama 3: 128,000 and 280,147; 26 and 256 added tokens). */
#define VOCAB_MAX (4u << 20)
#define MERGES_MAX (8u << 20)
#define ADDED_MAX (1u << 16)
#define TOKEN_BYTES_MAX 4096u
#define TEMPLATE_IDS_MAX 64u
#define ID_MAX 0x7fffffffu
#define JSON_DEPTH_MAX 32

#define EMPTY UINT32_MAX
#define DEAD UINT32_MAX
/* In the vocabulary's table, the top bit of an id marks an entry that BPE merges back into that
 * entry alone: a piece equal to it is that token without merging (what ignore_merges does for
 * every entry, done here only where it changes nothing). */
#define ID_MASK 0x7fffffffu
#define ID_WHOLE 0x80000000u

/* ---- hash tables --------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

/* The first 8 bytes of a key, zero-padded: stored in its slot, so that a piece of up to 8 bytes
 * (most of them) is compared without reading the string pool. */
static inline uint64_t key_head(const unsigned char *p, size_t n)
{
    uint64_t w = 0;
    if (n >= 8) {
        memcpy(&w, p, 8);
        return w;
    }
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)p[i] << (8 * i);
    return w;
}

/* Pieces are short (a handful of bytes): one multiply per 8 bytes. */
static inline uint64_t hash_key(uint64_t head, const unsigned char *p, size_t n)
{
    uint64_t h =
        (0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull) ^ head) * 0x94d049bb133111ebull;
    for (size_t i = 8; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ (h >> 29) ^ w) * 0xbf58476d1ce4e5b9ull;
    }
    if (n > 8 && n % 8)
        h = (h ^ (h >> 29) ^ key_head(p + n - n % 8, n % 8)) * 0xbf58476d1ce4e5b9ull;
    return mix64(h);
}

/* String -> id, open addressing with linear probing; the strings live in the tokenizer's pool
 * (offsets, so that the pool may grow while the table is built). */
typedef struct strslot {
    uint64_t head; /* key_head of the key */
    uint32_t hash;
    uint32_t id;
    uint32_t off; /* EMPTY: free slot */
    uint32_t len;
} strslot;

typedef struct strtab {
    strslot *slots;
    uint32_t mask;
    uint32_t count;
} strtab;

/* At most two thirds full: a table of 24-byte slots that stays small enough for the caches. */
static int strtab_init(strtab *t, size_t expected)
{
    size_t n = 16;
    while (n < expected + expected / 2 + 1)
        n <<= 1;
    t->slots = malloc(n * sizeof(*t->slots));
    if (!t->slots)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        t->slots[i].off = EMPTY;
    t->mask = (uint32_t)(n - 1);
    t->count = 0;
    return 0;
}

static void strtab_done(strtab *t)
{
    free(t->slots);
    t->slots = NULL;
}

static inline bool slot_is(const strslot *sl, const char *pool, uint64_t head, uint32_t h32,
                           const unsigned char *s, size_t len)
{
    return sl->head == head && sl->len == len && sl->hash == h32 &&
           (len <= 8 || memcmp(pool + sl->off + 8, s + 8, len - 8) == 0);
}

/* A key's head and hash. (Computing them for a batch of pieces and prefetching their slots
 * before the probes was tried: slower, 2026-12-02.) */
typedef struct keyhash {
    uint64_t head, h;
} keyhash;

static inline keyhash key_hash(const unsigned char *s, size_t len)
{
    keyhash k;
    k.head = key_head(s, len);
    k.h = hash_key(k.head, s, len);
    return k;
}

static inline const strslot *strtab_probe(const strtab *t, const char *pool, keyhash k,
                                          const unsigned char *s, size_t len)
{
    uint32_t h32 = (uint32_t)k.h;
    for (uint32_t i = (uint32_t)(k.h >> 32) & t->mask;; i = (i + 1) & t->mask) {
        const strslot *sl = &t->slots[i];
        if (sl->off == EMPTY)
            return NULL;
        if (slot_is(sl, pool, k.head, h32, s, len))
            return sl;
    }
}

static inline const strslot *strtab_find(const strtab *t, const char *pool, const void *key,
                                         size_t len)
{
    if (!t->slots)
        return NULL;
    return strtab_probe(t, pool, key_hash(key, len), key, len);
}

/* Insert or overwrite (a later duplicate wins, as in the library's HashMap). The table was
 * sized for at least as many keys as are inserted. Returns true when the key was new. */
static bool strtab_put(strtab *t, const char *pool, uint32_t off, uint32_t len, uint32_t id)
{
    const unsigned char *s = (const unsigned char *)pool + off;
    uint64_t head = key_head(s, len);
    uint64_t h = hash_key(head, s, len);
    uint32_t h32 = (uint32_t)h;
    for (uint32_t i = (uint32_t)(h >> 32) & t->mask;; i = (i + 1) & t->mask) {
        strslot *sl = &t->slots[i];
        if (sl->off == EMPTY) {
            *sl = (strslot){.head = head, .hash = h32, .id = id, .off = off, .len = len};
            t->count++;
            return true;
        }
        if (slot_is(sl, pool, head, h32, s, len)) {
            sl->id = id;
            return false;
        }
    }
}

/* (left id, right id) -> (rank, merged id). */
typedef struct pairslot {
    uint64_t key; /* UINT64_MAX: free */
    uint32_t rank;
    uint32_t new_id;
} pairslot;

typedef struct pairtab {
    pairslot *slots;
    uint32_t mask;
    unsigned shift;
} pairtab;

static inline uint64_t pair_key(uint32_t a, uint32_t b)
{
    return (uint64_t)a << 32 | b;
}

static inline uint32_t pair_index(const pairtab *t, uint64_t key)
{
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> t->shift);
}

static inline const pairslot *pairtab_find(const pairtab *t, uint32_t a, uint32_t b)
{
    uint64_t key = pair_key(a, b);
    for (uint32_t i = pair_index(t, key);; i = (i + 1) & t->mask) {
        const pairslot *sl = &t->slots[i];
        if (sl->key == key)
            return sl;
        if (sl->key == UINT64_MAX)
            return NULL;
    }
}

/* ---- the tokenizer -------------------------------------------------------------------------- */

/* A byte trie of added tokens' contents, for the leftmost-longest search. */
typedef struct trie_node {
    uint32_t child;   /* first child, 0 = none (node 0 is the root) */
    uint32_t sibling; /* next sibling, 0 = none */
    int32_t token;    /* index in tok->added ending here, -1 = none */
    uint8_t byte;
} trie_node;

typedef struct trie {
    trie_node *nodes;
    uint32_t count, cap;
    bool first[256]; /* bytes that start a pattern */
    bool empty;
    /* When every pattern starts with the same byte ('<' in the Qwen and Llama files): that
     * byte, found with memchr (the scan of a long prompt for added tokens was 15% of a cached
     * token-exact decision, perf 2026-12-02); -1 otherwise. */
    int only_first;
} trie;

typedef struct added_token {
    uint32_t off, len;             /* content in the pool */
    uint32_t match_off, match_len; /* what is matched: content, normalized when `normalized` */
    uint32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} added_token;

struct kvg_tokenizer {
    char *pool;
    size_t pool_len;
    strtab vocab;     /* raw bytes (byte-level form decoded) -> id */
    strtab vocab_lit; /* vocabulary entries outside the byte-level alphabet, literally */
    size_t vocab_entries;
    pairtab merges;
    uint32_t byte_id[256];
    bool byte_known[256];
    bool ignore_merges;
    bool nfc;
    bool split; /* a Split pre-tokenizer before ByteLevel */
    kvg_pretok_kind pretok;
    added_token *added;
    size_t n_added;
    strtab added_map; /* content -> id */
    trie raw_trie, norm_trie;
    uint32_t prefix[TEMPLATE_IDS_MAX], suffix[TEMPLATE_IDS_MAX];
    size_t n_prefix, n_suffix;
    uint32_t vocab_size;
};

/* ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ------------------------------------- */

/* Bytes that stand for themselves: printable Latin-1 except the space and the soft hyphen. The
 * other 68 bytes map, in order, to U+0100 upwards. */
static inline bool byte_is_self(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
}

/* The byte a code point of the alphabet stands for, or -1. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_self(cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    unsigned k = cp - 256;
    for (unsigned b = 0; b < 256; b++) {
        if (!byte_is_self(b) && k-- == 0)
            return (int)b;
    }
    return -1;
}

/* Decode a valid UTF-8 string in the byte-level alphabet to the bytes it stands for (out has
 * room for len bytes); false when a character is outside the alphabet. */
static bool bytelevel_decode(const unsigned char *s, size_t len, unsigned char *out,
                             size_t *out_len)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        if (s[i] < 0x80) {
            cp = s[i++];
        } else if ((s[i] & 0xe0) == 0xc0 && i + 1 < len) {
            cp = (uint32_t)(s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
            i += 2;
        } else {
            return false; /* every character of the alphabet is below U+0800 */
        }
        int b = cp_to_byte(cp);
        if (b < 0)
            return false;
        out[n++] = (unsigned char)b;
    }
    *out_len = n;
    return true;
}

/* ---- loading ------------------------------------------------------------------------------- */

typedef struct loader {
    kvg_tokenizer *tok;
    kvg_buf pool;
    char *err;
    size_t errlen;
} loader;

KVG_PRINTF(3, 4) static int lfail(loader *ld, int rc, const char *fmt, ...)
{
    if (ld->err && ld->errlen) {
        int n = snprintf(ld->err, ld->errlen, "tokenizer.json: ");
        if (n >= 0 && (size_t)n < ld->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ld->err + n, ld->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return rc;
}

/* A value quoted for an error message: at most 60 bytes of a string. */
static const char *quoted(const kvg_json *v, char *buf, size_t len)
{
    if (!v)
        return "(absent)";
    if (v->type != KVG_JSON_STRING)
        return kvg_json_type_str(v->type);
    /* At most 60 bytes, cut at a character boundary, controls shown as '?': one line. */
    const unsigned char *p = (const unsigned char *)v->u.str.ptr;
    size_t n = v->u.str.len > 60 ? 60 : v->u.str.len;
    while (n < v->u.str.len && n > 0 && (p[n] & 0xc0) == 0x80)
        n--;
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n && o + 6 < len; i++)
        buf[o++] = p[i] < 0x20 || p[i] == 0x7f ? '?' : (char)p[i];
    snprintf(buf + o, len - o, "%s\"", n < v->u.str.len ? "..." : "");
    return buf;
}

static bool is_null(const kvg_json *v)
{
    return !v || v->type == KVG_JSON_NULL;
}

static bool json_str_eq(const kvg_json *v, const char *s)
{
    return v && v->type == KVG_JSON_STRING && v->u.str.len == strlen(s) &&
           memcmp(v->u.str.ptr, s, v->u.str.len) == 0;
}

/* A boolean member; absent reads as dflt. */
static int get_bool(loader *ld, const kvg_json *obj, const char *where, const char *key, bool dflt,
                    bool *out)
{
    const kvg_json *v = kvg_json_get(obj, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE)
        return lfail(ld, KVG_EPARSE, "%s.%s is %s, not a boolean", where, key,
                     kvg_json_type_str(v->type));
    *out = v->type == KVG_JSON_TRUE;
    return 0;
}

static int pool_add(loader *ld, const void *s, size_t len, uint32_t *off)
{
    if (ld->pool.len + len >= UINT32_MAX - 1)
        return lfail(ld, KVG_ELIMIT, "strings too large");
    *off = (uint32_t)ld->pool.len;
    kvg_buf_append(&ld->pool, s, len);
    if (ld->pool.failed)
        return lfail(ld, -ENOMEM, "out of memory");
    return 0;
}

/* Give back the pool's bytes from off on (kept NUL-terminated, as a kvg_buf is). */
static void pool_drop(loader *ld, uint32_t off)
{
    ld->pool.len = off;
    ld->pool.data[off] = '\0';
}

/* The model's id of a token in its literal (byte-level) form, as BPE's token_to_id. */
static bool model_lookup(const kvg_tokenizer *tok, const char *pool, const char *s, size_t len,
                         uint32_t *id)
{
    unsigned char raw[TOKEN_BYTES_MAX];
    size_t n;
    const strslot *sl = NULL;
    if (len <= TOKEN_BYTES_MAX && bytelevel_decode((const unsigned char *)s, len, raw, &n))
        sl = strtab_find(&tok->vocab, pool, raw, n);
    else
        sl = strtab_find(&tok->vocab_lit, pool, s, len);
    if (!sl)
        return false;
    *id = sl->id & ID_MASK;
    return true;
}

static int load_vocab(loader *ld, const kvg_json *vocab)
{
    kvg_tokenizer *tok = ld->tok;
    if (!vocab || vocab->type != KVG_JSON_OBJECT)
        return lfail(ld, KVG_EPARSE, "model.vocab is %s, not an object",
                     vocab ? kvg_json_type_str(vocab->type) : "absent");
    size_t n = vocab->u.obj.count;
    if (n > VOCAB_MAX)
        return lfail(ld, KVG_ELIMIT, "model.vocab has %zu entries (at most %u)", n, VOCAB_MAX);
    if (strtab_init(&tok->vocab, n) || strtab_init(&tok->vocab_lit, 16))
        return lfail(ld, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *k = vocab->u.obj.keys[i];
        size_t klen = vocab->u.obj.key_lens[i];
        const kvg_json *v = vocab->u.obj.values[i];
        if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0 ||
            v->u.num.ival > ID_MAX)
            return lfail(ld, KVG_EPARSE, "model.vocab[\"%.40s\"] is not an id (0..%u)", k, ID_MAX);
        if (klen > TOKEN_BYTES_MAX)
            return lfail(ld, KVG_ELIMIT, "model.vocab has a token of %zu bytes (at most %u)", klen,
                         TOKEN_BYTES_MAX);
        uint32_t id = (uint32_t)v->u.num.ival;
        unsigned char raw[TOKEN_BYTES_MAX];
        size_t rn;
        uint32_t off;
        int rc;
        if (bytelevel_decode((const unsigned char *)k, klen, raw, &rn)) {
            if ((rc = pool_add(ld, raw, rn, &off)))
                return rc;
            if (!strtab_put(&tok->vocab, ld->pool.data, off, (uint32_t)rn, id))
                pool_drop(ld, off); /* a duplicate key: the later id won, the bytes are spare */
        } else {
            /* Never produced by byte-level input, but token_to_id and merges may name it. */
            if (tok->vocab_lit.count * 2 + 2 > tok->vocab_lit.mask) {
                strtab bigger;
                if (strtab_init(&bigger, (tok->vocab_lit.mask + 1) * 2))
                    return lfail(ld, -ENOMEM, "out of memory");
                for (uint32_t j = 0; j <= tok->vocab_lit.mask; j++) {
                    strslot *sl = &tok->vocab_lit.slots[j];
                    if (sl->off != EMPTY)
                        strtab_put(&bigger, ld->pool.data, sl->off, sl->len, sl->id);
                }
                strtab_done(&tok->vocab_lit);
                tok->vocab_lit = bigger;
            }
            if ((rc = pool_add(ld, k, klen, &off)))
                return rc;
            if (!strtab_put(&tok->vocab_lit, ld->pool.data, off, (uint32_t)klen, id))
                pool_drop(ld, off);
        }
    }
    tok->vocab_entries = tok->vocab.count + tok->vocab_lit.count;
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        const strslot *sl = strtab_find(&tok->vocab, ld->pool.data, &c, 1);
        tok->byte_known[b] = sl != NULL;
        tok->byte_id[b] = sl ? sl->id & ID_MASK : 0;
    }
    return 0;
}

static int merge_part_id(loader *ld, size_t index, const char *s, size_t len, uint32_t *id)
{
    if (model_lookup(ld->tok, ld->pool.data, s, len, id))
        return 0;
    return lfail(ld, KVG_EPARSE, "model.merges[%zu] names \"%.*s\", which is not in model.vocab",
                 index, (int)KVG_MIN(len, 60), s);
}

static int load_merges(loader *ld, const kvg_json *merges)
{
    kvg_tokenizer *tok = ld->tok;
    size_t n = 0;
    if (merges && merges->type != KVG_JSON_ARRAY)
        return lfail(ld, KVG_EPARSE, "model.merges is %s, not an array",
                     kvg_json_type_str(merges->type));
    if (merges)
        n = merges->u.arr.count;
    if (n > MERGES_MAX)
        return lfail(ld, KVG_ELIMIT, "model.merges has %zu entries (at most %u)", n, MERGES_MAX);
    size_t cap = 16;
    unsigned bits = 4;
    while (cap < n + n / 2 + 1) { /* at most two thirds full */
        cap <<= 1;
        bits++;
    }
    tok->merges.slots = malloc(cap * sizeof(*tok->merges.slots));
    if (!tok->merges.slots)
        return lfail(ld, -ENOMEM, "out of memory");
    for (size_t i = 0; i < cap; i++)
        tok->merges.slots[i].key = UINT64_MAX;
    tok->merges.mask = (uint32_t)(cap - 1);
    tok->merges.shift = 64 - bits;
    char joined[2 * TOKEN_BYTES_MAX];
    for (size_t i = 0; i < n; i++) {
        const kvg_json *m = merges->u.arr.items[i];
        const char *a, *b;
        size_t alen, blen;
        if (m->type == KVG_JSON_STRING) {
            /* The older form: "left right", split at the one space. */
            const char *sp = memchr(m->u.str.ptr, ' ', m->u.str.len);
            if (!sp || memchr(sp + 1, ' ', m->u.str.len - (size_t)(sp + 1 - m->u.str.ptr)))
                return lfail(ld, KVG_EPARSE, "model.merges[%zu] \"%.60s\" is not two tokens", i,
                             m->u.str.ptr);
            a = m->u.str.ptr;
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = m->u.str.len - alen - 1;
        } else if (m->type == KVG_JSON_ARRAY && m->u.arr.count == 2 &&
                   m->u.arr.items[0]->type == KVG_JSON_STRING &&
                   m->u.arr.items[1]->type == KVG_JSON_STRING) {
            a = m->u.arr.items[0]->u.str.ptr;
            alen = m->u.arr.items[0]->u.str.len;
            b = m->u.arr.items[1]->u.str.ptr;
            blen = m->u.arr.items[1]->u.str.len;
        } else {
            return lfail(ld, KVG_EPARSE, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]",
                         i);
        }
        if (alen > TOKEN_BYTES_MAX || blen > TOKEN_BYTES_MAX)
            return lfail(ld, KVG_EPARSE, "model.merges[%zu] names a token not in model.vocab", i);
        uint32_t ida = 0, idb = 0, idn = 0;
        int rc;
        if ((rc = merge_part_id(ld, i, a, alen, &ida)) ||
            (rc = merge_part_id(ld, i, b, blen, &idb)))
            return rc;
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        if ((rc = merge_part_id(ld, i, joined, alen + blen, &idn)))
            return rc;
        uint64_t key = pair_key(ida, idb);
        for (uint32_t j = pair_index(&tok->merges, key);; j = (j + 1) & tok->merges.mask) {
            pairslot *sl = &tok->merges.slots[j];
            if (sl->key == UINT64_MAX || sl->key == key) {
                /* A repeated pair takes its last rank, as the library's HashMap collect. */
                *sl = (pairslot){.key = key, .rank = (uint32_t)i, .new_id = idn};
                break;
            }
        }
    }
    return 0;
}

static int load_model(loader *ld, const kvg_json *model)
{
    kvg_tokenizer *tok = ld->tok;
    char q[80];
    int rc;
    if (!model || model->type != KVG_JSON_OBJECT)
        return lfail(ld, KVG_EPARSE, "model is %s, not an object",
                     model ? kvg_json_type_str(model->type) : "absent");
    const kvg_json *type = kvg_json_get(model, "type");
    if (!json_str_eq(type, "BPE"))
        return lfail(ld, KVG_ECONFIG, "model.type %s is not supported (BPE only)",
                     quoted(type, q, sizeof(q)));
    const kvg_json *v = kvg_json_get(model, "dropout");
    if (!is_null(v) && !(v->type == KVG_JSON_NUMBER && v->u.num.value == 0))
        return lfail(ld, KVG_ECONFIG, "model.dropout is not supported (null only)");
    v = kvg_json_get(model, "unk_token");
    if (!is_null(v))
        return lfail(ld, KVG_ECONFIG, "model.unk_token %s is not supported (null only)",
                     quoted(v, q, sizeof(q)));
    const char *empty_only[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        v = kvg_json_get(model, empty_only[i]);
        if (!is_null(v) && !json_str_eq(v, ""))
            return lfail(ld, KVG_ECONFIG, "model.%s %s is not supported (null or \"\" only)",
                         empty_only[i], quoted(v, q, sizeof(q)));
    }
    bool byte_fallback = false;
    if ((rc = get_bool(ld, model, "model", "byte_fallback", false, &byte_fallback)))
        return rc;
    if (byte_fallback)
        return lfail(ld, KVG_ECONFIG, "model.byte_fallback true is not supported (false only)");
    if ((rc = get_bool(ld, model, "model", "ignore_merges", false, &tok->ignore_merges)))
        return rc;
    if ((rc = load_vocab(ld, kvg_json_get(model, "vocab"))))
        return rc;
    return load_merges(ld, kvg_json_get(model, "merges"));
}

static int load_normalizer(loader *ld, const kvg_json *n, const char *where)
{
    char q[80];
    if (is_null(n))
        return 0;
    if (n->type != KVG_JSON_OBJECT)
        return lfail(ld, KVG_EPARSE, "%s is %s, not an object", where, kvg_json_type_str(n->type));
    const kvg_json *type = kvg_json_get(n, "type");
    if (json_str_eq(type, "NFC")) {
        ld->tok->nfc = true;
        return 0;
    }
    if (json_str_eq(type, "Sequence")) {
        const kvg_json *list = kvg_json_get(n, "normalizers");
        if (!list || list->type != KVG_JSON_ARRAY)
            return lfail(ld, KVG_EPARSE, "%s.normalizers is not an array", where);
        for (size_t i = 0; i < list->u.arr.count; i++) {
            char sub[64];
            snprintf(sub, sizeof(sub), "normalizer.normalizers[%zu]", i);
            int rc = load_normalizer(ld, list->u.arr.items[i], sub);
            if (rc)
                return rc;
        }
        return 0;
    }
    return lfail(ld, KVG_ECONFIG, "%s.type %s is not supported (NFC or a Sequence of NFC only)",
                 where, quoted(type, q, sizeof(q)));
}

static int load_bytelevel(loader *ld, const kvg_json *p, const char *where)
{
    bool b = false;
    int rc;
    if ((rc = get_bool(ld, p, where, "add_prefix_space", true, &b)))
        return rc;
    if (b)
        return lfail(ld, KVG_ECONFIG, "%s.add_prefix_space true is not supported (false only)",
                     where);
    if ((rc = get_bool(ld, p, where, "use_regex", true, &b)))
        return rc;
    if (b)
        return lfail(ld, KVG_ECONFIG,
                     "%s.use_regex true is not supported (false only, after a Split)", where);
    return 0;
}

static int load_split(loader *ld, const kvg_json *p, const char *where)
{
    char q[80];
    const kvg_json *pat = kvg_json_get(p, "pattern");
    const kvg_json *re = pat && pat->type == KVG_JSON_OBJECT ? kvg_json_get(pat, "Regex") : NULL;
    if (!re || re->type != KVG_JSON_STRING)
        return lfail(ld, KVG_ECONFIG, "%s.pattern is not supported ({\"Regex\": ...} only)", where);
    int kind = kvg_pretok_kind_of(re->u.str.ptr, re->u.str.len);
    if (kind < 0)
        return lfail(ld, KVG_ECONFIG,
                     "%s.pattern.Regex %s is not supported (the Qwen2 and Llama 3 patterns only)",
                     where, quoted(re, q, sizeof(q)));
    const kvg_json *beh = kvg_json_get(p, "behavior");
    if (!json_str_eq(beh, "Isolated"))
        return lfail(ld, KVG_ECONFIG, "%s.behavior %s is not supported (Isolated only)", where,
                     quoted(beh, q, sizeof(q)));
    bool invert = false;
    int rc = get_bool(ld, p, where, "invert", false, &invert);
    if (rc)
        return rc;
    if (invert)
        return lfail(ld, KVG_ECONFIG, "%s.invert true is not supported (false only)", where);
    ld->tok->split = true;
    ld->tok->pretok = (kvg_pretok_kind)kind;
    return 0;
}

static int load_pre_tokenizer(loader *ld, const kvg_json *p)
{
    char q[80];
    if (is_null(p) || p->type != KVG_JSON_OBJECT)
        return lfail(ld, KVG_ECONFIG,
                     "pre_tokenizer %s is not supported (Sequence[Split, ByteLevel] or ByteLevel)",
                     p ? kvg_json_type_str(p->type) : "(absent)");
    const kvg_json *type = kvg_json_get(p, "type");
    if (json_str_eq(type, "ByteLevel"))
        return load_bytelevel(ld, p, "pre_tokenizer");
    if (!json_str_eq(type, "Sequence"))
        return lfail(ld, KVG_ECONFIG,
                     "pre_tokenizer.type %s is not supported (Sequence[Split, ByteLevel] or "
                     "ByteLevel)",
                     quoted(type, q, sizeof(q)));
    const kvg_json *list = kvg_json_get(p, "pretokenizers");
    if (!list || list->type != KVG_JSON_ARRAY)
        return lfail(ld, KVG_EPARSE, "pre_tokenizer.pretokenizers is not an array");
    const char *want[] = {"Split", "ByteLevel"};
    if (list->u.arr.count != 2)
        return lfail(ld, KVG_ECONFIG,
                     "pre_tokenizer.pretokenizers has %zu entries (Split then ByteLevel only)",
                     list->u.arr.count);
    for (size_t i = 0; i < 2; i++) {
        const kvg_json *e = list->u.arr.items[i];
        const kvg_json *t = e->type == KVG_JSON_OBJECT ? kvg_json_get(e, "type") : NULL;
        char where[64];
        snprintf(where, sizeof(where), "pre_tokenizer.pretokenizers[%zu]", i);
        if (!json_str_eq(t, want[i]))
            return lfail(ld, KVG_ECONFIG, "%s.type %s is not supported (Split then ByteLevel only)",
                         where, quoted(t, q, sizeof(q)));
        int rc = i == 0 ? load_split(ld, e, where) : load_bytelevel(ld, e, where);
        if (rc)
            return rc;
    }
    return 0;
}

static int template_ids(loader *ld, const kvg_json *specials, const kvg_json *name, uint32_t *dst,
                        size_t *n)
{
    char q[80];
    const kvg_json *st =
        specials && specials->type == KVG_JSON_OBJECT && name && name->type == KVG_JSON_STRING
            ? kvg_json_get(specials, name->u.str.ptr)
            : NULL;
    const kvg_json *ids = st && st->type == KVG_JSON_OBJECT ? kvg_json_get(st, "ids") : NULL;
    if (!ids || ids->type != KVG_JSON_ARRAY)
        return lfail(ld, KVG_EPARSE,
                     "post_processor TemplateProcessing names special token %s, which its "
                     "special_tokens lack",
                     quoted(name, q, sizeof(q)));
    for (size_t i = 0; i < ids->u.arr.count; i++) {
        const kvg_json *v = ids->u.arr.items[i];
        if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0 ||
            v->u.num.ival > ID_MAX)
            return lfail(ld, KVG_EPARSE, "post_processor special token %s has a bad id",
                         quoted(name, q, sizeof(q)));
        if (*n >= TEMPLATE_IDS_MAX)
            return lfail(ld, KVG_ELIMIT, "post_processor adds more than %u ids", TEMPLATE_IDS_MAX);
        dst[(*n)++] = (uint32_t)v->u.num.ival;
    }
    return 0;
}

static int load_template(loader *ld, const kvg_json *p)
{
    kvg_tokenizer *tok = ld->tok;
    if (tok->n_prefix || tok->n_suffix)
        return lfail(ld, KVG_ECONFIG, "post_processor has two TemplateProcessing (one only)");
    const kvg_json *single = kvg_json_get(p, "single");
    const kvg_json *specials = kvg_json_get(p, "special_tokens");
    if (!single || single->type != KVG_JSON_ARRAY)
        return lfail(ld, KVG_EPARSE, "post_processor TemplateProcessing.single is not an array");
    bool seen_a = false;
    for (size_t i = 0; i < single->u.arr.count; i++) {
        const kvg_json *it = single->u.arr.items[i];
        const kvg_json *sp = it->type == KVG_JSON_OBJECT ? kvg_json_get(it, "SpecialToken") : NULL;
        const kvg_json *seq = it->type == KVG_JSON_OBJECT ? kvg_json_get(it, "Sequence") : NULL;
        int rc;
        if (sp && sp->type == KVG_JSON_OBJECT) {
            if (seen_a)
                rc =
                    template_ids(ld, specials, kvg_json_get(sp, "id"), tok->suffix, &tok->n_suffix);
            else
                rc =
                    template_ids(ld, specials, kvg_json_get(sp, "id"), tok->prefix, &tok->n_prefix);
            if (rc)
                return rc;
        } else if (seq && seq->type == KVG_JSON_OBJECT && !seen_a &&
                   json_str_eq(kvg_json_get(seq, "id"), "A")) {
            seen_a = true;
        } else {
            return lfail(ld, KVG_ECONFIG,
                         "post_processor TemplateProcessing.single[%zu] is not supported "
                         "(SpecialToken items around one Sequence A only)",
                         i);
        }
    }
    if (!seen_a)
        return lfail(ld, KVG_ECONFIG,
                     "post_processor TemplateProcessing.single has no Sequence A (unsupported)");
    return 0;
}

static int load_post_processor(loader *ld, const kvg_json *p, const char *where)
{
    char q[80];
    if (is_null(p))
        return 0;
    if (p->type != KVG_JSON_OBJECT)
        return lfail(ld, KVG_EPARSE, "%s is %s, not an object", where, kvg_json_type_str(p->type));
    const kvg_json *type = kvg_json_get(p, "type");
    if (json_str_eq(type, "ByteLevel"))
        return 0; /* offsets only: the ids are unchanged */
    if (json_str_eq(type, "TemplateProcessing"))
        return load_template(ld, p);
    if (json_str_eq(type, "Sequence")) {
        const kvg_json *list = kvg_json_get(p, "processors");
        if (!list || list->type != KVG_JSON_ARRAY)
            return lfail(ld, KVG_EPARSE, "%s.processors is not an array", where);
        for (size_t i = 0; i < list->u.arr.count; i++) {
            char sub[64];
            snprintf(sub, sizeof(sub), "post_processor.processors[%zu]", i);
            int rc = load_post_processor(ld, list->u.arr.items[i], sub);
            if (rc)
                return rc;
        }
        return 0;
    }
    return lfail(ld, KVG_ECONFIG,
                 "%s.type %s is not supported (ByteLevel, TemplateProcessing or a Sequence of "
                 "them only)",
                 where, quoted(type, q, sizeof(q)));
}

static int trie_node_new(loader *ld, trie *t, uint8_t byte, uint32_t *out)
{
    if (t->count == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 64;
        trie_node *nn = realloc(t->nodes, cap * sizeof(*nn));
        if (!nn)
            return lfail(ld, -ENOMEM, "out of memory");
        t->nodes = nn;
        t->cap = cap;
    }
    t->nodes[t->count] = (trie_node){.child = 0, .sibling = 0, .token = -1, .byte = byte};
    *out = t->count++;
    return 0;
}

static int trie_add(loader *ld, trie *t, const char *s, size_t len, int32_t token)
{
    int rc;
    uint32_t root;
    if (t->count == 0 && (rc = trie_node_new(ld, t, 0, &root)))
        return rc;
    uint32_t cur = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        uint32_t k = t->nodes[cur].child;
        while (k && t->nodes[k].byte != c)
            k = t->nodes[k].sibling;
        if (!k) {
            if ((rc = trie_node_new(ld, t, c, &k)))
                return rc;
            t->nodes[k].sibling = t->nodes[cur].child;
            t->nodes[cur].child = k;
        }
        cur = k;
    }
    /* Two patterns alike: the first keeps the match, as Aho-Corasick's lowest pattern id. */
    if (t->nodes[cur].token < 0)
        t->nodes[cur].token = token;
    if (t->empty)
        t->only_first = (uint8_t)s[0];
    else if (t->only_first != (uint8_t)s[0])
        t->only_first = -1;
    t->first[(uint8_t)s[0]] = true;
    t->empty = false;
    return 0;
}

static int load_added(loader *ld, const kvg_json *list)
{
    kvg_tokenizer *tok = ld->tok;
    char q[80];
    int rc;
    size_t n = 0;
    if (!is_null(list) && list->type != KVG_JSON_ARRAY)
        return lfail(ld, KVG_EPARSE, "added_tokens is %s, not an array",
                     kvg_json_type_str(list->type));
    if (!is_null(list))
        n = list->u.arr.count;
    if (n > ADDED_MAX)
        return lfail(ld, KVG_ELIMIT, "added_tokens has %zu entries (at most %u)", n, ADDED_MAX);
    tok->added = calloc(n ? n : 1, sizeof(*tok->added));
    if (!tok->added || strtab_init(&tok->added_map, n))
        return lfail(ld, -ENOMEM, "out of memory");
    tok->raw_trie.empty = tok->norm_trie.empty = true;
    /* Ids as AddedVocabulary::add_tokens gives them (the file's "id" is not read by the library
     * either): the model's id when the content is in its vocabulary, else the next one after
     * the vocabulary and the added tokens so far. */
    uint32_t vsize = (uint32_t)tok->vocab_entries;
    bool have_max = false;
    uint32_t max_id = 0;
    for (size_t i = 0; i < n; i++) {
        const kvg_json *e = list->u.arr.items[i];
        char where[48];
        snprintf(where, sizeof(where), "added_tokens[%zu]", i);
        if (e->type != KVG_JSON_OBJECT)
            return lfail(ld, KVG_EPARSE, "%s is not an object", where);
        const kvg_json *c = kvg_json_get(e, "content");
        if (!c || c->type != KVG_JSON_STRING)
            return lfail(ld, KVG_EPARSE, "%s.content is not a string", where);
        if (c->u.str.len > TOKEN_BYTES_MAX)
            return lfail(ld, KVG_ELIMIT, "%s.content has %zu bytes (at most %u)", where,
                         c->u.str.len, TOKEN_BYTES_MAX);
        added_token t = {0};
        const char *flags[] = {"single_word", "lstrip", "rstrip", "normalized", "special"};
        bool *dst[] = {&t.single_word, &t.lstrip, &t.rstrip, &t.normalized, &t.special};
        for (size_t k = 0; k < 5; k++) {
            /* The library's AddedToken has no defaults in a file: each flag must be there. */
            const kvg_json *f = kvg_json_get(e, flags[k]);
            if (!f)
                return lfail(ld, KVG_EPARSE, "%s.%s is missing", where, flags[k]);
            if ((rc = get_bool(ld, e, where, flags[k], false, dst[k])))
                return rc;
        }
        if (c->u.str.len == 0)
            continue; /* the library skips an empty token */
        if (strtab_find(&tok->added_map, ld->pool.data, c->u.str.ptr, c->u.str.len))
            return lfail(ld, KVG_ECONFIG,
                         "%s.content %s repeats an earlier added token "
                         "(unsupported)",
                         where, quoted(c, q, sizeof(q)));
        uint32_t id;
        if (!model_lookup(tok, ld->pool.data, c->u.str.ptr, c->u.str.len, &id))
            id = !have_max ? vsize : (max_id >= vsize || vsize == 0) ? max_id + 1 : vsize;
        if (id > ID_MAX)
            return lfail(ld, KVG_ELIMIT, "%s gets an id past %u", where, ID_MAX);
        if (!have_max || id > max_id)
            max_id = id;
        have_max = true;
        t.id = id;
        if ((rc = pool_add(ld, c->u.str.ptr, c->u.str.len, &t.off)))
            return rc;
        t.len = (uint32_t)c->u.str.len;
        t.match_off = t.off;
        t.match_len = t.len;
        strtab_put(&tok->added_map, ld->pool.data, t.off, t.len, id);
        tok->added[tok->n_added++] = t;
    }
    /* The matching sets: special tokens first, then the others, each split by `normalized`
     * (refresh_added_tokens); a normalized one is matched in its normalized form. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < tok->n_added; i++) {
            added_token *t = &tok->added[i];
            if (t->special != (pass == 0))
                continue;
            if (t->normalized && tok->nfc) {
                kvg_buf nb;
                kvg_buf_init(&nb);
                rc = kvg_unicode_nfc(ld->pool.data + t->off, t->len, &nb);
                if (!rc)
                    rc = pool_add(ld, nb.data ? nb.data : "", nb.len, &t->match_off);
                t->match_len = (uint32_t)nb.len;
                kvg_buf_done(&nb);
                if (rc)
                    return rc == -ENOMEM ? lfail(ld, rc, "out of memory") : rc;
            }
            if (t->match_len == 0)
                continue;
            trie *tr = t->normalized ? &tok->norm_trie : &tok->raw_trie;
            if ((rc = trie_add(ld, tr, ld->pool.data + t->match_off, t->match_len, (int32_t)i)))
                return rc;
        }
    }
    return 0;
}

static void tokenizer_size(kvg_tokenizer *tok)
{
    uint32_t max = 0;
    bool any = false;
    const strtab *tabs[] = {&tok->vocab, &tok->vocab_lit};
    for (size_t k = 0; k < 2; k++) {
        for (uint32_t i = 0; tabs[k]->slots && i <= tabs[k]->mask; i++) {
            uint32_t id = tabs[k]->slots[i].id & ID_MASK;
            if (tabs[k]->slots[i].off != EMPTY && (!any || id > max)) {
                max = id;
                any = true;
            }
        }
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        if (!any || tok->added[i].id > max) {
            max = tok->added[i].id;
            any = true;
        }
    }
    for (size_t i = 0; i < tok->n_prefix + tok->n_suffix; i++) {
        uint32_t id = i < tok->n_prefix ? tok->prefix[i] : tok->suffix[i - tok->n_prefix];
        if (!any || id > max) {
            max = id;
            any = true;
        }
    }
    tok->vocab_size = any ? max + 1 : 0;
}

static int mark_whole(kvg_tokenizer *tok);

int kvg_tokenizer_load(const char *json, size_t len, kvg_tokenizer **out, char *err, size_t errlen)
{
    loader ld = {.err = err, .errlen = errlen};
    char q[80];
    int rc;
    if (err && errlen)
        err[0] = '\0';
    kvg_buf_init(&ld.pool);
    ld.tok = calloc(1, sizeof(*ld.tok));
    if (!ld.tok)
        return lfail(&ld, -ENOMEM, "out of memory");
    kvg_tokenizer *tok = ld.tok;
    kvg_arena arena;
    kvg_arena_init(&arena, 1u << 20);
    kvg_json *root;
    kvg_json_error jerr;
    kvg_json_limits lim = {.max_depth = JSON_DEPTH_MAX};
    rc = kvg_json_parse(json, len, &arena, &lim, &root, &jerr);
    if (rc) {
        rc = rc == -ENOMEM ? lfail(&ld, rc, "out of memory")
                           : lfail(&ld, KVG_EPARSE, "not valid JSON (byte %zu: %s)", jerr.offset,
                                   jerr.message);
        goto fail;
    }
    if (root->type != KVG_JSON_OBJECT) {
        rc = lfail(&ld, KVG_EPARSE, "the top level is %s, not an object",
                   kvg_json_type_str(root->type));
        goto fail;
    }
    const char *null_only[] = {"truncation", "padding"};
    for (size_t i = 0; i < 2; i++) {
        const kvg_json *v = kvg_json_get(root, null_only[i]);
        if (!is_null(v)) {
            rc = lfail(&ld, KVG_ECONFIG, "%s %s is not supported (null only)", null_only[i],
                       quoted(v, q, sizeof(q)));
            goto fail;
        }
    }
    if ((rc = load_normalizer(&ld, kvg_json_get(root, "normalizer"), "normalizer")) ||
        (rc = load_pre_tokenizer(&ld, kvg_json_get(root, "pre_tokenizer"))) ||
        (rc = load_model(&ld, kvg_json_get(root, "model"))) ||
        (rc = load_added(&ld, kvg_json_get(root, "added_tokens"))) ||
        (rc = load_post_processor(&ld, kvg_json_get(root, "post_processor"), "post_processor")))
        goto fail;
    kvg_arena_done(&arena);
    tokenizer_size(tok);
    tok->pool = kvg_buf_steal(&ld.pool, &tok->pool_len);
    if (!tok->pool)
        tok->pool = malloc(1);
    if (!tok->pool || mark_whole(tok)) {
        rc = lfail(&ld, -ENOMEM, "out of memory");
        kvg_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return 0;
fail:
    kvg_arena_done(&arena);
    kvg_buf_done(&ld.pool);
    kvg_tokenizer_free(tok);
    return rc;
}

int kvg_tokenizer_load_file(const char *path, kvg_tokenizer **out, char *err, size_t errlen)
{
    char *data = NULL;
    size_t size = 0;
    int rc = kvg_read_file(path, KVG_TOKENIZER_FILE_MAX, &data, &size);
    if (rc == KVG_ELIMIT) {
        if (err && errlen)
            snprintf(err, errlen, "%s: larger than %u bytes", path, KVG_TOKENIZER_FILE_MAX);
        return rc;
    }
    if (rc < 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s: %s", path, kvg_strerror(rc));
        return rc;
    }
    rc = kvg_tokenizer_load(data, size, out, err, errlen);
    free(data);
    return rc;
}

void kvg_tokenizer_free(kvg_tokenizer *tok)
{
    if (!tok)
        return;
    strtab_done(&tok->vocab);
    strtab_done(&tok->vocab_lit);
    strtab_done(&tok->added_map);
    free(tok->merges.slots);
    free(tok->added);
    free(tok->raw_trie.nodes);
    free(tok->norm_trie.nodes);
    free(tok->pool);
    free(tok);
}

/* ---- lookups ------------------------------------------------------------------------------- */

int kvg_tokenizer_token_id(const kvg_tokenizer *tok, const char *s, size_t len, uint32_t *id)
{
    const strslot *sl = strtab_find(&tok->added_map, tok->pool, s, len);
    if (sl) {
        *id = sl->id;
        return 0;
    }
    return model_lookup(tok, tok->pool, s, len, id) ? 0 : KVG_ENOTFOUND;
}

uint32_t kvg_tokenizer_vocab_size(const kvg_tokenizer *tok)
{
    return tok->vocab_size;
}

int kvg_tokenizer_bos_id(const kvg_tokenizer *tok, uint32_t *id)
{
    if (!tok->n_prefix)
        return KVG_ENOTFOUND;
    *id = tok->prefix[0];
    return 0;
}

int kvg_tokenizer_eos_id(const kvg_tokenizer *tok, uint32_t *id)
{
    if (!tok->n_suffix)
        return KVG_ENOTFOUND;
    *id = tok->suffix[tok->n_suffix - 1];
    return 0;
}

/* ---- encoding ------------------------------------------------------------------------------ */

typedef struct sym {
    uint32_t id; /* DEAD once merged into its left neighbour */
    int32_t prev, next;
} sym;

struct kvg_tokens_scratch {
    /* kvg_tokenizer_encode_cached's cache and scope, for the call in progress (else NULL). */
    kvg_tokenizer_cache *cache;
    const void *scope;
    size_t scope_len;
    kvg_buf norm;
    sym *syms;
    uint32_t *ranks;
    size_t syms_cap;
    uint64_t *heap;
    size_t heap_cap;
};

void kvg_tokens_init(kvg_tokens *t)
{
    memset(t, 0, sizeof(*t));
}

void kvg_tokens_done(kvg_tokens *t)
{
    if (t->scratch) {
        kvg_buf_done(&t->scratch->norm);
        free(t->scratch->syms);
        free(t->scratch->ranks);
        free(t->scratch->heap);
        free(t->scratch);
    }
    free(t->ids);
    memset(t, 0, sizeof(*t));
}

void kvg_tokens_reset(kvg_tokens *t)
{
    t->len = 0;
}

static int tokens_reserve(kvg_tokens *t, size_t more)
{
    if (t->cap - t->len >= more)
        return 0;
    size_t cap = t->cap ? t->cap : 256;
    while (cap - t->len < more)
        cap *= 2;
    uint32_t *ids = realloc(t->ids, cap * sizeof(*ids));
    if (!ids)
        return -ENOMEM;
    t->ids = ids;
    t->cap = cap;
    return 0;
}

static int scratch_syms(kvg_tokens_scratch *s, size_t n)
{
    if (n <= s->syms_cap)
        return 0;
    size_t cap = s->syms_cap ? s->syms_cap : 64;
    while (cap < n)
        cap *= 2;
    sym *ns = realloc(s->syms, cap * sizeof(*ns));
    if (!ns)
        return -ENOMEM;
    s->syms = ns;
    uint32_t *nr = realloc(s->ranks, cap * sizeof(*nr));
    if (!nr)
        return -ENOMEM;
    s->ranks = nr;
    uint64_t *nh = realloc(s->heap, 3 * cap * sizeof(*nh));
    if (!nh)
        return -ENOMEM;
    s->heap = nh;
    s->heap_cap = 3 * cap;
    s->syms_cap = cap;
    return 0;
}

static inline void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0];
    uint64_t v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = v;
    return top;
}

/* Pieces up to this many symbols merge by scanning for the best pair (cheaper than a heap at
 * these sizes); longer ones use the library's priority queue. Both apply the pair of lowest
 * rank, leftmost first, until none is left, so they give the same tokens. */
#define SCAN_MAX 24

static uint32_t rank_of(const kvg_tokenizer *tok, uint32_t a, uint32_t b, uint32_t *new_id)
{
    const pairslot *sl = pairtab_find(&tok->merges, a, b);
    if (!sl)
        return UINT32_MAX;
    *new_id = sl->new_id;
    return sl->rank;
}

/* The merges of BPE on one piece (raw bytes); appends its ids (at most len of them: room was
 * reserved). */
static int bpe_merge(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const unsigned char *p,
                     size_t len, kvg_tokens *out)
{
    int rc = scratch_syms(s, len);
    if (rc)
        return rc;
    sym *sy = s->syms;
    uint32_t *rk = s->ranks;
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        /* A byte outside the vocabulary is dropped, as BPE without unk_token does. */
        if (tok->byte_known[p[i]])
            sy[m++].id = tok->byte_id[p[i]];
    }
    if (m <= SCAN_MAX) {
        uint32_t nid[SCAN_MAX] = {0};
        for (size_t i = 0; i + 1 < m; i++)
            rk[i] = rank_of(tok, sy[i].id, sy[i + 1].id, &nid[i]);
        while (m > 1) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < m; i++) {
                if (rk[i] < rk[best])
                    best = i;
            }
            if (rk[best] == UINT32_MAX)
                break;
            sy[best].id = nid[best];
            for (size_t i = best + 1; i + 1 < m; i++) {
                sy[i].id = sy[i + 1].id;
                rk[i] = rk[i + 1];
                nid[i] = nid[i + 1];
            }
            m--;
            if (best > 0)
                rk[best - 1] = rank_of(tok, sy[best - 1].id, sy[best].id, &nid[best - 1]);
            if (best + 1 < m)
                rk[best] = rank_of(tok, sy[best].id, sy[best + 1].id, &nid[best]);
        }
        for (size_t i = 0; i < m; i++)
            out->ids[out->len++] = sy[i].id;
        return 0;
    }
    uint64_t *h = s->heap;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++) {
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < m ? (int32_t)i + 1 : -1;
        uint32_t nid = 0;
        uint32_t r = i + 1 < m ? rank_of(tok, sy[i].id, sy[i + 1].id, &nid) : UINT32_MAX;
        if (r != UINT32_MAX)
            heap_push(h, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(h, &hn);
        uint32_t r = (uint32_t)(top >> 32), pos = (uint32_t)top;
        if (sy[pos].id == DEAD || sy[pos].next < 0)
            continue;
        int32_t nx = sy[pos].next;
        uint32_t nid = 0;
        /* A stale entry: its pair has changed since it was queued. */
        if (rank_of(tok, sy[pos].id, sy[nx].id, &nid) != r)
            continue;
        sy[pos].id = nid;
        sy[nx].id = DEAD;
        sy[pos].next = sy[nx].next;
        if (sy[pos].next >= 0)
            sy[sy[pos].next].prev = (int32_t)pos;
        uint32_t r2, nid2 = 0;
        if (sy[pos].prev >= 0 &&
            (r2 = rank_of(tok, sy[sy[pos].prev].id, sy[pos].id, &nid2)) != UINT32_MAX)
            heap_push(h, &hn, (uint64_t)r2 << 32 | (uint32_t)sy[pos].prev);
        if (sy[pos].next >= 0 &&
            (r2 = rank_of(tok, sy[pos].id, sy[sy[pos].next].id, &nid2)) != UINT32_MAX)
            heap_push(h, &hn, (uint64_t)r2 << 32 | pos);
    }
    for (int32_t i = m ? 0 : -1; i >= 0; i = sy[i].next)
        out->ids[out->len++] = sy[i].id;
    return 0;
}

/* BPE on one pre-tokenized piece: a whole vocabulary entry where that is what BPE gives (or
 * where ignore_merges says so), the merges otherwise. */
static inline int bpe_piece(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const unsigned char *p,
                            size_t len, kvg_tokens *out)
{
    const strslot *sl = strtab_find(&tok->vocab, tok->pool, p, len);
    if (sl && (tok->ignore_merges || (sl->id & ID_WHOLE))) {
        out->ids[out->len++] = sl->id & ID_MASK;
        return 0;
    }
    return bpe_merge(tok, s, p, len, out);
}

static kvg_tokens_scratch *scratch_new(void)
{
    kvg_tokens_scratch *s = calloc(1, sizeof(*s));
    if (s)
        kvg_buf_init(&s->norm);
    return s;
}

/* Mark the vocabulary entries that BPE merges back into themselves (ID_WHOLE): in natural text
 * most pieces are such words, and a lookup replaces their merging. */
static int mark_whole(kvg_tokenizer *tok)
{
    if (tok->ignore_merges)
        return 0;
    kvg_tokens t;
    kvg_tokens_init(&t);
    t.scratch = scratch_new();
    int rc = t.scratch ? 0 : -ENOMEM;
    for (uint32_t i = 0; !rc && i <= tok->vocab.mask; i++) {
        strslot *sl = &tok->vocab.slots[i];
        if (sl->off == EMPTY)
            continue;
        t.len = 0;
        if ((rc = tokens_reserve(&t, sl->len)) ||
            (rc = bpe_merge(tok, t.scratch, (const unsigned char *)tok->pool + sl->off, sl->len,
                            &t)))
            break;
        if (t.len == 1 && t.ids[0] == sl->id)
            sl->id |= ID_WHOLE;
    }
    kvg_tokens_done(&t);
    return rc;
}

/* Pre-tokenize one normalized piece and run BPE on each part. */
static int model_piece(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const char *p, size_t len,
                       kvg_tokens *out)
{
    if (!len)
        return 0;
    int rc = tokens_reserve(out, len);
    if (rc)
        return rc;
    const unsigned char *u = (const unsigned char *)p;
    if (!tok->split)
        return bpe_piece(tok, s, u, len, out);
    for (size_t pos = 0; pos < len;) {
        size_t n = kvg_pretok_next(tok->pretok, p, len, pos);
        if ((rc = bpe_piece(tok, s, u + pos, n, out)))
            return rc;
        pos += n;
    }
    return 0;
}

/* Rust's char::is_whitespace (the White_Space property), for lstrip and rstrip. */
static bool cp_is_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

static uint32_t cp_at(const unsigned char *s, size_t *n)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *n = 1;
        return c;
    }
    if (c < 0xe0) {
        *n = 2;
        return (uint32_t)(c & 0x1f) << 6 | (s[1] & 0x3f);
    }
    if (c < 0xf0) {
        *n = 3;
        return (uint32_t)(c & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    }
    *n = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
           (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
}

/* The code point ending at s[end-1] (end > 0, valid UTF-8); *start is where it begins. */
static uint32_t cp_before(const unsigned char *s, size_t end, size_t *start)
{
    size_t i = end - 1;
    while (i > 0 && (s[i] & 0xc0) == 0x80)
        i--;
    size_t n;
    *start = i;
    return cp_at(s + i, &n);
}

/* \w of the Rust regex crate, which single_word consults (`\w$` and `^\w`). */
static bool cp_is_word(uint32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    return kvg_tokenizer_is_word(c);
}

/* The longest pattern of t at s[pos..]: its added-token index and length, or -1. */
static int32_t trie_match(const trie *t, const unsigned char *s, size_t len, size_t pos,
                          size_t *mlen)
{
    uint32_t cur = 0;
    int32_t best = -1;
    for (size_t i = pos; i < len; i++) {
        uint32_t k = t->nodes[cur].child;
        while (k && t->nodes[k].byte != s[i])
            k = t->nodes[k].sibling;
        if (!k)
            break;
        cur = k;
        if (t->nodes[k].token >= 0) {
            best = t->nodes[k].token;
            *mlen = i + 1 - pos;
        }
    }
    return best;
}

static int normalized_piece(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const char *p,
                            size_t len, kvg_tokens *out);

/* Split [p, p+len) at the added tokens of trie t (AddedVocabulary::find_matches: leftmost-
 * longest matches, then each token's single_word, lstrip and rstrip), and hand every other
 * piece on: to normalization when t is the raw trie, to the model when it is the normalized
 * one. */
static int normalized_piece(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const char *p,
                            size_t len, kvg_tokens *out);

static int take_ids(void *ud, const uint32_t *ids, size_t n)
{
    kvg_tokens *out = ud;
    int rc = tokens_reserve(out, n);
    if (rc)
        return rc;
    memcpy(out->ids + out->len, ids, n * sizeof(*ids));
    out->len += n;
    return 0;
}

/* A piece of the text between added tokens: its ids are a function of its bytes alone (the
 * normalizer, the pre-tokenizer and BPE see nothing past it), so a long one is cached. */
static int raw_piece(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const char *p, size_t len,
                     kvg_tokens *out)
{
    if (!s->cache || len < KVG_TOKENIZER_CACHE_MIN)
        return normalized_piece(tok, s, p, len, out);
    kvg_piece_key k = kvg_piece_key_of(s->cache, s->scope, s->scope_len, p, len);
    int rc = kvg_tokenizer_cache_get(s->cache, &k, take_ids, out);
    if (rc)
        return rc < 0 ? rc : 0;
    size_t start = out->len;
    rc = normalized_piece(tok, s, p, len, out);
    if (rc == 0)
        kvg_tokenizer_cache_put(s->cache, &k, out->ids + start, out->len - start);
    return rc;
}

static int split_added(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const trie *t,
                       const char *text, size_t len, kvg_tokens *out)
{
    const unsigned char *u = (const unsigned char *)text;
    bool raw = t == &tok->raw_trie;
    size_t start_offset = 0;
    int rc;
    if (!t->empty) {
        for (size_t pos = 0; pos < len;) {
            if (t->only_first >= 0) {
                const unsigned char *next = memchr(u + pos, t->only_first, len - pos);
                if (!next)
                    break;
                pos = (size_t)(next - u);
            } else if (!t->first[u[pos]]) {
                pos++;
                continue;
            }
            size_t mlen = 0;
            int32_t ti = trie_match(t, u, len, pos, &mlen);
            if (ti < 0) {
                pos++;
                continue;
            }
            const added_token *at = &tok->added[ti];
            size_t start = pos, stop = pos + mlen;
            pos = stop;
            if (at->single_word) {
                size_t cs, cn;
                bool start_space = start == 0 || !cp_is_word(cp_before(u, start, &cs));
                bool stop_space = stop == len || !cp_is_word(cp_at(u + stop, &cn));
                if (!start_space || !stop_space)
                    continue;
            }
            if (at->lstrip) {
                size_t ns = start;
                while (ns > 0) {
                    size_t cs;
                    if (!cp_is_space(cp_before(u, ns, &cs)))
                        break;
                    ns = cs;
                }
                start = KVG_MAX(ns, start_offset);
            }
            if (at->rstrip) {
                while (stop < len) {
                    size_t cn;
                    if (!cp_is_space(cp_at(u + stop, &cn)))
                        break;
                    stop += cn;
                }
            }
            if (start_offset < start) {
                rc = raw ? raw_piece(tok, s, text + start_offset, start - start_offset, out)
                         : model_piece(tok, s, text + start_offset, start - start_offset, out);
                if (rc)
                    return rc;
            }
            if ((rc = tokens_reserve(out, 1)))
                return rc;
            out->ids[out->len++] = at->id;
            start_offset = stop;
        }
    }
    if (start_offset < len)
        return raw ? raw_piece(tok, s, text + start_offset, len - start_offset, out)
                   : model_piece(tok, s, text + start_offset, len - start_offset, out);
    return 0;
}

static int normalized_piece(const kvg_tokenizer *tok, kvg_tokens_scratch *s, const char *p,
                            size_t len, kvg_tokens *out)
{
    if (!tok->nfc)
        return split_added(tok, s, &tok->norm_trie, p, len, out);
    kvg_buf_reset(&s->norm);
    int rc = kvg_unicode_nfc(p, len, &s->norm);
    if (rc)
        return rc;
    return split_added(tok, s, &tok->norm_trie, s->norm.data ? s->norm.data : "", s->norm.len, out);
}

int kvg_tokenizer_encode_cached(const kvg_tokenizer *tok, const char *text, size_t len,
                                bool add_special_tokens, kvg_tokenizer_cache *cache,
                                const void *scope, size_t scope_len, kvg_tokens *out)
{
    if (!cache)
        return kvg_tokenizer_encode(tok, text, len, add_special_tokens, out);
    if (!out->scratch && !(out->scratch = scratch_new()))
        return -ENOMEM;
    out->scratch->cache = cache;
    out->scratch->scope = scope ? scope : "";
    out->scratch->scope_len = scope ? scope_len : 0;
    int rc = kvg_tokenizer_encode(tok, text, len, add_special_tokens, out);
    out->scratch->cache = NULL;
    return rc;
}

int kvg_tokenizer_encode(const kvg_tokenizer *tok, const char *text, size_t len,
                         bool add_special_tokens, kvg_tokens *out)
{
    if (!kvg_utf8_valid(text, len))
        return KVG_EPARSE;
    if (!out->scratch && !(out->scratch = scratch_new()))
        return -ENOMEM;
    size_t old = out->len;
    int rc = 0;
    if (add_special_tokens && tok->n_prefix) {
        if ((rc = tokens_reserve(out, tok->n_prefix)))
            goto fail;
        memcpy(out->ids + out->len, tok->prefix, tok->n_prefix * sizeof(uint32_t));
        out->len += tok->n_prefix;
    }
    if ((rc = split_added(tok, out->scratch, &tok->raw_trie, text, len, out)))
        goto fail;
    if (add_special_tokens && tok->n_suffix) {
        if ((rc = tokens_reserve(out, tok->n_suffix)))
            goto fail;
        memcpy(out->ids + out->len, tok->suffix, tok->n_suffix * sizeof(uint32_t));
        out->len += tok->n_suffix;
    }
    return 0;
fail:
    out->len = old;
    return rc;
}
