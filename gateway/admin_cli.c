/* SPDX-License-Identifier: Apache-2.0 */
/* `kvgate admin`: turns a command line into one admin API call, made with a small blocking
 * HTTP/1.1 client (plain socket, deadline on the whole exchange, http_parser for the answer). */
#include "admin_cli.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <http_parser.h>

#include "common.h"
#include "policy.h"
#include "router.h"
#include "tenancy.h"

#define DEFAULT_URL "http://127.0.0.1:9090"
#define DEFAULT_STATE_DIR "./kvgate-state"
#define DEFAULT_TIMEOUT_S 10.0
#define RESPONSE_MAX (256u * 1024 * 1024) /* /metrics of a large fleet fits */
#define TOKEN_MAX 1024

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

static const char usage_text[] =
    "usage: kvgate admin [--url URL] [--token TOKEN] [--state DIR] [--timeout SECONDS] COMMAND\n"
    "\n"
    "Calls the admin API of a running kvgate and prints the answer (JSON) to stdout.\n"
    "\n"
    "commands:\n"
    "  workers list\n"
    "  workers get NAME\n"
    "  workers put NAME URL [--model M]... [--kv-blocks N] [--max-inflight N]\n"
    "                 [--cache-salt|--no-cache-salt]\n"
    "  workers delete NAME\n"
    "  workers drain NAME\n"
    "  tenants list\n"
    "  tenants get ID\n"
    "  tenants put ID [--sharing isolated|global|group:NAME] [--model M]... [--rps N]\n"
    "                 [--burst N] [--prompt-bytes-per-s N] [--prompt-bytes-burst N]\n"
    "                 [--max-inflight N] [--group NAME]\n"
    "  tenants delete ID\n"
    "  keys create TENANT        prints the new key once; it cannot be shown again\n"
    "  keys delete TENANT KEYID\n"
    "  policy get\n"
    "  policy set [NAME] [--load-factor X] [--queue-cost-per-request US] ...\n"
    "                            NAME: cost, prefix_only, least_loaded, round_robin, random;\n"
    "                            also --block-bytes --block-tokens --max-blocks --cold-blocks\n"
    "                            --prefill-cost-per-block --waiting-cost-per-request\n"
    "                            --kv-usage-cost (fields left out keep their values)\n"
    "  explain FILE [--tenant ID] [--path /v1/completions]\n"
    "                            the routing decision for the request body in FILE (- stdin)\n"
    "  metrics                   Prometheus text\n"
    "  health                    GET /healthz (no token needed)\n"
    "  ready                     GET /readyz (no token needed)\n"
    "\n"
    "options:\n"
    "  --url URL          admin listener (default " DEFAULT_URL ")\n"
    "  --token TOKEN      admin token; default: $KVGATE_ADMIN_TOKEN, then the file admin-token\n"
    "                     in the state directory\n"
    "  --state DIR        state directory to read admin-token from (default " DEFAULT_STATE_DIR
    ")\n"
    "  --timeout SECONDS  for the whole call (default 10)\n"
    "  -h, --help         this text\n"
    "\n"
    "Exit status: 0 for a 2xx answer, 1 for another answer or no answer, 2 for a usage error.\n"
    "A PUT replaces the whole definition: options left out take their defaults. The gateway\n"
    "checks the values (docs/admin-api.md has each field's range).\n";

typedef struct cli {
    const char *url;
    const char *token;
    const char *state_dir;
    double timeout_s;
    /* the call */
    const char *method;
    kvg_buf path;
    kvg_buf body; /* empty: no body */
    bool auth;    /* needs the admin token */
} cli;

static int usage_error(const char *fmt, ...) KVG_PRINTF(1, 2);

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvgate admin: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(kvgate admin --help lists the commands)\n", stderr);
    return EXIT_USAGE;
}

/* ---- building the call ------------------------------------------------------------------- */

/* Append a path segment, percent-encoding all but unreserved characters: a name with a slash
 * or a space reaches the server as one (invalid) name, which it then names in its answer. */
