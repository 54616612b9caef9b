/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate admin's commands: one table of them (the words, the arguments, the admin API call and
 * the body it carries), from which the dispatch, the argument checks and --help all come; and
 * the main that runs one. */
#include "cli_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "policy.h"
#include "router.h"
#include "tenancy.h"

#define TOKEN_MAX 1024
#define ARGS_MAX 4
#define HELP_WIDTH 96
#define HELP_CALL_COLUMN 36
/* The admin API takes bodies up to 1 MiB (KVG_ADMIN_BODY_MAX). */
#define EXPLAIN_BODY_MAX (1024 * 1024)

/* ---- the tables ------------------------------------------------------------------------------ */

/* The options before the command. */
typedef struct global_opt {
    const char *name, *metavar, *help;
} global_opt;

static const global_opt global_opts[] = {
    {"--url", "URL", "admin listener (default " KVG_CLI_DEFAULT_URL ")"},
    {"--token", "TOKEN",
     "admin token; default: $KVGATE_ADMIN_TOKEN, then the file admin-token in the state "
     "directory"},
    {"--state", "DIR",
     "state directory to read admin-token from (default " KVG_CLI_DEFAULT_STATE_DIR ")"},
    {"--timeout", "SECONDS", "for the whole call (default 10)"},
    {"--output", "FORMAT",
     "json or table (also -o FORMAT, also after the command); default: a table when stdout is "
     "a terminal, JSON otherwise"},
};

enum {
    CMD_OPEN = 1u << 0,          /* no token: the probes answer anyone */
    CMD_SHOWS_KEY = 1u << 1,     /* the answer holds a new key, shown this once */
    CMD_BODY_REQUIRED = 1u << 2, /* a body without a member would change nothing */
};

/* The positional arguments given, in order. */
typedef struct args {
    const char *pos[ARGS_MAX];
    size_t npos;
} args;

typedef struct command command;

struct command {
    const char *words; /* as typed: "workers put" */
    /* Its arguments: NAME (required) or [NAME] (optional), then the options that are not
     * fields, "[--tenant ID]": each a string member of the body, given once. */
    const char *args;
    const char *method;
    const char *path;         /* {1}, {2}: the first, second argument */
    const kvg_fields *fields; /* the body: this resource's fields kvgate admin may set, as
                                 options (--kv-blocks for kv_blocks, --model for an item of
                                 models, --rps for rate.rps, --X and --no-X for a boolean) */
    const char *field_arg;    /* the last argument is this field of the body, not in the path */
    unsigned flags;           /* CMD_* */
    const char *note;         /* for --help */
    /** More of the call after the options, before the body is closed (explain reads its file):
     *  0 or KVG_CLI_EXIT_USAGE after saying why. */
    int (*finish)(kvg_cli *c, const args *a);
    /* The answer as a table (-o table): "" one object, else the member that is the list; NULL
     * for none (the answer is printed as it came). */
    const char *table;
    /* The output is this member of the answer alone, as JSON too. */
    const char *member;
};

static int explain_request(kvg_cli *c, const args *a);

/* A row: the words, the arguments, the call; then what a command has beyond that. */
#define CMD(words_, args_, method_, path_, ...)                                                    \
    {                                                                                              \
        .words = words_, .args = args_, .method = method_, .path = path_, __VA_ARGS__              \
    }

