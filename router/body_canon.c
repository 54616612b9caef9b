/* SPDX-License-Identifier: Apache-2.0 */
/* The canonical prefix stream (docs/canonical.md): the typed scanners of prompt, messages and
 * tools that validate, check types and write the stream in the body scan's single pass. */
#include "body_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

/*
 * kvg_body_scan hands the values of prompt, messages and tools to the scanners here (body.c,
 * scan_member), which validate, check types and emit the stream as they go, without a tree: a
 * string that goes into the stream as it stands (a message's content, a prompt) is decoded into
 * it by the string scanner in the same pass (scan_put_string); one that waits for a later member
 * (a text part's text) is copied in bulk afterwards, decoded only if it holds escapes.
 */

/* ---- the canonical prefix stream (docs/canonical.md) ---------------------------------------- */

/* Separators of the stream: ASCII's record, unit, group and file separators. */
#define SEP_RECORD 0x1e /* opens a message or the tools section */
#define SEP_UNIT 0x1f   /* between the fields of one */
#define SEP_GROUP 0x1d  /* closes it */
#define SEP_FILE 0x1c   /* around a media reference */

/* Depths (the body is 1) of the values the typed scanners walk themselves; scan_value takes
 * over below them with the right depth, so the 64-level limit and its offsets are unchanged. */
#define DEPTH_MEMBER 2  /* prompt, messages, tools */
#define DEPTH_ITEM 3    /* prompt[i], messages[i] */
#define DEPTH_FIELD 4   /* prompt[i][j], messages[i].content */
#define DEPTH_PART 5    /* messages[i].content[j] */
#define DEPTH_PART_V 6  /* messages[i].content[j].image_url */
#define DEPTH_MEDIA_V 7 /* messages[i].content[j].image_url.url */

/* The longest nested key or type name we look for ("function_call_output"), and its longest
 * escaped spelling. */
#define NESTED_KEY_MAX 20
#define NESTED_KEY_RAW_MAX (6 * NESTED_KEY_MAX)

/* Bytes of stream the rest of a body, rem bytes, can produce. Decoding, minimal re-escaping and
 * dropping whitespace never grow a string or a value, and each separator replaces at least as
 * many bytes of JSON syntax (a message `{"role":""}` is 11 bytes, its frame 3), except a media
 * part: at least 37 bytes of JSON (`{"type":"file","file":{"file_id":""}}`) that become at most
 * 2 bytes more than that (`\x1cvideo_url:<32 hex>\x1c` is 44 bytes for a 43-byte part). rem/8
 * covers that, 64 the tools frame (whose key may lie before the counted bytes). As this holds
 * piece by piece, it holds at every point of the body: the stream written so far leaves room
 * for as many bytes as the body has left (which scan_put_string relies on).
 * A responses body has frames that outgrow their JSON more: a function_call item (61 bytes at
 * least, `{"type":"function_call","call_id":"","name":"","arguments":""}`) becomes 90 bytes
 * plus its strings, an item of another type (`{"type":""}`, 11) its canonical JSON plus 7, an
 * input_image or input_file part (35 and 34 bytes with a file_id) a 40- or 39-byte reference,
 * instructions and a string input (`""`) 9 and 7 bytes: twice the bytes bounds each piece, with
 * room for the body's rest to spare, and 64 the frames whose keys lie before the counted bytes. */
static size_t stream_capacity(kvg_body_api api, size_t rem)
{
    if (api == KVG_BODY_API_RESPONSES)
        return 2 * rem + 64;
    return rem + rem / 8 + 64;
}

static int canon_reserve(rewrite *rw, const unsigned char *v)
{
    canon *c = &rw->canon;
    if (c->buf)
        return 0;
    size_t cap = stream_capacity(rw->api, (size_t)(rw->sc.end - v));
    c->buf = kvg_arena_alloc(rw->arena, cap);
    if (!c->buf)
        return fail(&rw->sc, -ENOMEM, v, "out of memory");
    c->cap = cap;
    return 0;
}

static inline bool room(canon *c, size_t n)
{
    if (n <= c->cap - c->len)
        return true;
    c->overflow = true;
    return false;
}

static inline void put(canon *c, const void *d, size_t n)
{
    if (room(c, n)) {
        kvg_copy(c->buf + c->len, d, n);
        c->len += n;
    }
}

static inline void put1(canon *c, unsigned char b)
{
    if (room(c, 1))
        c->buf[c->len++] = b;
}

#define PUT_LIT(c, lit) put((c), (lit), sizeof(lit) - 1)

/* The decoded contents [s, e) of an accepted string. Plain runs are one memcpy. */
static inline void put_string(canon *c, const unsigned char *s, const unsigned char *e,
                              bool escaped)
{
    size_t raw = (size_t)(e - s);
    if (!room(c, raw))
        return;
    if (escaped) {
        c->len += decode_string(s, e, c->buf + c->len);
    } else {
        kvg_copy(c->buf + c->len, s, raw);
        c->len += raw;
    }
}

/* Scan the string at *pp (on its quote) and append its decoded contents, as put_string would,
 * in the same pass. The writes stay within the rest of the body's length, which the stream has
 * room for at every point of the body (see stream_capacity). */
static int scan_put_string(rewrite *rw, const unsigned char **pp)
{
    canon *c = &rw->canon;
    bool escaped;
    if (!room(c, (size_t)(rw->sc.end - *pp)))
        return scan_string(&rw->sc, pp, &escaped);
    unsigned char *o = c->buf + c->len;
    int rc = scan_string_to(&rw->sc, pp, &escaped, &o, NULL);
    if (rc == 0)
        c->len = (size_t)(o - c->buf);
    return rc;
}

/* Re-encode the contents [s, e) of an accepted string that holds escapes, minimally (see
 * put_json_char). Never longer than the input: every character that needs an escape came from
 * an escape at least as long. */
static size_t reencode_string(const unsigned char *s, const unsigned char *e, unsigned char *o)
{
    return transcode_string(s, e, o, true);
}

/* An accepted string [s, e) (contents) as canonical JSON, quotes included. */
static void put_json_string(canon *c, const unsigned char *s, const unsigned char *e, bool escaped)
{
    size_t raw = (size_t)(e - s);
    if (!room(c, raw + 2))
        return;
    unsigned char *o = c->buf + c->len;
    *o++ = '"';
    if (escaped) {
        o += reencode_string(s, e, o);
    } else {
        /* Without escapes a string holds no '"', '\\' or control: it is minimal already. */
        kvg_copy(o, s, raw);
        o += raw;
    }
    *o++ = '"';
    c->len = (size_t)(o - c->buf);
}

