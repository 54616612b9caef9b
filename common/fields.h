/* SPDX-License-Identifier: Apache-2.0 */
/* Field tables: each field of a resource described once (name, type, place in its struct,
 * range, default, where it may be set) and the walker that decodes JSON objects and key=value
 * text into structs, and encodes structs back to JSON, through them. */
#ifndef KVG_FIELDS_H
#define KVG_FIELDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/*
 * A resource (a worker, a tenant, the policy settings, a section of the config file) has one
 * table, in the module that owns it, in the manner of Redis's static_configs[] and HAProxy's
 * keyword lists:
 *
 *   static const kvg_field worker_fields[] = {
 *       {.name = "kv_blocks", .type = KVG_FIELD_U32, .set_in = KVG_SET_ANY,
 *        .offset = offsetof(kvg_worker_def, kv_blocks), .max = UINT32_MAX},
 *       ...
 *   };
 *   const kvg_fields kvg_worker_fields = {"worker", worker_fields, KVG_ARRAY_LEN(worker_fields)};
 *
 * Every entry point (config file, gateway flags, state file, admin API, `kvgate admin`)
 * decodes and encodes through that table, so a field's type, range, default and message are
 * the same wherever it is set. Messages read "path.field: problem"; the path is the place of
 * the object ("workers[0]", "rate", or nothing at the top) and the field.
 */

typedef enum kvg_field_type {
    KVG_FIELD_STRING = 0, /* const char * (NULL: not set, and not encoded) */
    KVG_FIELD_CHARS,      /* char[max + 1] inside the struct */
    KVG_FIELD_STRINGS,    /* const char ** at offset, its size_t count at count_offset */
    KVG_FIELD_U32,        /* uint32_t */
    KVG_FIELD_U64,        /* uint64_t */
    KVG_FIELD_SIZE,       /* size_t */
    KVG_FIELD_DOUBLE,     /* double */
    KVG_FIELD_BOOL,       /* bool */
    KVG_FIELD_ENUM,       /* an enum (int-sized): the index of its keyword in keywords[] */
    KVG_FIELD_OBJECT,     /* a struct at offset described by the table `object` */
    KVG_FIELD_OBJECTS,    /* an array of such structs (elem_size each) at offset, count at
                             count_offset */
    KVG_FIELD_EMBED,      /* like OBJECT, but its members stand at this level (no name) */
    KVG_FIELD_CUSTOM,     /* decode and encode hooks, for what the types above cannot say */
    KVG_FIELD_TYPE_COUNT,
} kvg_field_type;

/* Where a field may be set (set_in) and where it must be (required_in). A member that cannot
 * be set at an entry point is an unknown field there. */
enum {
    KVG_SET_CONFIG = 1u << 0, /* the config file */
    KVG_SET_FLAG = 1u << 1,   /* the gateway's command line */
    KVG_SET_STATE = 1u << 2,  /* the state file */
    KVG_SET_ADMIN = 1u << 3,  /* admin API bodies */
    KVG_SET_CLI = 1u << 4,    /* kvgate admin options */
    KVG_SET_ANY = 0x1f,
};

/* kvg_field.flags */
enum {
    KVG_FIELD_NEGATE = 1u << 0,   /* BOOL stored inverted: the struct holds the opposite */
    KVG_FIELD_NULLABLE = 1u << 1, /* STRING: JSON null means "not set" */
    KVG_FIELD_NONEMPTY = 1u << 2, /* STRING, CHARS: at least one byte */
    KVG_FIELD_FLATTEN = 1u << 3,  /* OBJECT: in key=value text its members go by their own names */
    KVG_FIELD_AS_BOOL = 1u << 4,  /* ENUM of two keywords stored in a bool (the second = true) */
};

typedef struct kvg_fields kvg_fields;
typedef struct kvg_fields_ctx kvg_fields_ctx;

