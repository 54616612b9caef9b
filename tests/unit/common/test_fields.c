/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/fields.c: the field-table walker over a table of every field type. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "common_parts.h"
#include "fail_alloc.h"
#include "fields.h"
#include "fields_fix.h"

typedef enum colour { RED = 0, GREEN, BLUE } colour;

typedef struct limits {
    double rate;
    double burst;
} limits;

typedef struct thing {
    const char *name;
    const char *note;
    char path[16];
    const char **tags;
    size_t ntags;
    uint32_t count;
    uint64_t budget; /* bytes; MiB as written */
    size_t size;
    bool quiet; /* "loud": false */
    colour colour;
    bool open; /* "auth": "keys" | "open" */
    limits limits;
    int custom;
} thing;

typedef struct record {
    thing thing;
    uint32_t extra;
    limits *parts;
    size_t nparts;
} record;

static const char *const colours[] = {"red", "green", "blue"};
static const char *const auths[] = {"keys", "open"};

static int check_path(const void *value, char *why, size_t len)
{
    if (((const char *)value)[0] != '/') {
        snprintf(why, len, "must start with '/'");
        return KVG_EPARSE;
    }
    return 0;
}

static int check_tag(const void *value, char *why, size_t len)
{
    if (strcmp(value, "bad") == 0) {
        snprintf(why, len, "\"bad\" is not a tag");
        return KVG_EPARSE;
    }
    return 0;
}

static int decode_custom(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    if (v->type != KVG_JSON_NUMBER || v->u.num.ival != 42)
        return kvg_fields_fail(c, KVG_FIELD_INVALID, path, "must be the answer");
    ((thing *)target)->custom = 42;
    return 0;
}

static bool encode_custom(const void *target, kvg_buf *out)
{
    if (((const thing *)target)->custom == 0)
        return false;
    kvg_buf_printf(out, "%d", ((const thing *)target)->custom);
    return true;
}

static const kvg_field limit_fields[] = {
    {.name = "rate",
     .type = KVG_FIELD_DOUBLE,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(limits, rate),
     .dmax = 1e15},
    {.name = "burst",
     .type = KVG_FIELD_DOUBLE,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(limits, burst),
     .dmin = 1,
     .dmax = 100,
     .def.d = 1},
};
static const kvg_fields limit_table = {"limits", limit_fields, KVG_ARRAY_LEN(limit_fields), NULL};

static int check_thing(const void *target, char *why, size_t len)
{
    const thing *t = target;
    if (t->count == 7 && t->quiet) {
        snprintf(why, len, "count: 7 needs \"loud\"");
        return KVG_EPARSE;
    }
    return 0;
}

static const kvg_field thing_fields[] = {
    {.name = "name",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY,
     .required_in = KVG_SET_STATE | KVG_SET_ADMIN,
     .offset = offsetof(thing, name)},
    {.name = "note",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY & ~KVG_SET_ADMIN,
     .flags = KVG_FIELD_NULLABLE | KVG_FIELD_NONEMPTY,
     .offset = offsetof(thing, note),
     .def.s = "none"},
    {.name = "path",
     .type = KVG_FIELD_CHARS,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(thing, path),
     .max = 15,
     .def.s = "/x",
     .check = check_path},
    {.name = "tags",
     .type = KVG_FIELD_STRINGS,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(thing, tags),
     .count_offset = offsetof(thing, ntags),
     .max = 3,
     .item = "tag",
     .check = check_tag},
    {.name = "count",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(thing, count),
     .min = 1,
     .max = 1000,
     .def.u = 10},
    {.name = "budget_mib",
     .type = KVG_FIELD_U64,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(thing, budget),
     .min = 1,
     .max = 1024,
     .shift = 20,
     .def.u = 2},
    {.name = "size",
     .type = KVG_FIELD_SIZE,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(thing, size)},
    {.name = "loud",
     .type = KVG_FIELD_BOOL,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_NEGATE,
     .offset = offsetof(thing, quiet),
     .def.b = true},
    {.name = "colour",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(thing, colour),
     .keywords = colours,
     .nkeywords = 3,
     .def.u = GREEN},
    {.name = "auth",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_AS_BOOL,
     .offset = offsetof(thing, open),
     .keywords = auths,
     .nkeywords = 2,
     .invalid = "{path}: \"{value}\" is not {expect}"},
    {.name = "limits",
     .type = KVG_FIELD_OBJECT,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_FLATTEN,
     .offset = offsetof(thing, limits),
     .object = &limit_table},
    {.name = "custom",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_STATE,
     .decode = decode_custom,
     .encode = encode_custom},
};
static const kvg_fields thing_table = {"thing", thing_fields, KVG_ARRAY_LEN(thing_fields),
                                       check_thing};