static void put_segment(kvg_buf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    kvg_buf_putc(b, '/');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '.' || c == '_' || c == '~') {
            kvg_buf_putc(b, (char)c);
        } else {
            char esc[3] = {'%', hex[c >> 4], hex[c & 15]};
            kvg_buf_append(b, esc, 3);
        }
    }
}

static void put_str(kvg_buf *b, const char *s)
{
    kvg_buf_json_string(b, s, strlen(s));
}

/* Opening a member of the JSON body object. */
static void member(kvg_buf *b, const char *name)
{
    kvg_buf_putc(b, b->len ? ',' : '{');
    put_str(b, name);
    kvg_buf_putc(b, ':');
}

/* Positional arguments of one command, in order. */
typedef struct args {
    const char *pos[4];
    size_t npos;
} args;

typedef struct opt {
    const char *name;
    bool has_value;
} opt;

/* The options a command takes: a fixed list, or the fields of a resource that kvgate admin may
 * set (--kv-blocks for kv_blocks, --model for an item of models, --rps for rate.rps,
 * --cache-salt and --no-cache-salt for a boolean), less those given positionally. */
typedef struct optset {
    const opt *opts;
    size_t nopts;
    const kvg_fields *fields;
    const char *positional; /* a field taken as an argument, not an option (or NULL) */
} optset;

/* The field an option names ("--max-inflight" -> max_inflight) in t or its flattened objects;
 * *negate for "--no-NAME" of a boolean. NULL when there is none. */
static const kvg_field *option_field(const kvg_fields *t, const char *name, size_t len,
                                     const char *positional, char *key, size_t key_len,
                                     bool *negate)
{
    *negate = false;
    if (len < 3 || len - 2 >= key_len)
        return NULL;
    for (size_t i = 2; i < len; i++)
        key[i - 2] = name[i] == '-' ? '_' : name[i];
    key[len - 2] = '\0';
    for (int pass = 0; pass < 2; pass++) {
        const char *k = pass ? key + 3 : key;
        if (pass && strncmp(key, "no_", 3) != 0)
            break;
        for (size_t i = 0; i < t->count; i++) {
            const kvg_field *f = &t->fields[i];
            if (!(f->set_in & KVG_SET_CLI) || (positional && strcmp(f->name, positional) == 0))
                continue;
            const kvg_field *m = NULL;
            if (f->type == KVG_FIELD_OBJECT && (f->flags & KVG_FIELD_FLATTEN))
                m = kvg_fields_find(f->object, k, strlen(k));
            else if (strcmp(f->type == KVG_FIELD_STRINGS && f->item ? f->item : f->name, k) == 0)
                m = f;
            if (!m || !(m->set_in & KVG_SET_CLI) || (pass && m->type != KVG_FIELD_BOOL))
                continue;
            if (pass)
                memmove(key, key + 3, strlen(key + 3) + 1);
            *negate = pass == 1;
            return m;
        }
    }
    return NULL;
}

/* Split argv into positionals and the options of os, calling fn for each option with its
 * value (NULL for an option without one). Returns 0 or EXIT_USAGE after printing why. */
typedef int (*opt_fn)(void *ud, const char *name, const char *value);

static int parse_args(int argc, char **argv, const optset *os, args *a, size_t max_pos, opt_fn fn,
                      void *ud)
{
    bool options = true;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (options && strcmp(arg, "--") == 0) {
            options = false; /* what follows is positional, even "--x" */
            continue;
        }
        if (!options || strncmp(arg, "--", 2) != 0) {
            if (a->npos == max_pos)
                return usage_error("unexpected argument \"%s\"", arg);
            a->pos[a->npos++] = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        bool known = false, has_value = false, negate;
        char key[64];
        for (size_t k = 0; os && k < os->nopts && !known; k++) {
            known = strlen(os->opts[k].name) == nlen && memcmp(os->opts[k].name, arg, nlen) == 0;
            has_value = known && os->opts[k].has_value;
        }
        if (!known && os && os->fields) {
            const kvg_field *f =
                option_field(os->fields, arg, nlen, os->positional, key, sizeof(key), &negate);
            known = f != NULL;
            has_value = known && f->type != KVG_FIELD_BOOL;
        }
        if (!known)
            return usage_error("unknown option %.*s", (int)nlen, arg);
        const char *value = NULL;
        if (has_value) {
            if (eq)
                value = eq + 1;
            else if (i + 1 < argc)
                value = argv[++i];
            else
                return usage_error("%.*s needs a value", (int)nlen, arg);
        } else if (eq) {
            return usage_error("%.*s takes no value", (int)nlen, arg);
        }
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)nlen, arg);
        int rc = fn(ud, name, value);
        if (rc)
            return rc;
    }
    return 0;
}