/* clang-format off */
static const command commands[] = {
    CMD("workers list",   "",             "GET",    "/admin/v1/workers", .table = "workers"),
    CMD("workers get",    "NAME",         "GET",    "/admin/v1/workers/{1}", .table = ""),
    CMD("workers put",    "NAME URL",     "PUT",    "/admin/v1/workers/{1}",
        .fields = &kvg_worker_fields, .field_arg = "url", .table = ""),
    CMD("workers delete", "NAME",         "DELETE", "/admin/v1/workers/{1}"),
    CMD("workers drain",  "NAME",         "POST",   "/admin/v1/workers/{1}/drain", .table = ""),
    CMD("models list",    "",             "GET",    "/admin/v1/models", .table = "models"),
    CMD("models get",     "NAME",         "GET",    "/admin/v1/models/{1}", .table = ""),
    CMD("models put",     "NAME TOKENIZER", "PUT",  "/admin/v1/models/{1}",
        .fields = &kvg_model_fields, .field_arg = "tokenizer",
        .note = "loads the files on the gateway's host; paths are absolute", .table = ""),
    CMD("models delete",  "NAME",         "DELETE", "/admin/v1/models/{1}"),
    CMD("tenants list",   "",             "GET",    "/admin/v1/tenants", .table = "tenants"),
    CMD("tenants get",    "ID",           "GET",    "/admin/v1/tenants/{1}", .table = ""),
    CMD("tenants put",    "ID",           "PUT",    "/admin/v1/tenants/{1}",
        .fields = &kvg_tenant_fields, .note = "--sharing group:NAME is --sharing group --group NAME",
        .table = ""),
    CMD("tenants delete", "ID",           "DELETE", "/admin/v1/tenants/{1}"),
    CMD("keys list",      "TENANT",       "GET",    "/admin/v1/tenants/{1}",
        .note = "the tenant's key ids and creation times", .table = "keys", .member = "keys"),
    CMD("keys create",    "TENANT",       "POST",   "/admin/v1/tenants/{1}/keys",
        .flags = CMD_SHOWS_KEY, .note = "prints the new key once; it cannot be shown again",
        .table = ""),
    CMD("keys delete",    "TENANT KEYID", "DELETE", "/admin/v1/tenants/{1}/keys/{2}"),
    CMD("policy get",     "",             "GET",    "/admin/v1/policy", .table = ""),
    CMD("policy set",     "[NAME]",       "PUT",    "/admin/v1/policy",
        .fields = &kvg_policy_fields, .field_arg = "policy", .flags = CMD_BODY_REQUIRED,
        .note = "settings left out keep their values", .table = ""),
    CMD("explain",        "FILE [--tenant ID] [--path P]", "POST", "/admin/v1/route/explain",
        .finish = explain_request,
        .note = "the routing decision for the request body in FILE (- for stdin)"),
    CMD("metrics",        "",             "GET",    "/metrics", .note = "Prometheus text"),
    CMD("health",         "",             "GET",    "/healthz", .flags = CMD_OPEN,
        .note = "no token needed"),
    CMD("ready",          "",             "GET",    "/readyz", .flags = CMD_OPEN,
        .note = "no token needed"),
};
/* clang-format on */

/* ---- reading the tables --------------------------------------------------------------------- */

int kvg_cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvgate admin: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(kvgate admin --help lists the commands)\n", stderr);
    return KVG_CLI_EXIT_USAGE;
}

/* The length of a command's positional part of args: up to its first option. */
static size_t positional_len(const char *spec)
{
    const char *opt = strstr(spec, "[--");
    size_t n = opt ? (size_t)(opt - spec) : strlen(spec);
    while (n && spec[n - 1] == ' ')
        n--;
    return n;
}

/* How many arguments a command takes: *required of them, *max at most. */
static void count_args(const char *spec, size_t *required, size_t *max)
{
    size_t len = positional_len(spec);
    *required = *max = 0;
    for (size_t i = 0; i < len;) {
        size_t n = strcspn(spec + i, " ");
        if (n > len - i)
            n = len - i;
        if (n) {
            (*max)++;
            *required += spec[i] != '[';
        }
        i += n + 1;
    }
}

/* Whether args offers the option name (of len bytes) that is not a field: "[--tenant ID]". */
static bool string_option(const char *spec, const char *name, size_t len)
{
    for (const char *p = spec; (p = strstr(p, "[--")); p++)
        if (strncmp(p + 1, name, len) == 0 && p[1 + len] == ' ')
            return true;
    return false;
}

/* "--max-inflight" for max_inflight. */
static void option_name(const char *field, char *out, size_t len)
{
    snprintf(out, len, "--%s", field);
    for (char *p = out + 2; *p; p++)
        if (*p == '_')
            *p = '-';
}

/* The field an option names ("--max-inflight" -> max_inflight) in t or its flattened objects;
 * *negate for "--no-NAME" of a boolean. NULL when there is none. key receives the field's
 * name as kvg_fields_json_set_text takes it. */
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

/* ---- --help ---------------------------------------------------------------------------------- */

