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
/** The token: --token, then $KVGATE_ADMIN_TOKEN, then STATE/admin-token as the gateway
 *  generates it. 0, or KVG_CLI_EXIT_USAGE after saying why. */
int kvg_cli_find_token(const kvg_cli *c, char *out, size_t out_len);

#endif
