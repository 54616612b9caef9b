/* SPDX-License-Identifier: Apache-2.0 */
/* The tokenizer's word-character class (private to tokenizer/). */
#ifndef KVG_TOKENIZER_WORD_H
#define KVG_TOKENIZER_WORD_H

#include <stdbool.h>
#include <stdint.h>

/** Whether cp is a word character (\w) of the Rust regex crate (tokenizer_word.c). */
bool kvg_tokenizer_is_word(uint32_t cp);

#endif
