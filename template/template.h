/* SPDX-License-Identifier: Apache-2.0 */
/* A model's own chat template (the Jinja subset real chat templates use), rendered the way vLLM
 * renders it through transformers' Jinja2 environment: byte for byte. */
#ifndef KVG_TEMPLATE_H
#define KVG_TEMPLATE_H

#include <stdint.h>

#include "common.h"

/* A compiled template: immutable after kvg_template_compile, shared by every thread. */
typedef struct kvg_template kvg_template;

/* Bounds of one compile and one render. Templates come from the operator; contexts come from
 * tenants' requests, so every resource a conversation can drive is bounded. A zero field takes
 * its default (kvg_template_limits_default). */
typedef struct kvg_template_limits {
    size_t max_source;  /* template source bytes; default 1 MiB */
    size_t max_depth;   /* nesting of statements and expressions at compile, and of values
                           (tojson, equality, repr) at render; default 128 */
    size_t max_output;  /* rendered bytes; default 64 MiB */
    size_t max_string;  /* bytes of any one string a render builds; default 64 MiB */
    size_t max_memory;  /* scratch bytes of one render (its arena); default 512 MiB */
    uint64_t max_loop;  /* loop iterations of one render, all loops together; default 10 M */
    uint64_t max_steps; /* expression and statement evaluations of one render; default 200 M */
} kvg_template_limits;

/* Inputs of a render besides the context. */
typedef struct kvg_template_opts {
    const kvg_template_limits *limits; /* NULL: the defaults */
    /* The clock of strftime_now(fmt), seconds since the epoch, formatted in UTC (transformers
     * calls datetime.now(): the engine host's local time; engines run in UTC containers).
     * Negative: the wall clock now. */
    int64_t now_s;
} kvg_template_opts;

/** The default limits. */
void kvg_template_limits_default(kvg_template_limits *l);

/** Parse a chat_template string (as in a model's tokenizer_config.json) into *out. Jinja2's
 *  lexing as transformers configures it: trim_blocks, lstrip_blocks, loop controls, a single
 *  trailing newline dropped. Any syntax error, and any construct outside the supported subset
 *  (docs/template.md), fails here with "line:column: message" in err (errlen bytes, may be 0).
 *  Returns 0, KVG_EPARSE, KVG_ELIMIT (source too large or nested too deeply) or -ENOMEM. */
int kvg_template_compile(const char *source, size_t len, const kvg_template_limits *limits,
                         kvg_template **out, char *err, size_t errlen);

/** Free a compiled template; NULL is a no-op. */
void kvg_template_free(kvg_template *tpl);

/** Render tpl with the context ctx (a JSON object: messages, tools, add_generation_prompt,
 *  bos_token, ...; its members become the template's variables), appending to out. Thread-safe:
 *  all scratch memory is the render's own arena. On error out is left at its length on entry
 *  and err says why: raise_exception's message ("raise_exception: ..."), a type error, an
 *  undefined value used as Jinja2 refuses to, or the limit that was hit. Returns 0, KVG_EPARSE
 *  (the template raised, or a Jinja2 runtime error), KVG_ETYPE (ctx is not an object),
 *  KVG_ELIMIT or -ENOMEM. opts may be NULL. */
int kvg_template_render(const kvg_template *tpl, const kvg_json *ctx, const kvg_template_opts *opts,
                        kvg_buf *out, char *err, size_t errlen);

/* What kvg_template_prepare adds to the request's own fields. */
typedef struct kvg_template_vars {
    const char *bos_token; /* from tokenizer_config.json; NULL: not passed */
    const char *eos_token;
    /* vLLM's "openai" content format (kvg_template_wants_parts): content parts stay a list
     * of {"type": "text", "text": ...}; false: the "string" format, texts joined with "\n". */
    bool openai_content;
} kvg_template_vars;

/** Whether tpl walks a message's content parts itself (a for loop over something's
 *  `content`), which is how vLLM's "auto" content format picks "openai" over "string". */
bool kvg_template_wants_parts(const kvg_template *tpl);

/** Build the render context vLLM builds for a /v1/chat/completions body (docs/canonical.md,
 *  "Token-exact mode"): messages as vLLM's parser leaves them (content parts joined with "\n"
 *  or kept as text parts, tool-call arguments parsed from JSON strings, reasoning copied to
 *  reasoning_content), tools as vLLM's model_dump() writes them, documents, add_generation_prompt
 *  (default true), the chat_template_kwargs spread in, and the model's special tokens. body is
 *  borrowed and must outlive the result, which lives in arena. Returns 0, KVG_EPARSE (a request
 *  token-exact mode does not cover: media parts, continue_final_message, a request's own
 *  chat_template; or one vLLM refuses; err says which) or -ENOMEM. */
int kvg_template_prepare(const kvg_json *body, const kvg_template_vars *vars, kvg_arena *arena,
                         kvg_json **ctx, char *err, size_t errlen);

#endif