/* walk_value's hooks for canon_json: tokens as they stand (a bracket or a separator in one
 * store, as a put1), strings re-encoded. */
static void canon_bytes(void *out, const unsigned char *s, size_t n)
{
    if (n == 1)
        put1(out, *s);
    else
        put(out, s, n);
}

static void canon_string(void *out, const unsigned char *s, const unsigned char *e, bool escaped)
{
    put_json_string(out, s, e, escaped);
}

/* Scan one value at *pp (whitespace first) at nesting depth `depth`, like scan_value, and
 * append it to the stream as canonical JSON: no insignificant whitespace, member order and
 * duplicates kept, strings re-encoded minimally, numbers and literals as their source text. */
static int canon_json(rewrite *rw, const unsigned char **pp, unsigned depth)
{
    return walk_value(&rw->sc, pp, depth, canon_bytes, canon_string, &rw->canon);
}

/* Index of the key [s, e) (contents of an accepted string, decoded when escaped) in names, or
 * -1. The keys looked for are short, so a long raw key cannot be one of them. */
static int key_index(const unsigned char *s, const unsigned char *e, bool escaped,
                     const char *const *names, int n)
{
    unsigned char buf[NESTED_KEY_RAW_MAX];
    const unsigned char *k = s;
    size_t len = (size_t)(e - s);
    if (escaped) {
        if (len > sizeof(buf))
            return -1;
        len = decode_string(s, e, buf);
        k = buf;
    }
    if (len > NESTED_KEY_MAX)
        return -1;
    for (int i = 0; i < n; i++)
        if (names[i] && strlen(names[i]) == len && memcmp(names[i], k, len) == 0)
            return i;
    return -1;
}

/* The container walk shared by the typed scanners, with the grammar and offsets of walk_value;
 * `close` is '}' for an object, ']' for an array. first_item: *pp on the opening bracket;
 * returns 1 with *pp on the first key or element, 0 with *pp past an empty container.
 * next_item: after a member's value or an element, 1 with *pp on the next key or element, 0
 * with *pp past `close`. obj_key: scans the key at *pp and the ':' after it, sets *k to the
 * key's index in names (n of them) or -1, and leaves *pp on the value (whitespace skipped, end
 * checked); its callers start *k at -1 all the same, as gcc -O3 does not see that it is set
 * whenever obj_key returns 0. Negative returns are parse errors. */

/* The key or element that comes at p (whitespace skipped): an element is checked to be there,
 * a key by obj_key, each with walk_value's message at the end of the body. */
static int item_at(const scanner *sc, const unsigned char **pp, const unsigned char *p,
                   unsigned char close)
{
    if (close == ']' && p == sc->end)
        return fail(sc, KVG_EPARSE, p, "unexpected end of input");
    *pp = p;
    return 1;
}

static int first_item(const scanner *sc, const unsigned char **pp, unsigned char close)
{
    const unsigned char *p = skip_ws(*pp + 1, sc->end);
    if (p < sc->end && *p == close) {
        *pp = p + 1;
        return 0;
    }
    return item_at(sc, pp, p, close);
}

