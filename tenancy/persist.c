/* SPDX-License-Identifier: Apache-2.0 */
/* The tenants' persistent form (a JSON array, see below and docs/state.md) and atomic writes
 * and bounded reads of state files. */
#include "tenancy_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/*
 * Format: a JSON array of tenant objects, sorted by id, one per line:
 *
 *   [
 *   {"id":"acme","sharing":"group","group":"research","models":["llama-3-8b"],
 *    "rate":{"rps":50,"burst":100,"prompt_bytes_per_s":0,"prompt_bytes_burst":0},
 *    "max_inflight":64,
 *    "keys":[{"id":"k0a1b2c3d4e5f6g7","sha256":"<64 lowercase hex>",
 *             "created":"2024-05-01T12:00:00.000Z"}]}
 *   ]
 *
 * A tenant is its definition, through the tenant's field table (kvg_tenant_fields; id and
 * sharing are required here), and its keys (at most 16): id ("k" + 15 of [a-z0-9], distinct
 * within the tenant), sha256 (the key's SHA-256, 64 hex digits; distinct across all tenants),
 * created (RFC 3339; written in UTC with milliseconds). The key itself is never written.
 * docs/state.md has the whole table.
 */

/* A tenant as the file holds it. */
typedef struct tenant_record {
    kvg_tenant_def def;
    const kvg_key_info *keys;
    size_t nkeys;
} tenant_record;

/* ---- a key's fields ---------------------------------------------------------------------------
 */

static int check_key_id(const void *value, char *why, size_t len)
{
    if (kvg_tenancy_key_id_valid(value))
        return 0;
    snprintf(why, len, "must be \"k\" and 15 characters of a-z 0-9");
    return KVG_EPARSE;
}

static int decode_sha256(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    kvg_key_info *key = target;
    const char *s;
    int rc = kvg_fields_get_string(c, v, path, &s);
    if (rc < 0)
        return rc;
    if (v->u.str.len != 2 * KVG_KEY_DIGEST_LEN)
        return kvg_fields_fail(c, KVG_FIELD_INVALID, path, "must be 64 hex digits");
    for (size_t b = 0; b < KVG_KEY_DIGEST_LEN; b++) {
        int hi = kvg_hex_digit(s[2 * b]), lo = kvg_hex_digit(s[2 * b + 1]);
        if (hi < 0 || lo < 0)
            return kvg_fields_fail(c, KVG_FIELD_INVALID, path, "must be 64 hex digits");
        key->digest[b] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static bool encode_sha256(const void *target, kvg_buf *out)
{
    const kvg_key_info *key = target;
    char digest[2 * KVG_KEY_DIGEST_LEN + 2];
    digest[0] = '"';
    kvg_hex_encode(key->digest, KVG_KEY_DIGEST_LEN, digest + 1);
    kvg_buf_append(out, digest, sizeof(digest) - 1);
    kvg_buf_putc(out, '"');
    return true;
}

static int parse_rfc3339(const char *s, size_t len, uint64_t *out);

static int decode_created(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    kvg_key_info *key = target;
    const char *s;
    int rc = kvg_fields_get_string(c, v, path, &s);
    if (rc == 0 && parse_rfc3339(s, v->u.str.len, &key->created_wall_ns) < 0)
        rc = kvg_fields_fail(c, KVG_FIELD_INVALID, path,
                             "must be an RFC 3339 time such as 2024-05-01T12:00:00Z");
    return rc;
}

static bool encode_created(const void *target, kvg_buf *out)
{
    char created[40];
    kvg_format_time(((const kvg_key_info *)target)->created_wall_ns, created, sizeof(created));
    kvg_buf_printf(out, "\"%s\"", created);
    return true;
}

static const kvg_field key_fields[] = {
    {.name = "id",
     .type = KVG_FIELD_CHARS,
     .set_in = KVG_SET_STATE,
     .required_in = KVG_SET_STATE,
     .offset = offsetof(kvg_key_info, id),
     .max = KVG_KEY_ID_LEN,
     .check = check_key_id},
    {.name = "sha256",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_STATE,
     .required_in = KVG_SET_STATE,
     .decode = decode_sha256,
     .encode = encode_sha256},
    {.name = "created",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_STATE,
     .required_in = KVG_SET_STATE,
     .decode = decode_created,
     .encode = encode_created},
};

static const kvg_fields key_table = {"key", key_fields, KVG_ARRAY_LEN(key_fields), NULL};

static const kvg_field record_fields[] = {
    {.type = KVG_FIELD_EMBED, .offset = offsetof(tenant_record, def), .object = &kvg_tenant_fields},
    {.name = "keys",
     .type = KVG_FIELD_OBJECTS,
     .set_in = KVG_SET_STATE,
     .offset = offsetof(tenant_record, keys),
     .count_offset = offsetof(tenant_record, nkeys),
     .elem_size = sizeof(kvg_key_info),
     .object = &key_table,
     .max = KVG_TENANT_KEYS_MAX},
};

static const kvg_fields record_table = {"tenant", record_fields, KVG_ARRAY_LEN(record_fields),
                                        NULL};

/* ---- writing --------------------------------------------------------------------------------- */

static void put_tenant(kvg_buf *out, const kvg_tenant *t)
{
    const tenant_spec *s = t->spec;
    tenant_record r = {
        .def = {.id = s->id,
                .sharing = s->sharing,
                .group = s->group,
                .models = (const char *const *)s->models,
                .nmodels = s->nmodels,
                .limits = s->limits},
        .keys = t->keys,
        .nkeys = t->nkeys,
    };
    kvg_fields_encode(&record_table, &r, KVG_SET_STATE, out);
}

void kvg_tenants_to_json(kvg_tenants *ts, kvg_buf *out)
{
    kvg_tenant_set *set = kvg_tenants_acquire(ts);
    kvg_buf_putc(out, '[');
    for (size_t i = 0; i < set->count; i++) {
        kvg_buf_puts(out, i ? ",\n" : "\n");
        put_tenant(out, set->tenants[i]);
    }
    kvg_buf_puts(out, set->count ? "\n]" : "]");
    kvg_tenant_set_unref(set);
}

/* ---- reading --------------------------------------------------------------------------------- */

static int bad(char *msg, size_t msg_len, const char *fmt, ...) KVG_PRINTF(3, 4);

static int bad(char *msg, size_t msg_len, const char *fmt, ...)
{
    if (msg && msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
    }
    return KVG_EPARSE;
}

static int two_digits(const char *s, int *out)
{
    if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9')
        return -1;
    *out = (s[0] - '0') * 10 + (s[1] - '0');
    return 0;
}

/* RFC 3339 date-time ("2024-05-01T12:00:00Z", "...:00.123+02:00") to nanoseconds since the
 * epoch; times before 1970 are refused (the field is unsigned). */
static int parse_rfc3339(const char *s, size_t len, uint64_t *out)
{
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int c1, c2, mon, day, hour, min, sec;
    if (len < 20 || two_digits(s, &c1) || two_digits(s + 2, &c2) || s[4] != '-' ||
        two_digits(s + 5, &mon) || s[7] != '-' || two_digits(s + 8, &day) ||
        (s[10] != 'T' && s[10] != 't') || two_digits(s + 11, &hour) || s[13] != ':' ||
        two_digits(s + 14, &min) || s[16] != ':' || two_digits(s + 17, &sec))
        return -1;
    int year = c1 * 100 + c2;
    bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    if (year < 1970 || mon < 1 || mon > 12 || day < 1 || day > mdays[mon - 1] ||
        (mon == 2 && day == 29 && !leap) || hour > 23 || min > 59 || sec > 60)
        return -1;
    size_t p = 19;
    uint64_t frac_ns = 0;
    if (p < len && s[p] == '.') {
        uint64_t scale = 100000000;
        p++;
        if (p >= len || s[p] < '0' || s[p] > '9')
            return -1;
        for (; p < len && s[p] >= '0' && s[p] <= '9'; p++) {
            frac_ns += (uint64_t)(s[p] - '0') * scale; /* digits past the 9th add nothing */
            scale /= 10;
        }
    }
    long offset = 0;
    if (p < len && (s[p] == 'Z' || s[p] == 'z')) {
        p++;
    } else if (p + 6 == len && (s[p] == '+' || s[p] == '-')) {
        int oh, om;
        if (two_digits(s + p + 1, &oh) || s[p + 3] != ':' || two_digits(s + p + 4, &om) ||
            oh > 23 || om > 59)
            return -1;
        offset = (oh * 3600L + om * 60L) * (s[p] == '+' ? 1 : -1);
        p += 6;
    } else {
        return -1;
    }
    if (p != len)
        return -1;
    struct tm tm = {.tm_year = year - 1900,
                    .tm_mon = mon - 1,
                    .tm_mday = day,
                    .tm_hour = hour,
                    .tm_min = min,
                    .tm_sec = sec};
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return -1;
    long long secs = (long long)t - offset;
    if (secs < 0)
        return -1;
    *out = (uint64_t)secs * 1000000000u + frac_ns;
    return 0;
}

/* One tenant object into r (strings borrowed from the tree, lists from the arena). Messages
 * name the field without the tenant; the caller adds it. */
static int parse_tenant(const kvg_json *o, kvg_arena *arena, tenant_record *r, char *msg,
                        size_t msg_len)
{
    kvg_fields_ctx c = {.from = KVG_SET_STATE, .arena = arena, .msg = msg, .msg_len = msg_len};
    memset(r, 0, sizeof(*r));
    kvg_fields_defaults(&record_table, r);
    int rc = kvg_fields_decode(&record_table, r, o, "", &c);
    for (size_t i = 0; rc == 0 && i < r->nkeys; i++) {
        for (size_t j = 0; rc == 0 && j < i; j++) {
            if (strcmp(r->keys[j].id, r->keys[i].id) == 0)
                rc = bad(msg, msg_len, "keys[%zu].id: duplicate of keys[%zu]", i, j);
            else if (memcmp(r->keys[j].digest, r->keys[i].digest, KVG_KEY_DIGEST_LEN) == 0)
                rc = bad(msg, msg_len, "keys[%zu].sha256: duplicate of keys[%zu]", i, j);
        }
    }
    return rc;
}

static int cmp_tenant(const void *a, const void *b)
{
    return strcmp((*(kvg_tenant *const *)a)->spec->id, (*(kvg_tenant *const *)b)->spec->id);
}

/* Prefix a tenant's message with its id when the id is sound, else with its position. */
static void name_tenant(const kvg_json *o, size_t i, const char *why, char *msg, size_t msg_len)
{
    const kvg_json *id = kvg_json_get(o, "id");
    if (!msg || !msg_len)
        return;
    if (id && id->type == KVG_JSON_STRING && strlen(id->u.str.ptr) == id->u.str.len &&
        kvg_tenant_id_validate(id->u.str.ptr, "id", NULL, 0) == 0)
        snprintf(msg, msg_len, "tenant \"%s\": %s", id->u.str.ptr, why);
    else
        snprintf(msg, msg_len, "tenants[%zu]: %s", i, why);
}

int kvg_tenants_from_json(kvg_tenants *ts, const kvg_json *arr, char *msg, size_t msg_len)
{
    char why[256];
    kvg_arena arena;
    kvg_tenant_set *next;
    size_t n = 0, built = 0, dup = 0;
    int rc;
    if (msg && msg_len)
        msg[0] = '\0';
    if (!arr || arr->type != KVG_JSON_ARRAY)
        return bad(msg, msg_len, "tenants: must be a JSON array, not %s",
                   arr ? kvg_json_type_str(arr->type) : "nothing");
    n = arr->u.arr.count;
    if (n > KVG_TENANTS_MAX)
        return bad(msg, msg_len, "tenants: more than %d tenants", KVG_TENANTS_MAX);
    /* The definitions' lists and keys live until their tenants have copied them. */
    kvg_arena_init(&arena, 0);
    kvg_tenant **list = calloc(n ? n : 1, sizeof(*list));
    if (!list) {
        rc = -ENOMEM;
        goto fail;
    }

    /* Everything that can fail on the input happens before the lock: the store is untouched
     * until one snapshot replaces it whole. */
    for (; built < n; built++) {
        const kvg_json *o = arr->u.arr.items[built];
        tenant_record r;
        tenant_spec *spec;
        rc = parse_tenant(o, &arena, &r, why, sizeof(why));
        if (rc == 0)
            rc = kvg_tenancy_spec_new(&r.def, why, sizeof(why), &spec);
        if (rc == 0)
            rc = kvg_tenancy_tenant_new(spec, NULL, r.keys, r.nkeys, &list[built]);
        if (rc == -ENOMEM)
            goto fail;
        if (rc < 0) {
            name_tenant(o, built, why, msg, msg_len);
            rc = KVG_EPARSE;
            goto fail;
        }
    }
    kvg_arena_done(&arena); /* the tenants hold copies */
    if (n > 1)
        qsort(list, n, sizeof(*list), cmp_tenant);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(list[i - 1]->spec->id, list[i]->spec->id) == 0) {
            rc = bad(msg, msg_len, "tenant \"%s\": defined more than once", list[i]->spec->id);
            goto fail;
        }
    }

    pthread_mutex_lock(&ts->write_lock);
    /* Tenants that stay keep their runtime (buckets, in-flight count, counters, ordinal), as a
     * put would; new ones are numbered in id order. Both lists are sorted: one merge walk. */
    const kvg_tenant_set *cur = kvg_tenancy_current(ts);
    uint64_t ordinal = ts->next_ordinal;
    for (size_t i = 0, o = 0; i < n; i++) {
        while (o < cur->count && strcmp(cur->tenants[o]->spec->id, list[i]->spec->id) < 0)
            o++;
        if (o < cur->count && strcmp(cur->tenants[o]->spec->id, list[i]->spec->id) == 0)
            list[i]->rt = kvg_tenancy_runtime_ref(cur->tenants[o]->rt);
        else if ((rc = kvg_tenancy_runtime_new(ordinal, &list[i]->rt)) < 0)
            goto fail_unlock;
        else
            ordinal++;
    }
    rc = kvg_tenancy_set_new(list, n, &dup, &next);
    if (rc == -EEXIST) {
        rc = bad(msg, msg_len, "tenant \"%s\": keys: a key digest also belongs to another key",
                 list[dup]->spec->id);
        goto fail_unlock;
    }
    if (rc < 0)
        goto fail_unlock;
    kvg_tenancy_publish(ts, next);
    ts->next_ordinal = ordinal;
    pthread_mutex_unlock(&ts->write_lock);
    free(list);
    return 0;

fail_unlock:
    pthread_mutex_unlock(&ts->write_lock);
fail:
    kvg_arena_done(&arena);
    if (rc == -ENOMEM && msg && msg_len)
        snprintf(msg, msg_len, "out of memory");
    for (size_t i = 0; list && i < built; i++)
        kvg_tenant_unref(list[i]);
    free(list);
    return rc;
}

/* ---- state files ----------------------------------------------------------------------------- */

static int write_all(int fd, const char *p, size_t len)
{
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* fsync the folder holding path, so that a rename into it survives a crash. */
static int sync_dir(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

int kvg_state_write_file(const char *path, const void *data, size_t len, unsigned mode)
{
    /* The pid keeps replicas sharing a folder apart, the sequence number threads of one
     * process. */
    static _Atomic unsigned long seq;
    char tmp[PATH_MAX];
    int rc;
    if (!path || (len && !data))
        return -EINVAL;
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%lu", path, (long)getpid(),
                     atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed));
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return -ENAMETOOLONG;
    mode &= 07777;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    /* open() applied the umask; the caller's mode is the contract (0600 for secrets). */
    if (fchmod(fd, mode) < 0) {
        rc = -errno;
        goto fail_fd;
    }
    rc = write_all(fd, data, len);
    if (rc < 0)
        goto fail_fd;
    if (fsync(fd) < 0) {
        rc = -errno;
        goto fail_fd;
    }
    if (close(fd) < 0) {
        rc = -errno;
        goto fail_tmp;
    }
    if (rename(tmp, path) < 0) {
        rc = -errno;
        goto fail_tmp;
    }
    return sync_dir(path);

fail_fd:
    close(fd);
fail_tmp:
    unlink(tmp);
    return rc;
}

int kvg_state_read_file(const char *path, size_t max, kvg_buf *out)
{
    struct stat st;
    int rc = 0;
    if (!path)
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t start = out->len;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = -EISDIR;
        goto out;
    }
    if (st.st_size > 0 && (uint64_t)st.st_size > max) {
        rc = -EFBIG;
        goto out;
    }
    /* The size is a hint (the file may change under us); the bound is enforced while reading. */
    for (;;) {
        /* One byte past max tells a file that grew beyond it. */
        size_t left = max - (out->len - start);
        size_t room = left >= 65536 ? 65536 : left + 1;
        if (kvg_buf_reserve(out, room) < 0) {
            rc = -ENOMEM;
            break;
        }
        ssize_t got = read(fd, out->data + out->len, room);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        if (got == 0)
            break;
        out->len += (size_t)got;
        out->data[out->len] = '\0';
        if (out->len - start > max) {
            rc = -EFBIG;
            break;
        }
    }
out:
    close(fd);
    if (rc < 0 && out->len > start) {
        out->len = start;
        out->data[start] = '\0';
    }
    return rc;
}
