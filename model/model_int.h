/* SPDX-License-Identifier: Apache-2.0 */
/* Inside model/: the loaded model's layout, shared by load.c (which fills it) and keys.c (which
 * reads it). */
#ifndef KVG_MODEL_INT_H
#define KVG_MODEL_INT_H

#include "model.h"

struct kvg_model {
    char *name; /* owned copies of the definition's strings (NULL where the definition had none) */
    size_t name_len;
    char *tokenizer_path, *tokenizer_config_path, *chat_template_path, *hash_seed;
    kvg_vllm_algo algo;
    uint32_t block_size;
    kvg_tokenizer *tokenizer;         /* owned */
    kvg_tokenizer_cache *token_cache; /* owned; NULL: token_cache_mib 0 */
    uint32_t token_cache_mib;
    kvg_template *tpl;       /* owned; NULL when neither tokenizer_config's chat_template nor a
                                chat_template file gives one: chat requests stay in byte mode */
    kvg_template_vars vars;  /* bos/eos token strings (owned; NULL when the config has none);
                                openai_content = kvg_template_wants_parts(tpl) */
    kvg_vllm_hash none_hash; /* NONE_HASH of (algo, hash_seed) */
    uint64_t root;           /* kvg_model_root */
};

#endif
