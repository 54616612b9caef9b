/* SPDX-License-Identifier: Apache-2.0 */
/* The state file: every admin change saved atomically before its answer, and restored at
 * start-up (tenants with their key digests, admin-defined workers and models, policy
 * settings). */
#include "admin_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>

#define STATE_VERSION 1
#define STATE_DEPTH_MAX 32

void kvg_admin_state_doc(kvg_admin *admin, kvg_buf *b)
{
    kvg_buf_printf(b, "{\"version\":%d", STATE_VERSION);
    if (admin->tenants) {
        kvg_buf_puts(b, ",\"tenants\":");
        kvg_tenants_to_json(admin->tenants, b);
    }
    kvg_buf_puts(b, ",\"workers\":");
    kvg_registry_admin_to_json(admin->reg, b);
    if (admin->models) {
        /* Left out while there are none: a state without models stays readable by a kvgate
         * that predates them (a downgrade, or an older replica during a rolling upgrade), and
         * an absent section reads as an empty one. */
        size_t at = b->len;
        kvg_buf_puts(b, ",\"models\":");
        size_t list = b->len;
        kvg_model_registry_admin_to_json(admin->models, b);
        if (!b->failed && b->len - list == 2) {
            b->len = at;
            b->data[at] = '\0';
        }
    }
    if (admin->policy) {
        kvg_policy_config cfg;
        kvg_policy_state_get(admin->policy, &cfg);
        kvg_buf_puts(b, ",\"policy\":");
        kvg_policy_config_to_json(&cfg, b);
    }
    kvg_buf_puts(b, "}\n");
}

int kvg_admin_write_state_file(kvg_admin *admin, const char *doc, size_t len, char *why,
                               size_t why_len)
{
    if (!admin->state_path)
        return 0;
    int rc = kvg_state_write_file(admin->state_path, doc, len, 0600);
    if (rc < 0)
        snprintf(why, why_len, "%s: %s", admin->state_path, kvg_strerror(rc));
    return rc;
}

int kvg_admin_save_state(kvg_admin *admin, char *why, size_t why_len)
{
    if (!admin->state_path)
        return 0;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_admin_state_doc(admin, &b);
    int rc = b.failed ? -ENOMEM : kvg_admin_write_state_file(admin, b.data, b.len, why, why_len);
    if (rc == -ENOMEM)
        snprintf(why, why_len, "%s: %s", admin->state_path, kvg_strerror(rc));
    kvg_buf_done(&b);
    return rc;
}

int kvg_admin_store(kvg_admin *admin, bool *undone, char *why, size_t why_len)
{
    *undone = false;
    if (admin->shared)
        return kvg_admin_shared_commit(admin, undone, why, why_len);
    return kvg_admin_save_state(admin, why, why_len);
}

bool kvg_admin_commit(admin_ctx *c)
{
    char why[320];
    bool undone;
    int rc = kvg_admin_store(c->admin, &undone, why, sizeof(why));
    if (rc == 0)
        return true;
    if (rc == -EAGAIN) {
        /* Another replica changed the shared state first: it is in memory now, and
         * kvg_admin_handle runs the change again on top of it. */
        c->again = true;
        return false;
    }
    const char *what = c->action ? c->action : "change";
    if (undone) {
        kvg_log_error("admin: %s not applied: %s", what, why);
        kvg_admin_fail(c, 503, "the change was not applied: %s", why);
        return false;
    }
    kvg_log_error("admin: %s applied but not saved: %s", what, why);
    kvg_admin_fail(c, 500, "the change is applied but could not be saved: %s", why);
    return false;
}

bool kvg_admin_applied(admin_ctx *c, int rc, const char *msg)
{
    if (rc == -ENOMEM) {
        kvg_admin_fail(c, 500, "out of memory");
        return false;
    }
    if (rc < 0) {
        kvg_admin_fail(c, rc == KVG_ELIMIT ? 409 : 400, "%s", msg ? msg : kvg_strerror(rc));
        return false;
    }
    return kvg_admin_commit(c);
}

bool kvg_admin_changed(admin_ctx *c, int rc, const char *kind, const char *verb, const char *detail)
{
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_fail(c, 404, "%s \"%s\" not found", kind, c->name);
        return false;
    }
    if (rc < 0) {
        kvg_admin_fail(c, 500, "could not %s %s: %s", verb, kind, kvg_strerror(rc));
        return false;
    }
    if (!kvg_admin_commit(c))
        return false;
    kvg_admin_detail(c, "%s", detail);
    return true;
}

/* The sections of a state file, found before anything is applied. */
typedef struct sections {
    const kvg_json *tenants, *workers, *models, *policy;
} sections;

static int decode_version(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    (void)target;
    if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival != STATE_VERSION)
        return kvg_fields_fail(c, KVG_FIELD_INVALID, path,
                               "must be %d (this kvgate reads version %d)", STATE_VERSION,
                               STATE_VERSION);
    return 0;
}

