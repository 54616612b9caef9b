/* SPDX-License-Identifier: Apache-2.0 */
/* The state that gateway replicas share through Redis (docs/redis.md#shared-state): one
 * document (the state file's JSON) in one hash, changed only by a compare-and-set script that
 * also publishes the new version; a sync thread that applies the other replicas' changes
 * (pub/sub, and a periodic version check that heals a lost message or a wiped Redis); the
 * verifier of the server secret. */
#include "admin_int.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "prom.h"

#define VERIFIER_LABEL "kvgate server secret verifier v1"
#define VERIFIER_HEX 64
#define KEY_MAX 320
#define EPOCH_MAX 32 /* what this code writes: 16 hex digits; longer ones from Redis refused */
#define ID_MAX 64    /* "<epoch>:<version>", as published */
#define WHY_MAX 320

/* What a check of the shared state came to, for kvgate_state_sync_total{outcome}. */
typedef enum sync_outcome {
    SYNC_UNCHANGED = 0, /* Redis has the version this replica has */
    SYNC_APPLIED,       /* another replica's document applied */
    SYNC_SEEDED,        /* Redis had none: this replica's state stored */
    SYNC_ERROR,         /* Redis unreachable, or an answer that makes no sense */
    SYNC_INVALID,       /* a document this replica cannot apply (kept its own) */
    SYNC_MISMATCH,      /* Redis holds the verifier of another server secret */
    SYNC_OUTCOME_COUNT,
} sync_outcome;

static const char *const sync_names[SYNC_OUTCOME_COUNT] = {
    "unchanged", "applied", "seeded", "error", "invalid", "mismatch",
};

/* Commits of admin changes, for kvgate_state_commits_total{outcome}. */
typedef enum commit_outcome {
    COMMIT_OK = 0,
    COMMIT_CONFLICT, /* another replica committed first: made again on top of its state */
    COMMIT_ERROR,    /* not committed (Redis unreachable, another secret): taken back */
    COMMIT_OUTCOME_COUNT,
} commit_outcome;

static const char *const commit_names[COMMIT_OUTCOME_COUNT] = {"ok", "conflict", "error"};

struct admin_shared {
    kvg_admin *admin;
    kvg_redis *redis;
    char key[KEY_MAX];     /* "<prefix>:{state}": fields epoch, version, doc, verifier */
    char channel[KEY_MAX]; /* "<prefix>:state": the CAS script publishes "<epoch>:<version>" */
    char verifier[VERIFIER_HEX + 1];
    uint32_t interval_ms, timeout_ms;

    /* Guarded by admin->change_lock: the version this replica's state is (epoch "" before
     * the first), the document Redis held at that version, the command connection. */
    char epoch[EPOCH_MAX + 1];
    uint64_t version;
    kvg_buf base;
    redisContext *cmd;
    char last_bad[ID_MAX]; /* a document already reported as not applicable */

    /* The sync thread, and its pub/sub connection (its own). */
    pthread_t thread;
    bool started;
    int wake_fd;
    _Atomic bool stop;
    redisContext *sub;
    bool ping_out; /* a PING on sub waits for its answer */

    /* Degradation for /readyz (lock). */
    pthread_mutex_t lock;
    char degraded[WHY_MAX];
    bool sub_degraded; /* the last subscription attempt failed (logged once): written by the
                        * sync thread alone, which reads it without the lock */

    _Atomic uint64_t version_gauge;
    _Atomic uint64_t subscribed;
    _Atomic uint64_t syncs[SYNC_OUTCOME_COUNT];
    _Atomic uint64_t commits[COMMIT_OUTCOME_COUNT];
};

/*
 * The compare-and-set: the only way the document changes. KEYS[1] the hash; ARGV: [1] the
 * epoch the writer's state is of ("" = it believes there is none), [2] its version, [3] a new
 * epoch (used when the hash holds no document), [4] the document, [5] the writer's verifier,
 * [6] the channel. The epoch is drawn at random by whoever stores a document into an empty
 * Redis, so that versions counted again from 1 after a wipe are never taken for the old ones.
 * Answers {"ok", epoch, version}, {"conflict", epoch, version, doc}, {"absent"} (the writer
 * had a version, Redis has nothing: it was wiped or restarted empty) or {"mismatch"}.
 */