typedef struct kvg_field {
    const char *name; /* JSON member; key of key=value text */
    kvg_field_type type;
    unsigned set_in;      /* KVG_SET_* */
    unsigned required_in; /* KVG_SET_*: absent there is an error (JSON objects only) */
    unsigned flags;       /* KVG_FIELD_* */
    size_t offset;        /* of the value in the target struct */
    size_t count_offset;  /* STRINGS, OBJECTS: of its size_t count */
    size_t elem_size;     /* OBJECTS: of one struct */
    /* Range. Integers: min..max of the value as written (0..0 means the type's whole range).
     * STRING, CHARS: min..max bytes (max 0: any; CHARS: max is the room, without the NUL).
     * STRINGS, OBJECTS: max items (0: any). */
    uint64_t min, max;
    double dmin, dmax; /* DOUBLE: min..dmax, finite */
    unsigned shift;    /* integers: the struct holds the written value << shift (MiB -> bytes) */
    const char *const *keywords; /* ENUM: keyword of each value, nkeywords of them */
    size_t nkeywords;
    const kvg_fields *object; /* OBJECT, OBJECTS, EMBED */
    const char *item;         /* STRINGS: key=value name of one item ("model=a,model=b") */
    /* The default, as written: what kvg_fields_defaults stores. */
    union {
        uint64_t u; /* integers, ENUM */
        double d;
        bool b; /* BOOL (before NEGATE) */
        const char *s;
    } def;
    /* Template for a value of the right type that is refused; NULL: "{path}: must be
     * {expect}" (the placeholders are listed below, before kvg_field_problem). */
    const char *invalid;
    /** Further check of a decoded value (for STRINGS, of each item): 0, or a negative code with
     *  the problem in why, without the field's name ("must be an absolute path"). */
    int (*check)(const void *value, char *why, size_t why_len);
    /** CUSTOM: decode v into target at path; errors through kvg_fields_fail. */
    int (*decode)(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c);
    /** CUSTOM: append the field's JSON value (or nothing, to leave the member out: then return
     *  false). */
    bool (*encode)(const void *target, kvg_buf *out);
} kvg_field;

struct kvg_fields {
    const char *name; /* what one object is ("worker"), for documentation and messages */
    const kvg_field *fields;
    size_t count;
    /** Rules across fields, run after each decode of an object: 0, or a negative code with
     *  "field: problem" in why (the object's path is put in front). May be NULL. */
    int (*check)(const void *target, char *why, size_t why_len);
};

/*
 * Messages: one wording per problem, the same at every entry point, which puts only its context
 * in front ("FILE: ", "--worker w1 (k=v): ", "state file PATH: workers: worker \"w1\": ",
 * "kvgate admin: 400: "):
 *   unknown   "{path}: unknown field"
 *   repeated  "{path}: appears more than once"
 *   missing   "{path}: required"
 *   mistyped  "{path}: must be {shape}, not {type}"
 *   range     "{path}: must be {expect}" (out of range, or a fraction for an integer)
 *   NUL       "{path}: must not contain NUL characters"
 *   invalid   the field's invalid template, else "{path}: must be {expect}"; check hooks say
 *             "{path}: <their why>"
 * Placeholders of templates:
 *   {path}     the field's path ("workers[0].kv_blocks", "rate.rps"); an unknown member's name
 *              is shown printable and bounded
 *   {expect}   every value the field takes ("an integer in 0..4294967295", "isolated, group
 *              or global")
 *   {shape}    what a value must look like: {expect}, except "a string" for keywords
 *   {type}     the JSON type of the value given ("string", "null")
 *   {keywords} a keyword field's keywords, separated by commas
 *   {value}    the string given (printable, bounded)
 */

/* What went wrong, for callers that answer differently (a usage error, a 400, a 409). */
typedef enum kvg_field_problem {
    KVG_FIELD_OK = 0,
    KVG_FIELD_UNKNOWN,  /* no such field, or not settable here */
    KVG_FIELD_REPEATED, /* the same member twice */
    KVG_FIELD_MISSING,  /* required and absent */
    KVG_FIELD_MISTYPED, /* the JSON type (or the text) does not fit the field */
    KVG_FIELD_RANGE,    /* the right type, a value the field does not take */
    KVG_FIELD_INVALID,  /* refused by a check (of the field or of the object) */
    KVG_FIELD_NOMEM,    /* out of memory */
    KVG_FIELD_PROBLEM_COUNT,
} kvg_field_problem;

/** Name of a problem ("unknown", "range", ...). */
const char *kvg_field_problem_str(kvg_field_problem p);

/* One decode: where from, where copies go, where the first error goes. */
struct kvg_fields_ctx {
    unsigned from;     /* the entry point: a KVG_SET_* (or several that take
                          the same fields, as the policy settings do) */
    kvg_arena *arena;  /* lists, and strings when copy_strings; required for them */
    bool copy_strings; /* false: strings point into the JSON tree (which must
                          outlive the target) */
    char *msg;         /* the first error, "path: problem" (may be NULL) */
    size_t msg_len;
    kvg_field_problem problem; /* out: what the first error was */
};