/* The options a resource's fields give, as option_field reads them: " [--kv-blocks N]". */
static void field_options(const kvg_fields *t, const char *skip, kvg_buf *out)
{
    char opt[64], meta[64];
    for (size_t i = 0; i < t->count; i++) {
        const kvg_field *f = &t->fields[i];
        if (!(f->set_in & KVG_SET_CLI) || (skip && strcmp(f->name, skip) == 0))
            continue;
        if (f->type == KVG_FIELD_OBJECT && (f->flags & KVG_FIELD_FLATTEN)) {
            field_options(f->object, NULL, out);
            continue;
        }
        const char *name = f->type == KVG_FIELD_STRINGS && f->item ? f->item : f->name;
        option_name(name, opt, sizeof(opt));
        size_t k;
        for (k = 0; name[k] && k + 1 < sizeof(meta); k++)
            meta[k] = name[k] >= 'a' && name[k] <= 'z' ? (char)(name[k] - 'a' + 'A') : name[k];
        meta[k] = '\0';
        switch (f->type) {
        case KVG_FIELD_BOOL:
            kvg_buf_printf(out, " [%s|--no-%s]", opt, opt + 2);
            break;
        case KVG_FIELD_STRINGS:
            kvg_buf_printf(out, " [%s %s]...", opt, meta);
            break;
        case KVG_FIELD_ENUM:
            kvg_buf_printf(out, " [%s ", opt);
            for (size_t w = 0; w < f->nkeywords; w++)
                kvg_buf_printf(out, "%s%s", w ? "|" : "", f->keywords[w]);
            kvg_buf_putc(out, ']');
            break;
        case KVG_FIELD_U32:
        case KVG_FIELD_U64:
        case KVG_FIELD_SIZE:
            kvg_buf_printf(out, " [%s N]", opt);
            break;
        case KVG_FIELD_DOUBLE:
            kvg_buf_printf(out, " [%s X]", opt);
            break;
        default:
            kvg_buf_printf(out, " [%s %s]", opt, meta);
            break;
        }
    }
}

/* Print text wrapped at HELP_WIDTH from column col, continuation lines indented, breaking
 * before each sep (" [" between a synopsis' groups, " " between words). Returns the column
 * where it ends. */
static size_t print_wrapped(FILE *out, const char *text, size_t col, size_t indent, const char *sep)
{
    for (const char *p = text; *p;) {
        const char *next = strstr(p + 1, sep);
        size_t n = next ? (size_t)(next - p) : strlen(p);
        if (col + n > HELP_WIDTH && col > indent) {
            fprintf(out, "\n%*s", (int)indent, "");
            col = indent;
            if (*p == ' ') {
                p++;
                n--;
            }
        }
        fwrite(p, 1, n, out);
        col += n;
        p += n;
    }
    return col;
}

/* The name of the last positional argument ("NAME" of "[NAME]"), as *w and its length. */
static size_t last_arg(const command *cmd, const char **w)
{
    size_t len = positional_len(cmd->args), start = len;
    while (start && cmd->args[start - 1] != ' ')
        start--;
    *w = cmd->args + start;
    if (len - start > 2 && **w == '[') {
        (*w)++;
        return len - start - 2;
    }
    return len - start;
}

/* "; NAME: cost, prefix_only, ...": the keywords of a field given as an argument. */
static void arg_keywords(const command *cmd, kvg_buf *b)
{
    const kvg_field *f = cmd->field_arg
                             ? kvg_fields_find(cmd->fields, cmd->field_arg, strlen(cmd->field_arg))
                             : NULL;
    if (!f || f->type != KVG_FIELD_ENUM)
        return;
    const char *w;
    size_t wl = last_arg(cmd, &w);
    kvg_buf_printf(b, "; %.*s: ", (int)wl, w);
    for (size_t k = 0; k < f->nkeywords; k++)
        kvg_buf_printf(b, "%s%s", k ? ", " : "", f->keywords[k]);
}

