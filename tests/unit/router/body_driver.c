/* SPDX-License-Identifier: Apache-2.0 */
/* Test driver for the body rewriter: reads request bodies on stdin and prints one JSON verdict
 * line per body (with --api, the canonical prefix stream too), for the differential tests
 * against Python's json module and the reference in tests/integration/canon_reference.py. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router.h"

#define BODY_MAX (64u << 20)

static const char *rc_name(int rc)
{
    switch (rc) {
    case 0:
        return "ok";
    case KVG_EPARSE:
        return "EPARSE";
    case KVG_ETYPE:
        return "ETYPE";
    case KVG_ELIMIT:
        return "ELIMIT";
    case -ENOMEM:
        return "ENOMEM";
    default:
        return "other";
    }
}

/* Rewrite one body and print its verdict as one line of JSON. */
static void verdict(const char *body, size_t len, const char *salt, int api, kvg_buf *line)
{
    kvg_arena arena;
    kvg_buf out;
    kvg_body_info info;
    kvg_json_error err = {0};
    kvg_arena_init(&arena, 0);
    kvg_buf_init(&out);
    int rc = api < 0 ? kvg_body_rewrite(body, len, salt, &arena, &out, &info, &err)
                     : kvg_body_scan(body, len, (kvg_body_api)api, salt, &arena, &out, &info, &err);
    kvg_buf_reset(line);
    kvg_buf_printf(line, "{\"rc\":\"%s\"", rc_name(rc));
    if (rc == 0) {
        kvg_buf_puts(line, ",\"output\":");
        kvg_buf_json_string(line, out.data, out.len);
        kvg_buf_puts(line, ",\"model\":");
        if (info.model)
            kvg_buf_json_string(line, info.model, info.model_len);
        else
            kvg_buf_puts(line, "null");
        kvg_buf_printf(line, ",\"stream\":%s,\"prompt_bytes\":%llu,\"removed\":%u",
                       info.stream ? "true" : "false", (unsigned long long)info.prompt_bytes,
                       info.cache_salts_removed);
        if (api >= 0) {
            /* The stream as hex: text bytes, or each token id as 8 hex digits. */
            const kvg_prefix_stream *ps = &info.prefix;
            kvg_buf_printf(line, ",\"tokens\":%s,\"prefix\":\"", ps->is_tokens ? "true" : "false");
            if (ps->is_tokens)
                for (size_t i = 0; i < ps->ntokens; i++)
                    kvg_buf_printf(line, "%08x", (unsigned)ps->tokens[i]);
            else
                for (size_t i = 0; i < ps->text_len; i++)
                    kvg_buf_printf(line, "%02x", ps->text[i]);
            kvg_buf_putc(line, '"');
        }
    } else {
        kvg_buf_printf(line, ",\"offset\":%zu,\"message\":", err.offset);
        kvg_buf_json_string(line, err.message, strlen(err.message));
    }
    kvg_buf_puts(line, "}\n");
    kvg_buf_done(&out);
    kvg_arena_done(&arena);
}

static int read_exact(char *buf, size_t n)
{
    return fread(buf, 1, n, stdin) == n ? 0 : -1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: body_driver [--salt SALT] [--api other|completions|chat] [--batch]\n"
            "  Reads one body on stdin (all of it), or with --batch a series of\n"
            "  \"<length>\\n<bytes>\" frames, and prints one JSON verdict line per body.\n"
            "  --api uses kvg_body_scan and adds the prefix stream (\"prefix\", hex) to it.\n");
}

int main(int argc, char **argv)
{
    const char *salt = NULL;
    int batch = 0, api = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--salt") == 0 && i + 1 < argc) {
            salt = argv[++i];
        } else if (strcmp(argv[i], "--api") == 0 && i + 1 < argc) {
            i++;
            for (api = 0; api < KVG_BODY_API_COUNT; api++)
                if (strcmp(argv[i], kvg_body_api_str((kvg_body_api)api)) == 0)
                    break;
            if (api == KVG_BODY_API_COUNT) {
                usage();
                return 2;
            }
        } else if (strcmp(argv[i], "--batch") == 0) {
            batch = 1;
        } else {
            usage();
            return 2;
        }
    }
    kvg_buf line;
    kvg_buf_init(&line);
    char *body = malloc(BODY_MAX);
    if (!body)
        return 1;
    if (!batch) {
        size_t len = fread(body, 1, BODY_MAX, stdin);
        verdict(body, len, salt, api, &line);
        fwrite(line.data, 1, line.len, stdout);
    } else {
        unsigned long len;
        while (scanf("%lu", &len) == 1) {
            if (getchar() != '\n' || len > BODY_MAX || read_exact(body, len) < 0) {
                fprintf(stderr, "body_driver: bad frame\n");
                return 2;
            }
            verdict(body, len, salt, api, &line);
            fwrite(line.data, 1, line.len, stdout);
            fflush(stdout);
        }
    }
    free(body);
    kvg_buf_done(&line);
    return 0;
}
