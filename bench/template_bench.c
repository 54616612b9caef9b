/* SPDX-License-Identifier: Apache-2.0 */
/* Render time of a chat template (default: Qwen3's, tests/data/templates/qwen3_chat_template.jinja)
 * for conversations of about 32 KiB and 512 KiB of JSON: the context parse (kvg_json_parse), the
 * preprocessing (kvg_template_prepare) and the render, each the median of repeated runs on one
 * core. Usage: template_bench [TEMPLATE] (run from the repository root by default). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template.h"

static char *slurp(const char *path, size_t *len)
{
    char *data = NULL;
    return kvg_read_file(path, SIZE_MAX - 1, &data, len) == 0 ? data : NULL;
}

/* A chat request of about want bytes: a system prompt, then user and assistant turns of mixed
 * prose (ASCII, CJK, emoji), some assistant turns with reasoning in <think>, some with a tool
 * call and its result; tools declared. */
static void make_body(kvg_buf *b, size_t want)
{
    static const char *const words[] = {"the",    "request", "routes", "to",     "a",
                                        "worker", "cache",   "block",  "prefix", "你好",
                                        "😀",      "naïve",   "token",  "\\n"};
    unsigned seed = 12345;
    kvg_buf_puts(b, "{\"model\": \"qwen3\", \"tools\": [{\"type\": \"function\", \"function\": "
                    "{\"name\": \"get_weather\", \"description\": \"Weather of a city\", "
                    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
                    "\"string\"}}, \"required\": [\"city\"]}}}], \"messages\": [{\"role\": "
                    "\"system\", \"content\": \"You are a helpful assistant.\"}");
    for (int turn = 0; b->len < want; turn++) {
        for (int who = 0; who < 2; who++) {
            kvg_buf_printf(b, ", {\"role\": \"%s\", \"content\": \"", who ? "assistant" : "user");
            if (who && turn % 3 == 0)
                kvg_buf_puts(b, "<think>\\nLet me think.\\n</think>\\n\\n");
            for (int w = 0; w < 120; w++) {
                seed = seed * 1103515245u + 12345u;
                kvg_buf_puts(b, words[(seed >> 16) % KVG_ARRAY_LEN(words)]);
                kvg_buf_putc(b, ' ');
            }
            kvg_buf_puts(b, "\"");
            if (who && turn % 4 == 1)
                kvg_buf_puts(b, ", \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", "
                                "\"function\": {\"name\": \"get_weather\", \"arguments\": "
                                "\"{\\\"city\\\": \\\"Köln\\\"}\"}}]}, {\"role\": \"tool\", "
                                "\"content\": \"14 C, cloudy\"");
            kvg_buf_puts(b, "}");
        }
    }
    kvg_buf_puts(b, ", {\"role\": \"user\", \"content\": \"And now?\"}]}");
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/data/templates/qwen3_chat_template.jinja";
    size_t slen;
    char *src = slurp(path, &slen);
    if (!src) {
        perror(path);
        return 1;
    }
    kvg_template *tpl;
    char err[256];
    if (kvg_template_compile(src, slen, NULL, &tpl, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s: %s\n", path, err);
        return 1;
    }
    static const size_t sizes[] = {32 * 1024, 512 * 1024};
    printf("%-10s %10s %10s %12s %12s %12s %10s\n", "body", "bytes", "out", "parse us",
           "prepare us", "render us", "MB/s");
    for (size_t si = 0; si < KVG_ARRAY_LEN(sizes); si++) {
        kvg_buf body, out;
        kvg_buf_init(&body);
        kvg_buf_init(&out);
        make_body(&body, sizes[si]);
        enum { RUNS = 31 };
        uint64_t t_parse[RUNS], t_prep[RUNS], t_render[RUNS];
        for (int r = 0; r < RUNS; r++) {
            kvg_arena a;
            kvg_arena_init(&a, 0);
            kvg_json *j, *ctx;
            uint64_t t0 = kvg_now_ns();
            if (kvg_json_parse(body.data, body.len, &a, NULL, &j, NULL) != 0)
                return 1;
            uint64_t t1 = kvg_now_ns();
            kvg_template_vars vars = {.eos_token = "<|im_end|>"};
            if (kvg_template_prepare(j, &vars, &a, &ctx, err, sizeof(err)) != 0) {
                fprintf(stderr, "prepare: %s\n", err);
                return 1;
            }
            uint64_t t2 = kvg_now_ns();
            kvg_buf_reset(&out);
            if (kvg_template_render(tpl, ctx, NULL, &out, err, sizeof(err)) != 0) {
                fprintf(stderr, "render: %s\n", err);
                return 1;
            }
            uint64_t t3 = kvg_now_ns();
            t_parse[r] = t1 - t0;
            t_prep[r] = t2 - t1;
            t_render[r] = t3 - t2;
            kvg_arena_done(&a);
        }
        qsort(t_parse, RUNS, sizeof(uint64_t), cmp_u64);
        qsort(t_prep, RUNS, sizeof(uint64_t), cmp_u64);
        qsort(t_render, RUNS, sizeof(uint64_t), cmp_u64);
        uint64_t med = t_render[RUNS / 2];
        printf("%-10s %10zu %10zu %12.1f %12.1f %12.1f %10.1f\n",
               sizes[si] == 32 * 1024 ? "32 KiB" : "512 KiB", body.len, out.len,
               (double)t_parse[RUNS / 2] / 1e3, (double)t_prep[RUNS / 2] / 1e3, (double)med / 1e3,
               med ? (double)body.len / ((double)med / 1e3) : 0.0);
        kvg_buf_done(&body);
        kvg_buf_done(&out);
    }
    kvg_template_free(tpl);
    free(src);
    return 0;
}