/** Store every field's default into target (nested objects too; CUSTOM fields untouched).
 *  Strings get the table's pointers (static storage). */
void kvg_fields_defaults(const kvg_fields *t, void *target);

/** Decode the JSON object obj over target: members present replace the value, absent ones
 *  keep it (start from kvg_fields_defaults for a whole definition). path is the object's place
 *  for messages ("" or NULL at the top). Unknown (or not settable at c->from), repeated,
 *  mistyped and out-of-range members, required ones that are absent and refusals of checks
 *  fail with the first message in c->msg. Returns 0, KVG_EPARSE or -ENOMEM. On failure target
 *  may be partly written: decode into a copy when that matters. */
int kvg_fields_decode(const kvg_fields *t, void *target, const kvg_json *obj, const char *path,
                      kvg_fields_ctx *c);

/** Set one field from key=value text (a flag's item). key is a member name, a dotted path
 *  ("rate.rps"), a member of a FLATTEN object ("rps") or a STRINGS item name, which appends
 *  ("model"). The text is read by the field's type: numbers as JSON numbers, booleans as
 *  true/false/on/off, anything else as the string itself; then checked as a JSON value would be,
 *  with the same messages. path is put in front of the key in messages. Returns as
 *  kvg_fields_decode. */
int kvg_fields_set_text(const kvg_fields *t, void *target, const char *key, size_t key_len,
                        const char *text, size_t text_len, const char *path, kvg_fields_ctx *c);

/** An empty JSON object in arena (NULL when out of memory), for kvg_fields_json_set_text. */
kvg_json *kvg_fields_json_object(kvg_arena *arena);
/** Add key=value text to obj as the JSON member the field takes (for `kvgate admin`, which
 *  builds a request body and leaves the values to the gateway): keys as kvg_fields_set_text;
 *  the text is read by the field's type, and only what cannot be that type is refused here (a
 *  number that is not one, or has a sign: no field takes a negative value), with the message
 *  the gateway would give. A member set twice is an error; list items append. Returns 0,
 *  KVG_EPARSE or -ENOMEM (c->arena required). */
int kvg_fields_json_set_text(const kvg_fields *t, kvg_json *obj, const char *key, size_t key_len,
                             const char *text, size_t text_len, kvg_fields_ctx *c);

/** Append target as one JSON object: the fields settable in `in` (KVG_SET_*), in table order;
 *  STRING fields that are NULL are left out. */
void kvg_fields_encode(const kvg_fields *t, const void *target, unsigned in, kvg_buf *out);
/** The members alone (no braces), each preceded by a comma unless *first, which is then
 *  cleared: for objects that add members of their own. */
void kvg_fields_encode_members(const kvg_fields *t, const void *target, unsigned in, bool *first,
                               kvg_buf *out);

/** Field by name (EMBED members included); NULL if absent. */
const kvg_field *kvg_fields_find(const kvg_fields *t, const char *name, size_t len);
/** Write what the field takes ("an integer in 0..4294967295") into buf; returns buf. */
const char *kvg_field_expect(const kvg_field *f, char *buf, size_t len);

/** For CUSTOM decoders and callers: record "path: <fmt>" ("<fmt>" when path is empty) as the
 *  error and return KVG_EPARSE (-ENOMEM for KVG_FIELD_NOMEM). */
int kvg_fields_fail(kvg_fields_ctx *c, kvg_field_problem problem, const char *path, const char *fmt,
                    ...) KVG_PRINTF(4, 5);
/** For CUSTOM decoders: v as a string without NUL characters, with the walker's messages for
 *  anything else. 0 and *out (borrowed from v), or KVG_EPARSE. */
int kvg_fields_get_string(kvg_fields_ctx *c, const kvg_json *v, const char *path, const char **out);
/** Join a path and a member name ("rate" + "rps" -> "rate.rps"; "" + "rps" -> "rps") into buf
 *  (truncated to len); returns buf. */
const char *kvg_fields_path(char *buf, size_t len, const char *path, const char *name);

/** Append the shortest decimal that reads back as v: integers (below 2^53) without a
 *  fraction, -0 as 0, infinities and NaN as null. */
void kvg_buf_json_double(kvg_buf *b, double v);

#endif
