/* SPDX-License-Identifier: Apache-2.0 */
/* The smallest tokenizer.json the loader accepts (byte-level BPE over "a" and "b", no merges),
 * for unit tests that need a model on disk (test_model.c, test_registry.c, router's
 * test_route.c). */
#ifndef KVG_TEST_TINY_TOKENIZER_H
#define KVG_TEST_TINY_TOKENIZER_H

#define TINY_TOKENIZER_JSON                                                                        \
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"               \
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"    \
    "\"use_regex\":false},\"post_processor\":null,\"decoder\":null,\"model\":{\"type\":\"BPE\","   \
    "\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"                      \
    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,"                      \
    "\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}"

#endif
