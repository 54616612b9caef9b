/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the request-body rewriter; it accepts exactly what the JSON parser accepts, and
 * whatever it accepts comes out as JSON with one top-level cache_salt, the injected one, and
 * the input's other members, and rewriting that output again changes nothing. It refuses, as a
 * type error, every body with an object key that holds a control character. */
#include <stdlib.h>
#include <string.h>

#include "router.h"

#define SALT "VGhlIHNjb3BlIHNhbHQgb2YgdGhlIGZ1enogdGFyZ2V0"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool is_salt_key(const kvg_json *obj, size_t i)
{
    return obj->u.obj.key_lens[i] == 10 && memcmp(obj->u.obj.keys[i], "cache_salt", 10) == 0;
}

/* Whether a key at any level of v holds a control character (Unicode Cc), decoded. */
static bool control_key(const kvg_json *v)
{
    if (v->type == KVG_JSON_ARRAY) {
        for (size_t i = 0; i < v->u.arr.count; i++)
            if (control_key(v->u.arr.items[i]))
                return true;
    } else if (v->type == KVG_JSON_OBJECT) {
        for (size_t i = 0; i < v->u.obj.count; i++) {
            const unsigned char *k = (const unsigned char *)v->u.obj.keys[i];
            for (size_t j = 0; j < v->u.obj.key_lens[i]; j++)
                if (k[j] < 0x20 || k[j] == 0x7f || (k[j] == 0xc2 && k[j + 1] < 0xa0))
                    return true;
            if (control_key(v->u.obj.values[i]))
                return true;
        }
    }
    return false;
}

/* The compact serialisation of obj without its cache_salt members (and with salt added). */
static void without_salts(const kvg_json *obj, const char *salt, kvg_buf *b)
{
    kvg_buf_putc(b, '{');
    bool first = true;
    for (size_t i = 0; i < obj->u.obj.count; i++) {
        if (is_salt_key(obj, i))
            continue;
        if (!first)
            kvg_buf_putc(b, ',');
        first = false;
        kvg_buf_json_string(b, obj->u.obj.keys[i], obj->u.obj.key_lens[i]);
        kvg_buf_putc(b, ':');
        kvg_json_write(b, obj->u.obj.values[i]);
    }
    if (salt) {
        if (!first)
            kvg_buf_putc(b, ',');
        kvg_buf_puts(b, "\"cache_salt\":");
        kvg_buf_json_string(b, salt, strlen(salt));
    }
    kvg_buf_putc(b, '}');
}

static void check(const uint8_t *data, size_t size, const char *salt)
{
    kvg_arena arena, ta;
    kvg_buf out, again, want, got;
    kvg_body_info info;
    kvg_json_error err;
    kvg_json *in_tree, *out_tree;
    kvg_arena_init(&arena, 0);
    kvg_arena_init(&ta, 0);
    kvg_buf_init(&out);
    kvg_buf_init(&again);
    kvg_buf_init(&want);
    kvg_buf_init(&got);

    int rc = kvg_body_rewrite((const char *)data, size, salt, &arena, &out, &info, &err);
    kvg_json_error perr;
    int prc = kvg_json_parse((const char *)data, size, &ta, NULL, &in_tree, &perr);
    /* Same acceptance as the parser; type errors only on what it accepts. */
    if (rc == KVG_ETYPE) {
        if (prc != 0)
            abort();
        goto out;
    }
    if (prc == 0 && control_key(in_tree))
        abort();
    if (rc != prc)
        abort();
    if (rc != 0) {
        if (err.offset != perr.offset || err.offset > size)
            abort();
        goto out;
    }
    if (in_tree->type != KVG_JSON_OBJECT)
        abort();

    /* The output parses, has one cache_salt (ours) or none, and means the input otherwise. */
    if (kvg_json_parse(out.data, out.len, &ta, NULL, &out_tree, NULL) != 0 ||
        out_tree->type != KVG_JSON_OBJECT)
        abort();
    size_t salts = 0;
    for (size_t i = 0; i < out_tree->u.obj.count; i++) {
        if (!is_salt_key(out_tree, i))
            continue;
        const kvg_json *v = out_tree->u.obj.values[i];
        if (!salt || v->type != KVG_JSON_STRING || v->u.str.len != strlen(salt) ||
            memcmp(v->u.str.ptr, salt, v->u.str.len) != 0)
            abort();
        salts++;
    }
    if (salts != (salt ? 1u : 0u))
        abort();
    without_salts(in_tree, salt, &want);
    kvg_json_write(&got, out_tree);
    if (want.len != got.len || memcmp(want.data, got.data, want.len) != 0)
        abort();
    size_t removed = 0;
    for (size_t i = 0; i < in_tree->u.obj.count; i++)
        removed += is_salt_key(in_tree, i);
    if (info.cache_salts_removed != removed || info.prompt_bytes > size)
        abort();
    if (info.model && info.model_len != strlen(info.model))
        abort();

    /* Rewriting the output again gives the same bytes. */
    kvg_body_info info2;
    if (kvg_body_rewrite(out.data, out.len, salt, &arena, &again, &info2, NULL) != 0 ||
        again.len != out.len || memcmp(again.data, out.data, out.len) != 0)
        abort();
    if (info2.stream != info.stream || info2.prompt_bytes != info.prompt_bytes ||
        (info.model == NULL) != (info2.model == NULL) ||
        (info.model && strcmp(info.model, info2.model) != 0))
        abort();

out:
    kvg_buf_done(&got);
    kvg_buf_done(&want);
    kvg_buf_done(&again);
    kvg_buf_done(&out);
    kvg_arena_done(&ta);
    kvg_arena_done(&arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size, SALT);
    check(data, size, NULL);
    return 0;
}
