/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the gateway's configuration: defaults, the strict JSON file, flags. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static char path[64];

static void write_file(const char *text)
{
    snprintf(path, sizeof(path), "/tmp/kvgate-test-config-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static int load(kvg_config *cfg, const char *text, char *err, size_t len)
{
    write_file(text);
    int rc = kvg_config_load_file(cfg, path, err, len);
    unlink(path);
    return rc;
}

static void test_defaults(void **state)
{
    (void)state;
    kvg_config cfg;
    assert_int_equal(kvg_config_init(&cfg), 0);
    assert_int_equal(cfg.nlisteners, 1);
    assert_string_equal(cfg.listeners[0].address, "0.0.0.0:8080");
    assert_string_equal(cfg.admin_listeners[0].address, "127.0.0.1:9090");
    assert_int_equal(cfg.limits.body_bytes, 32u << 20);
    assert_int_equal(cfg.limits.send_timeout_ms, 60000);
    assert_int_equal(cfg.limits.max_connections, 0); /* from the descriptor limit */
    assert_int_equal(cfg.limits.body_budget_bytes, 1u << 30);
    assert_int_equal(cfg.limits.tenant_body_share, 25);
    assert_int_equal(cfg.limits.body_min_rate, 1024);
    assert_int_equal(cfg.admin_max_connections, 64);
    assert_int_equal(cfg.scrape.interval_ms, 0); /* off: not every engine speaks vLLM */
    assert_string_equal(cfg.scrape.path, "/metrics");
    char err[256];
    assert_int_equal(kvg_config_validate(&cfg, err, sizeof(err)), 0);
    kvg_config_done(&cfg);
}

static void test_full_file(void **state)
{
    (void)state;
    kvg_config cfg;
    char err[256] = "";
    kvg_config_init(&cfg);
    int rc =
        load(&cfg,
             "{\"listen\": [\"127.0.0.1:0\", {\"address\": \"[::1]:8443\", \"tls_cert\": \"c\","
             " \"tls_key\": \"k\", \"cleartext\": false}],"
             " \"admin\": {\"listen\": \"127.0.0.1:1\", \"tokens\": [\"0123456789abcdef\"],"
             " \"max_connections\": 5},"
             " \"threads\": 3, \"log_level\": \"debug\", \"worker_header\": false,"
             " \"limits\": {\"body_bytes\": 4096, \"streams_per_conn\": 7,"
             " \"send_timeout_ms\": 1500, \"max_connections\": 99, \"body_budget_mib\": 2,"
             " \"tenant_body_share\": 40, \"response_budget_mib\": 3, \"body_min_rate\": 0},"
             " \"upstream\": {\"retries\": 0}, \"health\": {\"path\": \"/ready\", \"fall\": 1},"
             " \"scrape\": {\"interval_ms\": 250, \"timeout_ms\": 500, \"path\": \"/m\"},"
             " \"auth\": \"open\", \"secret\": \"0123456789abcdef0123456789abcdef!\","
             " \"state_file\": \"/tmp/s.json\", \"audit_log\": \"off\","
             " \"tenant_metrics_max\": 7,"
             " \"workers\": [{\"name\": \"a\", \"url\": \"http://127.0.0.1:1\","
             " \"models\": [\"m1\", \"m2\"], \"kv_blocks\": 10, \"cache_salt\": false}]}",
             err, sizeof(err));
    assert_int_equal(rc, 0);
    assert_int_equal(cfg.nlisteners, 2);
    assert_string_equal(cfg.listeners[1].host, "::1");
    assert_int_equal(cfg.listeners[1].port, 8443);
    assert_false(cfg.listeners[1].cleartext);
    assert_string_equal(cfg.listeners[1].tls_cert, "c");
    assert_int_equal(cfg.nadmin_tokens, 1);
    assert_int_equal(cfg.threads, 3);
    assert_int_equal(cfg.log_level, KVG_LOG_DEBUG);
    assert_false(cfg.worker_header);
    assert_int_equal(cfg.limits.body_bytes, 4096);
    assert_int_equal(cfg.limits.streams_per_conn, 7);
    assert_int_equal(cfg.limits.send_timeout_ms, 1500);
    assert_int_equal(cfg.limits.max_connections, 99);
    assert_int_equal(cfg.limits.body_budget_bytes, 2u << 20);
    assert_int_equal(cfg.limits.tenant_body_share, 40);
    assert_int_equal(cfg.limits.response_budget_bytes, 3u << 20);
    assert_int_equal(cfg.limits.body_min_rate, 0);
    assert_int_equal(cfg.admin_max_connections, 5);
    assert_int_equal(cfg.upstream.retries, 0);
    assert_string_equal(cfg.health.path, "/ready");
    assert_int_equal(cfg.health.fall, 1);
    assert_int_equal(cfg.scrape.interval_ms, 250);
    assert_int_equal(cfg.scrape.timeout_ms, 500);
    assert_string_equal(cfg.scrape.path, "/m");
    assert_int_equal(cfg.nworkers, 1);
    assert_int_equal(cfg.workers[0].nmodels, 2);
    assert_int_equal(cfg.workers[0].kv_blocks, 10);
    assert_true(cfg.workers[0].no_cache_salt);
    assert_true(cfg.auth_open);
    assert_string_equal(cfg.secret, "0123456789abcdef0123456789abcdef!");
    assert_string_equal(cfg.state_file, "/tmp/s.json");
    assert_string_equal(cfg.audit_log, "off");
    assert_int_equal(cfg.tenant_metrics_max, 7);
    assert_int_equal(kvg_config_validate(&cfg, err, sizeof(err)), 0);
    kvg_config_done(&cfg);
}

/* Every mistake names the key it is about. */
static void test_errors_name_the_key(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *needle;
    } cases[] = {
        {"{\"lisen\": \"x\"}", "lisen: unknown field"},
        {"{\"threads\": \"4\"}", "threads: must be an integer"},
        {"{\"threads\": 5000}", "threads: must be an integer in 0..1024"},
        {"{\"limits\": {\"body_bytez\": 1}}", "limits.body_bytez: unknown field"},
        {"{\"limits\": {\"body_bytes\": 1.5}}", "limits.body_bytes: must be an integer"},
        {"{\"listen\": \"nohost\"}", "invalid listen address"},
        {"{\"workers\": [{\"name\": \"a\"}]}", "workers[0].url: required"},
        {"{\"workers\": [{\"name\": \"a\", \"url\": \"u\", \"gpu\": 1}]}", "workers[0].gpu"},
        {"{\"health\": {\"path\": \"no-slash\"}}", "health.path"},
        {"{\"scrape\": {\"path\": \"metrics\"}}", "scrape.path"},
        {"{\"scrape\": {\"interval_ms\": 10}}", "scrape.interval_ms: must be 0 (off)"},
        {"{\"scrape\": {\"timeout_ms\": 1}}",
         "scrape.timeout_ms: must be an integer in 10..600000"},
        {"{\"scrape\": {\"every\": 1}}", "scrape.every: unknown field"},
        {"{\"scrape\": 5}", "scrape: must be an object"},
        {"{\"admin\": {\"tokens\": [\"short\"]}}", "at least 16"},
        {"{\"log_level\": \"loud\"}", "log_level"},
        {"{\"threads\": 1, \"threads\": 2}", "duplicate key"},
        {"[1]", "must be a JSON object"},
        {"{\"auth\": \"none\"}", "auth: must be"},
        {"{\"secret\": \"short\"}", "secret: must be at least 32"},
        {"{\"workers\": [{\"name\": \"a\", \"url\": \"u\", \"cache_salt\": 1}]}",
         "workers[0].cache_salt"},
        {"{\"a\":", "invalid JSON"},
        {"{\"limits\": {\"tenant_body_share\": 0}}",
         "limits.tenant_body_share: must be an integer in 1..100"},
        {"{\"admin\": {\"max_connections\": 0}}",
         "admin.max_connections: must be an integer in 1..100000"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvg_config cfg;
        char err[256] = "";
        kvg_config_init(&cfg);
        int rc = load(&cfg, cases[i].text, err, sizeof(err));
        if (rc == 0 || !strstr(err, cases[i].needle))
            fail_msg("case %zu: rc %d, message '%s' lacks '%s'", i, rc, err, cases[i].needle);
        kvg_config_done(&cfg);
    }
}

static void test_validate(void **state)
{
    (void)state;
    kvg_config cfg;
    char err[256] = "";
    kvg_config_init(&cfg);
    assert_int_equal(load(&cfg, "{\"listen\": {\"address\": \"1.2.3.4:1\", \"tls_cert\": \"c\"}}",
                          err, sizeof(err)),
                     0);
    assert_int_equal(kvg_config_validate(&cfg, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "go together"));
    kvg_config_done(&cfg);
    /* The body budget holds one largest body and its rewritten copy at least. */
    kvg_config_init(&cfg);
    assert_int_equal(load(&cfg, "{\"limits\": {\"body_bytes\": 1048576, \"body_budget_mib\": 1}}",
                          err, sizeof(err)),
                     0);
    assert_int_equal(kvg_config_validate(&cfg, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "limits.body_budget_mib"));
    kvg_config_done(&cfg);
    kvg_config_init(&cfg);
    assert_int_equal(load(&cfg,
                          "{\"workers\": [{\"name\": \"a\", \"url\": \"https://x:1\"},"
                          " {\"name\": \"b\", \"url\": \"http://x:1\"}]}",
                          err, sizeof(err)),
                     0);
    assert_int_equal(kvg_config_validate(&cfg, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "worker 'a'"));
    kvg_config_done(&cfg);
}

static void test_flags(void **state)
{
    (void)state;
    kvg_config cfg;
    char err[256] = "";
    kvg_config_action action;
    kvg_config_init(&cfg);
    char *argv[] = {"kvgate",
                    "--listen",
                    "127.0.0.1:1",
                    "--listen",
                    "127.0.0.1:2",
                    "--threads",
                    "2",
                    "--worker",
                    "w1=http://127.0.0.1:5,model=a,model=b,kv_blocks=64,max_inflight=9",
                    "--access-log",
                    "off",
                    "--check-config",
                    NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 12, argv, &action, err, sizeof(err)), 0);
    assert_int_equal(action, KVG_ACTION_CHECK);
    assert_int_equal(cfg.nlisteners, 2);
    assert_int_equal(cfg.threads, 2);
    assert_int_equal(cfg.nworkers, 1);
    assert_string_equal(cfg.workers[0].url, "http://127.0.0.1:5");
    assert_int_equal(cfg.workers[0].nmodels, 2);
    assert_string_equal(cfg.workers[0].models[1], "b");
    assert_int_equal(cfg.workers[0].kv_blocks, 64);
    assert_int_equal(cfg.workers[0].max_inflight, 9);
    assert_string_equal(cfg.access_log, "off");
    assert_false(cfg.auth_open); /* keys unless the operator says otherwise */
    kvg_config_done(&cfg);

    kvg_config_init(&cfg);
    char *open_args[] = {
        "kvgate", "--auth", "open", "--worker", "w1=http://127.0.0.1:5,cache_salt=off", NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 5, open_args, &action, err, sizeof(err)), 0);
    assert_true(cfg.auth_open);
    assert_true(cfg.workers[0].no_cache_salt);
    kvg_config_done(&cfg);

    kvg_config_init(&cfg);
    char *bad_auth[] = {"kvgate", "--auth", "maybe", NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 3, bad_auth, &action, err, sizeof(err)),
                     KVG_ECONFIG);
    kvg_config_done(&cfg);

    kvg_config_init(&cfg);
    char *bad[] = {"kvgate", "--worker", "w1=http://x:1,gpu=1", NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 3, bad, &action, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "gpu=1"));
    kvg_config_done(&cfg);

    kvg_config_init(&cfg);
    char *bad2[] = {"kvgate", "--threads", "many", NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 3, bad2, &action, err, sizeof(err)), KVG_ECONFIG);
    kvg_config_done(&cfg);

    /* An item set twice is refused as a repeated JSON member is; list items append. */
    kvg_config_init(&cfg);
    char *twice[] = {"kvgate", "--worker", "w1=http://x:1,kv_blocks=1,kv_blocks=2", NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 3, twice, &action, err, sizeof(err)), KVG_ECONFIG);
    assert_string_equal(err, "--worker w1 (kv_blocks=2): kv_blocks: appears more than once");
    kvg_config_done(&cfg);

    kvg_config_init(&cfg);
    char *bad3[] = {"kvgate", "--nope", NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 2, bad3, &action, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "--nope"));
    kvg_config_done(&cfg);
}

/* Flags override the file, whatever their order on the command line. */
static void test_flags_override_file(void **state)
{
    (void)state;
    write_file("{\"threads\": 7, \"listen\": \"127.0.0.1:9\"}");
    kvg_config cfg;
    char err[256] = "";
    kvg_config_action action;
    kvg_config_init(&cfg);
    char *argv[] = {"kvgate", "--threads", "2", "-c", path, NULL};
    assert_int_equal(kvg_config_parse_args(&cfg, 5, argv, &action, err, sizeof(err)), 0);
    assert_int_equal(cfg.threads, 2);
    assert_string_equal(cfg.listeners[0].address, "127.0.0.1:9");
    assert_string_equal(cfg.path, path);
    unlink(path);
    kvg_config_done(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_file),
        cmocka_unit_test(test_errors_name_the_key),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_flags_override_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
