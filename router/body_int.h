/* SPDX-License-Identifier: Apache-2.0 */
/* Private declarations shared by the body rewriter (body.c) and the canonical prefix stream
 * (body_canon.c): the state of one scan and the calls between the two. */
#ifndef KVG_BODY_INT_H
#define KVG_BODY_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "body_lex.h"
#include "router.h"

typedef enum member_kind {
    MEMBER_OTHER = 0,
    MEMBER_CACHE_SALT,
    MEMBER_MODEL,
    MEMBER_STREAM,
    MEMBER_PROMPT,
    MEMBER_MESSAGES,
    MEMBER_INPUT,
    MEMBER_INSTRUCTIONS,
    MEMBER_PREVIOUS_RESPONSE_ID,
    MEMBER_TOOLS,
    MEMBER_KIND_COUNT,
} member_kind;

/* The canonical prefix stream being built. Its capacity is fixed when the first member that
 * feeds it is met, from the bytes left in the body (see stream_capacity), so writes never
 * reallocate; `overflow` is sticky and turns into an error, should the bound ever be wrong. */
typedef struct canon {
    unsigned char *buf;
    size_t len, cap;
    unsigned char *scratch; /* cap bytes, allocated on first use: reordering pieces */
    uint32_t *tokens;
    size_t ntokens, tcap;
    size_t tools_len; /* bytes of the tools section at the front of buf; 0: none yet */
    bool is_tokens;
    bool overflow;
} canon;

/* State of the rewrite of the top-level object. */
typedef struct rewrite {
    scanner sc;
    kvg_arena *arena;
    kvg_body_plan *plan;
    bool plan_failed;              /* a piece could not be added (arena) */
    const unsigned char *flush;    /* input before this is settled in the plan */
    const unsigned char *kept_end; /* end of the last kept member's value; NULL: none yet */
    bool skip_separator;           /* the separator after a removed first member must go */
    unsigned seen[MEMBER_KIND_COUNT];
    type_fault fault;
    kvg_body_info info;
    kvg_body_api api;
    canon canon;
} rewrite;

/* The JSON type named by a value's first byte, for type errors. */
static inline const char *value_type(unsigned char c)
{
    switch (c) {
    case '{':
        return "an object";
    case '[':
        return "an array";
    case '"':
        return "a string";
    case 't':
    case 'f':
        return "a boolean";
    case 'n':
        return "null";
    default:
        return "a number";
    }
}

/* In body.c. */
/** Record the body's type error (the first one wins), at the value that starts at `at`; only
 *  reported once the whole body is known to be valid JSON. */
void kvg_body_type_error(rewrite *rw, const unsigned char *at, const char *fmt, ...)
    KVG_PRINTF(3, 4);

/* In body_canon.c: the values of the top-level members that feed the canonical prefix stream
 * (docs/canonical.md). Each scans the value at *pp (on its first byte), appends to rw->canon
 * and leaves *pp past it; 0, a parse error, or -ENOMEM. Type errors go to rw->fault. */
int kvg_body_scan_prompt(rewrite *rw, const unsigned char **pp);   /* completions: "prompt" */
int kvg_body_scan_messages(rewrite *rw, const unsigned char **pp); /* chat: "messages" */
int kvg_body_scan_tools(rewrite *rw, const unsigned char **pp);    /* chat, responses: "tools" */
int kvg_body_scan_instructions(rewrite *rw, const unsigned char **pp); /* responses */
int kvg_body_scan_input(rewrite *rw, const unsigned char **pp);        /* responses: "input" */

#endif