static const char cas_script[] =
    "local cur = redis.call('HMGET', KEYS[1], 'epoch', 'version', 'verifier')\n"
    "if cur[3] and cur[3] ~= ARGV[5] then return {'mismatch'} end\n"
    "local epoch, version = cur[1], 1\n"
    "if epoch then\n"
    "  if epoch ~= ARGV[1] or cur[2] ~= ARGV[2] then\n"
    "    return {'conflict', epoch, cur[2] or '0', redis.call('HGET', KEYS[1], 'doc') or ''}\n"
    "  end\n"
    "  version = tonumber(cur[2]) + 1\n"
    "else\n"
    "  if ARGV[1] ~= '' then return {'absent'} end\n"
    "  epoch = ARGV[3]\n"
    "end\n"
    "local v = string.format('%d', version)\n"
    "redis.call('HSET', KEYS[1], 'epoch', epoch, 'version', v, 'doc', ARGV[4], 'verifier', "
    "ARGV[5])\n"
    "redis.call('PUBLISH', ARGV[6], epoch .. ':' .. v)\n"
    "return {'ok', epoch, v}\n";

/* At start-up: the verifier set when absent and compared, and the document if there is one.
 * KEYS[1] the hash, ARGV[1] the verifier. {"mismatch"}, {"absent"} or {"ok", epoch, version,
 * doc}. */
static const char start_script[] =
    "local v = redis.call('HGET', KEYS[1], 'verifier')\n"
    "if v and v ~= ARGV[1] then return {'mismatch'} end\n"
    "if not v then redis.call('HSET', KEYS[1], 'verifier', ARGV[1]) end\n"
    "local cur = redis.call('HMGET', KEYS[1], 'epoch', 'version', 'doc')\n"
    "if not cur[1] then return {'absent'} end\n"
    "return {'ok', cur[1], cur[2] or '0', cur[3] or ''}\n";

static const char mismatch_msg[] =
    "this gateway's server secret is not the one the other replicas sharing this Redis use "
    "(the verifier stored there differs), so its cache salts would differ from theirs; every "
    "replica must run with the same secret: the same KVGATE_SECRET, \"secret\" in the config "
    "file, or a copy of the same <state dir>/secret file";

/* /readyz's line for the same. */
static const char mismatch_degraded[] =
    "Redis holds the state of replicas with another server secret";

int kvg_admin_secret_verifier(const uint8_t *secret, size_t len, char out[VERIFIER_HEX + 1])
{
    static const uint8_t empty[1];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    /* A NULL key means "the previous key" to some OpenSSL paths: never pass one. */
    if (!HMAC(EVP_sha256(), len ? (const void *)secret : empty, (int)len,
              (const unsigned char *)VERIFIER_LABEL, sizeof(VERIFIER_LABEL) - 1, md, &mdlen) ||
        mdlen != VERIFIER_HEX / 2)
        return KVG_ETLS;
    kvg_hex_encode(md, mdlen, out);
    out[VERIFIER_HEX] = '\0';
    OPENSSL_cleanse(md, sizeof(md));
    return 0;
}

/* ---- degradation ------------------------------------------------------------------------- */

static void set_degraded(admin_shared *s, const char *why)
{
    pthread_mutex_lock(&s->lock);
    snprintf(s->degraded, sizeof(s->degraded), "%s", why ? why : "");
    pthread_mutex_unlock(&s->lock);
}

bool kvg_admin_shared_healthy(admin_shared *s, char *why, size_t len)
{
    pthread_mutex_lock(&s->lock);
    if (s->degraded[0])
        snprintf(why, len, "%s", s->degraded);
    else if (s->sub_degraded)
        snprintf(why, len,
                 "no pub/sub subscription: changes of other replicas arrive by the "
                 "periodic check only");
    else if (len)
        why[0] = '\0';
    bool ok = !s->degraded[0] && !s->sub_degraded;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

/* ---- the command connection ---------------------------------------------------------------- */

static void cmd_drop(admin_shared *s)
{
    redisFree(s->cmd);
    s->cmd = NULL;
}

/* Run a command on the command connection (change_lock held). A connection that fails (a
 * Redis restarted, a failover) is made again once and the command sent again, unless it timed
 * out: the compare-and-set recognises its own document if a first one landed anyway. An error
 * reply is KVG_EPROTO with its text in why. The reply is the caller's. */
static int command(admin_shared *s, int argc, const char **argv, const size_t *lens,
                   redisReply **out, char *why, size_t len)
{
    for (int attempt = 0;; attempt++) {
        int rc = 0;
        if (!s->cmd) {
            char msg[256] = "";
            rc = kvg_redis_connect_blocking(s->redis, s->key, strlen(s->key), s->timeout_ms,
                                            &s->cmd, msg, sizeof(msg));
            if (rc < 0) {
                snprintf(why, len, "Redis: %s", msg[0] ? msg : kvg_strerror(rc));
                return rc;
            }
        }
        errno = 0;
        redisReply *r = redisCommandArgv(s->cmd, argc, argv, lens);
        if (!r) {
            bool timeout = s->cmd->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
            snprintf(why, len, "Redis: %s",
                     timeout ? "no answer within redis.command_timeout_ms"
                             : (s->cmd->errstr[0] ? s->cmd->errstr : "connection lost"));
            cmd_drop(s);
            if (attempt == 0 && !timeout)
                continue;
            return timeout ? -ETIMEDOUT : -ECONNRESET;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            snprintf(why, len, "Redis answered: %.*s", (int)KVG_MIN(r->len, (size_t)200), r->str);
            /* A slot that moved, a primary that became a replica: ask for the topology again
             * and connect afresh next time. */
            if (strncmp(r->str, "MOVED", 5) == 0 || strncmp(r->str, "ASK", 3) == 0 ||
                strncmp(r->str, "READONLY", 8) == 0) {
                cmd_drop(s);
                kvg_redis_refresh_topology(s->redis);
            }
            freeReplyObject(r);
            return KVG_EPROTO;
        }
        *out = r;
        return 0;
    }
}

static bool reply_is(const redisReply *r, const char *s)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) &&
           r->len == strlen(s) && memcmp(r->str, s, r->len) == 0;
}