/* A request body built through a resource's field table: options and positionals become
 * members as the gateway takes them; only text that cannot be the field's type is refused here
 * (a usage error), the values are the gateway's to check. */
typedef struct req_body {
    const kvg_fields *fields;
    kvg_arena arena;
    kvg_json *obj;
    const char *positional;
} req_body;

static int body_init(req_body *b, const kvg_fields *fields, const char *positional)
{
    b->fields = fields;
    b->positional = positional;
    kvg_arena_init(&b->arena, 0);
    b->obj = kvg_fields_json_object(&b->arena);
    return b->obj ? 0 : -ENOMEM;
}

/* Set a member from text ("kv_blocks", "40"); a usage error with the walker's message. */
static int body_set(req_body *b, const char *key, const char *text)
{
    char msg[256];
    kvg_fields_ctx c = {
        .from = KVG_SET_CLI, .arena = &b->arena, .msg = msg, .msg_len = sizeof(msg)};
    int rc = kvg_fields_json_set_text(b->fields, b->obj, key, strlen(key), text, strlen(text), &c);
    if (rc == -ENOMEM)
        return usage_error("out of memory");
    return rc < 0 ? usage_error("%s", msg) : 0;
}

/* An option of a put or set command: its field, set from its value. */
static int field_opt(void *ud, const char *name, const char *value)
{
    req_body *b = ud;
    char key[64];
    bool negate;
    const kvg_field *f =
        option_field(b->fields, name, strlen(name), b->positional, key, sizeof(key), &negate);
    if (f->type == KVG_FIELD_BOOL)
        value = negate ? "false" : "true";
    /* --sharing group:NAME is both the sharing and the group. */
    if (strcmp(key, "sharing") == 0 && strncmp(value, "group:", 6) == 0) {
        if (!value[6])
            return usage_error("--sharing group:NAME needs a group name");
        int rc = body_set(b, "sharing", "group");
        return rc ? rc : body_set(b, "group", value + 6);
    }
    return body_set(b, key, value);
}

/* Write the body into the call and free it. */
static void body_done(req_body *b, cli *c, bool send)
{
    if (send)
        kvg_json_write(&c->body, b->obj);
    kvg_arena_done(&b->arena);
}

static int need(const args *a, size_t n, const char *what)
{
    if (a->npos < n)
        return usage_error("missing %s", what);
    return 0;
}

/* put NAME ... / set ...: a body of the resource's fields from the options. */
static int parse_body(int argc, char **argv, const kvg_fields *fields, const char *positional,
                      args *a, size_t max_pos, req_body *b)
{
    optset os = {.fields = fields, .positional = positional};
    if (body_init(b, fields, positional) < 0)
        return usage_error("out of memory");
    return parse_args(argc, argv, &os, a, max_pos, field_opt, b);
}

/* put NAME [ARG] [options]: the resource's body from the options (and from the second argument
 * when the resource takes one of its fields positionally), NAME the path's last segment. */
static int cmd_put(cli *c, int argc, char **argv, const kvg_fields *fields, const char *positional,
                   const char *what)
{
    args a = {.npos = 0};
    size_t npos = positional ? 2 : 1;
    req_body b;
    int rc = parse_body(argc, argv, fields, positional, &a, npos, &b);
    if (!rc)
        rc = need(&a, npos, what);
    if (!rc && positional)
        rc = body_set(&b, positional, a.pos[1]);
    body_done(&b, c, rc == 0);
    if (rc)
        return rc;
    put_segment(&c->path, a.pos[0]);
    c->method = "PUT";
    return 0;
}

