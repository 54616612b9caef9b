/* SPDX-License-Identifier: Apache-2.0 */
/* The compiled form of a chat template (tokens, syntax tree) shared by template/'s parser
 * (parse.c) and evaluator (render.c); private to template/ and its tests. */
#ifndef KVG_TPL_INT_H
#define KVG_TPL_INT_H

#include <setjmp.h>

#include "template.h"

typedef struct tstr {
    const char *p;
    size_t n;
} tstr;

/* Syntax tree. Statements and expressions share one node shape; which children a kind uses is
 * noted by each kind. */
typedef enum nkind {
    /* statements */
    N_BODY,     /* kids: statements */
    N_TEXT,     /* s: literal text */
    N_OUTPUT,   /* a: expression */
    N_IF,       /* a: condition, b: then body, c: else body (an elif is an N_IF there) or NULL */
    N_FOR,      /* kids: target names (N_NAME), a: iterable, b: body, c: else body, d: filter */
    N_SET,      /* a: target (N_NAME or N_ATTR of an N_NAME), b: value */
    N_SETBLOCK, /* a: target, b: body */
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_LIT,    /* lit */
    N_NAME,   /* s */
    N_ATTR,   /* a.s */
    N_INDEX,  /* a[b] */
    N_SLICE,  /* a[b:c:d], missing parts NULL */
    N_CALL,   /* a(kids), knames: keyword of each argument or {NULL, 0} */
    N_FILTER, /* a | s(kids), op: filter id */
    N_TEST,   /* a is [not] s(kids), op: test id, neg */
    N_BIN,    /* a op b */
    N_UNARY,  /* op a ('-', '+', 'n' for not) */
    N_AND,
    N_OR,
    N_COND,     /* b if a else c (c may be NULL) */
    N_LIST,     /* kids; neg: a tuple */
    N_DICT,     /* kids: key, value, key, value ... */
    N_CMPCHAIN, /* kids[0] ops[0] kids[1] ops[1] kids[2] ...: Python's chained comparison */
    N_KIND_COUNT,
} nkind;

/* Binary operators (N_BIN's op). */
enum {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
};

typedef enum vtype {
    V_UNDEF = 0,
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,
    V_DICT,
    V_NS,
    V_LOOP,
    V_FUNC,
} vtype;

typedef struct tval tval;
typedef struct tlist {
    size_t n;
    tval *v;
    bool tuple; /* a Python tuple: () in repr, never equal to a list */
} tlist;
typedef struct tdict {
    size_t n, cap;
    tstr *k;
    tval *v;
} tdict;
typedef struct loopst {
    int64_t index0, length;
    const tlist *items;
} loopst;

struct tval {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        tstr s; /* V_STR; for V_UNDEF the name that was looked up, for messages */
        tlist *l;
        tdict *d;
        loopst *lp;
        int fn;
    } u;
};

typedef struct node node;
struct node {
    uint8_t kind;
    uint8_t neg;
    int op;
    uint32_t line, col;
    node *a, *b, *c, *d;
    node **kids;
    tstr *knames;
    int *ops; /* N_CMPCHAIN */
    size_t nkids;
    tstr s;
    tval lit;
};

struct kvg_template {
    kvg_arena arena; /* every node and string of the compiled form */
    node *root;
    kvg_template_limits limits;
};

/* Filter, test, method and global ids, resolved at compile time so that an unsupported name is
 * refused before any request. */
enum {
    F_LENGTH = 1,
    F_TRIM,
    F_TOJSON,
    F_SELECTATTR,
    F_REJECTATTR,
    F_SELECT,
    F_REJECT,
    F_MAP,
    F_JOIN,
    F_ITEMS,
    F_LIST,
    F_FIRST,
    F_LAST,
    F_UPPER,
    F_LOWER,
    F_CAPITALIZE,
    F_TITLE,
    F_REPLACE,
    F_DEFAULT,
    F_STRING,
    F_INT,
    F_FLOAT,
    F_ABS,
    F_REVERSE,
    F_SAFE,
};
enum {
    T_DEFINED = 1,
    T_UNDEFINED,
    T_NONE,
    T_STRING,
    T_NUMBER,
    T_INTEGER,
    T_FLOAT,
    T_MAPPING,
    T_ITERABLE,
    T_SEQUENCE,
    T_BOOLEAN,
    T_TRUE,
    T_FALSE,
    T_EQ,
    T_NE,
    T_LT,
    T_LE,
    T_GT,
    T_GE,
    T_IN,
    T_ODD,
    T_EVEN,
    T_DIVISIBLEBY,
    T_SAMEAS,
    T_LOWER,
    T_UPPER,
};
enum {
    G_NAMESPACE = 1,
    G_RAISE,
    G_STRFTIME,
    G_RANGE,
    G_DICT,
};

/* Name tables (render.c), used by the parser to resolve names. */
int tpl_filter_id(const char *p, size_t n);
int tpl_test_id(const char *p, size_t n);
int tpl_global_id(const char *p, size_t n);
bool tpl_method_known(const char *p, size_t n);

#endif