/* A section is kept as it stands: its own module decodes it once every section is found. */
static int keep_section(const kvg_json *v, kvg_json_type type, const char *path, kvg_fields_ctx *c,
                        const kvg_json **out)
{
    if (v->type != type)
        return kvg_fields_fail(c, KVG_FIELD_MISTYPED, path, "must be %s, not %s",
                               type == KVG_JSON_ARRAY ? "an array of objects" : "an object",
                               kvg_json_type_str(v->type));
    *out = v;
    return 0;
}

static int decode_tenants(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    return keep_section(v, KVG_JSON_ARRAY, path, c, &((sections *)target)->tenants);
}

static int decode_workers(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    return keep_section(v, KVG_JSON_ARRAY, path, c, &((sections *)target)->workers);
}

static int decode_models(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    return keep_section(v, KVG_JSON_ARRAY, path, c, &((sections *)target)->models);
}

static int decode_policy(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    return keep_section(v, KVG_JSON_OBJECT, path, c, &((sections *)target)->policy);
}

/* The file's top level, through the walker like every other object, so that its messages are
 * the same as everywhere ("extra: unknown field", "version: required"). */
static const kvg_field section_fields[] = {
    {.name = "version",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_STATE,
     .required_in = KVG_SET_STATE,
     .decode = decode_version},
    {.name = "tenants",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_STATE,
     .decode = decode_tenants},
    {.name = "workers",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_STATE,
     .decode = decode_workers},
    {.name = "models", .type = KVG_FIELD_CUSTOM, .set_in = KVG_SET_STATE, .decode = decode_models},
    {.name = "policy", .type = KVG_FIELD_CUSTOM, .set_in = KVG_SET_STATE, .decode = decode_policy},
};

static const kvg_fields section_table = {"state file", section_fields,
                                         KVG_ARRAY_LEN(section_fields), NULL};

static int find_sections(const kvg_json *root, sections *s, char *msg, size_t msg_len)
{
    *s = (sections){0};
    if (root->type != KVG_JSON_OBJECT) {
        snprintf(msg, msg_len, "must be a JSON object");
        return KVG_EPARSE;
    }
    kvg_fields_ctx c = {.from = KVG_SET_STATE, .msg = msg, .msg_len = msg_len};
    return kvg_fields_decode(&section_table, s, root, "", &c);
}

/* Put back the tenants kvg_tenants_to_json wrote before a document that was then refused. What
 * that function wrote, it reads; only memory can fail here, and then the error log says so. */
static void restore_tenants(kvg_admin *admin, const kvg_buf *old)
{
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *root;
    kvg_json_error jerr = {0};
    kvg_json_limits lim = {.max_depth = STATE_DEPTH_MAX};
    char why[256] = "";
    int rc = kvg_json_parse(old->data, old->len, &arena, &lim, &root, &jerr);
    if (rc == 0)
        rc = kvg_tenants_from_json(admin->tenants, root, why, sizeof(why));
    if (rc < 0)
        kvg_log_error("admin: the tenants could not be put back after a refused document: %s",
                      why[0] ? why : kvg_strerror(rc));
    kvg_arena_done(&arena);
}

/* Put back the models kvg_model_registry_admin_to_json wrote, after a later section was
 * refused: the same definitions keep their loaded models, so nothing is read again. */
static void restore_models(kvg_admin *admin, const kvg_buf *old)
{
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *root;
    char why[512] = "";
    int rc = kvg_json_parse(old->data, old->len, &arena, NULL, &root, NULL);
    if (rc == 0)
        rc = kvg_model_registry_admin_from_json(admin->models, root, why, sizeof(why));
    if (rc < 0)
        kvg_log_error("admin: the models could not be put back after a refused document: %s",
                      why[0] ? why : kvg_strerror(rc));
    kvg_arena_done(&arena);
}

/* Apply the sections; the policy is checked first (on a copy) since it is the cheapest. A
 * replacement (a document from Redis) starts the policy from its defaults and counts an absent
 * section as an empty one, so that what the document lacks is gone here too. */
