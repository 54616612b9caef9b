/* SPDX-License-Identifier: Apache-2.0 */
/* The audit log: one JSON line per admin change attempt, appended to the audit file and logged
 * at info level. Lines name actions, targets, the acting admin token's id, key ids and the
 * resource before and after the change, never key material or a token. */
#include "admin_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Output bytes one string may take in a line: a line stays well under the error log's 2048. */
#define TARGET_OUT_MAX 400
#define DETAIL_OUT_MAX 800
#define LINE_MAX_LEN 1536
/* A resource's JSON larger than this (a tenant with thousands of models) is left out of the
 * line, with its size, rather than make one line of megabytes. */
#define RESOURCE_OUT_MAX (64u * 1024)

typedef struct line {
    char buf[LINE_MAX_LEN];
    size_t len;
} line;

static void put(line *l, const char *s, size_t n)
{
    n = KVG_MIN(n, sizeof(l->buf) - 1 - l->len);
    memcpy(l->buf + l->len, s, n);
    l->len += n;
    l->buf[l->len] = '\0';
}

static bool is_b64url(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_';
}

/* Length of an API key at s (the prefix and 32+ base64url characters), or 0. An operator may
 * paste a key where an id belongs; the audit log must not keep it. */
static size_t key_at(const char *s, size_t avail)
{
    size_t plen = strlen(KVG_KEY_PREFIX), run = 0;
    if (avail < plen || memcmp(s, KVG_KEY_PREFIX, plen) != 0)
        return 0;
    while (plen + run < avail && is_b64url(s[plen + run]))
        run++;
    return run >= 32 ? plen + run : 0;
}

/* A JSON string of at most max bytes (quotes included, cut at a character boundary); invalid
 * UTF-8 becomes '?', so the line is valid JSON whatever the path held, and anything shaped
 * like an API key is redacted. The buffer is large enough for every field at its maximum. */
static void put_string(line *l, const char *s, size_t max)
{
    static const char hex[] = "0123456789abcdef";
    static const char redacted[] = KVG_KEY_PREFIX "[redacted]";
    size_t used = 2;
    put(l, "\"", 1);
    for (size_t i = 0, n = strlen(s); i < n;) {
        const unsigned char ch = (unsigned char)s[i];
        char esc[8];
        size_t len = 1;
        const char *out = esc;
        size_t key = key_at(s + i, n - i);
        if (key) {
            if (used + sizeof(redacted) - 1 > max)
                break;
            put(l, redacted, sizeof(redacted) - 1);
            used += sizeof(redacted) - 1;
            i += key;
            continue;
        }
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\', esc[1] = (char)ch, len = 2;
        } else if (ch < 0x20 || ch == 0x7f) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[ch >> 4], esc[5] = hex[ch & 15], len = 6;
        } else if (ch < 0x80) {
            esc[0] = (char)ch;
        } else {
            size_t seq = kvg_utf8_seq_len((const unsigned char *)s + i, n - i);
            if (seq) {
                out = s + i;
                len = seq;
            } else {
                esc[0] = '?';
            }
        }
        if (used + len > max)
            break;
        put(l, out, len);
        used += len;
        i += out == esc ? 1 : len;
    }
    put(l, "\"", 1);
}

/* Append a resource's JSON (from kvg_admin_audit_resource) as member name of the line, with
 * anything shaped like an API key redacted (a tenant id may be a pasted key); left out when it
 * was not taken. A key run stays inside its JSON string, so the result stays valid JSON. */
static void put_resource(kvg_buf *out, const char *name, const kvg_buf *json)
{
    static const char redacted[] = KVG_KEY_PREFIX "[redacted]";
    if (!json->len && !json->failed)
        return;
    kvg_buf_printf(out, ",\"%s\":", name);
    if (json->failed) {
        kvg_buf_puts(out, "{\"omitted\":\"out of memory\"}");
        return;
    }
    if (json->len > RESOURCE_OUT_MAX) {
        kvg_buf_printf(out, "{\"omitted_bytes\":%zu}", json->len);
        return;
    }
    const char *s = json->data;
    size_t from = 0;
    for (size_t i = 0; i < json->len;) {
        size_t key = key_at(s + i, json->len - i);
        if (!key) {
            i++;
            continue;
        }
        kvg_buf_append(out, s + from, i - from);
        kvg_buf_append(out, redacted, sizeof(redacted) - 1);
        i += key;
        from = i;
    }
    kvg_buf_append(out, s + from, json->len - from);
}

