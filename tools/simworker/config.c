/* SPDX-License-Identifier: Apache-2.0 */
/* Default settings of the simulated worker and its deterministic random streams. */
#include "simworker.h"

#include <string.h>

void sim_config_defaults(sim_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_host = "127.0.0.1";
    cfg->listen_port = 8000; /* vLLM's default port */
    cfg->name = "simworker";
    cfg->models[0] = "sim-model";
    cfg->n_models = 1;
    cfg->kv_blocks = 4096;
    cfg->block_tokens = 16; /* vLLM's default block size on GPUs */
    cfg->max_model_len = 0; /* 0: min(32768, kv_blocks * block_tokens), set by main */
    cfg->max_running = 256; /* vLLM's max_num_seqs default */
    cfg->max_waiting = 10000;
    cfg->default_max_tokens = 16; /* OpenAI's completions default */
    cfg->prefill_us_per_token = 50.0;
    cfg->decode_us_per_token = 5000.0;
    cfg->time_scale = 1.0;
    cfg->keep_alive_s = 5; /* uvicorn's keep-alive timeout, which vLLM keeps */
    cfg->max_body_bytes = 64u << 20;
    cfg->seed = 0;
    cfg->kv_events_buffer = SIM_KVEV_BUFFER_DEFAULT;
}

uint64_t sim_rand(uint64_t seed, uint64_t stream, uint64_t n)
{
    /* SplitMix64 over (seed, stream, n): independent streams without shared state, so one
     * kind of draw never shifts another. */
    uint64_t z = seed ^ (stream * 0x9e3779b97f4a7c15ull) ^ (n * 0xbf58476d1ce4e5b9ull);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sim_rand_unit(uint64_t seed, uint64_t stream, uint64_t n)
{
    return (double)(sim_rand(seed, stream, n) >> 11) * (1.0 / 9007199254740992.0);
}