static const kvg_field record_fields[] = {
    {.type = KVG_FIELD_EMBED, .offset = offsetof(record, thing), .object = &thing_table},
    {.name = "extra",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_STATE,
     .offset = offsetof(record, extra)},
    {.name = "parts",
     .type = KVG_FIELD_OBJECTS,
     .set_in = KVG_SET_STATE,
     .offset = offsetof(record, parts),
     .count_offset = offsetof(record, nparts),
     .elem_size = sizeof(limits),
     .object = &limit_table,
     .max = 2},
};
static const kvg_fields record_table = {"record", record_fields, KVG_ARRAY_LEN(record_fields),
                                        NULL};

/* ---- helpers ------------------------------------------------------------------------------- */

static kvg_json *parse(fix *f, const char *text)
{
    return fix_parse(f, text);
}

static int decode(fix *f, thing *t, const char *text)
{
    return kvg_fields_decode(&thing_table, t, parse(f, text), "", &f->c);
}

static char *encode(const kvg_fields *table, const void *t, unsigned in)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_fields_encode(table, t, in, &b);
    assert_false(b.failed);
    return kvg_buf_steal(&b, NULL);
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_defaults_and_encode(void **state)
{
    (void)state;
    thing t;
    memset(&t, 0xa5, sizeof(t));
    kvg_fields_defaults(&thing_table, &t);
    assert_null(t.name);
    assert_string_equal(t.note, "none");
    assert_string_equal(t.path, "/x");
    assert_null(t.tags);
    assert_int_equal(t.ntags, 0);
    assert_int_equal(t.count, 10);
    assert_int_equal(t.budget, 2u << 20);
    assert_int_equal(t.size, 0);
    assert_false(t.quiet);
    assert_int_equal(t.colour, GREEN);
    assert_false(t.open);
    assert_true(t.limits.burst == 1);
    t.custom = 0;
    char *s = encode(&thing_table, &t, KVG_SET_STATE);
    assert_string_equal(s, "{\"note\":\"none\",\"path\":\"/x\",\"tags\":[],\"count\":10,"
                           "\"budget_mib\":2,\"size\":0,\"loud\":true,\"colour\":\"green\","
                           "\"auth\":\"keys\",\"limits\":{\"rate\":0,\"burst\":1}}");
    free(s);
    /* fields not settable at an entry point are not written for it */
    s = encode(&thing_table, &t, KVG_SET_ADMIN);
    assert_null(strstr(s, "note"));
    free(s);
}

static void test_decode_round_trip(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_STATE);
    thing t;
    kvg_fields_defaults(&thing_table, &t);
    const char *text = "{\"name\":\"n1\",\"note\":\"hi\",\"path\":\"/p\",\"tags\":[\"a\",\"b\"],"
                       "\"count\":1000,\"budget_mib\":1024,\"size\":123456789012,\"loud\":false,"
                       "\"colour\":\"blue\",\"auth\":\"open\",\"limits\":{\"rate\":0.1,"
                       "\"burst\":100},\"custom\":42}";
    if (decode(&f, &t, text) != 0)
        fail_msg("%s", f.msg);
    assert_string_equal(t.name, "n1");
    assert_int_equal(t.ntags, 2);
    assert_string_equal(t.tags[1], "b");
    assert_int_equal(t.budget, 1024ull << 20);
    assert_int_equal(t.size, 123456789012ull);
    assert_true(t.quiet);
    assert_int_equal(t.colour, BLUE);
    assert_true(t.open);
    assert_true(t.limits.rate == 0.1);
    assert_int_equal(t.custom, 42);
    char *s = encode(&thing_table, &t, KVG_SET_STATE);
    assert_string_equal(s, text);
    free(s);
    /* a merge (where name is not required): absent members keep their value; null clears a
     * NULLABLE string */
    f.c.from = KVG_SET_CONFIG;
    assert_int_equal(decode(&f, &t, "{\"note\":null,\"limits\":{\"burst\":5}}"), 0);
    assert_null(t.note);
    assert_true(t.limits.rate == 0.1 && t.limits.burst == 5);
    assert_string_equal(t.name, "n1");
    kvg_arena_done(&f.arena);
}

