/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the config file's field tables (gateway/config.c): the flags that share them,
 * --worker items through the worker's table, the ranges the file and the flags agree on. */
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

static int args(kvg_config *cfg, char **argv, char *err, size_t len)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    kvg_config_action action;
    return kvg_config_parse_args(cfg, argc, argv, &action, err, len);
}

/* A flag that sets a field of the file names itself in its message. */
static void test_flag_messages(void **state)
{
    (void)state;
    static const struct {
        const char *flag, *value, *msg;
    } cases[] = {
        {"--threads", "5000", "--threads: must be an integer in 0..1024"},
        {"--threads", "many", "--threads: must be an integer in 0..1024, not string"},
        {"--log-level", "loud", "--log-level: must be error, warn, info or debug"},
        {"--auth", "maybe", "--auth: must be keys or open"},
        {"--state", "", "--state: must be a non-empty string"},
        {"--access-log", "", "--access-log: must be a non-empty string"},
        {"--worker", "w1=http://h:1,kv_blocks=x",
         "--worker w1 (kv_blocks=x): kv_blocks: must be an integer in 0..4294967295, not string"},
        {"--worker", "w1=http://h:1,gpu=1", "--worker w1 (gpu=1): gpu: unknown field"},
        {"--worker", "w1=http://h:1,name=w2", "--worker w1 (name=w2): name: unknown field"},
        {"--worker", "w1=http://h:1,cache_salt=maybe",
         "--worker w1 (cache_salt=maybe): cache_salt: must be true or false, not string"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        kvg_config cfg;
        char err[256] = "";
        kvg_config_init(&cfg);
        char *argv[] = {"kvgate", (char *)cases[i].flag, (char *)cases[i].value, NULL};
        assert_int_equal(args(&cfg, argv, err, sizeof(err)), KVG_ECONFIG);
        if (strcmp(err, cases[i].msg) != 0)
            fail_msg("case %zu: \"%s\", want \"%s\"", i, err, cases[i].msg);
        kvg_config_done(&cfg);
    }
}

/* The flags take what the file takes: --worker's max_inflight 0 is the default, as in the file
 * and the admin API; --log-level and --auth are the file's keywords. */
static void test_flags_take_the_file_ranges(void **state)
{
    (void)state;
    kvg_config cfg;
    char err[256] = "";
    kvg_config_init(&cfg);
    char *argv[] = {"kvgate",
                    "--worker",
                    "w1=http://h:1,max_inflight=0,kv_blocks=4294967295,model=a,cache_salt=false",
                    "--worker",
                    "w2=http://h:2,max_inflight=4294967295",
                    "--log-level",
                    "warn",
                    "--auth",
                    "open",
                    "--threads",
                    "1024",
                    NULL};
    assert_int_equal(args(&cfg, argv, err, sizeof(err)), 0);
    assert_int_equal(cfg.nworkers, 2);
    assert_int_equal(cfg.workers[0].max_inflight, 0);
    assert_int_equal(cfg.workers[0].kv_blocks, 4294967295u);
    assert_true(cfg.workers[0].no_cache_salt);
    assert_string_equal(cfg.workers[0].models[0], "a");
    assert_int_equal(cfg.workers[1].max_inflight, 4294967295u);
    assert_int_equal(cfg.log_level, KVG_LOG_WARN);
    assert_true(cfg.auth_open);
    assert_int_equal(cfg.threads, 1024);
    assert_int_equal(kvg_config_validate(&cfg, err, sizeof(err)), 0);
    kvg_worker_def *defs = kvg_config_worker_defs(&cfg);
    assert_string_equal(defs[1].name, "w2");
    free(defs);
    kvg_config_done(&cfg);
}

/* The tables' defaults are the embedded defaults (docs/configuration.md). */
static void test_defaults_from_the_tables(void **state)
{
    (void)state;
    kvg_config cfg;
    kvg_config_init(&cfg);
    assert_int_equal(cfg.limits.header_bytes, 64 * 1024);
    assert_int_equal(cfg.limits.response_budget_bytes, 1ull << 30);
    assert_int_equal(cfg.upstream.max_inflight, 1024);
    assert_int_equal(cfg.upstream.connect_timeout_ms, 3000);
    /* Outlier detection and retries (Envoy's defaults but max_ejection_percent). */
    assert_int_equal(cfg.upstream.outlier.consecutive_5xx, 5);
    assert_int_equal(cfg.upstream.outlier.consecutive_gateway_failure, 5);
    assert_int_equal(cfg.upstream.outlier.base_ejection_ms, 30000);
    assert_int_equal(cfg.upstream.outlier.max_ejection_ms, 300000);
    assert_int_equal(cfg.upstream.outlier.max_ejection_percent, 50);
    assert_int_equal(cfg.upstream.retry_budget_percent, 20);
    assert_int_equal(cfg.upstream.retry_budget_min_concurrency, 3);
    assert_int_equal(kvg_config_retry_on(&cfg.upstream), KVG_RETRY_ON_DEFAULT);
    assert_int_equal(cfg.health.fall, 3);
    assert_string_equal(cfg.health.path, "/health");
    assert_int_equal(cfg.scrape.timeout_ms, 1000);
    assert_int_equal(cfg.shutdown_timeout_ms, 30000);
    assert_int_equal(cfg.tenant_metrics_max, 100);
    assert_string_equal(cfg.state_dir, "./kvgate-state");
    assert_string_equal(cfg.access_log, "-");
    assert_int_equal(cfg.log_level, KVG_LOG_INFO);
    assert_true(cfg.worker_header);
    assert_false(cfg.auth_open);
    assert_null(cfg.secret);
    assert_int_equal(cfg.nadmin_tokens, 0);
    /* a flag-only field is no key of the file */
    assert_non_null(kvg_fields_find(&kvg_config_fields, "port_file", 9));
    assert_false(kvg_fields_find(&kvg_config_fields, "port_file", 9)->set_in & KVG_SET_CONFIG);
    kvg_config_done(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flag_messages),
        cmocka_unit_test(test_flags_take_the_file_ranges),
        cmocka_unit_test(test_defaults_from_the_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
