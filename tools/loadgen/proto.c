/* SPDX-License-Identifier: Apache-2.0 */
/* OpenAI wire format for kvgate-loadgen: request bodies, SSE parsing, usage and chunk reading. */
#include "loadgen.h"

#include <errno.h>
#include <string.h>

/* One event or one response body needs only a small, shallow tree. */
#define JSON_DEPTH 32

void lg_body_build(kvg_buf *out, const lg_item *item, const lg_body_opts *opts)
{
    kvg_buf_puts(out, "{\"model\":");
    kvg_buf_json_string(out, opts->model, strlen(opts->model));
    kvg_buf_puts(out, ",\"messages\":[");
    for (size_t i = 0; i < item->n_messages; i++) {
        const lg_message *m = &item->messages[i];
        kvg_buf_puts(out, i ? ",{\"role\":" : "{\"role\":");
        kvg_buf_json_string(out, m->role, strlen(m->role));
        kvg_buf_puts(out, ",\"content\":");
        kvg_buf_json_string(out, m->content, m->len);
        kvg_buf_putc(out, '}');
    }
    kvg_buf_printf(out, "],\"max_tokens\":%u", opts->max_tokens);
    if (opts->stream)
        kvg_buf_puts(out, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    kvg_buf_putc(out, '}');
}

/* A token counter: a non-negative integer. */
static int read_count(const kvg_json *obj, const char *key, uint64_t *out, bool *present)
{
    const kvg_json *v = kvg_json_get(obj, key);
    if (present)
        *present = false;
    if (!v || v->type == KVG_JSON_NULL) {
        *out = 0;
        return 0;
    }
    if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0)
        return KVG_ETYPE;
    *out = (uint64_t)v->u.num.ival;
    if (present)
        *present = true;
    return 0;
}

int lg_usage_read(const kvg_json *usage, lg_usage *out)
{
    if (!usage || usage->type == KVG_JSON_NULL)
        return 0;
    if (usage->type != KVG_JSON_OBJECT)
        return KVG_ETYPE;
    lg_usage u = {.present = true};
    int rc = read_count(usage, "prompt_tokens", &u.prompt_tokens, NULL);
    if (rc == 0)
        rc = read_count(usage, "completion_tokens", &u.completion_tokens, NULL);
    if (rc < 0)
        return rc;
    /* vLLM writes "prompt_tokens_details": null unless prefix-caching stats are enabled. */
    const kvg_json *details = kvg_json_get(usage, "prompt_tokens_details");
    if (details && details->type == KVG_JSON_OBJECT)
        rc = read_count(details, "cached_tokens", &u.cached_tokens, &u.cached_present);
    else if (details && details->type != KVG_JSON_NULL)
        rc = KVG_ETYPE;
    if (rc < 0)
        return rc;
    *out = u;
    return 0;
}

static int parse_json(const char *text, size_t len, kvg_arena *arena, kvg_json **out)
{
    kvg_json_limits lim = {.max_depth = JSON_DEPTH};
    return kvg_json_parse(text, len, arena, &lim, out, NULL);
}

int lg_response_parse(const char *body, size_t len, lg_usage *usage)
{
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *root = NULL;
    int rc = parse_json(body, len, &arena, &root);
    if (rc == KVG_ELIMIT)
        rc = KVG_EPARSE;
    if (rc < 0)
        goto out;
    const kvg_json *choices = kvg_json_get(root, "choices");
    if (root->type != KVG_JSON_OBJECT || kvg_json_get(root, "error") || !choices ||
        choices->type != KVG_JSON_ARRAY) {
        rc = KVG_EPROTO;
        goto out;
    }
    rc = lg_usage_read(kvg_json_get(root, "usage"), usage);
out:
    kvg_arena_done(&arena);
    return rc;
}

/* ---- server-sent events --------------------------------------------------------------------- */

void lg_sse_init(lg_sse *p, size_t max_event)
{
    kvg_buf_init(&p->line);
    kvg_buf_init(&p->data);
    p->max_event = max_event;
    p->has_data = false;
    p->after_cr = false;
}

void lg_sse_done(lg_sse *p)
{
    kvg_buf_done(&p->line);
    kvg_buf_done(&p->data);
    lg_sse_init(p, p->max_event);
}