/* A reply element that is a string, or NULL (nil). */
static const redisReply *str_at(const redisReply *r, size_t i)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements)
        return NULL;
    const redisReply *e = r->element[i];
    return e && e->type == REDIS_REPLY_STRING ? e : NULL;
}

/* An epoch and a version from two reply elements; false when they make no sense. */
static bool read_id(const redisReply *e, const redisReply *v, char *epoch, uint64_t *version)
{
    if (!e || !v || e->len == 0 || e->len > EPOCH_MAX || memchr(e->str, ':', e->len) ||
        kvg_parse_u64(v->str, v->len, version) < 0)
        return false;
    memcpy(epoch, e->str, e->len);
    epoch[e->len] = '\0';
    return true;
}

/* ---- applying and committing (change_lock held) ---------------------------------------------- */

/* Take back whatever memory holds beyond the last document Redis had. */
static void restore(admin_shared *s)
{
    char why[WHY_MAX];
    if (kvg_admin_apply_doc(s->admin, s->base.data ? s->base.data : "", s->base.len, true, why,
                            sizeof(why)) < 0)
        kvg_log_error("admin: could not restore the shared state of version %llu: %s",
                      (unsigned long long)s->version, why);
}

static void write_backup(admin_shared *s)
{
    char why[WHY_MAX];
    if (kvg_admin_write_state_file(s->admin, s->base.data, s->base.len, why, sizeof(why)) < 0)
        kvg_log_warn("admin: the state file (a local copy of the shared state) was not "
                     "written: %s",
                     why);
}

static void set_id(admin_shared *s, const char *epoch, uint64_t version)
{
    snprintf(s->epoch, sizeof(s->epoch), "%s", epoch);
    s->version = version;
    atomic_store_explicit(&s->version_gauge, version, memory_order_relaxed);
}

/* Make next (taken: it is left empty) the document of this replica's version. The old one is
 * wiped as kvg_admin_shared_free wipes it: it holds key digests. */
static void take_base(admin_shared *s, kvg_buf *next)
{
    if (s->base.data)
        OPENSSL_cleanse(s->base.data, s->base.cap);
    kvg_buf_done(&s->base);
    s->base = *next;
    kvg_buf_init(next);
}

/* Keep a copy of doc as the document of this replica's version. */
static int set_base(admin_shared *s, const char *doc, size_t len)
{
    kvg_buf next;
    kvg_buf_init(&next);
    kvg_buf_append(&next, doc, len);
    if (next.failed) {
        kvg_buf_done(&next);
        return -ENOMEM;
    }
    take_base(s, &next);
    return 0;
}

/* Make the state in memory the document Redis holds at (epoch, version): the same document
 * again changes nothing; one that cannot be applied leaves the state as it was. */
static int adopt(admin_shared *s, const char *epoch, uint64_t version, const char *doc, size_t len,
                 char *why, size_t why_len)
{
    bool same = s->base.len == len && len && memcmp(s->base.data, doc, len) == 0;
    if (!same) {
        int rc = kvg_admin_apply_doc(s->admin, doc, len, true, why, why_len);
        if (rc == 0)
            rc = set_base(s, doc, len);
        if (rc < 0) {
            if (rc == -ENOMEM)
                snprintf(why, why_len, "out of memory");
            restore(s); /* sections before the bad one were applied */
            return rc;
        }
    }
    set_id(s, epoch, version);
    if (!same)
        write_backup(s);
    return 0;
}

/* The outcome of one compare-and-set. */
typedef struct cas_result {
    redisReply *reply;
    enum { CAS_OK, CAS_CONFLICT, CAS_ABSENT, CAS_MISMATCH } kind;
    char epoch[EPOCH_MAX + 1];
    uint64_t version;
    const redisReply *doc; /* CAS_CONFLICT */
} cas_result;