/* "PUT /admin/v1/workers/NAME": a command's call, its arguments named as in args. */
static void put_call(const command *cmd, kvg_buf *b)
{
    const char *spec = cmd->args;
    kvg_buf_printf(b, "%s ", cmd->method);
    for (const char *p = cmd->path; *p; p++) {
        if (*p != '{') {
            kvg_buf_putc(b, *p);
            continue;
        }
        /* {N}: the Nth word of the positional part */
        int n = p[1] - '0';
        const char *w = spec;
        while (--n > 0)
            w += strcspn(w, " ") + 1;
        kvg_buf_append(b, w, strcspn(w, " "));
        p += 2;
    }
}

void kvg_cli_usage(FILE *out)
{
    kvg_buf synopsis;
    kvg_buf_init(&synopsis);
    kvg_buf_puts(&synopsis, "usage: kvgate admin");
    for (size_t i = 0; i < KVG_ARRAY_LEN(global_opts); i++)
        kvg_buf_printf(&synopsis, " [%s %s]", global_opts[i].name, global_opts[i].metavar);
    kvg_buf_puts(&synopsis, " COMMAND");
    if (!synopsis.failed)
        print_wrapped(out, synopsis.data, 0, 6, " [");
    kvg_buf_done(&synopsis);
    fputs("\n\nCalls the admin API of a running kvgate and prints the answer to stdout: "
          "a table on a\nterminal, the JSON as the gateway sent it otherwise or with -o json.\n\n"
          "commands:\n",
          out);
    for (size_t i = 0; i < KVG_ARRAY_LEN(commands); i++) {
        const command *cmd = &commands[i];
        kvg_buf line, call;
        kvg_buf_init(&line);
        kvg_buf_init(&call);
        kvg_buf_printf(&line, "  %s%s%s", cmd->words, *cmd->args ? " " : "", cmd->args);
        if (cmd->fields)
            field_options(cmd->fields, cmd->field_arg, &line);
        put_call(cmd, &call);
        if (cmd->note)
            kvg_buf_printf(&call, ": %s", cmd->note);
        arg_keywords(cmd, &call);
        if (line.failed || call.failed) {
            kvg_buf_done(&line);
            kvg_buf_done(&call);
            return;
        }
        size_t col = print_wrapped(out, line.data, 0, 6, " [");
        if (col + 1 >= HELP_CALL_COLUMN || line.len > HELP_WIDTH)
            fprintf(out, "\n%*s", HELP_CALL_COLUMN, "");
        else
            fprintf(out, "%*s", (int)(HELP_CALL_COLUMN - col), "");
        print_wrapped(out, call.data, HELP_CALL_COLUMN, HELP_CALL_COLUMN + 2, " ");
        fputc('\n', out);
        kvg_buf_done(&line);
        kvg_buf_done(&call);
    }
    fputs("\noptions:\n", out);
    for (size_t i = 0; i < KVG_ARRAY_LEN(global_opts); i++) {
        char left[64];
        snprintf(left, sizeof(left), "  %s %s", global_opts[i].name, global_opts[i].metavar);
        fprintf(out, "%-21s", left);
        print_wrapped(out, global_opts[i].help, 21, 21, " ");
        fputc('\n', out);
    }
    fputs("  -h, --help         this text\n"
          "\n"
          "Exit status: 0 for a 2xx answer, 1 for another answer or no answer, 2 for a usage "
          "error.\n"
          "A PUT replaces the whole definition: options left out take their defaults. The "
          "gateway\n"
          "checks the values (docs/admin-api.md has each field's range).\n",
          out);
}

/* ---- building the call ----------------------------------------------------------------------- */

/* Append a path segment, percent-encoding all but unreserved characters: a name with a slash
 * or a space reaches the server as one (invalid) name, which it then names in its answer. */
