/* SPDX-License-Identifier: Apache-2.0 */
/* `kvgate admin`: the operator's command line for the admin API, a client of it that shares
 * nothing with the gateway but the resources' field tables. */
#ifndef KVG_CLI_H
#define KVG_CLI_H

/** Run `kvgate admin` with argv[0] = "admin" and the rest of the command line: one admin API
 *  call over HTTP/1.1, the response body printed to stdout and errors to stderr. Returns the
 *  process exit status: 0 for a 2xx answer, 1 for any other answer or a connection failure,
 *  2 for a usage error. Blocking; never returns before the call ends or times out. */
int kvg_cli_main(int argc, char **argv);

#endif