void kvg_admin_audit_resource(admin_ctx *c, kvg_buf *out)
{
    void (*get)(admin_ctx *) = NULL;
    if (strncmp(c->action, "worker.", 7) == 0)
        get = kvg_admin_worker_get;
    else if (strncmp(c->action, "model.", 6) == 0)
        get = kvg_admin_model_get;
    else if (strncmp(c->action, "tenant.", 7) == 0 || strncmp(c->action, "key.", 4) == 0)
        get = kvg_admin_tenant_get;
    else if (strncmp(c->action, "policy.", 7) == 0)
        get = kvg_admin_policy_get;
    if (!get)
        return;
    /* The GET route on a context of its own: its answer (or 404) is the resource. */
    kvg_admin_response resp = {.status = 500, .content_type = CT_JSON};
    kvg_buf_init(&resp.body);
    admin_ctx g = {.admin = c->admin, .req = c->req, .resp = &resp, .remote = c->remote};
    memcpy(g.name, c->name, sizeof(g.name));
    memcpy(g.model, c->model, sizeof(g.model));
    kvg_arena_init(&g.arena, 0);
    get(&g);
    if (resp.status == 200 && !resp.body.failed)
        kvg_buf_append(out, resp.body.data, resp.body.len);
    else if (resp.status == 404)
        kvg_buf_puts(out, "null");
    else
        out->failed = true;
    kvg_arena_done(&g.arena);
    kvg_admin_response_done(&resp);
}

void kvg_admin_audit(admin_ctx *c)
{
    kvg_admin *admin = c->admin;
    char ts[40], num[32];
    line l = {.len = 0};
    kvg_format_time(kvg_wall_ns(), ts, sizeof(ts));
    put(&l, "{\"time\":\"", 9);
    put(&l, ts, strlen(ts));
    put(&l, "\",\"remote\":", 11);
    put_string(&l, c->remote, 200);
    put(&l, ",\"token\":", 9);
    if (c->token_id[0])
        put_string(&l, c->token_id, ADMIN_TOKEN_ID_LEN + 2);
    else
        put(&l, "null", 4);
    put(&l, ",\"action\":", 10);
    put_string(&l, c->action, 64);
    put(&l, ",\"target\":", 10);
    put_string(&l, c->target, TARGET_OUT_MAX);
    int n = snprintf(num, sizeof(num), ",\"status\":%d,\"detail\":", c->resp->status);
    put(&l, num, (size_t)n);
    put_string(&l, c->detail, DETAIL_OUT_MAX);

    /* The error log keeps its lines short: there the line goes without before and after. */
    kvg_log_info("admin: audit %.*s}", (int)l.len, l.buf);
    if (!admin->audit_path)
        return;
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_buf_append(&out, l.buf, l.len);
    put_resource(&out, "before", &c->before);
    put_resource(&out, "after", &c->after);
    kvg_buf_puts(&out, "}\n");
    if (out.failed) {
        /* the line without the resources is still worth having */
        kvg_buf_reset(&out);
        kvg_buf_append(&out, l.buf, l.len);
        kvg_buf_puts(&out, "}\n");
    }
    /* Opened per line: changes are rare, and a rotated file is picked up at once. */
    int fd =
        out.failed ? -1 : open(admin->audit_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        kvg_log_error("admin: cannot open the audit log %s: %s", admin->audit_path,
                      out.failed ? "out of memory" : strerror(errno));
        kvg_buf_done(&out);
        return;
    }
    /* One write per line: O_APPEND keeps concurrent writers (another process) whole. */
    ssize_t w = write(fd, out.data, out.len);
    if (w != (ssize_t)out.len)
        kvg_log_error("admin: cannot append to the audit log %s: %s", admin->audit_path,
                      w < 0 ? strerror(errno) : "short write");
    close(fd);
    kvg_buf_done(&out);
}