static void put_segment(kvg_buf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
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

/* A request body built through a resource's field table: options and an argument become
 * members as the gateway takes them; only text that cannot be the field's type is refused here
 * (a usage error), the values are the gateway's to check. */
typedef struct req_body {
    const kvg_fields *fields;
    kvg_arena arena;
    kvg_json *obj;
} req_body;

/* Set a member from text ("kv_blocks", "40"); a usage error with the walker's message. */
static int body_set(req_body *b, const char *key, const char *text)
{
    char msg[256];
    kvg_fields_ctx c = {
        .from = KVG_SET_CLI, .arena = &b->arena, .msg = msg, .msg_len = sizeof(msg)};
    int rc = kvg_fields_json_set_text(b->fields, b->obj, key, strlen(key), text, strlen(text), &c);
    if (rc == -ENOMEM)
        return kvg_cli_usage_error("out of memory");
    return rc < 0 ? kvg_cli_usage_error("%s", msg) : 0;
}

/* What the options of one command write into. */
typedef struct parse {
    kvg_cli *c;
    const command *cmd;
    req_body body;  /* cmd->fields */
    char seen[256]; /* the string options given, " --tenant --path", each once */
} parse;

/* One option and its value (NULL for one without). */
static int take_option(parse *ps, const char *name, const char *value)
{
    char key[64];
    bool negate;
    const kvg_field *f = ps->cmd->fields
                             ? option_field(ps->cmd->fields, name, strlen(name), ps->cmd->field_arg,
                                            key, sizeof(key), &negate)
                             : NULL;
    if (!f) {
        /* a string option of args: a member of the body, once (a repeat is more likely a typo
         * than a wish) */
        size_t len = strlen(name);
        for (const char *p = ps->seen; (p = strstr(p, name)); p += len)
            if (p[len] == '\0' || p[len] == ' ')
                return kvg_cli_usage_error("%s given twice", name);
        size_t o = strlen(ps->seen);
        snprintf(ps->seen + o, sizeof(ps->seen) - o, " %s", name);
        member(&ps->c->body, name + 2);
        put_str(&ps->c->body, value);
        return 0;
    }
    if (f->type == KVG_FIELD_BOOL)
        value = negate ? "false" : "true";
    /* --sharing group:NAME is both the sharing and the group. */
    if (strcmp(key, "sharing") == 0 && strncmp(value, "group:", 6) == 0) {
        if (!value[6])
            return kvg_cli_usage_error("--sharing group:NAME needs a group name");
        int rc = body_set(&ps->body, "sharing", "group");
        return rc ? rc : body_set(&ps->body, "group", value + 6);
    }
    return body_set(&ps->body, key, value);
}

/* Split argv into positionals (at most max) and the command's options. 0, or
 * KVG_CLI_EXIT_USAGE after printing why. */
static int parse_args(parse *ps, int argc, char **argv, args *a, size_t max)
{
    const command *cmd = ps->cmd;
    bool options = true;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (options && strcmp(arg, "--") == 0) {
            options = false; /* what follows is positional, even "--x" */
            continue;
        }
        if (options && (strcmp(arg, "-o") == 0 || strcmp(arg, "--output") == 0 ||
                        strncmp(arg, "--output=", 9) == 0)) {
            /* the global -o/--output, also after the command as kubectl takes it */
            const char *value = arg[1] == '-' && arg[8] == '=' ? arg + 9 : NULL;
            if (!value && i + 1 < argc)
                value = argv[++i];
            if (!value)
                return kvg_cli_usage_error("%s needs a value", arg);
            int rc = kvg_cli_set_output(ps->c, value);
            if (rc)
                return rc;
            continue;
        }
        if (!options || strncmp(arg, "--", 2) != 0) {
            if (a->npos == max)
                return kvg_cli_usage_error("unexpected argument \"%s\"", arg);
            a->pos[a->npos++] = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        bool known = string_option(cmd->args, arg, nlen), has_value = known, negate;
        char key[64];
        if (!known && cmd->fields) {
            const kvg_field *f =
                option_field(cmd->fields, arg, nlen, cmd->field_arg, key, sizeof(key), &negate);
            known = f != NULL;
            has_value = known && f->type != KVG_FIELD_BOOL;
        }
        if (!known)
            return kvg_cli_usage_error("unknown option %.*s", (int)nlen, arg);
        const char *value = NULL;
        if (has_value) {
            if (eq)
                value = eq + 1;
            else if (i + 1 < argc)
                value = argv[++i];
            else
                return kvg_cli_usage_error("%.*s needs a value", (int)nlen, arg);
        } else if (eq) {
            return kvg_cli_usage_error("%.*s takes no value", (int)nlen, arg);
        }
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)nlen, arg);
        int rc = take_option(ps, name, value);
        if (rc)
            return rc;
    }
    return 0;
}

