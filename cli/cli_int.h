/* SPDX-License-Identifier: Apache-2.0 */
/* What cli.c (commands, options, the call they make) and client.c (the HTTP exchange) share,
 * and what the unit tests look at. */
#ifndef KVG_CLI_INT_H
#define KVG_CLI_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "common.h"

enum { KVG_CLI_EXIT_OK = 0, KVG_CLI_EXIT_FAIL = 1, KVG_CLI_EXIT_USAGE = 2 };

#define KVG_CLI_DEFAULT_URL "http://127.0.0.1:9090"
#define KVG_CLI_DEFAULT_STATE_DIR "./kvgate-state"
#define KVG_CLI_DEFAULT_TIMEOUT_S 10.0

/* How a 2xx answer is printed: -o json (the body as the gateway sent it) or -o table; without
 * -o, a table when stdout is a terminal and JSON otherwise (pipes and scripts). */
typedef enum kvg_cli_output {
    KVG_CLI_OUTPUT_AUTO = 0,
    KVG_CLI_OUTPUT_JSON,
    KVG_CLI_OUTPUT_TABLE,
    KVG_CLI_OUTPUT_COUNT,
} kvg_cli_output;

/* One invocation: the global options, then the admin API call the command turns into. */
typedef struct kvg_cli {
    const char *url;
    const char *token;
    const char *state_dir;
    double timeout_s;
    const char *method;
    kvg_buf path;   /* percent-encoded */
    kvg_buf body;   /* empty: no body */
    bool auth;      /* needs the admin token */
    bool shows_key; /* the answer holds a new key: remind to store it */
    kvg_cli_output output;
    /* The answer's table: NULL none (printed as it came), "" one object (FIELD VALUE lines),
     * else the member of the answer that is the list ("workers"). */
    const char *table;
    /* The command's output is this member of the answer, also as JSON ({"keys": [...]}). */
    const char *member;
} kvg_cli;

/** Start c with the defaults; kvg_cli_done frees what it holds. */
void kvg_cli_init(kvg_cli *c);
void kvg_cli_done(kvg_cli *c);

/** Print "kvgate admin: <message>" and the pointer to --help on stderr; returns
 *  KVG_CLI_EXIT_USAGE. */
int kvg_cli_usage_error(const char *fmt, ...) KVG_PRINTF(1, 2);
/** Write the --help text, made from the tables of global options and commands. */
void kvg_cli_usage(FILE *out);

/** Read the global options (argv[0] is "admin") into c. Returns 0 with *first at the command,
 *  -1 when --help was printed, or KVG_CLI_EXIT_USAGE after saying why. */
int kvg_cli_global_options(kvg_cli *c, int argc, char **argv, int *first);
/** Turn a command (argv[0] its first word) into c's method, path, body and flags. 0, or
 *  KVG_CLI_EXIT_USAGE after saying why (nothing is sent then). */
int kvg_cli_build_call(kvg_cli *c, int argc, char **argv);

/* Where the call goes: the admin listener of --url. */
typedef struct kvg_cli_target {
    char host[256];
    uint16_t port;
    char authority[300]; /* host:port, for the Host header and messages */
} kvg_cli_target;

/** Read --url (http://host[:port][/]; no https, no path) into t. 0, or KVG_CLI_EXIT_USAGE
 *  after saying why. */
int kvg_cli_parse_url(const char *url, kvg_cli_target *t);
/** Make c's call to t and report it: the body on stdout for a 2xx answer, "kvgate admin:
 *  STATUS: message" on stderr otherwise. Returns the exit status. token is sent unless NULL. */
int kvg_cli_send(const kvg_cli *c, const kvg_cli_target *t, const char *token);
/** Set c->output from -o/--output's value ("json" or "table"); 0, or KVG_CLI_EXIT_USAGE after
 *  saying why. */
int kvg_cli_set_output(kvg_cli *c, const char *value);
/** Print a 2xx answer's body to out as c->output and c->table, c->member say (AUTO must be
 *  resolved before): a table, or the JSON as it came (its c->member alone when set), ending
 *  with a newline. A body that is not of the expected shape is printed as it came. */
void kvg_cli_print_answer(FILE *out, const kvg_cli *c, const char *body, size_t len);
/** Write body (a JSON object) as a table: view "" the object as FIELD VALUE lines, otherwise
 *  its array member view as one row per item and a column per member (objects flattened as
 *  "rate.rps"). 0, or -1 when the body is not of that shape (nothing written then). */
int kvg_cli_print_table(FILE *out, const char *view, const char *body, size_t len);

/** The token: --token, then $KVGATE_ADMIN_TOKEN, then STATE/admin-token as the gateway
 *  generates it. 0, or KVG_CLI_EXIT_USAGE after saying why. */
int kvg_cli_find_token(const kvg_cli *c, char *out, size_t out_len);

#endif
