/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate's command line: `kvgate admin ...` is the admin CLI; anything else configures a
 * gateway from the flags and its config file and runs it until a signal stops it. */
#include <stdio.h>
#include <string.h>

#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include "cli.h"
#include "block_cache.h"
#include "gateway.h"
#include "kvg_config.h"
#include "preflight.h"

int main(int argc, char **argv)
{
    kvg_block_cache_install_libevent(); /* before anything libevent allocates */
    if (argc > 1 && strcmp(argv[1], "admin") == 0)
        return kvg_cli_main(argc - 1, argv + 1);
    kvg_config cfg;
    char err[1024];
    if (kvg_config_init(&cfg) < 0) {
        fprintf(stderr, "kvgate: out of memory\n");
        return 1;
    }
    kvg_config_action action;
    int status = 1;
    if (kvg_config_parse_args(&cfg, argc, argv, &action, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvgate: %s\n", err);
        goto out;
    }
    if (action == KVG_ACTION_HELP) {
        kvg_config_usage(stdout);
        status = 0;
        goto out;
    }
    if (action == KVG_ACTION_VERSION) {
        printf("kvgate %s (libevent %s, nghttp2 %s, %s)\n", KVG_VERSION, event_get_version(),
               nghttp2_version(0)->version_str, OpenSSL_version(OPENSSL_VERSION));
        status = 0;
        goto out;
    }
    if (action == KVG_ACTION_CHECK) {
        /* The checks start-up makes, short of binding the ports, contacting Redis and opening
         * a GPU; nothing is created. */
        kvg_preflight pf;
        if (kvg_preflight_run(&cfg, true, &pf, err, sizeof(err)) < 0) {
            fprintf(stderr, "kvgate: %s\n", err);
            goto out;
        }
        size_t ntls = 0;
        for (size_t i = 0; i < KVG_MAX_LISTENERS; i++)
            ntls += (pf.ctx[0][i] != NULL) + (pf.ctx[1][i] != NULL);
        kvg_preflight_done(&pf);
        printf("configuration ok: %zu listeners, %zu admin listeners, %zu workers, "
               "%zu TLS certificates\n",
               cfg.nlisteners, cfg.nadmin_listeners, cfg.nworkers, ntls);
        status = 0;
        goto out;
    }
    if (kvg_config_validate(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "kvgate: %s\n", err);
        goto out;
    }
    kvg_gateway *gw;
    if (kvg_gateway_new(&cfg, argc, argv, &gw) < 0) /* takes cfg over, also on failure */
        return 1;
    status = kvg_gateway_run(gw) < 0 ? 1 : 0;
    kvg_gateway_free(gw);
    return status;
out:
    kvg_config_done(&cfg);
    return status;
}
