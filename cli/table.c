/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate admin's table output: an answer's JSON (a list of workers, tenants or keys, or one
 * object) laid out in aligned columns for a person at a terminal. The columns come from the
 * answer's own members, so a field the gateway adds shows up without a change here. */
#include "cli_int.h"

#include <string.h>

#define COLUMNS_MAX 64
#define LIST_CELL_MAX 48 /* display characters of a cell in a list; longer ones are cut */

/* One answer's cells: columns[c] is a flattened member name ("rate.rps"), cells[r][c] its text
 * in row r (NULL: the row has no such member). */
typedef struct grid {
    kvg_arena *arena;
    const char *columns[COLUMNS_MAX];
    size_t ncolumns;
    const char **cells; /* nrows x COLUMNS_MAX */
    size_t nrows;
    bool failed;
} grid;

/* Characters a terminal shows for s: UTF-8 continuation bytes take no column. */
static size_t display_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* Text of a scalar, or of a list: strings as they are, numbers as JSON writes them, true and
 * false; an array's items joined by ","; objects in an array by their "id" or "name" (their
 * count when in_list, where a cell should stay short). Control characters become '?', so a
 * value cannot move the cursor. NULL for null and for an empty array (shown as "-"). */
static const char *cell_text(grid *g, const kvg_json *v, bool in_list)
{
    kvg_buf b;
    kvg_buf_init(&b);
    switch (v->type) {
    case KVG_JSON_NULL:
        return NULL;
    case KVG_JSON_TRUE:
        return "true";
    case KVG_JSON_FALSE:
        return "false";
    case KVG_JSON_STRING:
        kvg_buf_append(&b, v->u.str.ptr, v->u.str.len);
        break;
    case KVG_JSON_NUMBER:
        kvg_json_write(&b, v);
        break;
    case KVG_JSON_ARRAY: {
        if (v->u.arr.count == 0)
            return NULL;
        bool objects = v->u.arr.items[0]->type == KVG_JSON_OBJECT;
        if (objects && in_list) {
            kvg_buf_printf(&b, "%zu", v->u.arr.count);
            break;
        }
        for (size_t i = 0; i < v->u.arr.count; i++) {
            const kvg_json *item = v->u.arr.items[i];
            if (item->type == KVG_JSON_OBJECT) {
                const kvg_json *id = kvg_json_get(item, "id");
                item = id ? id : kvg_json_get(item, "name");
            }
            const char *t = item ? cell_text(g, item, true) : NULL;
            kvg_buf_printf(&b, "%s%s", i ? "," : "", t ? t : "?");
        }
        break;
    }
    case KVG_JSON_OBJECT:
    default:
        kvg_json_write(&b, v);
        break;
    }
    char *out = b.failed ? NULL : kvg_arena_strndup(g->arena, b.data ? b.data : "", b.len);
    if (!out)
        g->failed = true;
    for (char *p = out; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    kvg_buf_done(&b);
    return out;
}

/* The column named name, added when new; -1 when there are too many. */
static int column(grid *g, const char *name)
{
    for (size_t c = 0; c < g->ncolumns; c++)
        if (strcmp(g->columns[c], name) == 0)
            return (int)c;
    if (g->ncolumns == COLUMNS_MAX)
        return -1;
    const char *copy = kvg_arena_strndup(g->arena, name, strlen(name));
    if (!copy) {
        g->failed = true;
        return -1;
    }
    g->columns[g->ncolumns] = copy;
    return (int)g->ncolumns++;
}

/* Fill row r from an object, flattening objects ("rate": {"rps": 1} is the column rate.rps). */
static void fill_row(grid *g, size_t r, const kvg_json *obj, const char *prefix, bool in_list)
{
    for (size_t i = 0; i < obj->u.obj.count; i++) {
        char name[128];
        snprintf(name, sizeof(name), "%s%s%s", prefix, *prefix ? "." : "", obj->u.obj.keys[i]);
        const kvg_json *v = obj->u.obj.values[i];
        if (v->type == KVG_JSON_OBJECT && v->u.obj.count) {
            fill_row(g, r, v, name, in_list);
            continue;
        }
        int c = column(g, name);
        if (c >= 0)
            g->cells[r * COLUMNS_MAX + (size_t)c] = cell_text(g, v, in_list);
    }
}

/* Write one cell padded to width (no padding after the last column). A cell longer than
 * LIST_CELL_MAX is cut, with "..." at the end (only lists call this). */
static void put_cell(FILE *out, const char *s, size_t width, bool last)
{
    if (!s)
        s = "-";
    size_t len = display_len(s);
    if (len > LIST_CELL_MAX) {
        size_t shown = 0, i = 0;
        for (; s[i] && shown < LIST_CELL_MAX - 3; i++)
            shown += ((unsigned char)s[i] & 0xc0) != 0x80;
        while (((unsigned char)s[i] & 0xc0) == 0x80)
            i++; /* end at a character's end */
        fprintf(out, "%.*s...", (int)i, s);
        len = LIST_CELL_MAX;
    } else {
        fputs(s, out);
    }
    if (!last)
        fprintf(out, "%*s", (int)(width > len ? width - len + 2 : 2), "");
}

/* "KV_BLOCKS" for kv_blocks: the header of a column. */
static void put_header(FILE *out, const char *name, size_t width, bool last)
{
    char up[128];
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof(up); i++)
        up[i] = name[i] >= 'a' && name[i] <= 'z' ? (char)(name[i] - 'a' + 'A') : name[i];
    up[i] = '\0';
    put_cell(out, up, width, last);
}