static int apply(kvg_admin *admin, const sections *s, bool replace, char *msg, size_t msg_len)
{
    static const kvg_json empty = {.type = KVG_JSON_ARRAY};
    char why[256] = "";
    int rc;
    kvg_policy_config cfg;
    const kvg_json *tenants = s->tenants, *workers = s->workers, *models = s->models;
    if (replace) {
        tenants = tenants ? tenants : &empty;
        workers = workers ? workers : &empty;
        models = models ? models : &empty;
    }
    if (!admin->models)
        models = NULL;
    if ((s->policy || replace) && admin->policy) {
        if (replace)
            kvg_policy_config_init(&cfg);
        else
            kvg_policy_state_get(admin->policy, &cfg);
        rc = s->policy ? kvg_policy_config_apply_json(&cfg, s->policy, why, sizeof(why)) : 0;
        if (rc < 0) {
            snprintf(msg, msg_len, "policy: %s", why);
            return rc;
        }
    }
    /* The models before the tenants and workers: a bad definition is refused before anything
     * changes, and a model whose files are missing here is kept unloaded rather than refused
     * (model/registry.c), so that a state file or another replica's document still applies. */
    kvg_buf old_models;
    kvg_buf_init(&old_models);
    bool models_done = false;
    if (models) {
        if (tenants || workers) {
            kvg_model_registry_admin_to_json(admin->models, &old_models);
            if (old_models.failed) {
                kvg_buf_done(&old_models);
                snprintf(msg, msg_len, "models: %s", kvg_strerror(-ENOMEM));
                return -ENOMEM;
            }
        }
        char mwhy[512] = "";
        rc = kvg_model_registry_admin_from_json(admin->models, models, mwhy, sizeof(mwhy));
        if (rc < 0) {
            kvg_buf_done(&old_models);
            snprintf(msg, msg_len, "models: %s", rc == -ENOMEM ? kvg_strerror(rc) : mwhy);
            return rc;
        }
        models_done = true;
    }
    /* Each section replaces its store all or nothing, but the document must too: the tenants
     * as they were are kept, to be put back when the workers are refused after them. */
    kvg_buf old_tenants;
    kvg_buf_init(&old_tenants);
    bool tenants_done = false;
    if (tenants && admin->tenants) {
        if (workers) {
            kvg_tenants_to_json(admin->tenants, &old_tenants);
            if (old_tenants.failed) {
                kvg_buf_done(&old_tenants);
                snprintf(msg, msg_len, "tenants: %s", kvg_strerror(-ENOMEM));
                return -ENOMEM;
            }
        }
        rc = kvg_tenants_from_json(admin->tenants, tenants, why, sizeof(why));
        if (rc < 0) {
            kvg_buf_done(&old_tenants);
            snprintf(msg, msg_len, "tenants: %s", rc == -ENOMEM ? kvg_strerror(rc) : why);
            if (models_done)
                restore_models(admin, &old_models);
            kvg_buf_done(&old_models);
            return rc;
        }
        tenants_done = true;
    }
    if (workers) {
        rc = kvg_registry_admin_from_json(admin->reg, workers, why, sizeof(why));
        if (rc < 0) {
            snprintf(msg, msg_len, "workers: %s", rc == -ENOMEM ? kvg_strerror(rc) : why);
            if (tenants_done)
                restore_tenants(admin, &old_tenants);
            kvg_buf_done(&old_tenants);
            if (models_done)
                restore_models(admin, &old_models);
            kvg_buf_done(&old_models);
            return rc;
        }
    }
    kvg_buf_done(&old_tenants);
    kvg_buf_done(&old_models);
    if ((s->policy || replace) && admin->policy) {
        rc = kvg_policy_state_set(admin->policy, &cfg);
        if (rc < 0) {
            snprintf(msg, msg_len, "policy: %s", kvg_strerror(rc));
            return rc;
        }
    }
    return 0;
}

int kvg_admin_apply_doc(kvg_admin *admin, const char *text, size_t len, bool replace, char *msg,
                        size_t msg_len)
{
    /* The state file is read with this bound; a document from Redis gets the same one before
     * its parse (whose tree takes a multiple of its size). */
    if (len > ADMIN_STATE_MAX) {
        snprintf(msg, msg_len, "larger than %u bytes", ADMIN_STATE_MAX);
        return KVG_ELIMIT;
    }
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *root;
    kvg_json_error jerr = {0};
    kvg_json_limits lim = {.max_depth = STATE_DEPTH_MAX, .reject_duplicate_keys = true};
    int rc = kvg_json_parse(len ? text : "", len, &arena, &lim, &root, &jerr);
    if (rc == -ENOMEM) {
        snprintf(msg, msg_len, "%s", kvg_strerror(rc));
    } else if (rc < 0) {
        rc = KVG_EPARSE;
        snprintf(msg, msg_len, "invalid JSON at byte %zu: %s", jerr.offset, jerr.message);
    } else {
        sections s;
        rc = find_sections(root, &s, msg, msg_len);
        if (rc == 0)
            rc = apply(admin, &s, replace, msg, msg_len);
    }
    kvg_arena_done(&arena);
    return rc;
}

int kvg_admin_load_state(kvg_admin *admin, char *msg, size_t msg_len)
{
    char why[768] = ""; /* a model's message names its file: a path and the problem */
    if (!admin->state_path)
        return 0;
    pthread_mutex_lock(&admin->change_lock);
    kvg_buf text;
    kvg_buf_init(&text);
    int rc = kvg_state_read_file(admin->state_path, ADMIN_STATE_MAX, &text);
    if (rc == -ENOENT)
        rc = 0; /* first start */
    else if (rc < 0)
        snprintf(why, sizeof(why), "cannot read it: %s", kvg_strerror(rc));
    else
        rc = kvg_admin_apply_doc(admin, text.data, text.len, false, why, sizeof(why));
    pthread_mutex_unlock(&admin->change_lock);
    if (rc < 0)
        snprintf(msg, msg_len, "state file %s: %s", admin->state_path, why);
    else if (text.len)
        kvg_log_info("admin: restored the state from %s", admin->state_path);
    /* The file holds key digests: not secrets, but no reason to leave them around either. */
    if (text.data)
        OPENSSL_cleanse(text.data, text.cap);
    kvg_buf_done(&text);
    return rc;
}
