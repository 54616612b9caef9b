/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate admin without a network: each command turns into the admin API call docs/admin-api.md
 * gives it, wrong command lines are usage errors, and --help names every command. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli_int.h"

/* Usage errors print to stderr on purpose: keep the test's output for cmocka. */
static int saved_stderr = -1;

static void quiet_stderr(void)
{
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    assert_true(null >= 0);
    fflush(stderr);
    saved_stderr = dup(2);
    dup2(null, 2);
    close(null);
}

static void restore_stderr(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
}

/* Build the call of a command line given as one string of words separated by '|'. */
static int build(kvg_cli *c, const char *line)
{
    static char buf[512];
    static char *argv[16];
    int argc = 0;
    snprintf(buf, sizeof(buf), "%s", line);
    for (char *save = NULL, *w = strtok_r(buf, "|", &save); w && argc < 16;
         w = strtok_r(NULL, "|", &save))
        argv[argc++] = w;
    kvg_cli_init(c);
    quiet_stderr();
    int rc = kvg_cli_build_call(c, argc, argv);
    restore_stderr();
    return rc;
}

static void test_calls(void **state)
{
    (void)state;
    static const struct {
        const char *line, *method, *path, *body;
        bool auth;
    } cases[] = {
        {"workers|list", "GET", "/admin/v1/workers", "", true},
        {"workers|get|w.1", "GET", "/admin/v1/workers/w.1", "", true},
        {"workers|put|w1|http://h:1|--model|a|--model=b|--kv-blocks|40|--no-cache-salt", "PUT",
         "/admin/v1/workers/w1",
         "{\"models\":[\"a\",\"b\"],\"kv_blocks\":40,\"cache_salt\":false,\"url\":\"http://h:1\"}",
         true},
        {"workers|delete|w1", "DELETE", "/admin/v1/workers/w1", "", true},
        {"workers|drain|w_1", "POST", "/admin/v1/workers/w_1/drain", "", true},
        {"tenants|list", "GET", "/admin/v1/tenants", "", true},
        {"tenants|get|acme", "GET", "/admin/v1/tenants/acme", "", true},
        {"tenants|put|acme|--sharing|group:blue|--rps|2.5|--max-inflight|8", "PUT",
         "/admin/v1/tenants/acme",
         "{\"sharing\":\"group\",\"group\":\"blue\",\"rate\":{\"rps\":2.5},\"max_inflight\":8}",
         true},
        {"tenants|put|acme", "PUT", "/admin/v1/tenants/acme", "{}", true},
        {"tenants|delete|acme", "DELETE", "/admin/v1/tenants/acme", "", true},
        {"keys|create|acme", "POST", "/admin/v1/tenants/acme/keys", "", true},
        {"keys|delete|acme|kabc", "DELETE", "/admin/v1/tenants/acme/keys/kabc", "", true},
        {"policy|get", "GET", "/admin/v1/policy", "", true},
        {"policy|set|random", "PUT", "/admin/v1/policy", "{\"policy\":\"random\"}", true},
        {"policy|set|--load-factor|0.25", "PUT", "/admin/v1/policy", "{\"load_factor\":0.25}",
         true},
        {"metrics", "GET", "/metrics", "", true},
        {"health", "GET", "/healthz", "", false},
        {"ready", "GET", "/readyz", "", false},
        /* after "--" everything is an argument */
        {"workers|get|--|--odd", "GET", "/admin/v1/workers/--odd", "", true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvg_cli c;
        if (build(&c, cases[i].line) != 0)
            fail_msg("%s: refused", cases[i].line);
        assert_string_equal(c.method, cases[i].method);
        assert_string_equal(c.path.data, cases[i].path);
        if (strcmp(c.body.len ? c.body.data : "", cases[i].body) != 0)
            fail_msg("%s: body %s, want %s", cases[i].line, c.body.len ? c.body.data : "",
                     cases[i].body);
        assert_int_equal(c.auth, cases[i].auth);
        assert_int_equal(c.shows_key, strcmp(cases[i].line, "keys|create|acme") == 0);
        kvg_cli_done(&c);
    }
}

static void test_explain(void **state)
{
    (void)state;
    char path[] = "/tmp/kvg-cli-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char req[] = "{\"model\":\"m\",\"prompt\":\"x\"}";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    close(fd);
    char line[128];
    snprintf(line, sizeof(line), "explain|%s|--tenant|acme|--path=/v1/completions", path);
    kvg_cli c;
    assert_int_equal(build(&c, line), 0);
    assert_string_equal(c.method, "POST");
    assert_string_equal(c.path.data, "/admin/v1/route/explain");
    assert_string_equal(c.body.data,
                        "{\"tenant\":\"acme\",\"path\":\"/v1/completions\",\"request\":"
                        "{\"model\":\"m\",\"prompt\":\"x\"}}");
    kvg_cli_done(&c);
    snprintf(line, sizeof(line), "explain|%s|--tenant|a|--tenant|b", path);
    assert_int_equal(build(&c, line), KVG_CLI_EXIT_USAGE);
    kvg_cli_done(&c);
    unlink(path);
    assert_int_equal(build(&c, "explain|/nonexistent/kvg-cli"), KVG_CLI_EXIT_USAGE);
    kvg_cli_done(&c);
}

static void test_usage_errors(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "frobnicate",
        "workers",
        "workers|frob",
        "workers|get",
        "workers|get|a|b",
        "workers|put|w1",
        "workers|put|w1|http://h:1|--gpu|1",
        "workers|put|w1|http://h:1|--kv-blocks",
        "workers|put|w1|http://h:1|--kv-blocks|many",
        "workers|put|w1|http://h:1|--kv-blocks|1|--kv-blocks|2",
        "workers|put|w1|http://h:1|--cache-salt=yes",
        "workers|list|--model|m",
        "tenants|put|acme|--sharing|group:",
        "keys",
        "keys|delete|acme",
        "policy|set",
        "policy|set|--load-factor|-1",
        "policy|set|--policy|random", /* the name is an argument, not an option */
        "metrics|now",
        "explain",
        /* names and ids the gateway would refuse, refused before they are encoded */
        "workers|get|w 1",
        "workers|drain|w/1",
        "workers|get|..",
        "tenants|put|bad/x",
        "tenants|get|",
        "keys|create|a%2Fb",
        "keys|delete|acme|K1",
        "keys|delete|acme|k12345678901234567",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvg_cli c;
        if (build(&c, bad[i]) != KVG_CLI_EXIT_USAGE)
            fail_msg("%s: not a usage error", bad[i]);
        kvg_cli_done(&c);
    }
}

static void test_options_and_url(void **state)
{
    (void)state;
    char *argv[] = {"admin", "--url=http://[::1]:9", "--timeout", "2.5", "--token", "t", "workers",
                    "list"};
    kvg_cli c;
    kvg_cli_init(&c);
    int first = 0;
    assert_int_equal(kvg_cli_global_options(&c, 8, argv, &first), 0);
    assert_int_equal(first, 6);
    assert_string_equal(c.url, "http://[::1]:9");
    assert_string_equal(c.token, "t");
    assert_true(c.timeout_s == 2.5);
    kvg_cli_target t;
    assert_int_equal(kvg_cli_parse_url(c.url, &t), 0);
    assert_string_equal(t.host, "::1");
    assert_int_equal(t.port, 9);
    kvg_cli_done(&c);
    assert_int_equal(kvg_cli_parse_url("http://h", &t), 0);
    assert_int_equal(t.port, 80);
    assert_string_equal(t.authority, "h:80");
    quiet_stderr();
    assert_int_equal(kvg_cli_parse_url("https://h:1", &t), KVG_CLI_EXIT_USAGE);
    assert_int_equal(kvg_cli_parse_url("http://h:1/admin", &t), KVG_CLI_EXIT_USAGE);
    char *bad[] = {"admin", "--timeout", "0", "workers"};
    kvg_cli_init(&c);
    assert_int_equal(kvg_cli_global_options(&c, 4, bad, &first), KVG_CLI_EXIT_USAGE);
    kvg_cli_done(&c);
    restore_stderr();
}

/* -o/--output before or after the command; the command says which table its answer makes. */
static void test_output_option(void **state)
{
    (void)state;
    char *argv[] = {"admin", "-o", "table", "--output=json", "workers", "list"};
    kvg_cli c;
    kvg_cli_init(&c);
    int first = 0;
    assert_int_equal(kvg_cli_global_options(&c, 6, argv, &first), 0);
    assert_int_equal(first, 4);
    assert_int_equal(c.output, KVG_CLI_OUTPUT_JSON);
    kvg_cli_done(&c);
    static const struct {
        const char *line;
        kvg_cli_output output;
        const char *table, *member;
    } cases[] = {
        {"workers|list", KVG_CLI_OUTPUT_AUTO, "workers", NULL},
        {"workers|list|-o|json", KVG_CLI_OUTPUT_JSON, "workers", NULL},
        {"tenants|list|--output|table", KVG_CLI_OUTPUT_TABLE, "tenants", NULL},
        {"tenants|get|acme|--output=table", KVG_CLI_OUTPUT_TABLE, "", NULL},
        {"keys|list|acme", KVG_CLI_OUTPUT_AUTO, "keys", "keys"},
        {"policy|set|random|-o|json", KVG_CLI_OUTPUT_JSON, "", NULL},
        {"metrics", KVG_CLI_OUTPUT_AUTO, NULL, NULL},
        {"explain|-|-o|table", KVG_CLI_OUTPUT_TABLE, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (strncmp(cases[i].line, "explain", 7) == 0)
            continue; /* reads stdin */
        if (build(&c, cases[i].line) != 0)
            fail_msg("%s: refused", cases[i].line);
        assert_int_equal(c.output, cases[i].output);
        if (!cases[i].table)
            assert_null(c.table);
        else
            assert_string_equal(c.table, cases[i].table);
        if (!cases[i].member)
            assert_null(c.member);
        else
            assert_string_equal(c.member, cases[i].member);
        kvg_cli_done(&c);
    }
    static const char *const bad[] = {"workers|list|-o", "workers|list|-o|yaml",
                                      "workers|list|--output=", "workers|list|-oj"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (build(&c, bad[i]) != KVG_CLI_EXIT_USAGE)
            fail_msg("%s: not a usage error", bad[i]);
        kvg_cli_done(&c);
    }
}

/* What a print writes, as a string the caller frees. */
static char *print_table(const char *view, const char *body, int *rc)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    *rc = kvg_cli_print_table(f, view, body, strlen(body));
    fclose(f);
    return text;
}

static void test_tables(void **state)
{
    (void)state;
    int rc;
    /* a list: columns in first-seen order, objects flattened, "-" where a row has nothing,
     * arrays joined, objects in arrays counted, control characters shown as '?' */
    char *t = print_table("tenants",
                          "{\"tenants\":[{\"id\":\"a\",\"rate\":{\"rps\":2.5},\"models\":[\"m1\","
                          "\"m2\"],\"keys\":[{\"id\":\"k1\"},{\"id\":\"k2\"}]},{\"id\":\"long-id\","
                          "\"group\":\"g\\n\",\"models\":[],\"on\":true,\"none\":null}]}",
                          &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(t, "ID       RATE.RPS  MODELS  KEYS  GROUP  ON    NONE\n"
                           "a        2.5       m1,m2   2     -      -     -\n"
                           "long-id  -         -       -     g?     true  -\n");
    free(t);
    /* one object: FIELD VALUE lines; arrays of objects by their ids */
    t = print_table("",
                    "{\"id\":\"acme\",\"keys\":[{\"id\":\"k1\"},{\"id\":\"k2\"}],"
                    "\"rate\":{\"rps\":1}}",
                    &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(t, "FIELD     VALUE\n"
                           "id        acme\n"
                           "keys      k1,k2\n"
                           "rate.rps  1\n");
    free(t);
    /* a long cell is cut in a list, at a character's end */
    char body[512], want[512];
    char long_model[80];
    memset(long_model, 'x', 60);
    long_model[60] = '\0';
    snprintf(body, sizeof(body), "{\"w\":[{\"m\":\"%s\"}]}", long_model);
    t = print_table("w", body, &rc);
    snprintf(want, sizeof(want), "M\n%.45s...\n", long_model);
    assert_string_equal(t, want);
    free(t);
    t = print_table("w", "{\"w\":[]}", &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(t, "no w\n");
    free(t);
    /* not of the shape: nothing written, the caller prints the answer as it came */
    static const char *const odd[][2] = {{"w", "not json"},
                                         {"w", "[1]"},
                                         {"w", "{\"v\":[]}"},
                                         {"w", "{\"w\":[1]}"},
                                         {"w", "{\"w\":{}}"}};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        t = print_table(odd[i][0], odd[i][1], &rc);
        assert_int_equal(rc, -1);
        assert_string_equal(t, "");
        free(t);
    }
    /* keys list as JSON: the member alone */
    kvg_cli c;
    kvg_cli_init(&c);
    c.output = KVG_CLI_OUTPUT_JSON;
    c.table = "keys";
    c.member = "keys";
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    static const char tenant[] = "{\"id\":\"a\",\"keys\":[{\"id\":\"k1\"}],\"inflight\":0}";
    kvg_cli_print_answer(f, &c, tenant, strlen(tenant));
    c.output = KVG_CLI_OUTPUT_TABLE;
    c.table = "";
    c.member = NULL;
    kvg_cli_print_answer(f, &c, "oops", 4); /* not JSON: as it came, with a newline */
    fclose(f);
    assert_string_equal(text, "{\"keys\":[{\"id\":\"k1\"}]}\noops\n");
    free(text);
    kvg_cli_done(&c);
}

/* --help comes from the table: every command is in it, with its call. */
static void test_help(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    kvg_cli_usage(f);
    fclose(f);
    static const char *const want[] = {
        ("  workers put NAME URL [--model MODEL]... [--kv-blocks N] [--max-inflight N]\n"
         "      [--cache-salt|--no-cache-salt] [--kv-events KV_EVENTS]\n"
         "      [--kv-events-replay KV_EVENTS_REPLAY] [--kv-events-stale-ms N]\n"),
        "PUT /admin/v1/workers/NAME\n",
        "  keys delete TENANT KEYID          DELETE /admin/v1/tenants/TENANT/keys/KEYID\n",
        "[--rps X]",
        "NAME: least_loaded, round_robin, random, cost, prefix_only",
        "  health                            GET /healthz: no token needed\n",
        "  --timeout SECONDS  for the whole call (default 10)\n",
        "  --output FORMAT    json or table",
        "  keys list TENANT                  GET /admin/v1/tenants/TENANT",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(text, want[i]))
            fail_msg("--help lacks \"%s\":\n%s", want[i], text);
    for (const char *p = text, *nl; (nl = strchr(p, '\n')); p = nl + 1)
        assert_true(nl - p <= 96);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls),        cmocka_unit_test(test_explain),
        cmocka_unit_test(test_usage_errors), cmocka_unit_test(test_options_and_url),
        cmocka_unit_test(test_help),         cmocka_unit_test(test_output_option),
        cmocka_unit_test(test_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
