/* SPDX-License-Identifier: Apache-2.0 */
/* Response bodies and SSE events shaped like vLLM's OpenAI-compatible server. */
#include "simworker.h"

#include <math.h>
#include <string.h>

static void put_str(kvg_buf *out, const char *s)
{
    kvg_buf_json_string(out, s, strlen(s));
}

static void put_head(kvg_buf *out, const char *id, const char *object, uint64_t created,
                     const char *model)
{
    kvg_buf_puts(out, "{\"id\":");
    put_str(out, id);
    kvg_buf_puts(out, ",\"object\":");
    put_str(out, object);
    kvg_buf_printf(out, ",\"created\":%llu,\"model\":", (unsigned long long)created);
    put_str(out, model);
}

static void put_usage(kvg_buf *out, const sim_choice *choices, size_t n, bool generation)
{
    uint64_t p = 0, c = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        p += choices[i].prompt_tokens;
        c += choices[i].generated;
        k += choices[i].cached_tokens;
    }
    kvg_buf_printf(out,
                   "\"usage\":{\"prompt_tokens\":%llu,\"total_tokens\":%llu,"
                   "\"completion_tokens\":%llu,\"prompt_tokens_details\":{\"cached_tokens\":%llu}}",
                   (unsigned long long)p, (unsigned long long)(p + c),
                   (unsigned long long)(generation ? c : 0), (unsigned long long)k);
}

void sim_output_text(kvg_buf *out, uint32_t n)
{
    for (uint32_t k = 1; k <= n; k++)
        kvg_buf_puts(out, sim_output_piece(k));
}

void sim_respond_error(kvg_buf *out, const sim_error *err)
{
    kvg_buf_puts(out, "{\"error\":{\"message\":");
    put_str(out, err->message);
    kvg_buf_puts(out, ",\"type\":");
    put_str(out, err->type ? err->type : "BadRequestError");
    kvg_buf_puts(out, ",\"param\":");
    if (err->param[0])
        put_str(out, err->param);
    else
        kvg_buf_puts(out, "null");
    kvg_buf_printf(out, ",\"code\":%d}}", err->status);
}

void sim_respond_completion(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                            const sim_choice *choices, size_t n)
{
    bool chat = req->ep == SIM_EP_CHAT;
    put_head(out, id, chat ? "chat.completion" : "text_completion", created, req->model);
    kvg_buf_puts(out, ",\"choices\":[");
    kvg_buf text;
    kvg_buf_init(&text);
    for (size_t i = 0; i < n; i++) {
        kvg_buf_reset(&text);
        sim_output_text(&text, choices[i].generated);
        kvg_buf_printf(out, "%s{\"index\":%zu,", i ? "," : "", i);
        kvg_buf_puts(out, chat ? "\"message\":{\"role\":\"assistant\",\"content\":" : "\"text\":");
        kvg_buf_json_string(out, text.data ? text.data : "", text.len);
        if (chat)
            kvg_buf_puts(out, ",\"tool_calls\":[]}");
        kvg_buf_puts(out, ",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null");
        if (!chat)
            kvg_buf_puts(out, ",\"prompt_logprobs\":null");
        kvg_buf_putc(out, '}');
    }
    kvg_buf_done(&text);
    kvg_buf_puts(out, "],");
    put_usage(out, choices, n, true);
    kvg_buf_putc(out, '}');
}

void sim_respond_chunk(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                       size_t index, uint32_t token, bool last)
{
    bool chat = req->ep == SIM_EP_CHAT;
    kvg_buf_puts(out, "data: ");
    put_head(out, id, chat ? "chat.completion.chunk" : "text_completion", created, req->model);
    kvg_buf_printf(out, ",\"choices\":[{\"index\":%zu,", index);
    if (chat && token == 0)
        kvg_buf_puts(out, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}");
    else if (chat) {
        kvg_buf_puts(out, "\"delta\":{\"content\":");
        put_str(out, sim_output_piece(token));
        kvg_buf_putc(out, '}');
    } else {
        kvg_buf_puts(out, "\"text\":");
        put_str(out, sim_output_piece(token));
    }
    kvg_buf_puts(out, ",\"logprobs\":null,\"finish_reason\":");
    kvg_buf_puts(out, last ? "\"length\"" : "null");
    if (last || !chat)
        kvg_buf_puts(out, ",\"stop_reason\":null");
    kvg_buf_puts(out, "}]}\n\n");
}

void sim_respond_usage_chunk(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                             const sim_choice *choices, size_t n)
{
    bool chat = req->ep == SIM_EP_CHAT;
    kvg_buf_puts(out, "data: ");
    put_head(out, id, chat ? "chat.completion.chunk" : "text_completion", created, req->model);
    kvg_buf_puts(out, ",\"choices\":[],");
    put_usage(out, choices, n, true);
    kvg_buf_puts(out, "}\n\n");
}

