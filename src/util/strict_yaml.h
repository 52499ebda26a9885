/* SPDX-License-Identifier: Apache-2.0 */
/*
 * strict_yaml.h - YAML text as one libyaml document, refused where libyaml's document loader
 * would silently accept what no config means: an alias (yaml_parser_load resolves it into a
 * shared node, so the tree becomes a graph and a few bytes can stand for a very large one), a
 * second document, and nesting deeper than the caller's bound (so no walk over the tree ever
 * meets a hostile depth).  The programs' one YAML reader: idem-gateway's config
 * (src/gateway/config.c) and every program's flag file (flag_file.c) load through it.  Part of
 * idem_util (src/util/).
 */
#ifndef IDEM_UTIL_STRICT_YAML_H
#define IDEM_UTIL_STRICT_YAML_H

#include <stddef.h>

#include <yaml.h>

/* Why a text was refused: its line (1-based; 0 when about the whole text) and one sentence. */
struct strict_yaml_refusal {
    int line;
    char text[256];
};

/*
 * Loads `text` (`len` bytes, any byte, not NUL-terminated) into *doc and returns 0; delete the
 * document with yaml_document_delete().  Or returns -1 with *why: "invalid YAML: <libyaml's
 * words>", "aliases (*a) are not supported; write the value out", "a second YAML document; the
 * file is one document", or "nested deeper than <max_depth> levels".  An empty text (or only
 * comments) loads as a document without a root node.  Dies if memory runs out.
 */
int strict_yaml_load(const char *text, size_t len, int max_depth, yaml_document_t *doc,
                     struct strict_yaml_refusal *why);

/* The line a node starts on (1-based), for messages. */
static inline int strict_yaml_line(const yaml_node_t *n)
{
    return (int)n->start_mark.line + 1;
}

/* A scalar node's text (NUL-terminated; it may hold NUL bytes before its length). */
static inline const char *strict_yaml_text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* YAML's null: an empty, ~ or null plain scalar ("key:" with nothing after it). */
int strict_yaml_is_null(const yaml_node_t *n);

#endif /* IDEM_UTIL_STRICT_YAML_H */
