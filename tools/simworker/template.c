/* SPDX-License-Identifier: Apache-2.0 */
/* ChatML-style chat template: renders validated messages (and tools) to the prompt text the
 * simulated engine tokenizes, in the order real chat templates place the content. */
#include "simworker.h"

#include <errno.h>
#include <string.h>

static bool str_is(const kvg_json *v, const char *s)
{
    return v && v->type == KVG_JSON_STRING && v->u.str.len == strlen(s) &&
           memcmp(v->u.str.ptr, s, v->u.str.len) == 0;
}

/* Content is a string, null, or a list of {"type":"text","text":...} parts; request.c has
 * rejected everything else. Parts are joined with "\n" as vLLM does for text-only models. */
static void put_content(kvg_buf *out, const kvg_json *content)
{
    if (!content || content->type == KVG_JSON_NULL)
        return;
    if (content->type == KVG_JSON_STRING) {
        kvg_buf_append(out, content->u.str.ptr, content->u.str.len);
        return;
    }
    for (size_t i = 0; i < content->u.arr.count; i++) {
        const kvg_json *text = kvg_json_get(content->u.arr.items[i], "text");
        if (i)
            kvg_buf_putc(out, '\n');
        if (text && text->type == KVG_JSON_STRING)
            kvg_buf_append(out, text->u.str.ptr, text->u.str.len);
    }
}

int sim_chat_render(const kvg_json *messages, const kvg_json *tools, bool add_generation_prompt,
                    kvg_buf *out)
{
    size_t first = 0;
    if (tools && tools->type == KVG_JSON_ARRAY && tools->u.arr.count > 0) {
        /* Like Qwen/Hermes templates: the tools go into the system turn, which absorbs a
         * leading system message, before every other message. */
        kvg_buf_puts(out, "<|im_start|>system\n");
        const kvg_json *m0 = messages->u.arr.count ? messages->u.arr.items[0] : NULL;
        if (m0 && str_is(kvg_json_get(m0, "role"), "system")) {
            put_content(out, kvg_json_get(m0, "content"));
            kvg_buf_puts(out, "\n\n");
            first = 1;
        }
        kvg_buf_puts(out, "# Tools\n\n<tools>\n");
        for (size_t i = 0; i < tools->u.arr.count; i++) {
            kvg_json_write(out, tools->u.arr.items[i]);
            kvg_buf_putc(out, '\n');
        }
        kvg_buf_puts(out, "</tools><|im_end|>\n");
    }
    for (size_t i = first; i < messages->u.arr.count; i++) {
        const kvg_json *m = messages->u.arr.items[i];
        const kvg_json *role = kvg_json_get(m, "role");
        const kvg_json *calls = kvg_json_get(m, "tool_calls");
        kvg_buf_puts(out, "<|im_start|>");
        kvg_buf_append(out, role->u.str.ptr, role->u.str.len);
        kvg_buf_putc(out, '\n');
        put_content(out, kvg_json_get(m, "content"));
        if (calls && calls->type == KVG_JSON_ARRAY) {
            for (size_t j = 0; j < calls->u.arr.count; j++) {
                kvg_buf_puts(out, "\n<tool_call>\n");
                kvg_json_write(out, calls->u.arr.items[j]);
                kvg_buf_puts(out, "\n</tool_call>");
            }
        }
        kvg_buf_puts(out, "<|im_end|>\n");
    }
    if (add_generation_prompt)
        kvg_buf_puts(out, "<|im_start|>assistant\n");
    return out->failed ? -ENOMEM : 0;
}