static int cas(admin_shared *s, bool seed, const kvg_buf *doc, cas_result *res, char *why,
               size_t len)
{
    char version[24], epoch[EPOCH_MAX + 1];
    uint64_t raw;
    int rc = kvg_random_bytes(&raw, sizeof(raw));
    if (rc < 0) {
        snprintf(why, len, "no random epoch: %s", kvg_strerror(rc));
        return rc;
    }
    snprintf(epoch, sizeof(epoch), "%016llx", (unsigned long long)raw);
    snprintf(version, sizeof(version), "%llu", (unsigned long long)s->version);
    const char *expect = seed ? "" : s->epoch;
    const char *argv[] = {"EVAL",  cas_script, "1",       s->key,      expect,
                          version, epoch,      doc->data, s->verifier, s->channel};
    size_t lens[] = {4,
                     sizeof(cas_script) - 1,
                     1,
                     strlen(s->key),
                     strlen(expect),
                     strlen(version),
                     strlen(epoch),
                     doc->len,
                     VERIFIER_HEX,
                     strlen(s->channel)};
    redisReply *r;
    rc = command(s, (int)KVG_ARRAY_LEN(argv), argv, lens, &r, why, len);
    if (rc < 0)
        return rc;
    *res = (cas_result){.reply = r};
    const redisReply *kind = r->type == REDIS_REPLY_ARRAY && r->elements ? r->element[0] : NULL;
    if (reply_is(kind, "ok") && read_id(str_at(r, 1), str_at(r, 2), res->epoch, &res->version)) {
        res->kind = CAS_OK;
    } else if (reply_is(kind, "conflict") && str_at(r, 3) &&
               read_id(str_at(r, 1), str_at(r, 2), res->epoch, &res->version)) {
        res->kind = CAS_CONFLICT;
        res->doc = str_at(r, 3);
    } else if (reply_is(kind, "absent")) {
        res->kind = CAS_ABSENT;
    } else if (reply_is(kind, "mismatch")) {
        res->kind = CAS_MISMATCH;
    } else {
        freeReplyObject(r);
        snprintf(why, len, "Redis: an unexpected answer to the state's compare-and-set");
        return KVG_EPROTO;
    }
    return 0;
}

/* Store this replica's state as it is in memory (cas; seed: into a Redis that holds none). An
 * answer "conflict" with this very document is an attempt of ours whose answer was lost: ok.
 * On ok the document becomes the base, at the version Redis gave it. */
static int store(admin_shared *s, bool seed, cas_result *res, char *why, size_t len)
{
    kvg_buf doc;
    kvg_buf_init(&doc);
    kvg_admin_state_doc(s->admin, &doc); /* never empty: data is not NULL unless failed */
    if (doc.failed) {
        kvg_buf_done(&doc);
        snprintf(why, len, "out of memory");
        return -ENOMEM;
    }
    int rc = cas(s, seed, &doc, res, why, len);
    if (rc == 0 && res->kind == CAS_CONFLICT && res->doc->len == doc.len &&
        memcmp(res->doc->str, doc.data, doc.len) == 0)
        res->kind = CAS_OK;
    if (rc == 0 && res->kind == CAS_OK) {
        take_base(s, &doc);
        set_id(s, res->epoch, res->version);
    }
    if (doc.data)
        OPENSSL_cleanse(doc.data, doc.cap);
    kvg_buf_done(&doc);
    return rc;
}

int kvg_admin_shared_commit(kvg_admin *admin, bool *undone, char *why, size_t why_len)
{
    admin_shared *s = admin->shared;
    cas_result res = {0};
    int rc = store(s, false, &res, why, why_len);
    if (rc == 0 && res.kind == CAS_ABSENT) {
        /* Redis lost the state (restarted empty, or wiped) while this replica had it: store
         * ours, this change included, rather than lose it. */
        kvg_log_warn("admin: Redis holds no shared state any more (restarted empty or "
                     "wiped?): storing this gateway's");
        freeReplyObject(res.reply);
        rc = store(s, true, &res, why, why_len);
    }
    if (rc == 0) {
        switch (res.kind) {
        case CAS_OK:
            write_backup(s);
            break;
        case CAS_CONFLICT:
            atomic_fetch_add_explicit(&s->commits[COMMIT_CONFLICT], 1, memory_order_relaxed);
            rc = adopt(s, res.epoch, res.version, res.doc->str, res.doc->len, why, why_len);
            if (rc == 0) {
                kvg_log_info("admin: the shared state moved to version %llu on another "
                             "replica first; making the change again on top of it",
                             (unsigned long long)res.version);
                rc = -EAGAIN;
            } else {
                char bad[WHY_MAX];
                snprintf(bad, sizeof(bad), "%s", why);
                snprintf(why, why_len, "the shared state in Redis cannot be applied: %s", bad);
                rc = KVG_EPARSE;
            }
            break;
        case CAS_MISMATCH:
            snprintf(why, why_len, "%s", mismatch_msg);
            set_degraded(s, mismatch_degraded);
            rc = KVG_ECONFIG;
            break;
        case CAS_ABSENT:
            snprintf(why, why_len, "Redis: the shared state vanished while being stored");
            rc = KVG_EPROTO;
            break;
        }
        freeReplyObject(res.reply);
    }
    if (rc == 0) {
        atomic_fetch_add_explicit(&s->commits[COMMIT_OK], 1, memory_order_relaxed);
    } else if (rc != -EAGAIN) {
        atomic_fetch_add_explicit(&s->commits[COMMIT_ERROR], 1, memory_order_relaxed);
        if (rc != KVG_EPARSE)
            restore(s); /* adopt() restored already */
        *undone = true;
    }
    return rc;
}