/* "missing NAME and URL: workers put NAME URL": the required arguments from the npos-th on. */
static int missing_args(const command *cmd, size_t npos)
{
    char names[128] = "";
    size_t len = positional_len(cmd->args), o = 0, k = 0, required, max;
    count_args(cmd->args, &required, &max);
    for (size_t i = 0; i < len && o < sizeof(names); k++) {
        size_t n = strcspn(cmd->args + i, " ");
        if (k >= npos && cmd->args[i] != '[') {
            bool last = k + 1 == required;
            int w = snprintf(names + o, sizeof(names) - o, "%s%.*s",
                             o == 0 ? ""
                             : last ? " and "
                                    : ", ",
                             (int)n, cmd->args + i);
            o += w > 0 ? (size_t)w : 0;
        }
        i += n + 1;
    }
    return kvg_cli_usage_error("missing %s: %s %.*s", names, cmd->words, (int)len, cmd->args);
}

/* Check the arguments that become path segments with the gateway's own rule for what the
 * segment before names (a worker's name, a tenant's id, a key id), so that a bad one is named
 * as typed rather than as its percent-encoding ("invalid character '%'"), and nothing is sent.
 * 0, or KVG_CLI_EXIT_USAGE after saying why. */
static int check_path_args(const command *cmd, const args *a)
{
    for (const char *p = strchr(cmd->path, '{'); p; p = strchr(p + 1, '{')) {
        const char *arg = a->pos[p[1] - '1'];
        char msg[200], shown[80];
        int rc = 0;
        if (p >= cmd->path + 8 && strncmp(p - 8, "workers/", 8) == 0) {
            rc = kvg_worker_name_validate(arg, msg, sizeof(msg));
        } else if (p >= cmd->path + 7 && strncmp(p - 7, "models/", 7) == 0) {
            /* the definition's rule for names; a slash is fine (it is percent-encoded) */
            size_t n = strlen(arg), k = 0;
            while (k < n && (unsigned char)arg[k] >= 0x20 && arg[k] != 0x7f)
                k++;
            rc = n == 0 || n > KVG_MODEL_DEF_NAME_MAX || k < n ? -1 : 0;
            snprintf(msg, sizeof(msg), "%s",
                     n == 0                       ? "name: must not be empty"
                     : n > KVG_MODEL_DEF_NAME_MAX ? "name: longer than 256 bytes"
                                                  : "name: must not contain control characters");
        } else if (p >= cmd->path + 8 && strncmp(p - 8, "tenants/", 8) == 0) {
            rc = kvg_tenant_id_validate(arg, "id", msg, sizeof(msg));
        } else {
            /* key ids are generated: "k" and 15 of [a-z0-9] (tenancy.h) */
            size_t n = strspn(arg, "abcdefghijklmnopqrstuvwxyz0123456789");
            rc = strlen(arg) > KVG_KEY_ID_LEN || !*arg || arg[n] ? -1 : 0;
            if (strlen(arg) > KVG_KEY_ID_LEN)
                snprintf(msg, sizeof(msg), "key id: longer than %d characters", KVG_KEY_ID_LEN);
            else if (!*arg)
                snprintf(msg, sizeof(msg), "key id: must not be empty");
            else if (rc)
                snprintf(msg, sizeof(msg), "key id: invalid character %s%c%s; key ids are [a-z0-9]",
                         arg[n] > 0x20 && arg[n] < 0x7f ? "'" : "",
                         arg[n] > 0x20 && arg[n] < 0x7f ? arg[n] : '?',
                         arg[n] > 0x20 && arg[n] < 0x7f ? "'" : "");
        }
        if (rc == 0)
            continue;
        /* what was typed, printable (it goes to a terminal) and cut */
        size_t o = 0;
        for (; arg[o] && o + 4 < sizeof(shown); o++)
            shown[o] = arg[o] >= 0x20 && arg[o] < 0x7f ? arg[o] : '?';
        snprintf(shown + o, sizeof(shown) - o, "%s", arg[o] ? "..." : "");
        return kvg_cli_usage_error("%s \"%s\": %s", cmd->words, shown, msg);
    }
    return 0;
}