static int next_item(const scanner *sc, const unsigned char **pp, unsigned char close)
{
    bool obj = close == '}';
    const unsigned char *p = skip_ws(*pp, sc->end);
    if (p == sc->end)
        return fail(sc, KVG_EPARSE, p, obj ? "unterminated object" : "unterminated array");
    if (*p == ',')
        return item_at(sc, pp, skip_ws(p + 1, sc->end), close);
    if (*p != close)
        return fail(sc, KVG_EPARSE, p,
                    obj ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
    *pp = p + 1;
    return 0;
}

static int obj_key(const scanner *sc, const unsigned char **pp, const char *const *names, int n,
                   int *k)
{
    const unsigned char *p = *pp, *end = sc->end;
    bool escaped;
    if (p == end || *p != '"')
        return fail(sc, KVG_EPARSE, p, "expected string key in object");
    int rc = scan_key(sc, &p, &escaped);
    if (rc < 0)
        return rc;
    const unsigned char *ks = *pp + 1, *ke = p - 1;
    p = skip_ws(p, end);
    if (p == end || *p != ':')
        return fail(sc, KVG_EPARSE, p, "expected ':' after object key");
    p = skip_ws(p + 1, end);
    if (p == end)
        return fail(sc, KVG_EPARSE, p, "unexpected end of input");
    *k = key_index(ks, ke, escaped, names, n);
    *pp = p;
    return 0;
}

/* ---- completions: "prompt" ---- */

static int tokens_reserve(rewrite *rw, const unsigned char *v)
{
    canon *c = &rw->canon;
    if (c->tokens)
        return 0;
    /* A token id takes a digit and a separator: the rest of the body holds fewer than
     * rem / 2 + 1 of them. */
    size_t cap = (size_t)(rw->sc.end - v) / 2 + 1;
    c->tokens = kvg_arena_alloc(rw->arena, cap * sizeof(uint32_t));
    if (!c->tokens)
        return fail(&rw->sc, -ENOMEM, v, "out of memory");
    c->tcap = cap;
    return 0;
}

#define TOKEN_ID "a token id (an integer from 0 to 4294967295)"

/* "prompt[i]" or, with idx2 (not SIZE_MAX), "prompt[i][j]", into buf. */
static const char *token_path(char *buf, size_t len, size_t idx, size_t idx2)
{
    if (idx2 == SIZE_MAX)
        snprintf(buf, len, "prompt[%zu]", idx);
    else
        snprintf(buf, len, "prompt[%zu][%zu]", idx, idx2);
    return buf;
}

/* One element of a token-id list at *pp (on its first byte), appended to the stream when
 * store. idx2 is SIZE_MAX for prompt[i], the inner index for prompt[i][j]. */
static int scan_token(rewrite *rw, const unsigned char **pp, unsigned depth, bool store, size_t idx,
                      size_t idx2)
{
    const unsigned char *v = *pp;
    char path[48]; /* written only for an error: a prompt may hold 100k ids */
    if (*v != '-' && (*v < '0' || *v > '9')) {
        int rc = kvg_body_scan_value(&rw->sc, pp, depth);
        if (rc == 0)
            kvg_body_type_error(rw, v, "%s: must be " TOKEN_ID ", not %s",
                                token_path(path, sizeof(path), idx, idx2), value_type(*v));
        return rc;
    }
    int rc = kvg_body_scan_number(&rw->sc, pp);
    if (rc < 0)
        return rc;
    const unsigned char *q = v + (*v == '-');
    uint64_t id = 0;
    for (; q < *pp; q++) {
        if (*q < '0' || *q > '9' || id > UINT32_MAX) {
            id = UINT64_MAX; /* a fraction, an exponent or too many digits */
            break;
        }
        id = id * 10 + (uint64_t)(*q - '0');
    }
    if (id > UINT32_MAX || (*v == '-' && id != 0)) {
        kvg_body_type_error(rw, v, "%s: must be " TOKEN_ID,
                            token_path(path, sizeof(path), idx, idx2));
        return 0;
    }
    canon *c = &rw->canon;
    if (store) {
        if (c->ntokens < c->tcap)
            c->tokens[c->ntokens++] = (uint32_t)id;
        else
            c->overflow = true;
    }
    return 0;
}

/* prompt[idx] of a list of token-id lists: itself a non-empty list of token ids. */
static int scan_token_list(rewrite *rw, const unsigned char **pp, bool store, size_t idx)
{
    const unsigned char *v = *pp, *p = v;
    int rc;
    if (*v != '[') {
        rc = kvg_body_scan_value(&rw->sc, pp, DEPTH_ITEM);
        if (rc == 0)
            kvg_body_type_error(rw, v, "prompt[%zu]: must be an array of token ids, not %s", idx,
                                value_type(*v));
        return rc;
    }
    rc = first_item(&rw->sc, &p, ']');
    if (rc == 0)
        kvg_body_type_error(rw, v, "prompt[%zu]: must not be empty", idx);
    for (size_t j = 0; rc > 0; j++) {
        rc = scan_token(rw, &p, DEPTH_FIELD, store, idx, j);
        if (rc < 0)
            return rc;
        rc = next_item(&rw->sc, &p, ']');
    }
    if (rc < 0)
        return rc;
    *pp = p;
    return 0;
}

/* The array form of "prompt": its first element says which one (strings, token ids, lists of
 * token ids) and only that element feeds the stream; the others are checked. */
static int scan_prompt_array(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp, *p = v;
    canon *c = &rw->canon;
    int rc = first_item(&rw->sc, &p, ']');
    if (rc <= 0) {
        if (rc == 0)
            kvg_body_type_error(rw, v, "prompt: must not be empty");
        *pp = p;
        return rc;
    }
    unsigned char kind = *p;
    bool tokens = kind == '-' || (kind >= '0' && kind <= '9');
    if (tokens || kind == '[') {
        rc = tokens_reserve(rw, v);
        c->is_tokens = true;
    } else {
        rc = canon_reserve(rw, v);
    }
    for (size_t i = 0; rc == 0; i++) {
        const unsigned char *e = p;
        if (tokens) {
            rc = scan_token(rw, &p, DEPTH_ITEM, true, i, SIZE_MAX);
        } else if (kind == '[') {
            rc = scan_token_list(rw, &p, i == 0, i);
        } else if (kind == '"' && *e == '"' && i == 0) {
            rc = scan_put_string(rw, &p);
        } else if (kind == '"' && *e == '"') {
            bool escaped;
            rc = scan_string(&rw->sc, &p, &escaped);
        } else {
            rc = kvg_body_scan_value(&rw->sc, &p, DEPTH_ITEM);
            if (rc == 0 && kind == '"')
                kvg_body_type_error(rw, e, "prompt[%zu]: must be a string, not %s", i,
                                    value_type(*e));
            else if (rc == 0)
                kvg_body_type_error(
                    rw, e,
                    "prompt[0]: must be a string, a token id or an array of token ids, "
                    "not %s",
                    value_type(*e));
        }
        if (rc < 0)
            return rc;
        rc = next_item(&rw->sc, &p, ']');
        rc = rc > 0 ? 0 : rc < 0 ? rc : 1;
    }
    if (rc < 0)
        return rc;
    *pp = p;
    return 0;
}

int kvg_body_scan_prompt(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    int rc;
    if (rw->seen[MEMBER_PROMPT] > 1) {
        kvg_body_type_error(rw, v, "prompt: appears more than once");
        return kvg_body_scan_value(&rw->sc, pp, DEPTH_MEMBER);
    }
    if (*v == '[')
        return scan_prompt_array(rw, pp);
    if (*v != '"') {
        rc = kvg_body_scan_value(&rw->sc, pp, DEPTH_MEMBER);
        if (rc == 0 && *v != 'n') /* null: no prompt, like an absent one */
            kvg_body_type_error(rw, v, "prompt: must be a string or an array, not %s",
                                value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc == 0)
        rc = scan_put_string(rw, pp);
    return rc;
}

/* ---- chat: "messages" and "tools" ---- */

/* The parts of a message in stream order; a message's members may come in any order. */
typedef enum piece {
    PIECE_ROLE = 0,
    PIECE_NAME,
    PIECE_CONTENT,
    PIECE_TOOL_CALLS,
    PIECE_TOOL_CALL_ID,
    PIECE_COUNT,
} piece;

static const char *const piece_key[PIECE_COUNT] = {"role", "name", "content", "tool_calls",
                                                   "tool_call_id"};

/* Members of a content part; the types of part are the members after "type" and "text". */
enum {
    PART_TYPE = 0,
    PART_TEXT,
    PART_IMAGE_URL,
    PART_INPUT_AUDIO,
    PART_FILE,
    PART_VIDEO_URL,
    PART_KEY_COUNT
};

static const char *const part_key[PART_KEY_COUNT] = {"type",        "text", "image_url",
                                                     "input_audio", "file", "video_url"};
/* The tag of a media part in the stream. */
static const char *const part_tag[PART_KEY_COUNT] = {NULL,          NULL,   "image",
                                                     "input_audio", "file", "video_url"};

/* Members of a media object that name the media. */
enum { REF_URL = 0, REF_DATA, REF_FILE_ID, REF_FILE_DATA, REF_COUNT };
static const char *const ref_key[REF_COUNT] = {"url", "data", "file_id", "file_data"};

static int scratch_reserve(rewrite *rw)
{
    canon *c = &rw->canon;
    if (!c->scratch) {
        c->scratch = kvg_arena_alloc(rw->arena, c->cap);
        if (!c->scratch)
            return fail(&rw->sc, -ENOMEM, rw->sc.start, "out of memory");
    }
    return 0;
}

/* A string value recorded for later: contents [s, e). */
typedef struct span {
    const unsigned char *v; /* the value's first byte; NULL: member absent */
    const unsigned char *s, *e;
    bool is_string, escaped;
} span;

/* Where a message's content lives, for type errors: "<base>[<i>].<field>" ("messages[2].content",
 * "input[3].output"). */
typedef struct where {
    const char *base;
    size_t i;
    const char *field;
} where;

/* Scan the value at *pp (on its first byte) into sp: strings are scanned (and recorded),
 * anything else validated. */
static int scan_span(rewrite *rw, const unsigned char **pp, unsigned depth, span *sp)
{
    sp->v = *pp;
    if (**pp != '"')
        return kvg_body_scan_value(&rw->sc, pp, depth);
    sp->is_string = true;
    sp->s = *pp + 1;
    int rc = scan_string(&rw->sc, pp, &sp->escaped);
    sp->e = *pp - 1;
    return rc;
}

/* The members named in keys[0..n) of the object at *pp (on its '{'), each as the span of its
 * first occurrence in mem; the position of each one's first repeat in dup (NULL: none). Other
 * members are validated and skipped. Records no type error (the caller says what a repeat
 * means). Leaves *pp after the object. 0, or the scanner's error. */
static int collect_members(rewrite *rw, const unsigned char **pp, const char *const *keys, int n,
                           unsigned depth, span *mem, const unsigned char **dup)
{
    const scanner *sc = &rw->sc;
    const unsigned char *p = *pp;
    int rc = first_item(sc, &p, '}');
    while (rc > 0) {
        int k = -1;
        rc = obj_key(sc, &p, keys, n, &k);
        if (rc < 0)
            return rc;
        if (k < 0 || mem[k].v) {
            if (k >= 0 && !dup[k])
                dup[k] = p;
            rc = kvg_body_scan_value(sc, &p, depth);
        } else {
            rc = scan_span(rw, &p, depth, &mem[k]);
        }
        if (rc < 0)
            return rc;
        rc = next_item(sc, &p, '}');
    }
    if (rc < 0)
        return rc;
    *pp = p;
    return 0;
}

/* The key of the earliest repeat collect_members found, or -1. */
static int earliest_repeat(const unsigned char *const *dup, int n)
{
    int first = -1;
    for (int k = 0; k < n; k++)
        if (dup[k] && (first < 0 || dup[k] < dup[first]))
            first = k;
    return first;
}

/* The media object of a part (already validated: parse errors cannot happen here) at v:
 * its reference string hashed into the stream as \x1c<tag>:<32 hex>\x1c. */
static int emit_digest(rewrite *rw, const unsigned char *v, const char *tag, const span *ref);

static int emit_media(rewrite *rw, const unsigned char *v, int type, const where *w, size_t j)
{
    const scanner *sc = &rw->sc;
    const char *tk = part_key[type];
    if (*v != '{') {
        kvg_body_type_error(rw, v, "%s[%zu].%s[%zu].%s: must be an object, not %s", w->base, w->i,
                            w->field, j, tk, value_type(*v));
        return 0;
    }
    span refs[REF_COUNT] = {{0}};
    const unsigned char *p = v;
    int rc = first_item(sc, &p, '}');
    while (rc > 0) {
        int k = -1;
        rc = obj_key(sc, &p, ref_key, REF_COUNT, &k);
        if (rc < 0)
            return rc;
        bool wanted = type == PART_FILE          ? (k == REF_FILE_ID || k == REF_FILE_DATA)
                      : type == PART_INPUT_AUDIO ? k == REF_DATA
                                                 : k == REF_URL;
        if (!wanted) {
            rc = kvg_body_scan_value(sc, &p, DEPTH_MEDIA_V);
        } else if (refs[k].v) {
            kvg_body_type_error(rw, p, "%s[%zu].%s[%zu].%s.%s: appears more than once", w->base,
                                w->i, w->field, j, tk, ref_key[k]);
            rc = kvg_body_scan_value(sc, &p, DEPTH_MEDIA_V);
        } else {
            rc = scan_span(rw, &p, DEPTH_MEDIA_V, &refs[k]);
            if (rc == 0 && !refs[k].is_string)
                kvg_body_type_error(rw, refs[k].v,
                                    "%s[%zu].%s[%zu].%s.%s: must be a string, not %s", w->base,
                                    w->i, w->field, j, tk, ref_key[k], value_type(*refs[k].v));
        }
        if (rc < 0)
            return rc;
        rc = next_item(sc, &p, '}');
    }
    if (rc < 0)
        return rc;
    const span *ref = type == PART_FILE
                          ? (refs[REF_FILE_ID].v ? &refs[REF_FILE_ID] : &refs[REF_FILE_DATA])
                      : type == PART_INPUT_AUDIO ? &refs[REF_DATA]
                                                 : &refs[REF_URL];
    if (!ref->v) {
        if (type == PART_FILE)
            kvg_body_type_error(rw, v, "%s[%zu].%s[%zu].file: needs file_id or file_data", w->base,
                                w->i, w->field, j);
        else
            kvg_body_type_error(rw, v, "%s[%zu].%s[%zu].%s.%s: missing", w->base, w->i, w->field, j,
                                tk, type == PART_INPUT_AUDIO ? "data" : "url");
        return 0;
    }
    return emit_digest(rw, v, part_tag[type], ref);
}

/* A media reference (a string member, already validated, of the value at v) into the stream as
 * \x1c<tag>:<32 hex>\x1c; nothing when it is not a string (a type error already). */
static int emit_digest(rewrite *rw, const unsigned char *v, const char *tag, const span *ref)
{
    const scanner *sc = &rw->sc;
    if (!ref->is_string)
        return 0;
    const unsigned char *s = ref->s;
    size_t n = (size_t)(ref->e - ref->s);
    if (ref->escaped) {
        unsigned char *d = kvg_arena_alloc(rw->arena, n ? n : 1);
        if (!d)
            return fail(sc, -ENOMEM, v, "out of memory");
        n = decode_string(ref->s, ref->e, d);
        s = d;
    }
    XXH128_hash_t digest = XXH3_128bits(s, n);
    unsigned char frame[64];
    size_t tl = strlen(tag), f = 0;
    frame[f++] = SEP_FILE;
    memcpy(frame + f, tag, tl);
    f += tl;
    frame[f++] = ':';
    /* XXH128's canonical form: high half then low, each big-endian, in lowercase hex. */
    kvg_fmt_hex64((char *)frame + f, digest.high64);
    kvg_fmt_hex64((char *)frame + f + 16, digest.low64);
    f += 32;
    frame[f++] = SEP_FILE;
    put(&rw->canon, frame, f);
    return 0;
}

/* messages[i].content[j], at *pp (on its first byte). Its members may come in any order, so
 * they are recorded and the part is emitted once its type is known. */
static int scan_part(rewrite *rw, const unsigned char **pp, const where *w, size_t j,
                     bool *prev_text)
{
    const scanner *sc = &rw->sc;
    const unsigned char *o = *pp, *p = o;
    int rc;
    if (*o != '{') {
        rc = kvg_body_scan_value(sc, pp, DEPTH_PART);
        if (rc == 0)
            kvg_body_type_error(rw, o, "%s[%zu].%s[%zu]: must be an object, not %s", w->base, w->i,
                                w->field, j, value_type(*o));
        return rc;
    }
    span mem[PART_KEY_COUNT] = {{0}};
    const unsigned char *dup[PART_KEY_COUNT] = {0};
    rc = collect_members(rw, &p, part_key, PART_KEY_COUNT, DEPTH_PART_V, mem, dup);
    if (rc < 0)
        return rc;
    *pp = p;
    int rep = earliest_repeat(dup, PART_KEY_COUNT);
    if (rep >= 0)
        kvg_body_type_error(rw, dup[rep], "%s[%zu].%s[%zu].%s: appears more than once", w->base,
                            w->i, w->field, j, part_key[rep]);

    const span *t = &mem[PART_TYPE];
    int type = -1;
    if (!t->v) {
        kvg_body_type_error(rw, o, "%s[%zu].%s[%zu].type: missing", w->base, w->i, w->field, j);
    } else if (!t->is_string) {
        kvg_body_type_error(rw, t->v, "%s[%zu].%s[%zu].type: must be a string, not %s", w->base,
                            w->i, w->field, j, value_type(*t->v));
    } else {
        type = key_index(t->s, t->e, t->escaped, part_key, PART_KEY_COUNT);
        if (type <= PART_TYPE)
            kvg_body_type_error(rw, t->v, "%s[%zu].%s[%zu].type: unknown part type", w->base, w->i,
                                w->field, j);
    }
    if (type <= PART_TYPE)
        return 0;
    const span *m = &mem[type];
    if (!m->v) {
        kvg_body_type_error(rw, o, "%s[%zu].%s[%zu].%s: missing", w->base, w->i, w->field, j,
                            part_key[type]);
        return 0;
    }
    if (type != PART_TEXT) {
        *prev_text = false;
        return emit_media(rw, m->v, type, w, j);
    }
    if (!m->is_string) {
        kvg_body_type_error(rw, m->v, "%s[%zu].%s[%zu].text: must be a string, not %s", w->base,
                            w->i, w->field, j, value_type(*m->v));
        return 0;
    }
    /* Consecutive text parts are joined with a newline, as vLLM does. */
    if (*prev_text)
        put1(&rw->canon, '\n');
    put_string(&rw->canon, m->s, m->e, m->escaped);
    *prev_text = true;
    return 0;
}

static int scan_content(rewrite *rw, const unsigned char **pp, const where *w);

/* The piece of a message for member `kind`, at *pp (on its first byte), appended. */
static int scan_piece(rewrite *rw, piece kind, const unsigned char **pp, const where *w)
{
    const scanner *sc = &rw->sc;
    canon *c = &rw->canon;
    const unsigned char *v = *pp;
    int rc;
    switch (kind) {
    case PIECE_ROLE:
    case PIECE_NAME:
    case PIECE_TOOL_CALL_ID:
        if (*v == '"') {
            if (kind == PIECE_ROLE)
                put1(c, SEP_RECORD);
            else if (kind == PIECE_NAME)
                PUT_LIT(c, "name=");
            else
                PUT_LIT(c, "\x1ftool_call_id=");
            rc = scan_put_string(rw, pp);
            if (rc < 0)
                return rc;
            if (kind != PIECE_TOOL_CALL_ID)
                put1(c, SEP_UNIT);
            return 0;
        }
        rc = kvg_body_scan_value(sc, pp, DEPTH_FIELD);
        if (rc == 0 && kind == PIECE_ROLE)
            kvg_body_type_error(rw, v, "%s[%zu].role: must be a string, not %s", w->base, w->i,
                                value_type(*v));
        else if (rc == 0 && *v != 'n')
            kvg_body_type_error(rw, v, "%s[%zu].%s: must be a string or null, not %s", w->base,
                                w->i, piece_key[kind], value_type(*v));
        return rc;
    case PIECE_TOOL_CALLS:
        if (*v == '[') {
            PUT_LIT(c, "\x1ftool_calls=");
            return canon_json(rw, pp, DEPTH_FIELD);
        }
        rc = kvg_body_scan_value(sc, pp, DEPTH_FIELD);
        if (rc == 0 && *v != 'n')
            kvg_body_type_error(rw, v, "%s[%zu].tool_calls: must be an array or null, not %s",
                                w->base, w->i, value_type(*v));
        return rc;
    case PIECE_CONTENT:
        return scan_content(rw, pp, w);
    default:
        return kvg_body_scan_value(sc, pp, DEPTH_FIELD);
    }
}

/* The members of a message item of a responses body that feed the stream: chat's name,
 * tool_calls and tool_call_id have no counterpart there (function calls are items of their
 * own) and are ignored like any other member. */
static const char *const item_piece_key[PIECE_COUNT] = {"role", NULL, "content", NULL, NULL};

/* A message at *pp (on its first byte): \x1e role \x1f [name=N \x1f] content
 * [\x1ftool_calls=J] [\x1ftool_call_id=I] \x1d. Pieces are appended in body order, each with
 * its own separators, and put in stream order afterwards if the body had them otherwise. */
static int scan_message(rewrite *rw, const unsigned char **pp, const where *w)
{
    const scanner *sc = &rw->sc;
    canon *c = &rw->canon;
    const unsigned char *m = *pp, *p = m;
    const char *const *keys = rw->api == KVG_BODY_API_RESPONSES ? item_piece_key : piece_key;
    int rc;
    if (*m != '{') {
        rc = kvg_body_scan_value(sc, pp, DEPTH_ITEM);
        if (rc == 0)
            kvg_body_type_error(rw, m, "%s[%zu]: must be an object, not %s", w->base, w->i,
                                value_type(*m));
        return rc;
    }
    size_t mark = c->len, off[PIECE_COUNT] = {0}, len[PIECE_COUNT] = {0};
    bool seen[PIECE_COUNT] = {0}, sorted = true;
    int last = -1;
    rc = first_item(sc, &p, '}');
    while (rc > 0) {
        int k = -1;
        rc = obj_key(sc, &p, keys, PIECE_COUNT, &k);
        if (rc < 0)
            return rc;
        if (k < 0) {
            rc = kvg_body_scan_value(sc, &p, DEPTH_FIELD);
        } else if (seen[k]) {
            kvg_body_type_error(rw, p, "%s[%zu].%s: appears more than once", w->base, w->i,
                                piece_key[k]);
            rc = kvg_body_scan_value(sc, &p, DEPTH_FIELD);
        } else {
            seen[k] = true;
            off[k] = c->len;
            rc = scan_piece(rw, (piece)k, &p, w);
            len[k] = c->len - off[k];
            sorted = sorted && k > last;
            last = k;
        }
        if (rc < 0)
            return rc;
        rc = next_item(sc, &p, '}');
    }
    if (rc < 0)
        return rc;
    *pp = p;
    if (!seen[PIECE_ROLE])
        kvg_body_type_error(rw, m, "%s[%zu].role: missing", w->base, w->i);
    if (!sorted && !c->overflow) {
        rc = scratch_reserve(rw);
        if (rc < 0)
            return rc;
        size_t n = c->len - mark;
        kvg_copy(c->scratch, c->buf + mark, n);
        c->len = mark;
        for (int k = 0; k < PIECE_COUNT; k++)
            if (seen[k])
                put(c, c->scratch + (off[k] - mark), len[k]);
    }
    put1(c, SEP_GROUP);
    return 0;
}

int kvg_body_scan_messages(rewrite *rw, const unsigned char **pp)
{
    const scanner *sc = &rw->sc;
    const unsigned char *v = *pp, *p = v;
    int rc;
    if (rw->seen[MEMBER_MESSAGES] > 1) {
        kvg_body_type_error(rw, v, "messages: appears more than once");
        return kvg_body_scan_value(sc, pp, DEPTH_MEMBER);
    }
    if (*v != '[') {
        rc = kvg_body_scan_value(sc, pp, DEPTH_MEMBER);
        if (rc == 0)
            kvg_body_type_error(rw, v, "messages: must be an array, not %s", value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc < 0)
        return rc;
    rc = first_item(sc, &p, ']');
    if (rc == 0)
        kvg_body_type_error(rw, v, "messages: must not be empty");
    for (size_t i = 0; rc > 0; i++) {
        where w = {"messages", i, "content"};
        rc = scan_message(rw, &p, &w);
        if (rc < 0)
            return rc;
        rc = next_item(sc, &p, ']');
    }
    *pp = p;
    return rc;
}

/* Move the end of the stream, [from, len), to position at (<= from), after the bytes before
 * at and before those of [at, from): a section the chat templates render earlier than the body
 * gave it. */
static int move_back(rewrite *rw, size_t at, size_t from)
{
    canon *c = &rw->canon;
    if (at == from || c->overflow)
        return 0;
    int rc = scratch_reserve(rw);
    if (rc < 0)
        return rc;
    size_t n = c->len - from;
    kvg_copy(c->scratch, c->buf + from, n);
    memmove(c->buf + at + n, c->buf + at, from - at);
    kvg_copy(c->buf + at, c->scratch, n);
    return 0;
}

/* "tools": \x1etools\x1f <canonical JSON> \x1d, before every message whatever the member
 * order, as chat templates put tools in the system block. */
int kvg_body_scan_tools(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    canon *c = &rw->canon;
    int rc;
    if (rw->seen[MEMBER_TOOLS] > 1) {
        kvg_body_type_error(rw, v, "tools: appears more than once");
        return kvg_body_scan_value(&rw->sc, pp, DEPTH_MEMBER);
    }
    if (*v != '[') {
        rc = kvg_body_scan_value(&rw->sc, pp, DEPTH_MEMBER);
        if (rc == 0 && *v != 'n')
            kvg_body_type_error(rw, v, "tools: must be an array or null, not %s", value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc < 0)
        return rc;
    size_t t0 = c->len;
    PUT_LIT(c, "\x1etools\x1f");
    rc = canon_json(rw, pp, DEPTH_MEMBER);
    if (rc < 0)
        return rc;
    put1(c, SEP_GROUP);
    c->tools_len = c->len - t0;
    /* Messages (or instructions, input) came first in the body: the section goes before them. */
    return move_back(rw, 0, t0);
}

/* ---- responses: "instructions" and "input" ---- */

/* Members of a responses content part (input_text, input_image, ...). */
enum {
    RPART_TYPE = 0,
    RPART_TEXT,
    RPART_REFUSAL,
    RPART_IMAGE_URL,
    RPART_FILE_ID,
    RPART_FILE_DATA,
    RPART_FILE_URL,
    RPART_INPUT_AUDIO,
    RPART_KEY_COUNT
};
static const char *const rpart_key[RPART_KEY_COUNT] = {
    "type", "text", "refusal", "image_url", "file_id", "file_data", "file_url", "input_audio"};

enum {
    RTYPE_INPUT_TEXT = 0,
    RTYPE_OUTPUT_TEXT,
    RTYPE_REFUSAL,
    RTYPE_INPUT_IMAGE,
    RTYPE_INPUT_FILE,
    RTYPE_INPUT_AUDIO,
    RTYPE_COUNT
};
static const char *const rpart_type[RTYPE_COUNT] = {"input_text",  "output_text", "refusal",
                                                    "input_image", "input_file",  "input_audio"};

/* The media reference of an input_image or input_file part: the first of the n members keys[]
 * that is a string; every one present must be a string or null. NULL (a type error recorded)
 * when there is none. */
static const span *pick_ref(rewrite *rw, const span *mem, const int *keys, int n,
                            const unsigned char *o, const where *w, size_t j, const char *type)
{
    const span *ref = NULL;
    for (int k = 0; k < n; k++) {
        const span *m = &mem[keys[k]];
        if (!m->v || *m->v == 'n')
            continue;
        if (!m->is_string) {
            kvg_body_type_error(rw, m->v, "%s[%zu].%s[%zu].%s: must be a string or null, not %s",
                                w->base, w->i, w->field, j, rpart_key[keys[k]], value_type(*m->v));
            return NULL;
        }
        if (!ref)
            ref = m;
    }
    if (!ref)
        kvg_body_type_error(rw, o, "%s[%zu].%s[%zu]: %s needs %s", w->base, w->i, w->field, j, type,
                            n == 2 ? "image_url or file_id" : "file_id, file_data or file_url");
    return ref;
}

/* A part of a responses message's content at *pp (on its first byte): text parts as chat's
 * text parts, media as chat's media parts, so the same conversation gives the same stream. */
static int scan_resp_part(rewrite *rw, const unsigned char **pp, const where *w, size_t j,
                          bool *prev_text)
{
    const scanner *sc = &rw->sc;
    const unsigned char *o = *pp, *p = o;
    int rc;
    if (*o != '{') {
        rc = kvg_body_scan_value(sc, pp, DEPTH_PART);
        if (rc == 0)
            kvg_body_type_error(rw, o, "%s[%zu].%s[%zu]: must be an object, not %s", w->base, w->i,
                                w->field, j, value_type(*o));
        return rc;
    }
    span mem[RPART_KEY_COUNT] = {{0}};
    const unsigned char *dup[RPART_KEY_COUNT] = {0};
    rc = collect_members(rw, &p, rpart_key, RPART_KEY_COUNT, DEPTH_PART_V, mem, dup);
    if (rc < 0)
        return rc;
    *pp = p;
    int rep = earliest_repeat(dup, RPART_KEY_COUNT);
    if (rep >= 0)
        kvg_body_type_error(rw, dup[rep], "%s[%zu].%s[%zu].%s: appears more than once", w->base,
                            w->i, w->field, j, rpart_key[rep]);

    const span *t = &mem[RPART_TYPE];
    int type = -1;
    if (!t->v) {
        kvg_body_type_error(rw, o, "%s[%zu].%s[%zu].type: missing", w->base, w->i, w->field, j);
        return 0;
    }
    if (!t->is_string) {
        kvg_body_type_error(rw, t->v, "%s[%zu].%s[%zu].type: must be a string, not %s", w->base,
                            w->i, w->field, j, value_type(*t->v));
        return 0;
    }
    type = key_index(t->s, t->e, t->escaped, rpart_type, RTYPE_COUNT);
    if (type < 0) {
        kvg_body_type_error(rw, t->v, "%s[%zu].%s[%zu].type: unknown part type", w->base, w->i,
                            w->field, j);
        return 0;
    }
    if (type == RTYPE_INPUT_IMAGE || type == RTYPE_INPUT_FILE) {
        static const int image[] = {RPART_IMAGE_URL, RPART_FILE_ID};
        static const int file[] = {RPART_FILE_ID, RPART_FILE_DATA, RPART_FILE_URL};
        bool img = type == RTYPE_INPUT_IMAGE;
        const span *ref =
            pick_ref(rw, mem, img ? image : file, img ? 2 : 3, o, w, j, rpart_type[type]);
        *prev_text = false;
        return ref ? emit_digest(rw, o, img ? "image" : "file", ref) : 0;
    }
    int member = type == RTYPE_INPUT_AUDIO ? RPART_INPUT_AUDIO
                 : type == RTYPE_REFUSAL   ? RPART_REFUSAL
                                           : RPART_TEXT;
    const span *m = &mem[member];
    if (!m->v) {
        kvg_body_type_error(rw, o, "%s[%zu].%s[%zu].%s: missing", w->base, w->i, w->field, j,
                            rpart_key[member]);
        return 0;
    }
    if (type == RTYPE_INPUT_AUDIO) {
        *prev_text = false;
        return emit_media(rw, m->v, PART_INPUT_AUDIO, w, j);
    }
    if (!m->is_string) {
        kvg_body_type_error(rw, m->v, "%s[%zu].%s[%zu].%s: must be a string, not %s", w->base, w->i,
                            w->field, j, rpart_key[member], value_type(*m->v));
        return 0;
    }
    if (*prev_text)
        put1(&rw->canon, '\n');
    put_string(&rw->canon, m->s, m->e, m->escaped);
    *prev_text = true;
    return 0;
}

/* A message's content (or a function_call_output's output) at *pp: a string, null, or an array
 * of parts (chat's parts for chat, the Responses API's for responses). */
static int scan_content(rewrite *rw, const unsigned char **pp, const where *w)
{
    const scanner *sc = &rw->sc;
    const unsigned char *v = *pp;
    int rc;
    if (*v == '"')
        return scan_put_string(rw, pp);
    if (*v == '[') {
        const unsigned char *p = v;
        bool prev_text = false;
        rc = first_item(sc, &p, ']');
        for (size_t j = 0; rc > 0; j++) {
            rc = rw->api == KVG_BODY_API_RESPONSES ? scan_resp_part(rw, &p, w, j, &prev_text)
                                                   : scan_part(rw, &p, w, j, &prev_text);
            if (rc < 0)
                return rc;
            rc = next_item(sc, &p, ']');
        }
        *pp = p;
        return rc;
    }
    rc = kvg_body_scan_value(sc, pp, DEPTH_FIELD);
    if (rc == 0 && *v != 'n')
        kvg_body_type_error(rw, v, "%s[%zu].%s: must be a string, an array or null, not %s",
                            w->base, w->i, w->field, value_type(*v));
    return rc;
}

/* "instructions": the system message vLLM puts first, \x1esystem\x1f <text> \x1d, after the
 * tools section and before the input whatever the member order. */
int kvg_body_scan_instructions(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    canon *c = &rw->canon;
    int rc;
    if (rw->seen[MEMBER_INSTRUCTIONS] > 1) {
        kvg_body_type_error(rw, v, "instructions: appears more than once");
        return kvg_body_scan_value(&rw->sc, pp, DEPTH_MEMBER);
    }
    if (*v != '"') {
        rc = kvg_body_scan_value(&rw->sc, pp, DEPTH_MEMBER);
        if (rc == 0 && *v != 'n')
            kvg_body_type_error(rw, v, "instructions: must be a string or null, not %s",
                                value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc < 0)
        return rc;
    size_t i0 = c->len;
    PUT_LIT(c, "\x1esystem\x1f");
    rc = scan_put_string(rw, pp);
    if (rc < 0)
        return rc;
    put1(c, SEP_GROUP);
    return move_back(rw, c->tools_len, i0);
}

/* Members of an input item that decide its kind or feed a function_call(_output) frame. */
enum { ITEM_TYPE = 0, ITEM_CALL_ID, ITEM_NAME, ITEM_ARGUMENTS, ITEM_OUTPUT, ITEM_KEY_COUNT };
static const char *const item_key[ITEM_KEY_COUNT] = {"type", "call_id", "name", "arguments",
                                                     "output"};

/* The string member k of input[i], required: its span, or NULL (a type error recorded). */
static const span *item_string(rewrite *rw, const span *mem, const unsigned char *const *dup, int k,
                               const unsigned char *o, size_t i)
{
    const span *m = &mem[k];
    if (dup[k])
        kvg_body_type_error(rw, dup[k], "input[%zu].%s: appears more than once", i, item_key[k]);
    if (!m->v) {
        kvg_body_type_error(rw, o, "input[%zu].%s: missing", i, item_key[k]);
        return NULL;
    }
    if (!m->is_string) {
        kvg_body_type_error(rw, m->v, "input[%zu].%s: must be a string, not %s", i, item_key[k],
                            value_type(*m->v));
        return NULL;
    }
    return m;
}

/* input[i] at *pp (on its first byte). Its kind ("type") may come after the members that make
 * its frame, so the item is scanned once to find it, then again to write the frame:
 * - a message (type "message" or none): as a chat message, role and content;
 * - function_call: as chat's assistant message holding that one tool call, in the member order
 *   of OpenAI's (and the OpenAI SDK's) tool calls: \x1eassistant\x1f\x1ftool_calls=
 *   [{"id":C,"type":"function","function":{"name":N,"arguments":A}}]\x1d;
 * - function_call_output: as chat's tool message, \x1etool\x1f output \x1ftool_call_id=C\x1d;
 * - any other type (reasoning, item_reference, ...): \x1eitem\x1f <canonical JSON> \x1d. */
static int scan_item(rewrite *rw, const unsigned char **pp, size_t i)
{
    const scanner *sc = &rw->sc;
    canon *c = &rw->canon;
    const unsigned char *o = *pp, *p = o;
    int rc;
    if (*o != '{') {
        rc = kvg_body_scan_value(sc, pp, DEPTH_ITEM);
        if (rc == 0)
            kvg_body_type_error(rw, o, "input[%zu]: must be an object, not %s", i, value_type(*o));
        return rc;
    }
    span mem[ITEM_KEY_COUNT] = {{0}};
    const unsigned char *dup[ITEM_KEY_COUNT] = {0};
    rc = collect_members(rw, &p, item_key, ITEM_KEY_COUNT, DEPTH_FIELD, mem, dup);
    if (rc < 0)
        return rc;
    *pp = p;

    static const char *const kinds[] = {"message", "function_call", "function_call_output"};
    const span *t = &mem[ITEM_TYPE];
    int kind = 0;
    if (dup[ITEM_TYPE])
        kvg_body_type_error(rw, dup[ITEM_TYPE], "input[%zu].type: appears more than once", i);
    if (t->v && !t->is_string) {
        kvg_body_type_error(rw, t->v, "input[%zu].type: must be a string, not %s", i,
                            value_type(*t->v));
        return 0;
    }
    if (t->v)
        kind = key_index(t->s, t->e, t->escaped, kinds, (int)KVG_ARRAY_LEN(kinds));
    const unsigned char *q = o;
    if (kind == 0) {
        where w = {"input", i, "content"};
        return scan_message(rw, &q, &w);
    }
    if (kind < 0) {
        PUT_LIT(c, "\x1eitem\x1f");
        rc = canon_json(rw, &q, DEPTH_ITEM);
        put1(c, SEP_GROUP);
        return rc;
    }
    const span *id = item_string(rw, mem, dup, ITEM_CALL_ID, o, i);
    if (kind == 1) {
        const span *name = item_string(rw, mem, dup, ITEM_NAME, o, i);
        const span *args = item_string(rw, mem, dup, ITEM_ARGUMENTS, o, i);
        if (!id || !name || !args)
            return 0;
        PUT_LIT(c, "\x1e"
                   "assistant\x1f\x1ftool_calls=[{\"id\":");
        put_json_string(c, id->s, id->e, id->escaped);
        PUT_LIT(c, ",\"type\":\"function\",\"function\":{\"name\":");
        put_json_string(c, name->s, name->e, name->escaped);
        PUT_LIT(c, ",\"arguments\":");
        put_json_string(c, args->s, args->e, args->escaped);
        PUT_LIT(c, "}}]\x1d");
        return 0;
    }
    if (dup[ITEM_OUTPUT])
        kvg_body_type_error(rw, dup[ITEM_OUTPUT], "input[%zu].output: appears more than once", i);
    if (!id)
        return 0;
    PUT_LIT(c, "\x1etool\x1f");
    if (mem[ITEM_OUTPUT].v) {
        where w = {"input", i, "output"};
        q = mem[ITEM_OUTPUT].v;
        rc = scan_content(rw, &q, &w);
        if (rc < 0)
            return rc;
    }
    PUT_LIT(c, "\x1ftool_call_id=");
    put_string(c, id->s, id->e, id->escaped);
    put1(c, SEP_GROUP);
    return 0;
}

/* "input": a string (one user message, \x1euser\x1f <text> \x1d), or items in order. */
int kvg_body_scan_input(rewrite *rw, const unsigned char **pp)
{
    const scanner *sc = &rw->sc;
    canon *c = &rw->canon;
    const unsigned char *v = *pp, *p = v;
    int rc;
    if (rw->seen[MEMBER_INPUT] > 1) {
        kvg_body_type_error(rw, v, "input: appears more than once");
        return kvg_body_scan_value(sc, pp, DEPTH_MEMBER);
    }
    if (*v != '[' && *v != '"') {
        rc = kvg_body_scan_value(sc, pp, DEPTH_MEMBER);
        if (rc == 0 && *v != 'n')
            kvg_body_type_error(rw, v, "input: must be a string, an array or null, not %s",
                                value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc < 0)
        return rc;
    if (*v == '"') {
        PUT_LIT(c, "\x1euser\x1f");
        rc = scan_put_string(rw, pp);
        if (rc == 0)
            put1(c, SEP_GROUP);
        return rc;
    }
    rc = first_item(sc, &p, ']');
    if (rc == 0)
        kvg_body_type_error(rw, v, "input: must not be empty");
    for (size_t i = 0; rc > 0; i++) {
        rc = scan_item(rw, &p, i);
        if (rc < 0)
            return rc;
        rc = next_item(sc, &p, ']');
    }
    *pp = p;
    return rc;
}