static int cmd_workers(cli *c, int argc, char **argv)
{
    args a = {.npos = 0};
    if (argc < 1)
        return usage_error("workers: missing subcommand (list, get, put, delete, drain)");
    const char *sub = argv[0];
    kvg_buf_puts(&c->path, "/admin/v1/workers");
    if (strcmp(sub, "list") == 0) {
        int rc = parse_args(argc - 1, argv + 1, NULL, &a, 0, NULL, NULL);
        c->method = "GET";
        return rc;
    }
    if (strcmp(sub, "put") == 0)
        return cmd_put(c, argc - 1, argv + 1, &kvg_worker_fields, "url",
                       "NAME and URL: workers put NAME URL");
    if (strcmp(sub, "get") && strcmp(sub, "delete") && strcmp(sub, "drain"))
        return usage_error("workers: unknown subcommand \"%s\"", sub);
    int rc = parse_args(argc - 1, argv + 1, NULL, &a, 1, NULL, NULL);
    if (rc || (rc = need(&a, 1, "NAME")))
        return rc;
    put_segment(&c->path, a.pos[0]);
    c->method = strcmp(sub, "get") == 0 ? "GET" : strcmp(sub, "delete") == 0 ? "DELETE" : "POST";
    if (strcmp(sub, "drain") == 0)
        kvg_buf_puts(&c->path, "/drain");
    return 0;
}

static int cmd_tenants(cli *c, int argc, char **argv)
{
    args a = {.npos = 0};
    if (argc < 1)
        return usage_error("tenants: missing subcommand (list, get, put, delete)");
    const char *sub = argv[0];
    kvg_buf_puts(&c->path, "/admin/v1/tenants");
    if (strcmp(sub, "list") == 0) {
        c->method = "GET";
        return parse_args(argc - 1, argv + 1, NULL, &a, 0, NULL, NULL);
    }
    if (strcmp(sub, "put") == 0)
        return cmd_put(c, argc - 1, argv + 1, &kvg_tenant_fields, NULL, "ID: tenants put ID");
    if (strcmp(sub, "get") && strcmp(sub, "delete"))
        return usage_error("tenants: unknown subcommand \"%s\"", sub);
    int rc = parse_args(argc - 1, argv + 1, NULL, &a, 1, NULL, NULL);
    if (rc || (rc = need(&a, 1, "ID")))
        return rc;
    put_segment(&c->path, a.pos[0]);
    c->method = strcmp(sub, "get") == 0 ? "GET" : "DELETE";
    return 0;
}

static int cmd_keys(cli *c, int argc, char **argv)
{
    args a = {.npos = 0};
    if (argc < 1)
        return usage_error("keys: missing subcommand (create, delete)");
    const char *sub = argv[0];
    bool create = strcmp(sub, "create") == 0;
    if (!create && strcmp(sub, "delete") != 0)
        return usage_error("keys: unknown subcommand \"%s\"", sub);
    int rc = parse_args(argc - 1, argv + 1, NULL, &a, create ? 1 : 2, NULL, NULL);
    if (rc || (rc = need(&a, create ? 1 : 2, create ? "TENANT" : "TENANT and KEYID")))
        return rc;
    kvg_buf_puts(&c->path, "/admin/v1/tenants");
    put_segment(&c->path, a.pos[0]);
    kvg_buf_puts(&c->path, "/keys");
    if (!create)
        put_segment(&c->path, a.pos[1]);
    c->method = create ? "POST" : "DELETE";
    return 0;
}

/* The admin API takes bodies up to 1 MiB (KVG_ADMIN_BODY_MAX). */
#define EXPLAIN_BODY_MAX (1024 * 1024)