/* A deterministic unit vector derived from the prompt's tokens: equal inputs embed equally. */
static void embedding_vector(const sim_prompt *p, uint32_t dims, float *v)
{
    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < p->n; i++) {
        seed ^= p->tokens[i];
        seed *= 1099511628211ull;
    }
    double norm = 0.0;
    for (uint32_t d = 0; d < dims; d++) {
        double x = sim_rand_unit(seed, 0x656d6264, d) * 2.0 - 1.0;
        v[d] = (float)x;
        norm += x * x;
    }
    norm = sqrt(norm);
    for (uint32_t d = 0; d < dims && norm > 0.0; d++)
        v[d] = (float)(v[d] / norm);
}

static void put_base64(kvg_buf *out, const unsigned char *data, size_t len)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    kvg_buf_putc(out, '"');
    for (size_t i = 0; i < len; i += 3) {
        uint32_t w = (uint32_t)data[i] << 16;
        if (i + 1 < len)
            w |= (uint32_t)data[i + 1] << 8;
        if (i + 2 < len)
            w |= data[i + 2];
        char q[4] = {tbl[(w >> 18) & 63], tbl[(w >> 12) & 63],
                     i + 1 < len ? tbl[(w >> 6) & 63] : '=', i + 2 < len ? tbl[w & 63] : '='};
        kvg_buf_append(out, q, 4);
    }
    kvg_buf_putc(out, '"');
}

void sim_respond_embeddings(kvg_buf *out, const sim_request *req, const char *id, uint64_t created,
                            const sim_choice *choices, size_t n)
{
    float v[SIM_MAX_EMBED_DIMS];
    uint32_t dims = KVG_MIN(KVG_MAX(req->dimensions, 1u), (uint32_t)SIM_MAX_EMBED_DIMS);
    put_head(out, id, "list", created, req->model);
    kvg_buf_puts(out, ",\"data\":[");
    for (size_t i = 0; i < n && i < req->n_prompts; i++) {
        embedding_vector(&req->prompts[i], dims, v);
        kvg_buf_printf(out,
                       "%s{\"index\":%zu,\"object\":\"embedding\",\"embedding\":", i ? "," : "", i);
        if (req->base64) {
            /* OpenAI's base64 format: little-endian float32 array. */
            unsigned char raw[4 * SIM_MAX_EMBED_DIMS];
            for (uint32_t d = 0; d < dims; d++) {
                uint32_t bits;
                memcpy(&bits, &v[d], 4);
                raw[4 * d] = (unsigned char)bits;
                raw[4 * d + 1] = (unsigned char)(bits >> 8);
                raw[4 * d + 2] = (unsigned char)(bits >> 16);
                raw[4 * d + 3] = (unsigned char)(bits >> 24);
            }
            put_base64(out, raw, 4 * (size_t)dims);
        } else {
            kvg_buf_putc(out, '[');
            for (uint32_t d = 0; d < dims; d++)
                kvg_buf_printf(out, "%s%.9g", d ? "," : "", (double)v[d]);
            kvg_buf_putc(out, ']');
        }
        kvg_buf_putc(out, '}');
    }
    kvg_buf_puts(out, "],");
    put_usage(out, choices, n, false);
    kvg_buf_putc(out, '}');
}

void sim_respond_tokenize(kvg_buf *out, const sim_config *cfg, const sim_request *req)
{
    const sim_prompt *p = req->n_prompts ? &req->prompts[0] : NULL;
    size_t n = p ? p->n : 0;
    kvg_buf_printf(out, "{\"count\":%zu,\"max_model_len\":%u,\"tokens\":[", n, cfg->max_model_len);
    for (size_t i = 0; i < n; i++)
        kvg_buf_printf(out, "%s%u", i ? "," : "", p->tokens[i]);
    kvg_buf_puts(out, "],\"token_strs\":null}");
}

void sim_respond_models(kvg_buf *out, const sim_config *cfg, uint64_t created)
{
    kvg_buf_puts(out, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < cfg->n_models; i++) {
        kvg_buf_puts(out, i ? ",{\"id\":" : "{\"id\":");
        put_str(out, cfg->models[i]);
        kvg_buf_printf(out,
                       ",\"object\":\"model\",\"created\":%llu,\"owned_by\":\"vllm\",\"root\":",
                       (unsigned long long)created);
        put_str(out, cfg->models[0]);
        kvg_buf_printf(out, ",\"parent\":null,\"max_model_len\":%u,\"permission\":[]}",
                       cfg->max_model_len);
    }
    kvg_buf_puts(out, "]}");
}