typedef struct bad_case {
    unsigned from;
    const char *json;
    kvg_field_problem problem;
    const char *msg;
} bad_case;

static void test_decode_errors(void **state)
{
    (void)state;
    static const bad_case cases[] = {
        {KVG_SET_STATE, "[]", KVG_FIELD_MISTYPED, "must be an object, not array"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"nmae\":1}", KVG_FIELD_UNKNOWN, "nmae: unknown field"},
        {KVG_SET_ADMIN, "{\"name\":\"n\",\"note\":\"x\"}", KVG_FIELD_UNKNOWN,
         "note: unknown field"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"\\n\\u0000\\\"xyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\":1}",
         KVG_FIELD_UNKNOWN, "???xyyyyyyyyyyyyyyyyyyyyyyyyyyyy...: unknown field"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"name\":\"m\"}", KVG_FIELD_REPEATED,
         "name: appears more than once"},
        {KVG_SET_STATE, "{}", KVG_FIELD_MISSING, "name: required"},
        {KVG_SET_STATE, "{\"name\":1}", KVG_FIELD_MISTYPED, "name: must be a string, not number"},
        {KVG_SET_STATE, "{\"name\":\"a\\u0000b\"}", KVG_FIELD_MISTYPED,
         "name: must not contain NUL characters"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"note\":\"\"}", KVG_FIELD_RANGE,
         "note: must be a non-empty string"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"path\":\"/0123456789abcdef\"}", KVG_FIELD_RANGE,
         "path: longer than 15 bytes"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"path\":\"rel\"}", KVG_FIELD_INVALID,
         "path: must start with '/'"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"tags\":\"a\"}", KVG_FIELD_MISTYPED,
         "tags: must be an array of strings, not string"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"tags\":[\"a\",2]}", KVG_FIELD_MISTYPED,
         "tags[1]: must be a string, not number"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"tags\":[\"a\",\"bad\"]}", KVG_FIELD_INVALID,
         "tags[1]: \"bad\" is not a tag"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"tags\":[\"a\",\"b\",\"c\",\"d\"]}", KVG_FIELD_RANGE,
         "tags: more than 3 tags"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"count\":\"5\"}", KVG_FIELD_MISTYPED,
         "count: must be an integer in 1..1000, not string"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"count\":0}", KVG_FIELD_RANGE,
         "count: must be an integer in 1..1000"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"count\":1.5}", KVG_FIELD_RANGE,
         "count: must be an integer in 1..1000"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"count\":1e2}", KVG_FIELD_RANGE,
         "count: must be an integer in 1..1000"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"count\":-1}", KVG_FIELD_RANGE,
         "count: must be an integer in 1..1000"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"budget_mib\":1025}", KVG_FIELD_RANGE,
         "budget_mib: must be an integer in 1..1024"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"size\":-5}", KVG_FIELD_RANGE,
         "size: must be an integer in 0..18446744073709551615"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"loud\":1}", KVG_FIELD_MISTYPED,
         "loud: must be true or false, not number"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"colour\":1}", KVG_FIELD_MISTYPED,
         "colour: must be a string, not number"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"colour\":\"pink\"}", KVG_FIELD_RANGE,
         "colour: must be red, green or blue"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"auth\":\"none\"}", KVG_FIELD_INVALID,
         "auth: \"none\" is not keys or open"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"limits\":[]}", KVG_FIELD_MISTYPED,
         "limits: must be an object, not array"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"limits\":{\"rate\":-1}}", KVG_FIELD_RANGE,
         "limits.rate: must be a number in 0..1e15"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"limits\":{\"rate\":1e999}}", KVG_FIELD_RANGE,
         "limits.rate: must be a number in 0..1e15"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"limits\":{\"burst\":0.5}}", KVG_FIELD_RANGE,
         "limits.burst: must be a number in 1..100"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"limits\":{\"rate\":\"x\"}}", KVG_FIELD_MISTYPED,
         "limits.rate: must be a number in 0..1e15, not string"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"limits\":{\"cap\":1}}", KVG_FIELD_UNKNOWN,
         "limits.cap: unknown field"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"custom\":41}", KVG_FIELD_INVALID,
         "custom: must be the answer"},
        {KVG_SET_ADMIN, "{\"name\":\"n\",\"custom\":42}", KVG_FIELD_UNKNOWN,
         "custom: unknown field"},
        {KVG_SET_STATE, "{\"name\":\"n\",\"count\":7,\"loud\":false}", KVG_FIELD_INVALID,
         "count: 7 needs \"loud\""},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        fix f;
        fix_init(&f, cases[i].from);
        thing t;
        kvg_fields_defaults(&thing_table, &t);
        int rc = decode(&f, &t, cases[i].json);
        if (rc != KVG_EPARSE || f.c.problem != cases[i].problem || strcmp(f.msg, cases[i].msg) != 0)
            fail_msg("case %zu %s: rc %d problem %s \"%s\", want %s \"%s\"", i, cases[i].json, rc,
                     kvg_field_problem_str(f.c.problem), f.msg,
                     kvg_field_problem_str(cases[i].problem), cases[i].msg);
        kvg_arena_done(&f.arena);
    }
    /* a path in front, for objects inside others */
    fix f;
    fix_init(&f, KVG_SET_STATE);
    thing t;
    kvg_fields_defaults(&thing_table, &t);
    assert_int_equal(kvg_fields_decode(&thing_table, &t, parse(&f, "{\"name\":\"n\",\"count\":0}"),
                                       "things[2]", &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "things[2].count: must be an integer in 1..1000");
    assert_int_equal(kvg_fields_decode(&thing_table, &t,
                                       parse(&f, "{\"name\":\"n\",\"count\":7,\"loud\":false}"),
                                       "things[2]", &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "things[2].count: 7 needs \"loud\"");
    /* no message buffer: the verdict alone */
    f.c.msg = NULL;
    assert_int_equal(decode(&f, &t, "{\"x\":1}"), KVG_EPARSE);
    assert_int_equal(f.c.problem, KVG_FIELD_UNKNOWN);
    kvg_arena_done(&f.arena);
}

static void test_wording(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        const char *msg;
    } cases[] = {
        {"{\"name\":\"n\",\"limits\":{\"c\\u0001p\":1}}", "limits.c?p: unknown field"},
        {"{\"note\":\"x\"}", "name: required"},
        {"{\"name\":\"n\",\"tags\":{}}", "tags: must be an array of strings, not object"},
        {"{\"name\":\"n\",\"count\":1.5}", "count: must be an integer in 1..1000"},
        {"{\"name\":\"n\",\"count\":1001}", "count: must be an integer in 1..1000"},
        {"{\"name\":\"n\",\"limits\":{\"rate\":-1}}", "limits.rate: must be a number in 0..1e15"},
        {"{\"name\":\"n\\u0000\"}", "name: must not contain NUL characters"},
        {"{\"name\":\"n\",\"colour\":\"pink\"}", "colour: must be red, green or blue"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        fix f;
        fix_init(&f, KVG_SET_STATE);
        thing t;
        kvg_fields_defaults(&thing_table, &t);
        assert_int_equal(decode(&f, &t, cases[i].json), KVG_EPARSE);
        if (strcmp(f.msg, cases[i].msg) != 0)
            fail_msg("case %zu: \"%s\", want \"%s\"", i, f.msg, cases[i].msg);
        kvg_arena_done(&f.arena);
    }
}

static void test_embed(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_STATE);
    record r;
    kvg_fields_defaults(&record_table, &r);
    r.thing.custom = 0;
    kvg_json *v = parse(&f, "{\"extra\":5,\"name\":\"n\",\"count\":3}");
    assert_int_equal(kvg_fields_decode(&record_table, &r, v, NULL, &f.c), 0);
    assert_int_equal(r.extra, 5);
    assert_int_equal(r.thing.count, 3);
    assert_string_equal(r.thing.name, "n");
    char *s = encode(&record_table, &r, KVG_SET_STATE);
    assert_non_null(strstr(s, "{\"name\":\"n\",\"note\":\"none\""));
    assert_non_null(strstr(s, ",\"extra\":5,\"parts\":[]}"));
    free(s);
    /* arrays of objects: each from its defaults */
    v = parse(&f, "{\"name\":\"n\",\"parts\":[{\"rate\":2},{\"burst\":3}]}");
    assert_int_equal(kvg_fields_decode(&record_table, &r, v, NULL, &f.c), 0);
    assert_int_equal(r.nparts, 2);
    assert_true(r.parts[0].rate == 2 && r.parts[0].burst == 1);
    assert_true(r.parts[1].rate == 0 && r.parts[1].burst == 3);
    s = encode(&record_table, &r, KVG_SET_STATE);
    assert_non_null(strstr(s, ",\"parts\":[{\"rate\":2,\"burst\":1},{\"rate\":0,\"burst\":3}]}"));
    free(s);
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"name\":\"n\",\"parts\":{}}", "parts: must be an array of objects, not object"},
        {"{\"name\":\"n\",\"parts\":[1]}", "parts[0]: must be an object, not number"},
        {"{\"name\":\"n\",\"parts\":[{},{\"burst\":0}]}",
         "parts[1].burst: must be a number in 1..100"},
        {"{\"name\":\"n\",\"parts\":[{},{},{}]}", "parts: more than 2 parts"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        assert_int_equal(kvg_fields_decode(&record_table, &r, parse(&f, bad[i].json), NULL, &f.c),
                         KVG_EPARSE);
        assert_string_equal(f.msg, bad[i].msg);
    }
    /* members of the embedded table are required, repeated and unknown as its own */
    assert_int_equal(kvg_fields_decode(&record_table, &r, parse(&f, "{\"extra\":1}"), NULL, &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "name: required");
    assert_int_equal(kvg_fields_decode(&record_table, &r,
                                       parse(&f, "{\"name\":\"a\",\"count\":1,\"count\":2}"), NULL,
                                       &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "count: appears more than once");
    assert_non_null(kvg_fields_find(&record_table, "count", 5));
    assert_null(kvg_fields_find(&record_table, "counts", 6));
    kvg_arena_done(&f.arena);
}

static int set(fix *f, thing *t, const char *key, const char *text)
{
    return kvg_fields_set_text(&thing_table, t, key, strlen(key), text, strlen(text), "", &f->c);
}

static void test_set_text(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_FLAG);
    thing t;
    kvg_fields_defaults(&thing_table, &t);
    assert_int_equal(set(&f, &t, "name", "w1"), 0);
    assert_int_equal(set(&f, &t, "count", "12"), 0);
    assert_int_equal(set(&f, &t, "tag", "a"), 0);
    assert_int_equal(set(&f, &t, "tag", "b"), 0);
    assert_int_equal(set(&f, &t, "loud", "off"), 0);
    assert_int_equal(set(&f, &t, "colour", "red"), 0);
    assert_int_equal(set(&f, &t, "rate", "2.5"), 0);        /* a FLATTEN member */
    assert_int_equal(set(&f, &t, "limits.burst", "50"), 0); /* or dotted */
    assert_int_equal(set(&f, &t, "budget_mib", "3"), 0);
    assert_string_equal(t.name, "w1");
    assert_int_equal(t.count, 12);
    assert_int_equal(t.ntags, 2);
    assert_string_equal(t.tags[0], "a");
    assert_string_equal(t.tags[1], "b");
    assert_true(t.quiet);
    assert_int_equal(t.colour, RED);
    assert_true(t.limits.rate == 2.5 && t.limits.burst == 50);
    assert_int_equal(t.budget, 3u << 20);

    /* the messages a JSON value gets */
    static const struct {
        const char *key, *text, *msg;
    } bad[] = {
        {"count", "many", "count: must be an integer in 1..1000, not string"},
        {"count", "-1", "count: must be an integer in 1..1000"},
        {"count", "1.5", "count: must be an integer in 1..1000"},
        {"count", "", "count: must be an integer in 1..1000, not string"},
        {"count", "1 ", "count: must be an integer in 1..1000, not string"},
        {"loud", "maybe", "loud: must be true or false, not string"},
        {"colour", "pink", "colour: must be red, green or blue"},
        {"tag", "bad", "tags[2]: \"bad\" is not a tag"},
        {"tags", "x", "tags: unknown field"},
        {"gpu", "1", "gpu: unknown field"},
        {"limits.gpu", "1", "limits.gpu: unknown field"},
        {"custom", "42", "custom: unknown field"}, /* STATE only */
        {"limits", "1", "limits: must be an object, not string"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        assert_int_equal(set(&f, &t, bad[i].key, bad[i].text), KVG_EPARSE);
        if (strcmp(f.msg, bad[i].msg) != 0)
            fail_msg("case %zu: \"%s\", want \"%s\"", i, f.msg, bad[i].msg);
    }
    assert_int_equal(set(&f, &t, "tag", "c"), 0);
    assert_int_equal(set(&f, &t, "tag", "d"), KVG_EPARSE);
    assert_string_equal(f.msg, "tags: more than 3 tags");
    /* a path in front */
    assert_int_equal(kvg_fields_set_text(&thing_table, &t, "count", 5, "0", 1, "--thing", &f.c),
                     KVG_EPARSE);
    assert_string_equal(f.msg, "--thing.count: must be an integer in 1..1000");
    kvg_arena_done(&f.arena);
}

static char *json_of(const kvg_json *v)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_json_write(&b, v);
    return kvg_buf_steal(&b, NULL);
}

static int jset(fix *f, kvg_json *obj, const char *key, const char *text)
{
    return kvg_fields_json_set_text(&thing_table, obj, key, strlen(key), text, strlen(text), &f->c);
}

static void test_json_set_text(void **state)
{
    (void)state;
    fix f;
    fix_init(&f, KVG_SET_CLI);
    kvg_json *obj = kvg_fields_json_object(&f.arena);
    assert_non_null(obj);
    assert_int_equal(jset(&f, obj, "name", "w1"), 0);
    assert_int_equal(jset(&f, obj, "tag", "a"), 0);
    assert_int_equal(jset(&f, obj, "count", "1.5"), 0); /* the gateway's to refuse */
    assert_int_equal(jset(&f, obj, "rate", "0.25"), 0);
    assert_int_equal(jset(&f, obj, "tag", "b"), 0);
    assert_int_equal(jset(&f, obj, "loud", "false"), 0);
    assert_int_equal(jset(&f, obj, "limits.burst", "1e3"), 0);
    char *s = json_of(obj);
    assert_string_equal(s, "{\"name\":\"w1\",\"tags\":[\"a\",\"b\"],\"count\":1.5,\"limits\":"
                           "{\"rate\":0.25,\"burst\":1000.0},\"loud\":false}");
    free(s);
    /* what the built body decodes to at the gateway */
    thing t;
    kvg_fields_defaults(&thing_table, &t);
    f.c.from = KVG_SET_ADMIN;
    assert_int_equal(kvg_fields_decode(&thing_table, &t, obj, "", &f.c), KVG_EPARSE);
    assert_string_equal(f.msg, "count: must be an integer in 1..1000");
    f.c.from = KVG_SET_CLI;
    assert_int_equal(jset(&f, obj, "name", "w2"), KVG_EPARSE);
    assert_string_equal(f.msg, "name: appears more than once");
    obj = kvg_fields_json_object(&f.arena);
    static const struct {
        const char *key, *text, *msg;
    } bad[] = {
        {"size", "-3", "size: must be an integer in 0..18446744073709551615"},
        {"rate", "-0.5", "limits.rate: must be a number in 0..1e15"},
        {"size", "lots", "size: must be an integer in 0..18446744073709551615, not string"},
        {"loud", "yes", "loud: must be true or false, not string"},
        {"custom", "42", "custom: unknown field"},
        {"nope", "1", "nope: unknown field"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        assert_int_equal(jset(&f, obj, bad[i].key, bad[i].text), KVG_EPARSE);
        if (strcmp(f.msg, bad[i].msg) != 0)
            fail_msg("case %zu: \"%s\", want \"%s\"", i, f.msg, bad[i].msg);
    }
    kvg_arena_done(&f.arena);
}

static void test_copy_strings(void **state)
{
    (void)state;
    kvg_arena keep;
    kvg_arena_init(&keep, 0);
    thing t;
    kvg_fields_defaults(&thing_table, &t);
    {
        fix f;
        fix_init(&f, KVG_SET_CONFIG);
        f.c.arena = &keep;
        f.c.copy_strings = true;
        kvg_json *v;
        const char *text = "{\"name\":\"copied\",\"tags\":[\"x\"]}";
        assert_int_equal(kvg_json_parse(text, strlen(text), &f.arena, NULL, &v, NULL), 0);
        assert_int_equal(kvg_fields_decode(&thing_table, &t, v, "", &f.c), 0);
        kvg_arena_done(&f.arena); /* the tree is gone, the strings are not */
    }
    assert_string_equal(t.name, "copied");
    assert_string_equal(t.tags[0], "x");
    kvg_arena_done(&keep);
}

static void test_numbers(void **state)
{
    (void)state;
    static const struct {
        double v;
        const char *s;
    } cases[] = {
        {0, "0"},
        {-0.0, "0"},
        {50, "50"},
        {0.1, "0.1"},
        {1048576.5, "1048576.5"},
        {1e15, "1000000000000000"},
        {1e300, "1e+300"},
        {0.30000000000000004, "0.30000000000000004"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_buf_json_double(&b, cases[i].v);
        assert_string_equal(b.data, cases[i].s);
        kvg_buf_done(&b);
    }
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_json_double(&b, 1.0 / 0.0);
    assert_string_equal(b.data, "null");
    kvg_buf_done(&b);
    char buf[64];
    const kvg_field *f = kvg_fields_find(&thing_table, "budget_mib", 10);
    assert_string_equal(kvg_field_expect(f, buf, sizeof(buf)), "an integer in 1..1024");
    assert_string_equal(kvg_field_problem_str(KVG_FIELD_RANGE), "range");
    assert_string_equal(kvg_field_problem_str(KVG_FIELD_PROBLEM_COUNT), "?");
}

/* Every allocation the walker makes (list arrays, copies, lexed text) fails cleanly: the
 * arena gives -ENOMEM, the walker says "out of memory", nothing leaks (ASan). */
static void test_failing_allocator(void **state)
{
    (void)state;
    const char *text = "{\"name\":\"n\",\"note\":\"x\",\"tags\":[\"a\",\"b\"],\"count\":3}";
    int failures = 0;
    for (long n = 0;; n++) {
        kvg_arena arena;
        kvg_arena_init(&arena, 64); /* small chunks: each copy is an allocation of its own */
        kvg_json *v;
        assert_int_equal(kvg_json_parse(text, strlen(text), &arena, NULL, &v, NULL), 0);
        char msg[128] = "";
        kvg_fields_ctx c = {.from = KVG_SET_CONFIG,
                            .arena = &arena,
                            .copy_strings = true,
                            .msg = msg,
                            .msg_len = sizeof(msg)};
        thing t;
        kvg_fields_defaults(&thing_table, &t);
        fail_alloc_nth(n);
        int rc = kvg_fields_decode(&thing_table, &t, v, "", &c);
        if (rc == 0)
            rc = kvg_fields_set_text(&thing_table, &t, "tag", 3, "c", 1, "", &c);
        kvg_json *obj = NULL;
        if (rc == 0 && !(obj = kvg_fields_json_object(&arena))) {
            fail_alloc_off();
            kvg_arena_done(&arena);
            continue; /* the test's own allocation */
        }
        if (rc == 0)
            rc = kvg_fields_json_set_text(&thing_table, obj, "tag", 3, "x", 1, &c);
        if (rc == 0)
            rc = kvg_fields_json_set_text(&thing_table, obj, "count", 5, "7", 1, &c);
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_arena_done(&arena);
            break;
        }
        if (rc != 0) {
            assert_int_equal(rc, -ENOMEM);
            assert_int_equal(c.problem, KVG_FIELD_NOMEM);
            assert_string_equal(msg, "out of memory");
            failures++;
        }
        kvg_arena_done(&arena);
    }
    assert_true(failures > 3);
}

const struct CMUnitTest fields_tests[] = {
    cmocka_unit_test(test_defaults_and_encode),
    cmocka_unit_test(test_decode_round_trip),
    cmocka_unit_test(test_decode_errors),
    cmocka_unit_test(test_wording),
    cmocka_unit_test(test_embed),
    cmocka_unit_test(test_set_text),
    cmocka_unit_test(test_json_set_text),
    cmocka_unit_test(test_copy_strings),
    cmocka_unit_test(test_numbers),
    cmocka_unit_test(test_failing_allocator),
};
const size_t fields_tests_count = KVG_ARRAY_LEN(fields_tests);