/* policy set [NAME] [--SETTING VALUE]...: the settings' fields; the name is positional. */
static int cmd_policy(cli *c, int argc, char **argv)
{
    args a = {.npos = 0};
    if (argc < 1)
        return usage_error("policy: missing subcommand (get, set)");
    kvg_buf_puts(&c->path, "/admin/v1/policy");
    if (strcmp(argv[0], "get") == 0) {
        c->method = "GET";
        return parse_args(argc - 1, argv + 1, NULL, &a, 0, NULL, NULL);
    }
    if (strcmp(argv[0], "set") != 0)
        return usage_error("policy: unknown subcommand \"%s\"", argv[0]);
    req_body b;
    int rc = parse_body(argc - 1, argv + 1, &kvg_policy_fields, "policy", &a, 1, &b);
    /* the name is optional: "policy set --load-factor 0.5" keeps it */
    if (!rc && a.npos == 1)
        rc = body_set(&b, "policy", a.pos[0]);
    if (!rc && b.obj->u.obj.count == 0)
        rc = usage_error("policy set: give a policy NAME and/or settings (--load-factor ...)");
    body_done(&b, c, rc == 0);
    if (rc)
        return rc;
    c->method = "PUT";
    return 0;
}

/* explain FILE|- [--tenant ID] [--path P]: the request body read from FILE ('-': stdin), sent
 * as is inside {"request": ...}; the gateway validates it. */
typedef struct explain_ctx {
    cli *c;
    bool seen[2]; /* --tenant, --path: each once, a repeat is more likely a typo than a wish */
} explain_ctx;

static int explain_opt(void *ud, const char *name, const char *value)
{
    explain_ctx *e = ud;
    bool *seen = &e->seen[strcmp(name, "--path") == 0];
    if (*seen)
        return usage_error("%s given twice", name);
    *seen = true;
    member(&e->c->body, name + 2);
    put_str(&e->c->body, value);
    return 0;
}

static int cmd_explain(cli *c, int argc, char **argv)
{
    static const opt opts[] = {{"--tenant", true}, {"--path", true}};
    static const optset os = {.opts = opts, .nopts = KVG_ARRAY_LEN(opts)};
    args a = {.npos = 0};
    explain_ctx e = {.c = c};
    int rc = parse_args(argc, argv, &os, &a, 1, explain_opt, &e);
    if (rc || (rc = need(&a, 1, "FILE: explain FILE (a request body; - for stdin)")))
        return rc;
    FILE *f = strcmp(a.pos[0], "-") == 0 ? stdin : fopen(a.pos[0], "r");
    if (!f) {
        fprintf(stderr, "kvgate admin: %s: %s\n", a.pos[0], strerror(errno));
        return EXIT_USAGE;
    }
    member(&c->body, "request");
    char chunk[65536];
    size_t n, total = 0;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0 && total <= EXPLAIN_BODY_MAX) {
        kvg_buf_append(&c->body, chunk, n);
        total += n;
    }
    bool err = ferror(f);
    if (f != stdin)
        fclose(f);
    if (err)
        return usage_error("%s: read error", a.pos[0]);
    if (total > EXPLAIN_BODY_MAX)
        return usage_error("%s: larger than %d bytes", a.pos[0], EXPLAIN_BODY_MAX);
    if (!total)
        return usage_error("%s: empty", a.pos[0]);
    kvg_buf_putc(&c->body, '}');
    kvg_buf_puts(&c->path, "/admin/v1/route/explain");
    c->method = "POST";
    return 0;
}

static int cmd_simple(cli *c, int argc, char **argv, const char *path, bool auth)
{
    args a = {.npos = 0};
    int rc = parse_args(argc - 1, argv + 1, NULL, &a, 0, NULL, NULL);
    kvg_buf_puts(&c->path, path);
    c->method = "GET";
    c->auth = auth;
    return rc;
}