/* Rows under a header, one column per member any row has, in the order they first appear. */
static void print_rows(FILE *out, const grid *g)
{
    size_t width[COLUMNS_MAX];
    for (size_t c = 0; c < g->ncolumns; c++) {
        width[c] = KVG_MIN(display_len(g->columns[c]), LIST_CELL_MAX);
        for (size_t r = 0; r < g->nrows; r++) {
            const char *s = g->cells[r * COLUMNS_MAX + c];
            width[c] = KVG_MAX(width[c], KVG_MIN(display_len(s ? s : "-"), LIST_CELL_MAX));
        }
    }
    for (size_t c = 0; c < g->ncolumns; c++)
        put_header(out, g->columns[c], width[c], c + 1 == g->ncolumns);
    fputc('\n', out);
    for (size_t r = 0; r < g->nrows; r++) {
        for (size_t c = 0; c < g->ncolumns; c++)
            put_cell(out, g->cells[r * COLUMNS_MAX + c], width[c], c + 1 == g->ncolumns);
        fputc('\n', out);
    }
}

/* One object as FIELD VALUE lines, every member flattened. */
static void print_object(FILE *out, const grid *g)
{
    size_t width = strlen("FIELD");
    for (size_t c = 0; c < g->ncolumns; c++)
        width = KVG_MAX(width, display_len(g->columns[c]));
    fprintf(out, "%-*s  VALUE\n", (int)width, "FIELD");
    for (size_t c = 0; c < g->ncolumns; c++) {
        const char *s = g->cells[c];
        fprintf(out, "%s%*s  %s\n", g->columns[c], (int)(width - display_len(g->columns[c])), "",
                s ? s : "-");
    }
}

int kvg_cli_print_table(FILE *out, const char *view, const char *body, size_t len)
{
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    grid g = {.arena = &arena};
    kvg_json *root;
    int rc = -1;
    if (kvg_json_parse(body, len, &arena, NULL, &root, NULL) != 0 || root->type != KVG_JSON_OBJECT)
        goto out;
    const kvg_json *items = *view ? kvg_json_get(root, view) : root;
    if (!items)
        goto out;
    if (!*view) {
        g.nrows = 1;
        g.cells = kvg_arena_alloc(&arena, COLUMNS_MAX * sizeof(*g.cells));
        if (!g.cells)
            goto out;
        memset(g.cells, 0, COLUMNS_MAX * sizeof(*g.cells));
        fill_row(&g, 0, root, "", false);
        if (g.failed)
            goto out;
        print_object(out, &g);
        rc = 0;
        goto out;
    }
    if (items->type != KVG_JSON_ARRAY)
        goto out;
    g.nrows = items->u.arr.count;
    g.cells = kvg_arena_alloc(&arena, (g.nrows ? g.nrows : 1) * COLUMNS_MAX * sizeof(*g.cells));
    if (!g.cells)
        goto out;
    memset(g.cells, 0, (g.nrows ? g.nrows : 1) * COLUMNS_MAX * sizeof(*g.cells));
    for (size_t r = 0; r < g.nrows; r++) {
        if (items->u.arr.items[r]->type != KVG_JSON_OBJECT)
            goto out;
        fill_row(&g, r, items->u.arr.items[r], "", true);
    }
    if (g.failed)
        goto out;
    if (g.nrows == 0)
        fprintf(out, "no %s\n", view);
    else
        print_rows(out, &g);
    rc = 0;
out:
    kvg_arena_done(&arena);
    return rc;
}

int kvg_cli_set_output(kvg_cli *c, const char *value)
{
    if (strcmp(value, "json") == 0)
        c->output = KVG_CLI_OUTPUT_JSON;
    else if (strcmp(value, "table") == 0)
        c->output = KVG_CLI_OUTPUT_TABLE;
    else
        return kvg_cli_usage_error("-o/--output: expected json or table, got \"%s\"", value);
    return 0;
}

/* The answer's member alone as JSON ({"keys":[...]}); false when the body has no such member. */
static bool print_member(FILE *out, const char *member, const char *body, size_t len)
{
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *root;
    const kvg_json *v = NULL;
    kvg_buf b;
    kvg_buf_init(&b);
    if (kvg_json_parse(body, len, &arena, NULL, &root, NULL) == 0)
        v = kvg_json_get(root, member);
    if (v) {
        kvg_buf_putc(&b, '{');
        kvg_buf_json_string(&b, member, strlen(member));
        kvg_buf_putc(&b, ':');
        kvg_json_write(&b, v);
        kvg_buf_puts(&b, "}\n");
    }
    bool ok = v && !b.failed;
    if (ok)
        fwrite(b.data, 1, b.len, out);
    kvg_buf_done(&b);
    kvg_arena_done(&arena);
    return ok;
}

void kvg_cli_print_answer(FILE *out, const kvg_cli *c, const char *body, size_t len)
{
    if (c->output == KVG_CLI_OUTPUT_TABLE && c->table &&
        kvg_cli_print_table(out, c->table, body, len) == 0)
        return;
    if (c->member && print_member(out, c->member, body, len))
        return;
    fwrite(body, 1, len, out);
    if (len && body[len - 1] != '\n')
        fputc('\n', out);
}