/* Bring this replica to the version Redis has (change_lock held): nothing when it is current,
 * the newer document when there is one, this replica's state when Redis has none. */
static sync_outcome check_locked(admin_shared *s, char *why, size_t len)
{
    const char *argv[] = {"HMGET", s->key, "epoch", "version", "verifier", "doc"};
    size_t lens[KVG_ARRAY_LEN(argv)];
    for (size_t i = 0; i < KVG_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    sync_outcome out = SYNC_ERROR;
    redisReply *r = NULL;
    char epoch[EPOCH_MAX + 1], id[ID_MAX];
    uint64_t version = 0;
    /* The version first, without the document: most checks find nothing new. */
    for (int with_doc = 0; with_doc < 2; with_doc++) {
        if (r)
            freeReplyObject(r);
        r = NULL;
        if (command(s, with_doc ? 6 : 5, argv, lens, &r, why, len) < 0)
            goto out;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)(with_doc ? 4 : 3)) {
            snprintf(why, len, "Redis: an unexpected answer to HMGET");
            goto out;
        }
        const redisReply *v = str_at(r, 2);
        if (v && (v->len != VERIFIER_HEX || memcmp(v->str, s->verifier, VERIFIER_HEX) != 0)) {
            snprintf(why, len, "%s", mismatch_msg);
            out = SYNC_MISMATCH;
            goto out;
        }
        if (!str_at(r, 0))
            break; /* no document */
        if (!read_id(str_at(r, 0), str_at(r, 1), epoch, &version)) {
            snprintf(why, len, "Redis: the shared state's epoch or version makes no sense");
            goto out;
        }
        if (strcmp(epoch, s->epoch) == 0 && version == s->version) {
            out = SYNC_UNCHANGED;
            goto out;
        }
    }
    if (!str_at(r, 0)) {
        /* A fresh Redis, or one restarted empty or wiped: store what this replica has rather
         * than take an empty state from it. */
        cas_result res = {0};
        if (store(s, true, &res, why, len) == 0) {
            if (res.kind == CAS_OK) {
                kvg_log_warn("admin: Redis held no shared state (a fresh Redis, or one "
                             "restarted empty or wiped): stored this gateway's as version %llu",
                             (unsigned long long)res.version);
                out = SYNC_SEEDED;
            } else if (res.kind == CAS_CONFLICT) {
                /* Another replica stored its state first: take it. */
                out = adopt(s, res.epoch, res.version, res.doc->str, res.doc->len, why, len) == 0
                          ? SYNC_APPLIED
                          : SYNC_INVALID;
                if (out == SYNC_APPLIED)
                    kvg_log_info("admin: the shared state moved to version %llu",
                                 (unsigned long long)res.version);
            } else if (res.kind == CAS_MISMATCH) {
                snprintf(why, len, "%s", mismatch_msg);
                out = SYNC_MISMATCH;
            }
            freeReplyObject(res.reply);
        }
        goto out;
    }
    const redisReply *doc = str_at(r, 3);
    snprintf(id, sizeof(id), "%s:%llu", epoch, (unsigned long long)version);
    if (!doc) {
        snprintf(why, len, "Redis: the shared state of version %llu has no document",
                 (unsigned long long)version);
        goto out;
    }
    char bad[WHY_MAX];
    if (adopt(s, epoch, version, doc->str, doc->len, bad, sizeof(bad)) < 0) {
        snprintf(why, len, "the shared state of version %llu in Redis cannot be applied: %s",
                 (unsigned long long)version, bad);
        out = SYNC_INVALID;
        /* Reported once per version: the periodic check would repeat it every interval. */
        if (strcmp(s->last_bad, id) != 0)
            kvg_log_error("admin: %s; keeping this gateway's state", why);
        snprintf(s->last_bad, sizeof(s->last_bad), "%s", id);
        goto out;
    }
    kvg_log_info("admin: the shared state moved to version %llu", (unsigned long long)version);
    out = SYNC_APPLIED;
