/* SPDX-License-Identifier: Apache-2.0 */
/* The tenants' persistent form (a JSON array, see below and docs/state.md) and atomic writes
 * and bounded reads of state files. */
#include "tenancy_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
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
 * - id (string, required): [A-Za-z0-9._-], 1..64 characters, not "." or "..".
 * - sharing (string, required): "isolated" | "group" | "global".
 * - group (string): required with sharing "group", absent (or null) otherwise; same charset.
 * - models (array of strings, default []): allowed models, at most 64, distinct, printable
 *   ASCII, 1..256 bytes each; empty = every model.
 * - rate (object, default all 0): rps, burst, prompt_bytes_per_s, prompt_bytes_burst; each a
 *   finite number >= 0 (0 = unlimited / the default burst; a burst is 0 or >= 1); members
 *   omitted are 0.
 * - max_inflight (integer 0..4294967295, default 0 = unlimited).
 * - keys (array, default [], at most 16): id ("k" + 15 of [a-z0-9], distinct within the
 *   tenant), sha256 (the key's SHA-256, 64 hex digits; distinct across all tenants), created
 *   (RFC 3339; written in UTC with milliseconds). The key itself is never written.
 * Unknown members and repeated members are errors; so are duplicate ids. Numbers are written
 * in the shortest form that reads back to the same double.
 */

/* ---- writing --------------------------------------------------------------------------------- */

/* Integers (below 2^53, where doubles are exact) as integers ("50", "2500000"); anything else
 * in the shortest %g form that reads back to the same double ("0.1", not
 * "0.10000000000000001"). */
static void put_number(kvg_buf *out, double v)
{
    char tmp[40];
    if (v == 0) { /* -0 too: limits are >= 0 */
        kvg_buf_putc(out, '0');
        return;
    }
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        kvg_buf_printf(out, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    kvg_buf_puts(out, tmp);
}

static void put_key(kvg_buf *out, const char *key)
{
    kvg_buf_json_string(out, key, strlen(key));
    kvg_buf_putc(out, ':');
}

static void put_tenant(kvg_buf *out, const kvg_tenant *t)
{
    static const char hex[] = "0123456789abcdef";
    const tenant_spec *s = t->spec;
    kvg_buf_putc(out, '{');
    put_key(out, "id");
    kvg_buf_json_string(out, s->id, strlen(s->id));
    kvg_buf_putc(out, ',');
    put_key(out, "sharing");
    kvg_buf_json_string(out, kvg_sharing_str(s->sharing), strlen(kvg_sharing_str(s->sharing)));
    if (s->group) {
        kvg_buf_putc(out, ',');
        put_key(out, "group");
        kvg_buf_json_string(out, s->group, strlen(s->group));
    }
    kvg_buf_puts(out, ",\"models\":[");
    for (size_t i = 0; i < s->nmodels; i++) {
        if (i)
            kvg_buf_putc(out, ',');
        kvg_buf_json_string(out, s->models[i], strlen(s->models[i]));
    }
    kvg_buf_puts(out, "],\"rate\":{\"rps\":");
    put_number(out, s->limits.rps);
    kvg_buf_puts(out, ",\"burst\":");
    put_number(out, s->limits.burst);
    kvg_buf_puts(out, ",\"prompt_bytes_per_s\":");
    put_number(out, s->limits.prompt_bytes_per_s);
    kvg_buf_puts(out, ",\"prompt_bytes_burst\":");
    put_number(out, s->limits.prompt_bytes_burst);
    kvg_buf_printf(out, "},\"max_inflight\":%u,\"keys\":[", (unsigned)s->limits.max_inflight);
    for (size_t i = 0; i < t->nkeys; i++) {
        const kvg_key_info *k = &t->keys[i];
        char digest[2 * KVG_KEY_DIGEST_LEN + 1], created[40];
        for (size_t b = 0; b < KVG_KEY_DIGEST_LEN; b++) {
            digest[2 * b] = hex[k->digest[b] >> 4];
            digest[2 * b + 1] = hex[k->digest[b] & 15];
        }
        digest[2 * KVG_KEY_DIGEST_LEN] = '\0';
        kvg_format_time(k->created_wall_ns, created, sizeof(created));
        kvg_buf_printf(out, "%s{\"id\":\"%s\",\"sha256\":\"%s\",\"created\":\"%s\"}", i ? "," : "",
                       k->id, digest, created);
    }
    kvg_buf_puts(out, "]}");
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

/* A member name from the file, fit for a message: printable ASCII, at most 64 bytes. */
static const char *show_name(const char *s, size_t len, char out[72])
{
    size_t o = 0;
    for (size_t i = 0; i < len && o < 64; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? (char)c : '?';
    }
    if (len > 64) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

static bool key_is(const kvg_json *obj, size_t i, const char *name)
{
    return obj->u.obj.key_lens[i] == strlen(name) &&
           memcmp(obj->u.obj.keys[i], name, obj->u.obj.key_lens[i]) == 0;
}

/* Index of the member of obj named by one of names, or -1; sets *seen's bit and fails on a
 * repeat. */
static int member(const kvg_json *obj, size_t i, const char *const *names, size_t n, unsigned *seen,
                  const char *prefix, char *msg, size_t msg_len)
{
    char nb[72];
    for (size_t k = 0; k < n; k++) {
        if (!key_is(obj, i, names[k]))
            continue;
        if (*seen & (1u << k))
            return bad(msg, msg_len, "%s%s: appears more than once", prefix, names[k]);
        *seen |= 1u << k;
        return (int)k;
    }
    return bad(msg, msg_len, "%s%s: unknown field", prefix,
               show_name(obj->u.obj.keys[i], obj->u.obj.key_lens[i], nb));
}

static int get_string(const kvg_json *v, const char *field, const char **out, char *msg,
                      size_t msg_len)
{
    if (v->type != KVG_JSON_STRING)
        return bad(msg, msg_len, "%s: must be a string, not %s", field, kvg_json_type_str(v->type));
    if (strlen(v->u.str.ptr) != v->u.str.len)
        return bad(msg, msg_len, "%s: must not contain NUL characters", field);
    *out = v->u.str.ptr;
    return 0;
}

static int get_number(const kvg_json *v, const char *field, double *out, char *msg, size_t msg_len)
{
    if (v->type != KVG_JSON_NUMBER)
        return bad(msg, msg_len, "%s: must be a number, not %s", field, kvg_json_type_str(v->type));
    *out = v->u.num.value;
    /* Range (finite, >= 0) is the definition's check, with the same message as the API's. */
    return 0;
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

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int parse_key(const kvg_json *o, size_t i, kvg_key_info *key, char *msg, size_t msg_len)
{
    static const char *const names[] = {"id", "sha256", "created"};
    char prefix[32], field[48];
    unsigned seen = 0;
    snprintf(prefix, sizeof(prefix), "keys[%zu].", i);
    if (o->type != KVG_JSON_OBJECT)
        return bad(msg, msg_len, "keys[%zu]: must be an object, not %s", i,
                   kvg_json_type_str(o->type));
    memset(key, 0, sizeof(*key));
    for (size_t m = 0; m < o->u.obj.count; m++) {
        int k = member(o, m, names, KVG_ARRAY_LEN(names), &seen, prefix, msg, msg_len);
        if (k < 0)
            return k;
        const kvg_json *v = o->u.obj.values[m];
        const char *s = NULL;
        snprintf(field, sizeof(field), "%s%s", prefix, names[k]);
        int rc = get_string(v, field, &s, msg, msg_len);
        if (rc < 0)
            return rc;
        if (k == 0) {
            if (!kvg_tenancy_key_id_valid(s))
                return bad(msg, msg_len, "%s: must be \"k\" and 15 characters of a-z 0-9", field);
            memcpy(key->id, s, KVG_KEY_ID_LEN + 1);
        } else if (k == 1) {
            if (v->u.str.len != 2 * KVG_KEY_DIGEST_LEN)
                return bad(msg, msg_len, "%s: must be 64 hex digits", field);
            for (size_t b = 0; b < KVG_KEY_DIGEST_LEN; b++) {
                int hi = hex_value(s[2 * b]), lo = hex_value(s[2 * b + 1]);
                if (hi < 0 || lo < 0)
                    return bad(msg, msg_len, "%s: must be 64 hex digits", field);
                key->digest[b] = (uint8_t)(hi << 4 | lo);
            }
        } else if (parse_rfc3339(s, v->u.str.len, &key->created_wall_ns) < 0) {
            return bad(msg, msg_len, "%s: must be an RFC 3339 time such as 2024-05-01T12:00:00Z",
                       field);
        }
    }
    for (size_t k = 0; k < KVG_ARRAY_LEN(names); k++)
        if (!(seen & (1u << k)))
            return bad(msg, msg_len, "%s%s: missing", prefix, names[k]);
    return 0;
}

static int parse_rate(const kvg_json *o, kvg_tenant_limits *l, char *msg, size_t msg_len)
{
    static const char *const names[] = {"rps", "burst", "prompt_bytes_per_s", "prompt_bytes_burst"};
    double *fields[] = {&l->rps, &l->burst, &l->prompt_bytes_per_s, &l->prompt_bytes_burst};
    char field[48];
    unsigned seen = 0;
    if (o->type != KVG_JSON_OBJECT)
        return bad(msg, msg_len, "rate: must be an object, not %s", kvg_json_type_str(o->type));
    for (size_t m = 0; m < o->u.obj.count; m++) {
        int k = member(o, m, names, KVG_ARRAY_LEN(names), &seen, "rate.", msg, msg_len);
        if (k < 0)
            return k;
        snprintf(field, sizeof(field), "rate.%s", names[k]);
        int rc = get_number(o->u.obj.values[m], field, fields[k], msg, msg_len);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* One tenant object into def (strings borrowed from the tree, models into models[]) and keys.
 * Messages name the field without the tenant; the caller adds it. */
static int parse_tenant(const kvg_json *o, kvg_tenant_def *def, const char **models,
                        kvg_key_info *keys, size_t *nkeys, char *msg, size_t msg_len)
{
    enum { F_ID, F_SHARING, F_GROUP, F_MODELS, F_RATE, F_MAX_INFLIGHT, F_KEYS };
    static const char *const names[] = {"id",   "sharing",      "group", "models",
                                        "rate", "max_inflight", "keys"};
    unsigned seen = 0;
    const char *s = NULL;
    int rc;
    memset(def, 0, sizeof(*def));
    *nkeys = 0;
    if (o->type != KVG_JSON_OBJECT)
        return bad(msg, msg_len, "must be an object, not %s", kvg_json_type_str(o->type));
    for (size_t m = 0; m < o->u.obj.count; m++) {
        int k = member(o, m, names, KVG_ARRAY_LEN(names), &seen, "", msg, msg_len);
        if (k < 0)
            return k;
        const kvg_json *v = o->u.obj.values[m];
        switch (k) {
        case F_ID:
            rc = get_string(v, "id", &def->id, msg, msg_len);
            break;
        case F_SHARING:
            rc = get_string(v, "sharing", &s, msg, msg_len);
            if (rc == 0 && kvg_sharing_parse(s, &def->sharing) < 0)
                rc = bad(msg, msg_len, "sharing: must be isolated, group or global");
            break;
        case F_GROUP:
            rc = v->type == KVG_JSON_NULL ? 0 : get_string(v, "group", &def->group, msg, msg_len);
            break;
        case F_MODELS:
            if (v->type != KVG_JSON_ARRAY) {
                rc = bad(msg, msg_len, "models: must be an array, not %s",
                         kvg_json_type_str(v->type));
                break;
            }
            if (v->u.arr.count > KVG_TENANT_MODELS_MAX) {
                rc = bad(msg, msg_len, "models: more than %d models", KVG_TENANT_MODELS_MAX);
                break;
            }
            rc = 0;
            for (size_t i = 0; rc == 0 && i < v->u.arr.count; i++) {
                char field[32];
                snprintf(field, sizeof(field), "models[%zu]", i);
                rc = get_string(v->u.arr.items[i], field, &models[i], msg, msg_len);
            }
            def->models = models;
            def->nmodels = v->u.arr.count;
            break;
        case F_RATE:
            rc = parse_rate(v, &def->limits, msg, msg_len);
            break;
        case F_MAX_INFLIGHT:
            if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0 ||
                v->u.num.ival > UINT32_MAX)
                rc = bad(msg, msg_len, "max_inflight: must be an integer from 0 to %u", UINT32_MAX);
            else {
                def->limits.max_inflight = (uint32_t)v->u.num.ival;
                rc = 0;
            }
            break;
        default: /* F_KEYS */
            if (v->type != KVG_JSON_ARRAY) {
                rc =
                    bad(msg, msg_len, "keys: must be an array, not %s", kvg_json_type_str(v->type));
                break;
            }
            if (v->u.arr.count > KVG_TENANT_KEYS_MAX) {
                rc = bad(msg, msg_len, "keys: more than %d keys", KVG_TENANT_KEYS_MAX);
                break;
            }
            rc = 0;
            for (size_t i = 0; rc == 0 && i < v->u.arr.count; i++) {
                rc = parse_key(v->u.arr.items[i], i, &keys[i], msg, msg_len);
                for (size_t j = 0; rc == 0 && j < i; j++) {
                    if (strcmp(keys[j].id, keys[i].id) == 0)
                        rc = bad(msg, msg_len, "keys[%zu].id: duplicate of keys[%zu]", i, j);
                    else if (memcmp(keys[j].digest, keys[i].digest, KVG_KEY_DIGEST_LEN) == 0)
                        rc = bad(msg, msg_len, "keys[%zu].sha256: duplicate of keys[%zu]", i, j);
                }
            }
            *nkeys = v->u.arr.count;
            break;
        }
        if (rc < 0)
            return rc;
    }
    if (!(seen & (1u << F_ID)))
        return bad(msg, msg_len, "id: missing");
    if (!(seen & (1u << F_SHARING)))
        return bad(msg, msg_len, "sharing: missing");
    return 0;
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
    const char *models[KVG_TENANT_MODELS_MAX];
    kvg_key_info keys[KVG_TENANT_KEYS_MAX];
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
    kvg_tenant **list = calloc(n ? n : 1, sizeof(*list));
    if (!list) {
        rc = -ENOMEM;
        goto fail;
    }

    /* Everything that can fail on the input happens before the lock: the store is untouched
     * until one snapshot replaces it whole. */
    for (; built < n; built++) {
        const kvg_json *o = arr->u.arr.items[built];
        kvg_tenant_def def;
        size_t nkeys;
        tenant_spec *spec;
        rc = parse_tenant(o, &def, models, keys, &nkeys, why, sizeof(why));
        if (rc == 0)
            rc = kvg_tenancy_spec_new(&def, why, sizeof(why), &spec);
        if (rc == 0)
            rc = kvg_tenancy_tenant_new(spec, NULL, keys, nkeys, &list[built]);
        if (rc == -ENOMEM)
            goto fail;
        if (rc < 0) {
            name_tenant(o, built, why, msg, msg_len);
            rc = KVG_EPARSE;
            goto fail;
        }
    }
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
