/* SPDX-License-Identifier: Apache-2.0 */
/* Live mode's pseudo-text: a prompt of exactly a trace request's token count, block by block,
 * that kvgate-simworker's tokenizer (docs/simworker.md, "Tokenizer approximation") cuts at the
 * trace's block boundaries.
 *
 * Every token is " " followed by four lowercase letters. The simworker joins a single space
 * before a word with the word's first piece, and cuts word runs into pieces of at most four
 * bytes, so " abcd" is exactly one token and the next token's space ends it: n tokens are
 * 5 n bytes and token boundaries fall every 5 bytes, block boundaries included. The letters are
 * SplitMix64 of (the block's chain key, the token's position), so equal chain keys (equal hash-id
 * prefixes) give equal blocks and different keys give different text: real shared prefixes, as
 * deep as the trace's. The text needs no JSON escaping. */
#include "replay.h"

#define TOKEN_BYTES 5

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void put_tokens(char *p, uint64_t key, uint32_t from, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++) {
        uint64_t v = splitmix64(key ^ splitmix64(from + j));
        p[0] = ' ';
        for (int k = 1; k < TOKEN_BYTES; k++) {
            p[k] = (char)('a' + v % 26);
            v /= 26;
        }
        p += TOKEN_BYTES;
    }
}

void replay_live_text(kvg_buf *out, const replay_request *r)
{
    size_t bytes = (size_t)r->input_tokens * TOKEN_BYTES;
    if (kvg_buf_reserve(out, bytes + 1) < 0)
        return;
    char *p = out->data + out->len;
    uint32_t done = 0;
    for (uint32_t i = 0; i < r->nblocks && done < r->input_tokens; i++) {
        uint32_t n = replay_block_tokens(r, i);
        put_tokens(p, r->keys[i], 0, n);
        p += (size_t)n * TOKEN_BYTES;
        done += n;
    }
    /* Past the ids (a trace whose input outruns them): one more run from the last key. */
    uint64_t last = r->nblocks ? r->keys[r->nblocks - 1] : 0;
    put_tokens(p, ~last, 0, r->input_tokens - done);
    out->len += bytes;
    out->data[out->len] = '\0';
}
