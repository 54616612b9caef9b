/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: kvg_body_scan for every API (completions, chat, responses). It accepts and rejects
 * exactly as kvg_body_rewrite does, except for type errors it adds on valid JSON; its output is the
 * rewriter's; its stream stays within the bound on the body; and the stream does not change when
 * the output is scanned again or when the body is re-spelled (other whitespace, escaped letters).
 */
#include <stdlib.h>
#include <string.h>

#include "router.h"

#define SALT "VGhlIHNjb3BlIHNhbHQgb2YgdGhlIGZ1enogdGFyZ2V0"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_stream(const kvg_prefix_stream *a, const kvg_prefix_stream *b)
{
    if (a->is_tokens != b->is_tokens || a->text_len != b->text_len || a->ntokens != b->ntokens)
        return false;
    if (a->text_len && memcmp(a->text, b->text, a->text_len) != 0)
        return false;
    return !a->ntokens || memcmp(a->tokens, b->tokens, a->ntokens * sizeof(uint32_t)) == 0;
}

/* The same JSON spelled otherwise: a space after each structural character, and every other
 * ASCII letter inside strings written as a \u escape. `in` is valid JSON. */
static void respell(const char *in, size_t n, kvg_buf *b)
{
    static const char hex[] = "0123456789abcdef";
    bool str = false, flip = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (!str) {
            kvg_buf_putc(b, (char)c);
            if (c == '"')
                str = true;
            else if (c == '{' || c == '[' || c == ',' || c == ':')
                kvg_buf_putc(b, ' ');
            continue;
        }
        if (c == '\\') {
            size_t k = in[i + 1] == 'u' ? 6 : 2;
            kvg_buf_append(b, in + i, k);
            i += k - 1;
        } else if (c == '"') {
            kvg_buf_putc(b, '"');
            str = false;
        } else if (((c | 0x20) >= 'a' && (c | 0x20) <= 'z') && (flip = !flip)) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            kvg_buf_append(b, e, sizeof(e));
        } else {
            kvg_buf_putc(b, (char)c);
        }
    }
}

static void check(const uint8_t *data, size_t size, kvg_body_api api)
{
    kvg_arena arena;
    kvg_buf out, plain, again, re;
    kvg_body_info info, pinfo, info2;
    kvg_json_error err, perr;
    kvg_arena_init(&arena, 0);
    kvg_buf_init(&out);
    kvg_buf_init(&plain);
    kvg_buf_init(&again);
    kvg_buf_init(&re);
    const char *body = (const char *)data;

    int rc = kvg_body_scan(body, size, api, SALT, &arena, &out, &info, &err);
    int prc = kvg_body_rewrite(body, size, SALT, &arena, &plain, &pinfo, &perr);
    if (prc != 0 && prc != KVG_ETYPE) {
        /* Not valid JSON (or too deep): the same verdict, at the same place. */
        if (rc != prc || err.offset != perr.offset)
            abort();
        goto out;
    }
    if (api == KVG_BODY_API_OTHER && rc != prc)
        abort();
    if (prc == KVG_ETYPE) {
        if (rc != KVG_ETYPE)
            abort();
        goto out;
    }
    if (rc != 0) {
        if (rc != KVG_ETYPE || api == KVG_BODY_API_OTHER)
            abort();
        goto out;
    }
    if (out.len != plain.len || memcmp(out.data, plain.data, out.len) != 0)
        abort();
    const kvg_prefix_stream *ps = &info.prefix;
    if (api == KVG_BODY_API_OTHER && (ps->is_tokens || ps->text_len || ps->ntokens))
        abort();
    if ((api == KVG_BODY_API_CHAT || api == KVG_BODY_API_RESPONSES) && ps->is_tokens)
        abort();
    size_t bound = api == KVG_BODY_API_RESPONSES ? 2 * size + 64 : size + size / 8 + 64;
    if (ps->text_len > bound || ps->ntokens > size / 2 + 1)
        abort();

    /* The forwarded body has the same stream. */
    if (kvg_body_scan(out.data, out.len, api, SALT, &arena, &again, &info2, NULL) != 0 ||
        !same_stream(&info.prefix, &info2.prefix))
        abort();
    /* So does the body spelled otherwise. */
    respell(body, size, &re);
    kvg_buf_reset(&again);
    if (kvg_body_scan(re.data, re.len, api, NULL, &arena, &again, &info2, &err) != 0 ||
        !same_stream(&info.prefix, &info2.prefix))
        abort();

out:
    kvg_buf_done(&re);
    kvg_buf_done(&again);
    kvg_buf_done(&plain);
    kvg_buf_done(&out);
    kvg_arena_done(&arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int api = 0; api < KVG_BODY_API_COUNT; api++)
        check(data, size, (kvg_body_api)api);
    return 0;
}
