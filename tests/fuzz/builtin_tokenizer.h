/* SPDX-License-Identifier: Apache-2.0 */
/* The fuzz targets' built-in tokenizer.json (builtin_tokenizer.c). */
#ifndef KVG_FUZZ_BUILTIN_TOKENIZER_H
#define KVG_FUZZ_BUILTIN_TOKENIZER_H

#include "common.h"

/** The JSON into *out (initialised here; the caller frees it with kvg_buf_done). Its added
 *  tokens: <|s|> (264, special, the BOS the template adds), <|e|> (265, lstrip/rstrip), "word"
 *  (266, single_word), "e\u0301x" (267, normalized). */
void fuzz_builtin_tokenizer_json(kvg_buf *out);

#endif
