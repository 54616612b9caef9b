/* SPDX-License-Identifier: Apache-2.0 */
/* A fixture for tests of field tables (common and each module's): one decode context with an
 * arena and a message buffer. Include after cmocka.h. */
#ifndef KVG_TEST_FIELDS_FIX_H
#define KVG_TEST_FIELDS_FIX_H

#include <string.h>

#include "fields.h"

typedef struct fix {
    kvg_arena arena;
    char msg[256];
    kvg_fields_ctx c;
} fix;

static inline void fix_init(fix *f, unsigned from)
{
    kvg_arena_init(&f->arena, 0);
    f->msg[0] = '\0';
    f->c = (kvg_fields_ctx){
        .from = from, .arena = &f->arena, .msg = f->msg, .msg_len = sizeof(f->msg)};
}

/* text parsed into the fixture's arena (it must be valid JSON). */
static inline kvg_json *fix_parse(fix *f, const char *text)
{
    kvg_json *v;
    assert_int_equal(kvg_json_parse(text, strlen(text), &f->arena, NULL, &v, NULL), 0);
    return v;
}

/* Decode text over target from the table's defaults. */
static inline int fix_decode(fix *f, const kvg_fields *t, void *target, const char *text)
{
    kvg_json *v = fix_parse(f, text);
    kvg_fields_defaults(t, target);
    return kvg_fields_decode(t, target, v, "", &f->c);
}

/* One decode from the table's defaults at an entry point: msg NULL wants it accepted, else
 * refused with exactly msg. */
typedef struct fix_case {
    unsigned from;
    const char *text, *msg;
} fix_case;

static inline void fix_cases(const kvg_fields *t, void *target, const fix_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fix f;
        fix_init(&f, cases[i].from);
        int rc = fix_decode(&f, t, target, cases[i].text);
        if (cases[i].msg ? rc == 0 || strcmp(f.msg, cases[i].msg) != 0 : rc != 0)
            fail_msg("case %zu (%s): rc %d \"%s\"", i, cases[i].text, rc, f.msg);
        kvg_arena_done(&f.arena);
    }
}

#endif
