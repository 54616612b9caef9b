/* SPDX-License-Identifier: Apache-2.0 */
/* The small tokenizer.json the tokenizer and model-keys fuzz targets share: every byte in the
 * vocabulary (byte-level), a few merges, NFC, Qwen2's split, added tokens with each flag, a BOS
 * template. */
#include <stdlib.h>
#include <string.h>

#include "builtin_tokenizer.h"

/* GPT-2's bytes_to_unicode: the character standing for byte b in a byte-level vocabulary. */
static unsigned byte_char(unsigned b)
{
    bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (self)
        return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++) {
        bool s = (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
        k += !s;
    }
    return 256 + k;
}

static void put_char(kvg_buf *b, unsigned cp)
{
    unsigned char u[4];
    size_t n = kvg_utf8_put(u, cp);
    kvg_buf_json_string(b, (const char *)u, n);
}

void fuzz_builtin_tokenizer_json(kvg_buf *out)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\","
                     "\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":");
    kvg_buf_json_string(&b,
                        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                        strlen("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
    kvg_buf_puts(&b, "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                     "\"add_prefix_space\":false,\"use_regex\":false}]},"
                     "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (unsigned i = 0; i < 256; i++) {
        put_char(&b, byte_char(i));
        kvg_buf_printf(&b, ":%u,", i);
    }
    kvg_buf_puts(
        &b, "\"\\u0120t\":256,\"he\":257,\"\\u0120the\":258,\"in\":259,\"ing\":260,"
            "\"\\u0120\\u0120\":261,\"\\u0120\\u0120\\u0120\\u0120\":262,\"\\u00c3\\u00a9\":263},"
            "\"merges\":[\"\\u0120 t\",\"h e\",\"\\u0120t he\",\"i n\",\"in g\","
            "\"\\u0120 \\u0120\",\"\\u0120\\u0120 \\u0120\\u0120\",[\"\\u00c3\",\"\\u00a9\"]]},"
            "\"added_tokens\":["
            "{\"id\":264,\"content\":\"<|s|>\",\"single_word\":false,\"lstrip\":false,"
            "\"rstrip\":false,\"normalized\":false,\"special\":true},"
            "{\"id\":265,\"content\":\"<|e|>\",\"single_word\":false,\"lstrip\":true,"
            "\"rstrip\":true,\"normalized\":false,\"special\":true},"
            "{\"id\":266,\"content\":\"word\",\"single_word\":true,\"lstrip\":false,"
            "\"rstrip\":false,\"normalized\":true,\"special\":false},"
            "{\"id\":267,\"content\":\"e\\u0301x\",\"single_word\":false,\"lstrip\":false,"
            "\"rstrip\":false,\"normalized\":true,\"special\":false}],"
            "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
            "{\"SpecialToken\":{\"id\":\"<|s|>\",\"type_id\":0}},{\"Sequence\":{\"id\":"
            "\"A\",\"type_id\":0}}],\"special_tokens\":{\"<|s|>\":{\"id\":\"<|s|>\","
            "\"ids\":[264],\"tokens\":[\"<|s|>\"]}}}}");
    if (b.failed)
        abort();
    *out = b;
}
