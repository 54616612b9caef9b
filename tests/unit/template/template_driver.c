/* SPDX-License-Identifier: Apache-2.0 */
/* Renders chat templates for tests/integration/test_template_oracle.py: reads a template file
 * and, from stdin, one JSON context per line; writes one JSON line per context,
 * {"ok": "<rendered>"} or {"error": "<message>"}. With --prepare each line is a chat request
 * body, turned into the context by kvg_template_prepare first. With --pairs there is no FILE:
 * each line is {"template": "...", "context": {...}}, compiled and rendered on its own (a compile
 * error is {"error": "compile: ..."}). --dump-context: with --prepare's input, write
 * {"context": <the prepared context>} instead of rendering. Not a test by itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template.h"

static char *read_file(const char *path, size_t *len)
{
    char *data = NULL;
    return kvg_read_file(path, SIZE_MAX - 1, &data, len) == 0 ? data : NULL;
}

static void emit_result(kvg_buf *res, int rc, const kvg_buf *out, const char *prefix,
                        const char *err)
{
    kvg_buf_reset(res);
    if (rc == 0) {
        kvg_buf_puts(res, "{\"ok\":");
        kvg_buf_json_string(res, out->data ? out->data : "", out->len);
    } else {
        char msg[600];
        snprintf(msg, sizeof(msg), "%s%s", prefix, err);
        kvg_buf_puts(res, "{\"error\":");
        kvg_buf_json_string(res, msg, strlen(msg));
    }
    kvg_buf_puts(res, "}\n");
    fwrite(res->data, 1, res->len, stdout);
}

static int run_pairs(int64_t now)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    kvg_buf out, res;
    kvg_buf_init(&out);
    kvg_buf_init(&res);
    kvg_template_opts opts = {.now_s = now};
    while ((n = getline(&line, &cap, stdin)) > 0) {
        kvg_arena arena;
        kvg_arena_init(&arena, 0);
        kvg_json *pair;
        kvg_json_error jerr;
        if (kvg_json_parse(line, (size_t)n, &arena, NULL, &pair, &jerr) != 0) {
            fprintf(stderr, "pair: %s\n", jerr.message);
            return 1;
        }
        const kvg_json *t = kvg_json_get(pair, "template"), *c = kvg_json_get(pair, "context");
        if (!t || t->type != KVG_JSON_STRING || !c) {
            fprintf(stderr, "pair: needs template and context\n");
            return 1;
        }
        kvg_template *tpl;
        char err[512];
        kvg_buf_reset(&out);
        int rc = kvg_template_compile(t->u.str.ptr, t->u.str.len, NULL, &tpl, err, sizeof(err));
        if (rc) {
            emit_result(&res, rc, &out, "compile: ", err);
        } else {
            rc = kvg_template_render(tpl, c, &opts, &out, err, sizeof(err));
            emit_result(&res, rc, &out, "", err);
            kvg_template_free(tpl);
        }
        kvg_arena_done(&arena);
    }
    free(line);
    kvg_buf_done(&out);
    kvg_buf_done(&res);
    return 0;
}

int main(int argc, char **argv)
{
    bool prepare = false, pairs = false, dump = false;
    int64_t now = 1722000000; /* 26 Jul 2024, fixed so that strftime_now is reproducible */
    const char *path = NULL, *bos = NULL, *eos = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--prepare") == 0)
            prepare = true;
        else if (strcmp(argv[i], "--pairs") == 0)
            pairs = true;
        else if (strcmp(argv[i], "--dump-context") == 0)
            prepare = dump = true;
        else if (strcmp(argv[i], "--now") == 0 && i + 1 < argc)
            now = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--bos") == 0 && i + 1 < argc)
            bos = argv[++i];
        else if (strcmp(argv[i], "--eos") == 0 && i + 1 < argc)
            eos = argv[++i];
        else
            path = argv[i];
    }
    if (pairs)
        return run_pairs(now);
    if (!path) {
        fprintf(stderr, "usage: template_driver [--prepare] [--now S] [--bos T] [--eos T] FILE\n");
        return 2;
    }
    size_t slen;
    char *src = read_file(path, &slen);
    if (!src) {
        perror(path);
        return 2;
    }
    kvg_template *tpl;
    char err[512];
    int rc = kvg_template_compile(src, slen, NULL, &tpl, err, sizeof(err));
    free(src);
    if (rc) {
        fprintf(stderr, "compile: %s (%s)\n", err, kvg_strerror(rc));
        return 1;
    }
    kvg_template_opts opts = {.now_s = now};
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    kvg_buf out, res;
    kvg_buf_init(&out);
    kvg_buf_init(&res);
    while ((n = getline(&line, &cap, stdin)) > 0) {
        kvg_arena arena;
        kvg_arena_init(&arena, 0);
        kvg_json *ctx;
        kvg_json_error jerr;
        kvg_buf_reset(&out);
        kvg_buf_reset(&res);
        rc = kvg_json_parse(line, (size_t)n, &arena, NULL, &ctx, &jerr);
        if (rc) {
            fprintf(stderr, "context: %s\n", jerr.message);
            return 1;
        }
        if (prepare) {
            kvg_template_vars vars = {.bos_token = bos,
                                      .eos_token = eos,
                                      .openai_content = kvg_template_wants_parts(tpl)};
            kvg_json *pc;
            rc = kvg_template_prepare(ctx, &vars, &arena, &pc, err, sizeof(err));
            ctx = pc;
            if (dump && rc == 0) {
                kvg_buf_reset(&res);
                kvg_buf_puts(&res, "{\"context\":");
                kvg_json_write(&res, ctx);
                kvg_buf_puts(&res, "}\n");
                fwrite(res.data, 1, res.len, stdout);
                kvg_arena_done(&arena);
                continue;
            }
        }
        if (rc == 0)
            rc = kvg_template_render(tpl, ctx, &opts, &out, err, sizeof(err));
        emit_result(&res, rc, &out, "", err);
        kvg_arena_done(&arena);
    }
    free(line);
    kvg_buf_done(&out);
    kvg_buf_done(&res);
    kvg_template_free(tpl);
    return 0;
}