static int build_call(cli *c, int argc, char **argv)
{
    const char *cmd = argv[0];
    c->auth = true;
    if (strcmp(cmd, "workers") == 0)
        return cmd_workers(c, argc - 1, argv + 1);
    if (strcmp(cmd, "tenants") == 0)
        return cmd_tenants(c, argc - 1, argv + 1);
    if (strcmp(cmd, "keys") == 0)
        return cmd_keys(c, argc - 1, argv + 1);
    if (strcmp(cmd, "policy") == 0)
        return cmd_policy(c, argc - 1, argv + 1);
    if (strcmp(cmd, "explain") == 0)
        return cmd_explain(c, argc - 1, argv + 1);
    if (strcmp(cmd, "metrics") == 0)
        return cmd_simple(c, argc, argv, "/metrics", true);
    if (strcmp(cmd, "health") == 0)
        return cmd_simple(c, argc, argv, "/healthz", false);
    if (strcmp(cmd, "ready") == 0)
        return cmd_simple(c, argc, argv, "/readyz", false);
    return usage_error("unknown command \"%s\"", cmd);
}

/* ---- the token ----------------------------------------------------------------------------- */

/* --token, then $KVGATE_ADMIN_TOKEN, then STATE/admin-token as the gateway generates it. */
static int find_token(cli *c, char *out, size_t out_len)
{
    const char *t = c->token;
    if (!t || !*t)
        t = getenv("KVGATE_ADMIN_TOKEN");
    if (t && *t) {
        if (strlen(t) >= out_len)
            return usage_error("the admin token is longer than %zu bytes", out_len - 1);
        snprintf(out, out_len, "%s", t);
        return 0;
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/admin-token", c->state_dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr,
                "kvgate admin: no admin token: pass --token, set KVGATE_ADMIN_TOKEN, or run "
                "where %s is readable (--state DIR): %s\n",
                path, strerror(errno));
        return EXIT_USAGE;
    }
    char *ok = fgets(out, (int)out_len, f);
    fclose(f);
    if (ok)
        out[strcspn(out, "\r\n")] = '\0';
    if (!ok || !*out) {
        fprintf(stderr, "kvgate admin: %s is empty\n", path);
        return EXIT_USAGE;
    }
    return 0;
}

/* ---- HTTP ------------------------------------------------------------------------------------ */

typedef struct response {
    int status;
    kvg_buf body;
    bool complete;
    bool too_large;
} response;

static int on_body(http_parser *p, const char *at, size_t len)
{
    response *r = p->data;
    if (r->body.len + len > RESPONSE_MAX) {
        r->too_large = true;
        return 1;
    }
    kvg_buf_append(&r->body, at, len);
    return r->body.failed ? 1 : 0;
}

static int on_complete(http_parser *p)
{
    response *r = p->data;
    r->status = (int)p->status_code;
    r->complete = true;
    return 0;
}

/* Milliseconds left before the deadline (monotonic ns), at least 0. */
static int ms_left(uint64_t deadline)
{
    uint64_t now = kvg_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* Wait until fd is ready for events; 0, -ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int n = poll(&pfd, 1, ms_left(deadline));
        if (n > 0)
            return 0;
        if (n == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

static int connect_to(const char *host, uint16_t port, uint64_t deadline, int *out)
{
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        fprintf(stderr, "kvgate admin: cannot resolve %s: %s\n", host, gai_strerror(gai));
        return -EHOSTUNREACH;
    }
    int rc = -ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
            rc = -errno;
            close(fd);
            continue;
        }
        rc = wait_fd(fd, POLLOUT, deadline);
        int err = 0;
        socklen_t elen = sizeof(err);
        if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err)
            rc = -err;
        if (rc == 0) {
            *out = fd;
            break;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

static int send_all(int fd, const char *p, size_t len, uint64_t deadline)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int rc = wait_fd(fd, POLLOUT, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Read the answer until it is complete or the server closes. 0, -ETIMEDOUT, -EPROTO, -EFBIG. */
static int read_response(int fd, uint64_t deadline, response *r)
{
    static const http_parser_settings settings = {.on_body = on_body,
                                                  .on_message_complete = on_complete};
    http_parser parser;
    http_parser_init(&parser, HTTP_RESPONSE);
    parser.data = r;
    char buf[16384];
    while (!r->complete) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc < 0)
                return rc;
            continue;
        }
        if (n < 0)
            return -errno;
        /* n == 0: the end, which completes a body delimited by the close */
        size_t used = http_parser_execute(&parser, &settings, buf, (size_t)n);
        if (r->too_large)
            return -EFBIG;
        if (r->body.failed)
            return -ENOMEM;
        if (HTTP_PARSER_ERRNO(&parser) != HPE_OK || used != (size_t)n)
            return -EPROTO;
        if (n == 0)
            return r->complete ? 0 : -EPROTO;
    }
    return 0;
}