/* The admin API path from the command's template and its arguments. */
static void put_path(kvg_cli *c, const command *cmd, const args *a)
{
    for (const char *p = cmd->path; *p; p++) {
        if (*p == '{') {
            put_segment(&c->path, a->pos[p[1] - '1']);
            p += 2;
        } else {
            kvg_buf_putc(&c->path, *p);
        }
    }
}

static int run_command(kvg_cli *c, const command *cmd, int argc, char **argv)
{
    parse ps = {.c = c, .cmd = cmd};
    args a = {.npos = 0};
    size_t required, max;
    count_args(cmd->args, &required, &max);
    kvg_arena_init(&ps.body.arena, 0);
    ps.body.fields = cmd->fields;
    if (cmd->fields && !(ps.body.obj = kvg_fields_json_object(&ps.body.arena))) {
        kvg_arena_done(&ps.body.arena);
        return kvg_cli_usage_error("out of memory");
    }
    int rc = parse_args(&ps, argc, argv, &a, max);
    if (!rc && a.npos < required)
        rc = missing_args(cmd, a.npos);
    /* the field given as the last argument, when it is given */
    if (!rc && cmd->field_arg && a.npos == max)
        rc = body_set(&ps.body, cmd->field_arg, a.pos[a.npos - 1]);
    if (!rc && (cmd->flags & CMD_BODY_REQUIRED) && ps.body.obj->u.obj.count == 0) {
        const char *w;
        size_t wl = last_arg(cmd, &w);
        rc = kvg_cli_usage_error("%s: nothing to set: give %.*s and/or options", cmd->words,
                                 (int)wl, w);
    }
    if (!rc && cmd->fields)
        kvg_json_write(&c->body, ps.body.obj);
    kvg_arena_done(&ps.body.arena);
    if (!rc && cmd->finish)
        rc = cmd->finish(c, &a);
    if (rc)
        return rc;
    if ((rc = check_path_args(cmd, &a)) != 0)
        return rc;
    if (c->body.len && !cmd->fields)
        kvg_buf_putc(&c->body, '}'); /* the string options' object */
    put_path(c, cmd, &a);
    c->method = cmd->method;
    c->auth = !(cmd->flags & CMD_OPEN);
    c->shows_key = cmd->flags & CMD_SHOWS_KEY;
    c->table = cmd->table;
    c->member = cmd->member;
    return 0;
}

/* explain FILE|- [--tenant ID] [--path P]: the request body read from FILE ('-': stdin), sent
 * as is as the "request" member; the gateway validates it. */
