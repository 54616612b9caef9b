/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: kvg_redis_url_parse on any bytes (up to the first NUL: the API takes a C string).
 * A refusal says why; an accepted URL keeps the invariants its users rely on, formats to a URL
 * that parses back to the same thing (and formats to the same text again), and its redacted form
 * parses to the same URL with the password "***". */
#include <stdlib.h>
#include <string.h>

#include "router.h"

/* Room for the longest URL kvg_redis_url_format can write (tests/unit/router/test_redis_url.c
 * checks that the longest one fits). */
#define FORMAT_MAX 8192

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok)
{
    if (!ok)
        abort();
}

static bool same(const kvg_redis_url *a, const kvg_redis_url *b, bool same_password)
{
    if (a->mode != b->mode || strcmp(a->user, b->user) != 0 || a->nseeds != b->nseeds ||
        a->db != b->db || strcmp(a->master, b->master) != 0)
        return false;
    if (same_password && strcmp(a->password, b->password) != 0)
        return false;
    for (size_t i = 0; i < a->nseeds; i++)
        if (strcmp(a->seeds[i].host, b->seeds[i].host) != 0 || a->seeds[i].port != b->seeds[i].port)
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1);
    if (!url)
        return 0;
    memcpy(url, data, size);
    url[size] = '\0';

    kvg_redis_url u;
    char msg[256];
    int rc = kvg_redis_url_parse(url, &u, msg, sizeof(msg));
    if (rc != 0) {
        check(rc == KVG_EPARSE && strncmp(msg, "redis URL: ", 11) == 0 && strlen(msg) > 11);
        free(url);
        return 0;
    }
    check(msg[0] == '\0');
    /* What the topology thread and the handshake take for granted. */
    check(u.mode == KVG_REDIS_STANDALONE || u.mode == KVG_REDIS_SENTINEL);
    check(u.nseeds >= 1 && u.nseeds <= KVG_REDIS_SEEDS_MAX);
    check(u.mode == KVG_REDIS_SENTINEL || u.nseeds == 1);
    check(u.mode == KVG_REDIS_STANDALONE ? u.master[0] == '\0' : u.master[0] != '\0');
    check(u.mode == KVG_REDIS_STANDALONE || u.db == 0);
    check(u.db <= 65535);
    check(!u.user[0] || u.password[0]);
    for (size_t i = 0; i < u.nseeds; i++)
        check(u.seeds[i].host[0] && u.seeds[i].port != 0);

    static char out[FORMAT_MAX], again[FORMAT_MAX];
    kvg_redis_url_format(&u, false, out, sizeof(out));
    check(strlen(out) < sizeof(out) - 1); /* not cut */
    kvg_redis_url back;
    if (kvg_redis_url_parse(out, &back, msg, sizeof(msg)) != 0 || !same(&u, &back, true))
        abort();
    kvg_redis_url_format(&back, false, again, sizeof(again));
    check(strcmp(out, again) == 0);

    kvg_redis_url_format(&u, true, out, sizeof(out));
    if (kvg_redis_url_parse(out, &back, msg, sizeof(msg)) != 0 || !same(&u, &back, false))
        abort();
    check(strcmp(back.password, u.password[0] ? "***" : "") == 0);
    free(url);
    return 0;
}
