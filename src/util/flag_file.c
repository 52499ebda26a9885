/* SPDX-License-Identifier: Apache-2.0 */
/*
 * flag_file.c - long options from a flat YAML mapping (flag_file.h), loaded by the programs' one
 * strict YAML reader (strict_yaml.c): each refusal names the line it is about.
 */
#include "flag_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "strbuf.h"
#include "strict_yaml.h"
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

/* A flag file is a few lines; a larger one is not one. */
#define FLAG_FILE_MAX_BYTES ((size_t)1 << 20)
/* The mapping and a value, and room to say "a value, not a list" of a nested one. */
#define FLAG_FILE_MAX_DEPTH 4

/* The "--name=value" of each pair of mapping `root`, in order, or -1 with `err` set. */
static int read_options(yaml_document_t *doc, const yaml_node_t *root, const char *path,
                        const struct option *known, const char *exclude, char ***args, int *nargs,
                        char *err, size_t errlen)
{
    const yaml_node_pair_t *pair;

    if (root->type != YAML_MAPPING_NODE)
        return failed(err, errlen, path, (size_t)strict_yaml_line(root),
                      "a mapping of option names to values is expected%s", "");
    for (pair = root->data.mapping.pairs.start; pair < root->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = yaml_document_get_node(doc, pair->key);
        const yaml_node_t *v = yaml_document_get_node(doc, pair->value);
        struct strbuf arg = STRBUF_INIT;
        const char *name;

        if (k == NULL || v == NULL || k->type != YAML_SCALAR_NODE)
            return failed(err, errlen, path, (size_t)strict_yaml_line(k ? k : root),
                          "a mapping of option names to values is expected%s", "");
        name = strict_yaml_text(k);
        if (!known_option(known, exclude, name))
            return failed(err, errlen, path, (size_t)strict_yaml_line(k), "unknown option '%s'",
                          name);
        for (int i = 0; i < *nargs; i++) {
            size_t len = strlen(name);
            if (strncmp((*args)[i] + 2, name, len) == 0 && (*args)[i][2 + len] == '=')
                return failed(err, errlen, path, (size_t)strict_yaml_line(k), "'%s' is given twice",
                              name);
        }
        if (v->type != YAML_SCALAR_NODE)
            return failed(err, errlen, path, (size_t)strict_yaml_line(v),
                          "%s: a value, not a list or a mapping", name);
        strbuf_addf(&arg, "--%s=%s", name, strict_yaml_text(v));
        *args = xrealloc(*args, (size_t)(*nargs + 1) * sizeof **args);
        (*args)[(*nargs)++] = strbuf_detach(&arg, NULL);
    }
    return 0;
}

int flag_file_load(const char *path, const struct option *known, const char *exclude, char ***args,
                   int *nargs, char *err, size_t errlen)
{
    struct strict_yaml_refusal why;
    yaml_document_t doc;
    const yaml_node_t *root;
    char **out = NULL;
    size_t len = 0;
    char *text = NULL;
    int n = 0, rc = 0;

    *args = NULL;
    *nargs = 0;
    if (read_file_capped(path, FLAG_FILE_MAX_BYTES, 0, &text, &len) != 0)
        return failed(err, errlen, path, 0, "cannot read it: %s",
                      errno == EFBIG ? "larger than 1 MiB" : strerror(errno));
    if (strict_yaml_load(text, len, FLAG_FILE_MAX_DEPTH, &doc, &why) != 0) {
        free(text);
        return failed(err, errlen, path, (size_t)why.line, "%s", why.text);
    }
    root = yaml_document_get_root_node(&doc);
    /* No root: an empty file, or only comments.  So is one empty plain scalar. */
    if (root != NULL && !(root->type == YAML_SCALAR_NODE && strict_yaml_is_null(root)))
        rc = read_options(&doc, root, path, known, exclude, &out, &n, err, errlen);
    yaml_document_delete(&doc);
    free(text);
    if (rc != 0) {
        flag_file_free(out, n);
        return -1;
    }
    *args = out;
    *nargs = n;
    return 0;
}