out:
    if (r)
        freeReplyObject(r);
    atomic_fetch_add_explicit(&s->syncs[out], 1, memory_order_relaxed);
    if (out == SYNC_UNCHANGED || out == SYNC_APPLIED || out == SYNC_SEEDED)
        set_degraded(s, NULL);
    else if (out == SYNC_MISMATCH)
        set_degraded(s, mismatch_degraded);
    else
        set_degraded(s, why);
    return out;
}

/* A check's outcome as a return code: 0 when the state is Redis's now. */
static int outcome_rc(sync_outcome o)
{
    switch (o) {
    case SYNC_UNCHANGED:
    case SYNC_APPLIED:
    case SYNC_SEEDED:
        return 0;
    case SYNC_MISMATCH:
        return KVG_ECONFIG;
    case SYNC_INVALID:
        return KVG_EPARSE;
    default:
        return -EIO;
    }
}

int kvg_admin_shared_refresh(kvg_admin *admin, char *why, size_t why_len)
{
    return outcome_rc(check_locked(admin->shared, why, why_len));
}

/* ---- the sync thread ---------------------------------------------------------------------- */

/* Check the shared state unless hint ("<epoch>:<version>", as published) is what this replica
 * has already (its own commit, most often). */
static void sync_check(admin_shared *s, const char *hint)
{
    char why[WHY_MAX], id[ID_MAX];
    kvg_admin *admin = s->admin;
    pthread_mutex_lock(&admin->change_lock);
    snprintf(id, sizeof(id), "%s:%llu", s->epoch, (unsigned long long)s->version);
    sync_outcome o = SYNC_UNCHANGED;
    if (!hint || strcmp(hint, id) != 0)
        o = check_locked(s, why, sizeof(why));
    pthread_mutex_unlock(&admin->change_lock);
    if (o == SYNC_ERROR)
        kvg_log_warn("admin: cannot check the shared state: %s", why);
}

static void sub_drop(admin_shared *s)
{
    redisFree(s->sub);
    s->sub = NULL;
    s->ping_out = false;
    atomic_store(&s->subscribed, 0);
}

static void set_sub_degraded(admin_shared *s, bool on)
{
    pthread_mutex_lock(&s->lock);
    s->sub_degraded = on;
    pthread_mutex_unlock(&s->lock);
}

static int subscribe(admin_shared *s)
{
    char why[256] = "";
    redisContext *c = NULL;
    int rc = kvg_redis_connect_blocking(s->redis, s->key, strlen(s->key), s->timeout_ms, &c, why,
                                        sizeof(why));
    if (rc == 0) {
        redisReply *r = redisCommand(c, "SUBSCRIBE %s", s->channel);
        if (!r || r->type != REDIS_REPLY_ARRAY) {
            snprintf(why, sizeof(why), "SUBSCRIBE: %s",
                     r && r->type == REDIS_REPLY_ERROR ? r->str
                                                       : (c->errstr[0] ? c->errstr : "no answer"));
            rc = KVG_EPROTO;
        }
        if (r)
            freeReplyObject(r);
    }
    if (rc < 0) {
        redisFree(c);
        if (!s->sub_degraded)
            kvg_log_warn("admin: cannot subscribe to the shared state's changes (%s); trying "
                         "again every %u ms, checking the version meanwhile",
                         why, s->interval_ms);
        set_sub_degraded(s, true);
        return rc;
    }
    if (s->sub_degraded)
        kvg_log_info("admin: subscribed to the shared state's changes again");
    set_sub_degraded(s, false);
    s->sub = c;
    atomic_store(&s->subscribed, 1);
    return 0;
}

/* A PING on the subscription: an answer by the next check shows the connection alive (a
 * half-open one would otherwise go unnoticed, and messages with it). */
static int send_ping(admin_shared *s)
{
    int done = 0;
    if (redisAppendCommand(s->sub, "PING") != REDIS_OK)
        return -EIO;
    while (!done)
        if (redisBufferWrite(s->sub, &done) != REDIS_OK)
            return -EIO;
    s->ping_out = true;
    return 0;
}