static int call(const cli *c, const char *host, uint16_t port, const char *authority,
                const char *token, response *r)
{
    uint64_t deadline = kvg_now_ns() + (uint64_t)(c->timeout_s * 1e9);
    int fd = -1;
    int rc = connect_to(host, port, deadline, &fd);
    if (rc < 0) {
        if (rc != -EHOSTUNREACH)
            fprintf(stderr, "kvgate admin: cannot connect to %s: %s\n", authority,
                    kvg_strerror(rc));
        return rc;
    }
    kvg_buf req;
    kvg_buf_init(&req);
    kvg_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kvgate-admin\r\n", c->method,
                   c->path.data, authority);
    if (token)
        kvg_buf_printf(&req, "Authorization: Bearer %s\r\n", token);
    if (c->body.len)
        kvg_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                       c->body.len);
    else if (strcmp(c->method, "GET") != 0)
        kvg_buf_puts(&req, "Content-Length: 0\r\n");
    kvg_buf_puts(&req, "Accept: application/json\r\nConnection: close\r\n\r\n");
    if (c->body.len)
        kvg_buf_append(&req, c->body.data, c->body.len);
    rc = req.failed ? -ENOMEM : send_all(fd, req.data, req.len, deadline);
    /* the request holds the token: leave no copy behind */
    if (req.data)
        memset(req.data, 0, req.cap);
    kvg_buf_done(&req);
    if (rc == 0)
        rc = read_response(fd, deadline, r);
    close(fd);
    if (rc < 0)
        fprintf(stderr, "kvgate admin: %s %s on %s: %s\n", c->method, c->path.data, authority,
                rc == -ETIMEDOUT ? "no answer in time (--timeout)"
                : rc == -EPROTO  ? "not an HTTP answer"
                : rc == -EFBIG   ? "answer too large"
                                 : kvg_strerror(rc));
    return rc;
}

/* The URL: http://host[:port][/]; https is curl's business. */
static int parse_url(const char *url, char *host, size_t host_len, uint16_t *port, char *authority,
                     size_t auth_len)
{
    if (strncmp(url, "https://", 8) == 0)
        return usage_error("--url: https is not supported by kvgate admin; use curl with "
                           "--cacert for a TLS admin listener");
    if (strncmp(url, "http://", 7) != 0)
        return usage_error("--url: expected http://host:port, got \"%s\"", url);
    char hp[300];
    const char *rest = url + 7;
    size_t len = strcspn(rest, "/");
    if (rest[len] && strcmp(rest + len, "/") != 0)
        return usage_error("--url: no path allowed, got \"%s\"", url);
    if (len == 0 || len >= sizeof(hp) - 4)
        return usage_error("--url: expected http://host:port, got \"%s\"", url);
    memcpy(hp, rest, len);
    hp[len] = '\0';
    /* no port: HTTP's 80 */
    bool has_port = hp[len - 1] != ']' && strrchr(hp, ':') &&
                    (hp[0] != '[' || strrchr(hp, ':') > strchr(hp, ']'));
    if (!has_port)
        strcat(hp, ":80");
    if (kvg_parse_hostport(hp, host, host_len, port) < 0 || *port == 0)
        return usage_error("--url: expected http://host:port, got \"%s\"", url);
    snprintf(authority, auth_len, "%s", hp);
    return 0;
}

/* "message" of an OpenAI-shaped error body, or NULL. */
static const char *error_message(const kvg_buf *body, kvg_arena *arena)
{
    kvg_json *root;
    if (!body->len || kvg_json_parse(body->data, body->len, arena, NULL, &root, NULL) < 0)
        return NULL;
    const kvg_json *m = kvg_json_get(kvg_json_get(root, "error"), "message");
    if (!m)
        m = kvg_json_get(root, "reason"); /* /readyz */
    return m && m->type == KVG_JSON_STRING ? m->u.str.ptr : NULL;
}

