/* SPDX-License-Identifier: Apache-2.0 */
/* The simulated worker's own tokenizer: a deterministic approximation of a BPE tokenizer
 * (about 4 bytes per token) that shares no code with the gateway. */
#include "simworker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PIECE_MAX 4 /* bytes of a piece, not counting a leading space */

void sim_tokens_init(sim_tokens *t, size_t limit)
{
    t->v = NULL;
    t->n = 0;
    t->cap = 0;
    t->limit = limit;
}

void sim_tokens_done(sim_tokens *t)
{
    free(t->v);
    sim_tokens_init(t, t->limit);
}

int sim_tokens_push(sim_tokens *t, uint32_t id)
{
    if (t->limit && t->n >= t->limit) {
        t->n++;
        return 0;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        if (t->limit && cap > t->limit)
            cap = t->limit;
        uint32_t *v = realloc(t->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = id;
    return 0;
}

bool sim_tokens_truncated(const sim_tokens *t)
{
    return t->limit && t->n > t->limit;
}

uint32_t sim_piece_id(const char *piece, size_t len)
{
    /* FNV-1a: a simple, well-known 32-bit hash; the gateway uses neither it nor these pieces. */
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)piece[i];
        h *= 16777619u;
    }
    return h % SIM_TOKEN_ORDINARY;
}

/* Special tokens of the ChatML family are single tokens, as in real tokenizers, so a
 * pre-rendered prompt sent to /v1/completions tokenizes like the same chat. */
static const struct {
    const char *text;
    size_t len;
    uint32_t id;
} specials[] = {
    {"<|endoftext|>", 13, SIM_TOKEN_ENDOFTEXT},
    {"<|im_start|>", 12, SIM_TOKEN_IM_START},
    {"<|im_end|>", 10, SIM_TOKEN_IM_END},
};

static size_t special_at(const char *s, size_t avail, uint32_t *id)
{
    if (avail < 2 || s[0] != '<' || s[1] != '|')
        return 0;
    for (size_t i = 0; i < KVG_ARRAY_LEN(specials); i++) {
        if (avail >= specials[i].len && memcmp(s, specials[i].text, specials[i].len) == 0) {
            *id = specials[i].id;
            return specials[i].len;
        }
    }
    return 0;
}

static bool is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static bool is_word(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c >= 0x80;
}

/* Bytes of the character starting at s: UTF-8 sequences stay whole; anything malformed
 * counts as one byte, so arbitrary input is accepted. */
static size_t char_len(const unsigned char *s, size_t avail)
{
    size_t n = 1;
    if (s[0] >= 0xf0 && s[0] <= 0xf7)
        n = 4;
    else if (s[0] >= 0xe0)
        n = 3;
    else if (s[0] >= 0xc0)
        n = 2;
    if (n > avail)
        return 1;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 1;
    return n;
}

static int emit(sim_tokens *out, const char *p, size_t len)
{
    return sim_tokens_push(out, sim_piece_id(p, len));
}

/* Cut s[0..len) (one class) into pieces of at most PIECE_MAX bytes, characters kept whole.
 * lead is 1 when s[0] is a space that belongs to the first piece. */
static int emit_run(sim_tokens *out, const char *s, size_t len, size_t lead)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t start = i, used = 0;
        if (lead) {
            i += lead;
            lead = 0;
        }
        while (i < len) {
            size_t c = char_len(u + i, len - i);
            if (used && used + c > PIECE_MAX)
                break;
            used += c;
            i += c;
        }
        int rc = emit(out, s + start, i - start);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int sim_tokenize(const char *text, size_t len, sim_tokens *out)
{
    const unsigned char *u = (const unsigned char *)text;
    size_t i = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        uint32_t id;
        size_t sl = special_at(text + i, len - i, &id);
        if (sl) {
            rc = sim_tokens_push(out, id);
            i += sl;
            continue;
        }
        size_t j = i;
        if (is_word(u[i]) || (u[i] == ' ' && i + 1 < len && is_word(u[i + 1]))) {
            size_t lead = u[i] == ' ' ? 1 : 0;
            j = i + lead;
            while (j < len && is_word(u[j]))
                j++;
            rc = emit_run(out, text + i, j - i, lead);
        } else if (is_space(u[i])) {
            while (j < len && is_space(u[j]))
                j++;
            /* A single space before a word goes with the word (" word"), as in BPE
             * vocabularies; the rest of the run is its own pieces. */
            if (j < len && is_word(u[j]) && u[j - 1] == ' ')
                j--;
            rc = emit_run(out, text + i, j - i, 0);
        } else {
            uint32_t ignored;
            while (j < len && !is_space(u[j]) && !is_word(u[j]) &&
                   (j == i || !special_at(text + j, len - j, &ignored)))
                j++;
            rc = emit_run(out, text + i, j - i, 0);
        }
        i = j;
    }
    return rc;
}

/* Generated text cycles through short words (at most 4 bytes) so each " word" is exactly one
 * piece of the tokenizer above. */
static const char *const output_words[] = {
    " the",  " of",   " and",  " to",   " in",   " is",   " that", " for",  " it",   " as",
    " was",  " with", " be",   " on",   " not",  " he",   " by",   " are",  " this", " from",
    " at",   " or",   " have", " an",   " they", " you",  " were", " her",  " all",  " she",
    " one",  " had",  " word", " but",  " we",   " can",  " said", " now",  " use",  " each",
    " when", " how",  " will", " up",   " out",  " then", " them", " so",   " some", " make",
    " like", " him",  " into", " time", " has",  " look", " two",  " more", " see",  " way",
    " been", " call", " who",  " oil",
};

const char *sim_output_piece(uint32_t k)
{
    return output_words[(k ? k - 1 : 0) % KVG_ARRAY_LEN(output_words)];
}

uint32_t sim_output_token(uint32_t k)
{
    const char *p = sim_output_piece(k);
    return sim_piece_id(p, strlen(p));
}