static void read_sub(admin_shared *s)
{
    char hint[ID_MAX] = "";
    bool message = false;
    if (redisBufferRead(s->sub) != REDIS_OK) {
        kvg_log_warn("admin: lost the subscription to the shared state's changes: %s",
                     s->sub->errstr[0] ? s->sub->errstr : "connection closed");
        sub_drop(s);
        return;
    }
    for (;;) {
        void *rep = NULL;
        if (redisGetReplyFromReader(s->sub, &rep) != REDIS_OK) {
            kvg_log_warn("admin: the subscription to the shared state's changes failed: %s",
                         s->sub->errstr);
            sub_drop(s);
            break;
        }
        if (!rep)
            break;
        redisReply *r = rep;
        const redisReply *kind = r->type == REDIS_REPLY_ARRAY && r->elements ? r->element[0] : NULL;
        const redisReply *payload = str_at(r, 2);
        if (reply_is(kind, "message") && r->elements == 3) {
            message = true;
            if (payload && payload->len < sizeof(hint)) {
                memcpy(hint, payload->str, payload->len);
                hint[payload->len] = '\0';
            } else {
                hint[0] = '\0';
            }
        } else if (reply_is(kind, "pong")) {
            s->ping_out = false;
        }
        freeReplyObject(r);
    }
    /* The last message names the newest version: one check for all of them. */
    if (message)
        sync_check(s, hint[0] ? hint : NULL);
}

static uint64_t now_ms(void)
{
    return kvg_now_ns() / 1000000;
}

static void *sync_main(void *arg)
{
    admin_shared *s = arg;
    uint64_t interval = s->interval_ms, next_check = now_ms() + interval, next_sub = 0;
    while (!atomic_load(&s->stop)) {
        uint64_t now = now_ms();
        if (!s->sub && now >= next_sub) {
            if (subscribe(s) == 0) {
                /* What was published while unsubscribed is lost: look now. */
                sync_check(s, NULL);
                next_check = now_ms() + interval;
            } else {
                next_sub = now + interval;
            }
        }
        if (now >= next_check) {
            if (s->sub && s->ping_out) {
                kvg_log_warn("admin: the shared state's subscription does not answer; making "
                             "it again");
                sub_drop(s);
                next_sub = 0;
            } else if (s->sub && send_ping(s) < 0) {
                sub_drop(s);
                next_sub = 0;
            }
            sync_check(s, NULL);
            next_check = now_ms() + interval;
        }
        now = now_ms();
        uint64_t until = next_check;
        if (!s->sub && next_sub < until)
            until = next_sub;
        int timeout = until > now ? (int)KVG_MIN(until - now, (uint64_t)60000) : 0;
        struct pollfd fds[2] = {
            {.fd = s->wake_fd, .events = POLLIN},
            {.fd = s->sub ? s->sub->fd : -1, .events = POLLIN},
        };
        if (poll(fds, 2, timeout) < 0)
            continue; /* EINTR */
        if (fds[0].revents) {
            uint64_t n;
            if (read(s->wake_fd, &n, sizeof(n)) < 0)
                (void)0; /* counted, or nothing: either way, look at stop */
        }
        if (s->sub && fds[1].revents)
            read_sub(s);
    }
    if (s->sub)
        sub_drop(s);
    return NULL;
}

/* ---- start and stop ---------------------------------------------------------------------------
 */

static int start_locked(admin_shared *s, char *msg, size_t msg_len)
{
    char why[WHY_MAX] = "";
    const char *argv[] = {"EVAL", start_script, "1", s->key, s->verifier};
    size_t lens[] = {4, sizeof(start_script) - 1, 1, strlen(s->key), VERIFIER_HEX};
    redisReply *r;
    int rc = command(s, (int)KVG_ARRAY_LEN(argv), argv, lens, &r, why, sizeof(why));
    if (rc < 0) {
        snprintf(msg, msg_len, "cannot read the shared state from Redis: %s", why);
        return rc;
    }
    const redisReply *kind = r->type == REDIS_REPLY_ARRAY && r->elements ? r->element[0] : NULL;
    char epoch[EPOCH_MAX + 1];
    uint64_t version;
    if (reply_is(kind, "mismatch")) {
        snprintf(msg, msg_len, "%s; refusing to start", mismatch_msg);
        rc = KVG_ECONFIG;
    } else if (reply_is(kind, "ok") && str_at(r, 3) &&
               read_id(str_at(r, 1), str_at(r, 2), epoch, &version)) {
        rc = adopt(s, epoch, version, str_at(r, 3)->str, str_at(r, 3)->len, why, sizeof(why));
        if (rc < 0)
            snprintf(msg, msg_len,
                     "the shared state in Redis (%s, version %llu) cannot be applied: %s", s->key,
                     (unsigned long long)version, why);
        else
            kvg_log_info("admin: started from the shared state in Redis (version %llu); the "
                         "state file is its local copy from now on",
                         (unsigned long long)version);
    } else if (reply_is(kind, "absent")) {
        /* The first replica on this Redis: its state (the state file's) becomes the
         * fleet's; of several starting at once one wins, the others take its state. */
        sync_outcome o = check_locked(s, why, sizeof(why));
        if (o == SYNC_SEEDED) {
            kvg_log_info("admin: Redis held no shared state: stored this gateway's (version "
                         "%llu)",
                         (unsigned long long)s->version);
            write_backup(s);
        } else if ((rc = outcome_rc(o)) == 0) {
            kvg_log_info("admin: started from the shared state in Redis (version %llu)",
                         (unsigned long long)s->version);
        } else {
            snprintf(msg, msg_len, "%s%s", why, o == SYNC_MISMATCH ? "; refusing to start" : "");
        }
    } else {
        snprintf(msg, msg_len, "cannot read the shared state from Redis: an unexpected answer");
        rc = KVG_EPROTO;
    }
    freeReplyObject(r);
    return rc;
}

