/* SPDX-License-Identifier: Apache-2.0 */
/*
 * strict_yaml.c - the programs' one YAML reader (strict_yaml.h).  The text is parsed twice: a
 * pass over libyaml's events refuses aliases, a second document and deep nesting -- what the
 * document loader would accept -- and only then does yaml_parser_load() build the tree.  Syntax
 * errors surface in the first pass, with the line libyaml stopped at.
 */
#include "strict_yaml.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h"
#include "banned.h"

static int refuse(struct strict_yaml_refusal *why, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int refuse(struct strict_yaml_refusal *why, int line, const char *fmt, ...)
{
    va_list ap;

    why->line = line;
    va_start(ap, fmt);
    vsnprintf(why->text, sizeof why->text, fmt, ap);
    va_end(ap);
    return -1;
}

/*
 * What libyaml's sentence means for most people who meet it: the indentation of the line it
 * stopped at (0-based `line`), and a tab there in particular, which YAML does not indent with.
 */
static const char *syntax_hint(const yaml_parser_t *p, const char *text, size_t len, size_t line)
{
    size_t i = 0, n = 0;

    if (p->error != YAML_SCANNER_ERROR && p->error != YAML_PARSER_ERROR)
        return "";
    if ((p->context && strstr(p->context, "quoted")) ||
        (p->problem && strstr(p->problem, "quoted")))
        return " (a quote is not closed)";
    while (n < line && i < len)
        n += text[i++] == '\n';
    for (; i < len && (text[i] == ' ' || text[i] == '\t'); i++)
        if (text[i] == '\t')
            return " (this line is indented with a tab: YAML indents with spaces only)";
    return " (check the indentation of this line and of the one above it)";
}

/* libyaml's own sentence for text it cannot parse, at the line it stopped, and a hint. */
static int syntax_error(const yaml_parser_t *p, const char *text, size_t len,
                        struct strict_yaml_refusal *why)
{
    size_t line = p->problem_mark.line;

    if (p->error == YAML_MEMORY_ERROR)
        die("out of memory");
    if (p->error == YAML_READER_ERROR) {
        /* The reader reports a byte offset (bad UTF-8, a control character), not a mark. */
        line = 0;
        for (size_t i = 0; i < p->problem_offset && i < len; i++)
            line += text[i] == '\n';
    }
    return refuse(why, (int)line + 1, "invalid YAML: %s%s%s%s", p->problem ? p->problem : "error",
                  p->context ? " " : "", p->context ? p->context : "",
                  syntax_hint(p, text, len, line));
}

/* The pass over libyaml's events that refuses what its document loader would accept. */
static int prescan(const char *text, size_t len, int max_depth, struct strict_yaml_refusal *why)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int depth = 0, documents = 0, rc = 0, done = 0;

    if (!yaml_parser_initialize(&parser))
        die("out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    while (rc == 0 && !done) {
        if (!yaml_parser_parse(&parser, &ev)) {
            rc = syntax_error(&parser, text, len, why);
            break;
        }
        int line = (int)ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_ALIAS_EVENT:
            /* (libyaml allows only alphanumerics, '-' and '_' in an anchor's name) */
            rc = refuse(why, line, "aliases (*%.48s) are not supported; write the value out",
                        (const char *)ev.data.alias.anchor);
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++documents > 1)
                rc = refuse(why, line, "a second YAML document; the file is one document");
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (++depth > max_depth)
                rc = refuse(why, line, "nested deeper than %d levels", max_depth);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return rc;
}

int strict_yaml_load(const char *text, size_t len, int max_depth, yaml_document_t *doc,
                     struct strict_yaml_refusal *why)
{
    yaml_parser_t parser;
    int rc = 0;

    memset(why, 0, sizeof *why);
    if (prescan(text, len, max_depth, why) != 0)
        return -1;
    if (!yaml_parser_initialize(&parser))
        die("out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, doc))
        rc = syntax_error(&parser, text, len, why);
    yaml_parser_delete(&parser);
    return rc;
}

int strict_yaml_is_null(const yaml_node_t *n)
{
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};

    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) {
        if (strcmp(strict_yaml_text(n), nulls[i]) == 0)
            return 1;
    }
    return 0;
}
