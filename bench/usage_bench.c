/* SPDX-License-Identifier: Apache-2.0 */
/* kvg_usage_scan_feed (router/usage.c) against the byte-at-a-time reader it replaced
 * (tests/unit/router/usage_reference.c) in one process: the simworker's chat answer and its SSE
 * stream (captured from build/kvgate-simworker --time-scale 0, max_tokens 8), fed whole and as the
 * proxy sees a stream (a chunk per event), and a 64 KB answer. Prints ns per byte for each and
 * the ratio; both readers must agree, or it says so and exits 1. From a release build:
 *   meson setup build-bench -Dbuildtype=release -Dtests=disabled
 *   meson compile -C build-bench bench/usage_bench && build-bench/bench/usage_bench */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "router.h"
#include "usage_reference.h"

/* POST /v1/chat/completions {"model":"m","messages":[{"role":"user","content":"Say hello to the
 * benchmark."}],"max_tokens":8} */
static const char chat_answer[] =
    "{\"id\":\"chatcmpl-3a707beaafc2548f0bb58a411cccb8d8\",\"object\":\"chat.completion\",\"c"
    "reated\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"as"
    "sistant\",\"content\":\" the of and to in is that for\",\"tool_calls\":[]},\"logprobs\":"
    "null,\"finish_reason\":\"length\",\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":19"
    ",\"total_tokens\":27,\"completion_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\""
    ":0}}}";

/* The same with "stream":true,"stream_options":{"include_usage":true}. */
static const char chat_stream[] =
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"r"
    "ole\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" the\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" of\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" and\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" to\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" in\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" is\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" that\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"c"
    "ontent\":\" for\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]"
    "}\n\n"
    "data: {\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion"
    ".chunk\",\"created\":1796183056,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_token"
    "s\":19,\"total_tokens\":27,\"completion_tokens\":8,\"prompt_tokens_details\":{\"cached_t"
    "okens\":16}}}\n\n"
    "data: [DONE]\n\n";

typedef struct reader {
    const char *name;
    void (*init)(kvg_usage_scan *s);
    void (*feed)(kvg_usage_scan *s, const char *data, size_t len);
} reader;

static const reader readers[] = {
    {"reference", kvg_usage_ref_init, kvg_usage_ref_feed},
    {"usage.c", kvg_usage_scan_init, kvg_usage_scan_feed},
};

/* The chunk ends of text: the ends of its SSE events (chunked) or its end; at most MAX_CHUNKS,
 * the last one n. Found before the clock starts, so that only the readers are timed. */
enum { MAX_CHUNKS = 64 };
static size_t chunk_ends(const char *text, size_t n, bool chunked, size_t *ends)
{
    size_t k = 0, at = 0;
    while (chunked && k < MAX_CHUNKS - 1) {
        const char *e = memmem(text + at, n - at, "\n\n", 2);
        if (!e || (size_t)(e + 2 - text) == n)
            break;
        at = (size_t)(e + 2 - text);
        ends[k++] = at;
    }
    ends[k++] = n;
    return k;
}

/* One read of text in the chunks that end at ends. */
static void read_once(const reader *r, kvg_usage_scan *s, const char *text, const size_t *ends,
                      size_t nchunks)
{
    r->init(s);
    size_t at = 0;
    for (size_t i = 0; i < nchunks; i++) {
        r->feed(s, text + at, ends[i] - at);
        at = ends[i];
    }
}