int kvg_admin_share_state(kvg_admin *admin, char *msg, size_t msg_len)
{
    if (!admin->redis || admin->shared)
        return 0;
    admin_shared *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->admin = admin;
    s->redis = admin->redis;
    s->interval_ms = admin->redis_sync_interval_ms;
    s->timeout_ms = admin->redis_timeout_ms;
    s->wake_fd = -1;
    kvg_buf_init(&s->base);
    snprintf(s->key, sizeof(s->key), "%s:{state}", kvg_redis_prefix(admin->redis));
    snprintf(s->channel, sizeof(s->channel), "%s:state", kvg_redis_prefix(admin->redis));
    int rc = kvg_admin_secret_verifier(admin->secret, admin->secret_len, s->verifier);
    if (rc < 0) {
        snprintf(msg, msg_len, "cannot compute the server secret's verifier");
        goto fail_alloc;
    }
    rc = -pthread_mutex_init(&s->lock, NULL);
    if (rc < 0)
        goto fail_alloc;
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        rc = -errno;
        snprintf(msg, msg_len, "eventfd: %s", kvg_strerror(rc));
        goto fail_lock;
    }
    pthread_mutex_lock(&admin->change_lock);
    rc = start_locked(s, msg, msg_len);
    pthread_mutex_unlock(&admin->change_lock);
    if (rc < 0)
        goto fail_fd;
    /* Serving starts after this returns: handlers see admin->shared from their first request. */
    admin->shared = s;
    rc = -pthread_create(&s->thread, NULL, sync_main, s);
    if (rc < 0) {
        admin->shared = NULL;
        snprintf(msg, msg_len, "cannot start the state's sync thread: %s", kvg_strerror(rc));
        goto fail_fd;
    }
    s->started = true;
    return 0;

fail_fd:
    close(s->wake_fd);
fail_lock:
    pthread_mutex_destroy(&s->lock);
fail_alloc:
    redisFree(s->cmd);
    kvg_buf_done(&s->base);
    OPENSSL_cleanse(s->verifier, sizeof(s->verifier));
    free(s);
    return rc;
}

void kvg_admin_shared_free(admin_shared *s)
{
    if (!s)
        return;
    if (s->started) {
        uint64_t one = 1;
        atomic_store(&s->stop, true);
        if (write(s->wake_fd, &one, sizeof(one)) < 0)
            kvg_log_warn("admin: cannot wake the state's sync thread: %s", strerror(errno));
        pthread_join(s->thread, NULL);
    }
    close(s->wake_fd);
    pthread_mutex_destroy(&s->lock);
    redisFree(s->cmd);
    if (s->base.data)
        OPENSSL_cleanse(s->base.data, s->base.cap);
    kvg_buf_done(&s->base);
    OPENSSL_cleanse(s->verifier, sizeof(s->verifier));
    free(s);
}

void kvg_admin_shared_write_metrics(admin_shared *s, kvg_buf *out)
{
    kvg_prom_put_scalar_u64(out, "kvgate_state_version", KVG_PROM_GAUGE,
                            "Version of the shared state (Redis) this replica holds.",
                            atomic_load_explicit(&s->version_gauge, memory_order_relaxed));
    kvg_prom_put_scalar_u64(out, "kvgate_state_subscribed", KVG_PROM_GAUGE,
                            "1 while the replica is subscribed to the shared state's changes "
                            "(otherwise they arrive by the periodic check only).",
                            atomic_load_explicit(&s->subscribed, memory_order_relaxed));
    kvg_prom_put_by_label(out, "kvgate_state_sync_total", KVG_PROM_COUNTER,
                          "Checks of the shared state's version (on a change message, "
                          "periodically, before each admin change), by outcome.",
                          "outcome", sync_names, s->syncs, SYNC_OUTCOME_COUNT);
    kvg_prom_put_by_label(out, "kvgate_state_commits_total", KVG_PROM_COUNTER,
                          "Admin changes stored in the shared state by outcome (conflict: "
                          "another replica committed first, and the change was made again).",
                          "outcome", commit_names, s->commits, COMMIT_OUTCOME_COUNT);
}
