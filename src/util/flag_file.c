/*
 * flag_file.c - long options from a flat YAML mapping (flag_file.h).  libyaml's event parser is
 * enough for a mapping of scalars, and lets each refusal name the line it is about.
 */
#include "flag_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "strbuf.h"
#include "util.h"
#include "banned.h"

/* `name` in `known` with a value, or NULL. */
static const struct option *known_option(const struct option *known, const char *exclude,
                                         const char *name)
{
    if (exclude != NULL && strcmp(name, exclude) == 0)
        return NULL;
    for (; known->name != NULL; known++)
        if (known->has_arg == required_argument && strcmp(known->name, name) == 0)
            return known;
    return NULL;
}

static int failed(char *err, size_t errlen, const char *path, size_t line, const char *fmt,
                  const char *what)
{
    char text[300];

    snprintf(text, sizeof text, fmt, what ? what : "");
    if (line > 0)
        snprintf(err, errlen, "%s:%zu: %s", path, line, text);
    else
        snprintf(err, errlen, "%s: %s", path, text);
    return -1;
}

void flag_file_free(char **args, int nargs)
{
    for (int i = 0; i < nargs; i++)
        free(args[i]);
    free(args);
}

int flag_file_load(const char *path, const struct option *known, const char *exclude, char ***args,
                   int *nargs, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    yaml_parser_t parser;
    yaml_event_t ev;
    char **out = NULL;
    int n = 0, depth = 0, rc = 0, done = 0;
    char *key = NULL; /* the name waiting for its value */
    size_t key_line = 0;

    *args = NULL;
    *nargs = 0;
    if (f == NULL)
        return failed(err, errlen, path, 0, "cannot read it: %s", strerror(errno));
    if (!yaml_parser_initialize(&parser))
        die("libyaml: out of memory");
    yaml_parser_set_input_file(&parser, f);
    while (rc == 0 && !done) {
        size_t line;

        if (!yaml_parser_parse(&parser, &ev)) {
            rc = failed(err, errlen, path, parser.problem_mark.line + 1, "not YAML: %s",
                        parser.problem ? parser.problem : "a syntax error");
            break;
        }
        line = ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (depth < 0)
                rc = failed(err, errlen, path, line, "one document only%s", "");
            break;
        case YAML_DOCUMENT_END_EVENT:
            depth = -1; /* a second document is refused at its start */
            break;
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT:
            if (depth == 0 && ev.type == YAML_MAPPING_START_EVENT)
                depth = 1;
            else if (key != NULL)
                rc = failed(err, errlen, path, line, "%s: a value, not a list or a mapping", key);
            else
                rc = failed(err, errlen, path, line,
                            "a mapping of option names to values is expected%s", "");
            break;
        case YAML_MAPPING_END_EVENT:
            depth = 0;
            break;
        case YAML_ALIAS_EVENT:
            rc = failed(err, errlen, path, line, "aliases (*%s) are not supported",
                        (const char *)ev.data.alias.anchor);
            break;
        case YAML_SCALAR_EVENT: {
            const char *text = (const char *)ev.data.scalar.value;
            if (depth != 1) {
                /* A document that is one empty scalar is an empty file with a comment. */
                if (depth == 0 && ev.data.scalar.length == 0 && ev.data.scalar.plain_implicit)
                    break;
                rc = failed(err, errlen, path, line,
                            "a mapping of option names to values is expected%s", "");
            } else if (key == NULL) {
                if (!known_option(known, exclude, text)) {
                    rc = failed(err, errlen, path, line, "unknown option '%s'", text);
                    break;
                }
                for (int i = 0; i < n; i++) {
                    size_t len = strlen(text);
                    if (strncmp(out[i] + 2, text, len) == 0 && out[i][2 + len] == '=')
                        rc = failed(err, errlen, path, line, "'%s' is given twice", text);
                }
                key = xstrdup(text);
                key_line = line;
            } else {
                struct strbuf arg = STRBUF_INIT;
                size_t len = 0;
                strbuf_addf(&arg, "--%s=%s", key, text);
                out = xrealloc(out, (size_t)(n + 1) * sizeof *out);
                out[n++] = strbuf_detach(&arg, &len);
                free(key);
                key = NULL;
            }
            break;
        }
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    if (rc == 0 && key != NULL)
        rc = failed(err, errlen, path, key_line, "%s has no value", key);
    free(key);
    yaml_parser_delete(&parser);
    fclose(f);
    if (rc != 0) {
        flag_file_free(out, n);
        return -1;
    }
    *args = out;
    *nargs = n;
    return 0;
}