static int bench(const char *what, const char *text, size_t n, bool chunked)
{
    size_t ends[MAX_CHUNKS];
    size_t nchunks = chunk_ends(text, n, chunked, ends);
    double ns[2];
    kvg_usage_scan out[2];
    /* About 50 MB a reader; the best of five runs. */
    unsigned iters = (unsigned)KVG_MAX((size_t)20, (size_t)(10u << 20) / n);
    for (int k = 0; k < 2; k++) {
        ns[k] = 1e30;
        for (int run = 0; run < 5; run++) {
            uint64_t t0 = kvg_now_ns();
            for (unsigned i = 0; i < iters; i++) {
                read_once(&readers[k], &out[k], text, ends, nchunks);
                __asm__ volatile("" : : "r"(&out[k]) : "memory");
            }
            double t = (double)(kvg_now_ns() - t0) / ((double)iters * (double)n);
            ns[k] = KVG_MIN(ns[k], t);
        }
    }
    printf("%-28s %7zu %10.3f %10.3f %8.1fx\n", what, n, ns[0], ns[1], ns[0] / ns[1]);
    for (int f = 0; f < KVG_USAGE_FIELD_COUNT; f++)
        if (out[0].value[f] != out[1].value[f])
            goto differ;
    if (out[0].output_events != out[1].output_events)
        goto differ;
    return 0;
differ:
    fprintf(stderr, "%s: the readers differ\n", what);
    return 1;
}

/* A 64 KB answer: vLLM's chat completion with a long content. */
static char *big_answer(size_t *len)
{
    enum { BIG = 64 * 1024 };
    char *big = malloc(BIG + 1);
    if (!big)
        return NULL;
    static const char head[] =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
        "\"assistant\",\"content\":\"";
    static const char tail[] = "\",\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":"
                               "\"length\",\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":19,"
                               "\"total_tokens\":16027,\"completion_tokens\":16008,"
                               "\"prompt_tokens_details\":{\"cached_tokens\":0}}}";
    static const char *const words[] = {" the",  " of",  " and", " to", " in",  " is",
                                        " that", " for", ",",    "\\n", "\\\"", " it"};
    size_t n = sizeof(head) - 1;
    memcpy(big, head, n);
    for (unsigned w = 0; n + 8 + sizeof(tail) < BIG; w = w * 7 + 3) {
        const char *word = words[w % KVG_ARRAY_LEN(words)];
        memcpy(big + n, word, strlen(word));
        n += strlen(word);
    }
    memcpy(big + n, tail, sizeof(tail));
    *len = n + sizeof(tail) - 1;
    return big;
}

int main(int argc, char **argv)
{
    size_t big_len = 0;
    char *big = big_answer(&big_len);
    if (!big)
        return 1;
    const struct {
        const char *name, *what, *text;
        size_t len;
        bool chunked;
    } inputs[] = {
        {"answer", "chat answer, whole", chat_answer, sizeof(chat_answer) - 1, false},
        {"stream", "chat stream, a chunk/event", chat_stream, sizeof(chat_stream) - 1, true},
        {"stream-whole", "chat stream, whole", chat_stream, sizeof(chat_stream) - 1, false},
        {"big", "64 KB answer, whole", big, big_len, false},
    };
    int rc = 0;
    if (argc == 4) {
        /* usage_bench reference|usage.c INPUT N: N reads of one input by one reader, for
         * callgrind's instructions per byte (the feed function's inclusive cost / N / bytes). */
        const reader *r = strcmp(argv[1], "reference") == 0 ? &readers[0] : &readers[1];
        unsigned n = (unsigned)atoi(argv[3]);
        for (size_t k = 0; k < KVG_ARRAY_LEN(inputs); k++) {
            if (strcmp(argv[2], inputs[k].name) != 0)
                continue;
            kvg_usage_scan s;
            size_t ends[MAX_CHUNKS];
            size_t nchunks = chunk_ends(inputs[k].text, inputs[k].len, inputs[k].chunked, ends);
            for (unsigned i = 0; i < n; i++)
                read_once(r, &s, inputs[k].text, ends, nchunks);
            printf("%s %s: %zu bytes, prompt_tokens %lld, output events %llu\n", r->name,
                   inputs[k].name, inputs[k].len, (long long)s.value[KVG_USAGE_PROMPT_TOKENS],
                   (unsigned long long)s.output_events);
        }
    } else {
        printf("%-28s %7s %10s %10s %9s\n", "input", "bytes", "ref ns/B", "new ns/B", "ratio");
        for (size_t k = 0; k < KVG_ARRAY_LEN(inputs); k++)
            rc |= bench(inputs[k].what, inputs[k].text, inputs[k].len, inputs[k].chunked);
    }
    free(big);
    return rc;
}