/* Interpret one complete line (without its terminator). */
static int sse_line(lg_sse *p, const char *line, size_t len, lg_sse_cb cb, void *arg)
{
    if (len == 0) {
        if (!p->has_data)
            return 0;
        /* The event's data is its data lines joined by LF: drop the last LF. */
        size_t n = p->data.len - 1;
        p->data.data[n] = '\0';
        p->has_data = false;
        int rc = cb(arg, p->data.data, n);
        kvg_buf_reset(&p->data);
        return rc < 0 ? rc : 0;
    }
    if (line[0] == ':')
        return 0; /* comment, e.g. a keep-alive ping */
    const char *colon = memchr(line, ':', len);
    size_t name_len = colon ? (size_t)(colon - line) : len;
    if (name_len != 4 || memcmp(line, "data", 4) != 0)
        return 0; /* event, id, retry and unknown fields do not matter here */
    const char *value = colon ? colon + 1 : line + len;
    size_t value_len = (size_t)(line + len - value);
    if (value_len > 0 && value[0] == ' ') {
        value++;
        value_len--;
    }
    if (p->data.len + value_len + 1 > p->max_event)
        return KVG_ELIMIT;
    kvg_buf_append(&p->data, value, value_len);
    kvg_buf_putc(&p->data, '\n');
    if (p->data.failed)
        return -ENOMEM;
    p->has_data = true;
    return 0;
}

int lg_sse_feed(lg_sse *p, const char *buf, size_t len, lg_sse_cb cb, void *arg)
{
    size_t i = 0;
    if (len > 0 && p->after_cr && buf[0] == '\n')
        i = 1; /* the LF of a CRLF split across two feeds */
    p->after_cr = false;
    while (i < len) {
        size_t j = i;
        while (j < len && buf[j] != '\n' && buf[j] != '\r')
            j++;
        if (j == len) {
            /* No terminator yet: keep the partial line for the next feed. */
            if (p->line.len + (len - i) > p->max_event)
                return KVG_ELIMIT;
            kvg_buf_append(&p->line, buf + i, len - i);
            return p->line.failed ? -ENOMEM : 0;
        }
        int rc;
        if (p->line.len > 0) {
            if (p->line.len + (j - i) > p->max_event)
                return KVG_ELIMIT;
            kvg_buf_append(&p->line, buf + i, j - i);
            if (p->line.failed)
                return -ENOMEM;
            rc = sse_line(p, p->line.data, p->line.len, cb, arg);
            kvg_buf_reset(&p->line);
        } else {
            if (j - i > p->max_event)
                return KVG_ELIMIT;
            rc = sse_line(p, buf + i, j - i, cb, arg);
        }
        if (rc < 0)
            return rc;
        if (buf[j] == '\r') {
            if (j + 1 == len)
                p->after_cr = true;
            else if (buf[j + 1] == '\n')
                j++;
        }
        i = j + 1;
    }
    return 0;
}

/* ---- chat.completion.chunk events ----------------------------------------------------------- */

/* True when a choice carries generated text: chat deltas or legacy completions' text. */
static bool choice_has_text(const kvg_json *choice)
{
    const kvg_json *delta = kvg_json_get(choice, "delta");
    const kvg_json *text = delta ? kvg_json_get(delta, "content") : kvg_json_get(choice, "text");
    if (text && text->type == KVG_JSON_STRING && text->u.str.len > 0)
        return true;
    /* A tool call's first fragment is the first output as well. */
    const kvg_json *calls = delta ? kvg_json_get(delta, "tool_calls") : NULL;
    return calls && calls->type == KVG_JSON_ARRAY && calls->u.arr.count > 0;
}

int lg_stream_event(lg_stream *s, const char *data, size_t len)
{
    if (s->done)
        return KVG_EPROTO;
    s->events++;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        s->done = true;
        return 0;
    }
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *root = NULL;
    int rc = parse_json(data, len, &arena, &root);
    if (rc == KVG_ELIMIT)
        rc = KVG_EPARSE;
    if (rc < 0)
        goto out;
    if (root->type != KVG_JSON_OBJECT || kvg_json_get(root, "error")) {
        rc = KVG_EPROTO;
        goto out;
    }
    rc = lg_usage_read(kvg_json_get(root, "usage"), &s->usage);
    if (rc < 0)
        goto out;
    const kvg_json *choices = kvg_json_get(root, "choices");
    if (!choices || choices->type != KVG_JSON_ARRAY || s->content_seen)
        goto out;
    for (size_t i = 0; i < choices->u.arr.count; i++) {
        if (choice_has_text(choices->u.arr.items[i])) {
            s->content_seen = true;
            rc = 1;
            break;
        }
    }
out:
    kvg_arena_done(&arena);
    return rc;
}
