/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the response affinity map and the id scanner (gateway/resp_affinity.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "resp_affinity.h"

static void test_map(void **state)
{
    (void)state;
    char w[65];
    assert_false(kvg_resp_affinity_find("global", "resp_a", 6, w, sizeof(w)));
    kvg_resp_affinity_learn("global", "resp_a", 6, "w1");
    assert_true(kvg_resp_affinity_find("global", "resp_a", 6, w, sizeof(w)));
    assert_string_equal(w, "w1");
    assert_false(kvg_resp_affinity_find("global", "resp_", 5, w, sizeof(w)));
    assert_false(kvg_resp_affinity_find("global", "resp_ab", 7, w, sizeof(w)));
    assert_false(kvg_resp_affinity_find("global", "resp_a", 6, w, 2)); /* no room: not found */
    kvg_resp_affinity_learn("global", "resp_a", 6, "w2");              /* learnt again: the newer */
    assert_true(kvg_resp_affinity_find("global", "resp_a", 6, w, sizeof(w)));
    assert_string_equal(w, "w2");
    /* Per scope: another scope does not find it. */
    assert_false(kvg_resp_affinity_find("tenant:b", "resp_a", 6, w, sizeof(w)));
    kvg_resp_affinity_learn("tenant:b", "resp_a", 6, "w3");
    assert_true(kvg_resp_affinity_find("tenant:b", "resp_a", 6, w, sizeof(w)));
    assert_string_equal(w, "w3");
    /* Ids that cannot be kept are ignored. */
    char big[KVG_RESP_ID_MAX + 2];
    memset(big, 'x', sizeof(big));
    kvg_resp_affinity_learn("global", big, sizeof(big), "w1");
    assert_false(kvg_resp_affinity_find("global", big, sizeof(big), w, sizeof(w)));
    kvg_resp_affinity_learn("global", "a\0b", 3, "w1");
    assert_false(kvg_resp_affinity_find("global", "a\0b", 3, w, sizeof(w)));
    /* Bounded: many more ids than slots, and the latest ones are found. */
    char id[32];
    for (int i = 0; i < 4 * KVG_RESP_AFFINITY_SLOTS; i++) {
        int n = snprintf(id, sizeof(id), "resp_%d", i);
        kvg_resp_affinity_learn("global", id, (size_t)n, i % 2 ? "odd" : "even");
    }
    int n = snprintf(id, sizeof(id), "resp_%d", 4 * KVG_RESP_AFFINITY_SLOTS - 1);
    assert_true(kvg_resp_affinity_find("global", id, (size_t)n, w, sizeof(w)));
    assert_string_equal(w, "odd");
}

/* Feed text in pieces of `step` bytes; the id found, or "" */
static void scan(const char *text, size_t step, char *out, size_t cap)
{
    kvg_resp_id_scan s;
    memset(&s, 0, sizeof(s));
    out[0] = '\0';
    size_t len = strlen(text);
    for (size_t i = 0; i < len; i += step) {
        const char *id;
        size_t n;
        size_t k = len - i < step ? len - i : step;
        if (kvg_resp_id_scan_feed(&s, text + i, k, &id, &n)) {
            assert_true(n < cap);
            memcpy(out, id, n);
            out[n] = '\0';
            return;
        }
    }
}

static void test_scanner(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"{\"id\":\"resp_123abc\",\"object\":\"response\"}", "resp_123abc"},
        {"{\"id\" : \"resp_x-y.z\"}", "resp_x-y.z"},
        {"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":"
         "\"resp_9\",\"status\":\"in_progress\"}}\n\n",
         "resp_9"},
        {"{\"item_id\":\"resp_no\",\"id\":\"msg_1\",\"x\":{\"id\":\"resp_yes\"}}", "resp_yes"},
        {"{\"id\":\"resp_unterminated", ""},
        {"{\"id\":\"resp_bad\\u0020\"}", ""},
        {"{\"error\":{\"message\":\"no\"}}", ""},
    };
    char got[KVG_RESP_ID_MAX + 1];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (size_t step = 1; step <= 64; step = step * 2 + 1) {
            scan(cases[i].text, step, got, sizeof(got));
            if (strcmp(got, cases[i].want) != 0)
                fail_msg("%s (step %zu): got \"%s\", want \"%s\"", cases[i].text, step, got,
                         cases[i].want);
        }
    /* Past the first KVG_RESP_ID_SCAN_BYTES bytes the scanner has given up. */
    char text[KVG_RESP_ID_SCAN_BYTES + 64];
    memset(text, ' ', KVG_RESP_ID_SCAN_BYTES);
    strcpy(text + KVG_RESP_ID_SCAN_BYTES, "{\"id\":\"resp_late\"}");
    scan(text, 100, got, sizeof(got));
    assert_string_equal(got, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map),
        cmocka_unit_test(test_scanner),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