static int explain_request(kvg_cli *c, const args *a)
{
    FILE *f = strcmp(a->pos[0], "-") == 0 ? stdin : fopen(a->pos[0], "r");
    if (!f) {
        fprintf(stderr, "kvgate admin: %s: %s\n", a->pos[0], strerror(errno));
        return KVG_CLI_EXIT_USAGE;
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
        return kvg_cli_usage_error("%s: read error", a->pos[0]);
    if (total > EXPLAIN_BODY_MAX)
        return kvg_cli_usage_error("%s: larger than %d bytes", a->pos[0], EXPLAIN_BODY_MAX);
    if (!total)
        return kvg_cli_usage_error("%s: empty", a->pos[0]);
    return 0;
}

int kvg_cli_build_call(kvg_cli *c, int argc, char **argv)
{
    /* The command is the longest row whose words the arguments start with. */
    const char *group = argv[0];
    bool known_group = false;
    char subs[128] = "";
    for (size_t i = 0; i < KVG_ARRAY_LEN(commands); i++) {
        const command *cmd = &commands[i];
        const char *sp = strchr(cmd->words, ' ');
        size_t glen = sp ? (size_t)(sp - cmd->words) : strlen(cmd->words);
        if (strlen(group) != glen || strncmp(cmd->words, group, glen) != 0)
            continue;
        if (!sp)
            return run_command(c, cmd, argc - 1, argv + 1);
        known_group = true;
        size_t o = strlen(subs);
        snprintf(subs + o, sizeof(subs) - o, "%s%s", o ? ", " : "", sp + 1);
        if (argc > 1 && strcmp(argv[1], sp + 1) == 0)
            return run_command(c, cmd, argc - 2, argv + 2);
    }
    if (!known_group)
        return kvg_cli_usage_error("unknown command \"%s\"", group);
    if (argc < 2)
        return kvg_cli_usage_error("%s: missing subcommand (%s)", group, subs);
    return kvg_cli_usage_error("%s: unknown subcommand \"%s\"", group, argv[1]);
}

/* ---- main ------------------------------------------------------------------------------------ */

void kvg_cli_init(kvg_cli *c)
{
    *c = (kvg_cli){.url = KVG_CLI_DEFAULT_URL,
                   .state_dir = KVG_CLI_DEFAULT_STATE_DIR,
                   .timeout_s = KVG_CLI_DEFAULT_TIMEOUT_S};
    kvg_buf_init(&c->path);
    kvg_buf_init(&c->body);
}

void kvg_cli_done(kvg_cli *c)
{
    kvg_buf_done(&c->path);
    kvg_buf_done(&c->body);
}

int kvg_cli_global_options(kvg_cli *c, int argc, char **argv, int *first)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            kvg_cli_usage(stdout);
            return -1;
        }
        if (strcmp(arg, "-o") == 0) {
            if (i + 1 == argc)
                return kvg_cli_usage_error("-o needs a value");
            int rc = kvg_cli_set_output(c, argv[++i]);
            if (rc)
                return rc;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            break;
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        size_t k = 0;
        while (k < KVG_ARRAY_LEN(global_opts) && !(strlen(global_opts[k].name) == nlen &&
                                                   memcmp(global_opts[k].name, arg, nlen) == 0))
            k++;
        if (k == KVG_ARRAY_LEN(global_opts))
            return kvg_cli_usage_error("unknown option %.*s", (int)nlen, arg);
        const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!value)
            return kvg_cli_usage_error("%s needs a value", global_opts[k].name);
        const char *name = global_opts[k].name;
        if (strcmp(name, "--url") == 0) {
            c->url = value;
        } else if (strcmp(name, "--token") == 0) {
            c->token = value;
        } else if (strcmp(name, "--state") == 0) {
            c->state_dir = value;
        } else if (strcmp(name, "--output") == 0) {
            int rc = kvg_cli_set_output(c, value);
            if (rc)
                return rc;
        } else {
            char *end;
            double t = strtod(value, &end);
            if (*end || !(t > 0 && t <= 3600))
                return kvg_cli_usage_error("--timeout: expected seconds in (0, 3600], got \"%s\"",
                                           value);
            c->timeout_s = t;
        }
    }
    *first = i;
    return 0;
}

int kvg_cli_main(int argc, char **argv)
{
    kvg_cli c;
    kvg_cli_init(&c);
    kvg_cli_target t;
    char token[TOKEN_MAX] = "";
    int first = 1;

    int rc = kvg_cli_global_options(&c, argc, argv, &first);
    if (rc < 0) {
        rc = KVG_CLI_EXIT_OK; /* --help */
        goto out;
    }
    if (rc)
        goto out;
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            kvg_cli_usage(stdout);
            goto out;
        }
    }
    if (first >= argc) {
        rc = kvg_cli_usage_error("missing command");
        goto out;
    }
    rc = kvg_cli_parse_url(c.url, &t);
    if (rc)
        goto out;
    rc = kvg_cli_build_call(&c, argc - first, argv + first);
    if (rc)
        goto out;
    if (c.path.failed || c.body.failed) {
        fputs("kvgate admin: out of memory\n", stderr);
        rc = KVG_CLI_EXIT_FAIL;
        goto out;
    }
    if (c.auth && (rc = kvg_cli_find_token(&c, token, sizeof(token))) != 0)
        goto out;
    /* A person at a terminal reads a table; a pipe or a script gets the JSON it parses. */
    if (c.output == KVG_CLI_OUTPUT_AUTO)
        c.output = isatty(STDOUT_FILENO) ? KVG_CLI_OUTPUT_TABLE : KVG_CLI_OUTPUT_JSON;
    rc = kvg_cli_send(&c, &t, c.auth ? token : NULL);
    if (rc == KVG_CLI_EXIT_OK && c.shows_key)
        fputs("kvgate admin: store the key now: it is not shown again\n", stderr);

out:
    memset(token, 0, sizeof(token));
    kvg_cli_done(&c);
    return rc;
}