static int report(const response *r)
{
    bool ok = r->status >= 200 && r->status < 300;
    if (ok) {
        if (r->body.len) {
            fwrite(r->body.data, 1, r->body.len, stdout);
            if (r->body.data[r->body.len - 1] != '\n')
                putchar('\n');
        }
        return fflush(stdout) == 0 ? EXIT_OK : EXIT_FAIL;
    }
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    const char *msg = error_message(&r->body, &arena);
    if (msg)
        fprintf(stderr, "kvgate admin: %d: %s\n", r->status, msg);
    else
        fprintf(stderr, "kvgate admin: %d: %.*s\n", r->status, (int)KVG_MIN(r->body.len, 4096),
                r->body.len ? r->body.data : "");
    kvg_arena_done(&arena);
    return EXIT_FAIL;
}

/* ---- main ------------------------------------------------------------------------------------ */

static int global_options(cli *c, int argc, char **argv, int *first)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            fputs(usage_text, stdout);
            return -1;
        }
        if (strncmp(arg, "--", 2) != 0)
            break;
        static const char *const names[] = {"--url", "--token", "--state", "--timeout"};
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        size_t k = 0;
        while (k < KVG_ARRAY_LEN(names) &&
               !(strlen(names[k]) == nlen && memcmp(names[k], arg, nlen) == 0))
            k++;
        if (k == KVG_ARRAY_LEN(names))
            return usage_error("unknown option %.*s", (int)nlen, arg);
        const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!value)
            return usage_error("%s needs a value", names[k]);
        if (k == 0) {
            c->url = value;
        } else if (k == 1) {
            c->token = value;
        } else if (k == 2) {
            c->state_dir = value;
        } else {
            char *end;
            double t = strtod(value, &end);
            if (*end || !(t > 0 && t <= 3600))
                return usage_error("--timeout: expected seconds in (0, 3600], got \"%s\"", value);
            c->timeout_s = t;
        }
    }
    *first = i;
    return 0;
}

int kvg_admin_cli_main(int argc, char **argv)
{
    cli c = {.url = DEFAULT_URL, .state_dir = DEFAULT_STATE_DIR, .timeout_s = DEFAULT_TIMEOUT_S};
    kvg_buf_init(&c.path);
    kvg_buf_init(&c.body);
    response r = {.status = 0};
    kvg_buf_init(&r.body);
    char token[TOKEN_MAX] = "";
    char host[256], authority[300];
    uint16_t port;
    int first = 1;

    int rc = global_options(&c, argc, argv, &first);
    if (rc < 0) {
        rc = EXIT_OK; /* --help */
        goto out;
    }
    if (rc)
        goto out;
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage_text, stdout);
            goto out;
        }
    }
    if (first >= argc) {
        rc = usage_error("missing command");
        goto out;
    }
    rc = parse_url(c.url, host, sizeof(host), &port, authority, sizeof(authority));
    if (rc)
        goto out;
    rc = build_call(&c, argc - first, argv + first);
    if (rc)
        goto out;
    if (c.path.failed || c.body.failed) {
        fputs("kvgate admin: out of memory\n", stderr);
        rc = EXIT_FAIL;
        goto out;
    }
    if (c.auth && (rc = find_token(&c, token, sizeof(token))) != 0)
        goto out;
    rc = call(&c, host, port, authority, c.auth ? token : NULL, &r) < 0 ? EXIT_FAIL : report(&r);
    if (rc == EXIT_OK && strcmp(c.method, "POST") == 0 && strstr(c.path.data, "/keys"))
        fputs("kvgate admin: store the key now: it is not shown again\n", stderr);

out:
    memset(token, 0, sizeof(token));
    kvg_buf_done(&c.path);
    kvg_buf_done(&c.body);
    kvg_buf_done(&r.body);
    return rc;
}
