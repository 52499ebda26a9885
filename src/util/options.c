/* SPDX-License-Identifier: Apache-2.0 */
/*
 * options.c - the command line of every program from one table of rows (options.h): the
 * getopt_long() table, the parse and the --help text are made here, so that each program only
 * says what its options are.  A row's getopt value is its index plus OPTION_VAL0, out of the
 * range of the short letters.
 */
#include "options.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "banned.h"

#define OPTION_VAL0 0x100

int options_error(const struct options *o, const char *fmt, ...)
{
    char *msg;
    va_list ap, ap2;
    int n;

    va_start(ap, fmt);
    va_copy(ap2, ap);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    msg = xmalloc(n > 0 ? (size_t)n + 1 : 1);
    msg[0] = '\0';
    if (n > 0)
        vsnprintf(msg, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    /* Masked whole, never truncated first: no half a secret escapes the masking. */
    if (o->redact != NULL)
        o->redact(msg);
    fprintf(stderr, "%s: %s\nTry '%s --help'.\n", o->prog, msg, o->prog);
    free(msg);
    return OPTIONS_EXIT_USAGE;
}

static int is_option(const struct option_row *row)
{
    return row->kind != OPTION_TEXT && row->name != NULL;
}

struct option *options_longopts(const struct option_row *rows)
{
    struct option *table;
    size_t n = 0, i, j = 0;

    while (rows[n].kind != OPTION_END)
        n++;
    table = xcalloc(n + 1, sizeof *table);
    for (i = 0; i < n; i++) {
        if (!is_option(&rows[i]))
            continue;
        table[j].name = rows[i].name;
        table[j].has_arg = rows[i].argh != NULL ? required_argument : no_argument;
        table[j].flag = NULL;
        table[j].val = OPTION_VAL0 + (int)i;
        j++;
    }
    return table;
}

/* getopt's optstring of the rows' short letters, ':' first (a missing value is told apart). */
static char *short_options(const struct option_row *rows)
{
    size_t n = 0, i, j = 0;
    char *s;

    while (rows[n].kind != OPTION_END)
        n++;
    s = xmalloc(2 * n + 2);
    s[j++] = ':';
    for (i = 0; i < n; i++) {
        if (!is_option(&rows[i]) || rows[i].short_name == 0)
            continue;
        s[j++] = (char)rows[i].short_name;
        if (rows[i].argh != NULL)
            s[j++] = ':';
    }
    s[j] = '\0';
    return s;
}

/* The row of getopt's answer `c` (a row's value or a short letter), or NULL. */
static const struct option_row *row_of(const struct option_row *rows, int c)
{
    size_t i;

    for (i = 0; rows[i].kind != OPTION_END; i++) {
        if (is_option(&rows[i]) &&
            (c == OPTION_VAL0 + (int)i || (c != 0 && c == rows[i].short_name)))
            return &rows[i];
    }
    return NULL;
}

/* Keeps the value of one option as its row says.  Returns OPTIONS_CONTINUE or an exit status. */
static int apply(struct options *o, const struct option_row *row, const char *arg)
{
    int64_t v = 0;

    switch (row->kind) {
    case OPTION_FLAG:
        *(int *)row->value = 1;
        return OPTIONS_CONTINUE;
    case OPTION_INT:
    case OPTION_LONG:
    case OPTION_INT64:
        if (parse_int64(arg, row->min, row->max, &v) != 0)
            return options_error(o, "--%s must be an integer from %lld to %lld, not '%s'",
                                 row->name, (long long)row->min, (long long)row->max, arg);
        if (row->kind == OPTION_INT)
            *(int *)row->value = (int)v;
        else if (row->kind == OPTION_LONG)
            *(long *)row->value = (long)v;
        else
            *(int64_t *)row->value = v;
        return OPTIONS_CONTINUE;
    case OPTION_DOUBLE:
        if (parse_double(arg, row->dmin, row->dmax, (double *)row->value) != 0)
            return options_error(o, "--%s must be a number from %g to %g, not '%s'", row->name,
                                 row->dmin, row->dmax, arg);
        return OPTIONS_CONTINUE;
    case OPTION_STRING:
        *(const char **)row->value = arg;
        return OPTIONS_CONTINUE;
    case OPTION_CALLBACK:
        return row->callback(o, row, arg);
    case OPTION_HELP:
        options_usage(o, stdout);
        return 0;
    case OPTION_END:
    case OPTION_TEXT:
        break;
    }
    return options_error(o, "internal error: option --%s", row->name);
}

/* What getopt_long() found wrong (`c` is ':' or '?'), said as one line. */
static int getopt_error(struct options *o, int c, char **argv)
{
    const struct option_row *row = row_of(o->rows, optopt);
    const char *arg = argv[optind - 1];
    size_t len;

    if (c == ':' && row != NULL && optopt >= OPTION_VAL0)
        return options_error(o, "option '--%s' needs a value", row->name);
    if (c == ':')
        return options_error(o, "option '-%c' needs a value", optopt);
    if (row != NULL && optopt >= OPTION_VAL0)
        return options_error(o, "option '--%s' takes no value", row->name);
    if (optopt != 0)
        return options_error(o, "unknown option '-%c'", optopt);
    len = strcspn(arg, "=");
    return options_error(o, "unknown option '%.*s'", (int)len, arg);
}

int options_parse(struct options *o, int argc, char **argv)
{
    struct option *longopts = options_longopts(o->rows);
    char *shortopts = short_options(o->rows);
    const struct option_row *row;
    int status = OPTIONS_CONTINUE;
    int c;

    opterr = 0;
    optind = 0; /* glibc: start afresh, as with another argv */
    while (status == OPTIONS_CONTINUE) {
        c = getopt_long(argc, argv, shortopts, longopts, NULL);
        if (c == -1)
            break;
        row = c == ':' || c == '?' ? NULL : row_of(o->rows, c);
        if (row == NULL)
            status = getopt_error(o, c, argv);
        else
            status = apply(o, row, optarg);
    }
    o->next = optind;
    free(longopts);
    free(shortopts);
    return status;
}

void options_usage(const struct options *o, FILE *f)
{
    const struct option_row *row;
    const char *line, *end;
    int width;

    if (o->usage != NULL)
        fputs(o->usage, f);
    for (row = o->rows; row->kind != OPTION_END; row++) {
        if (row->help == NULL)
            continue;
        if (row->kind == OPTION_TEXT) {
            fputs(row->help, f);
            continue;
        }
        width = fprintf(f, "  ");
        if (row->short_name != 0)
            width += fprintf(f, "-%c, ", row->short_name);
        width += fprintf(f, "--%s", row->name);
        if (row->argh != NULL)
            width += fprintf(f, " %s", row->argh);
        /* Past the column, the text follows two spaces after the name. */
        fprintf(f, "%*s", width + 2 <= o->column ? o->column - width : 2, "");
        for (line = row->help;; line = end + 1) {
            end = strchr(line, '\n');
            if (end == NULL)
                end = line + strlen(line);
            if (line != row->help)
                fprintf(f, "%*s", o->column, "");
            fprintf(f, "%.*s\n", (int)(end - line), line);
            if (end[0] == '\0' || end[1] == '\0')
                break;
        }
    }
}
