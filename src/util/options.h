/* SPDX-License-Identifier: Apache-2.0 */
/*
 * options.h - a program's command-line options written once, as one table of rows, the way
 * git's parse-options.h does: each row gives a long name, maybe a short letter, the name of its
 * value, its line of --help and where the value goes (or a callback that checks it).  The
 * getopt_long() table, the parsing (numbers through util.h's parse_int64/parse_double, with
 * their bounds) and the --help text are all made from the rows, so a flag cannot be parsed and
 * not documented, or documented with another name.
 *
 * Every mistake on the command line is said one way, by options_error():
 *     <prog>: <what is wrong>
 *     Try '<prog> --help'.
 * on stderr, and the parse returns OPTIONS_EXIT_USAGE (2), which the programs exit with.
 * Part of idem_util (src/util/).
 */
#ifndef IDEM_UTIL_OPTIONS_H
#define IDEM_UTIL_OPTIONS_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#define OPTIONS_EXIT_USAGE 2
#define OPTIONS_CONTINUE (-1) /* a callback's (and the parse's) "all went well, go on" */

enum option_kind {
    OPTION_END,      /* the last row */
    OPTION_TEXT,     /* no option: `help` printed as it is in --help (a heading, a block) */
    OPTION_FLAG,     /* no value: sets the int at `value` to 1 */
    OPTION_INT,      /* an integer in [min, max] into the int at `value` */
    OPTION_LONG,     /* an integer in [min, max] into the long at `value` */
    OPTION_INT64,    /* an integer in [min, max] into the int64_t at `value` */
    OPTION_DOUBLE,   /* a number in [dmin, dmax] into the double at `value` */
    OPTION_STRING,   /* the argument itself into the const char * at `value` */
    OPTION_CALLBACK, /* callback(o, row, arg): it checks and keeps the value */
    OPTION_HELP,     /* -h, --help: prints the usage, the parse returns 0 */
};

struct options;
struct option_row;

/*
 * A callback row's work: `arg` is the value (NULL for a row without `argh`).  Returns
 * OPTIONS_CONTINUE, or an exit status that ends the parse: options_error()'s, or 0 after
 * printing what was asked (--version).
 */
typedef int option_callback(struct options *o, const struct option_row *row, const char *arg);

struct option_row {
    enum option_kind kind;
    int short_name;    /* a letter, or 0 */
    const char *name;  /* the long name without "--"; NULL for OPTION_TEXT */
    void *value;       /* where the value goes (the callback's own pointer for a callback) */
    const char *argh;  /* the value's name in --help ("N", "HOST:PORT"); NULL: takes no value */
    const char *help;  /* its --help text, lines separated by '\n'; NULL: not listed */
    int64_t min, max;  /* OPTION_INT, OPTION_LONG, OPTION_INT64 */
    double dmin, dmax; /* OPTION_DOUBLE */
    option_callback *callback;
};

#define OPT_END()                                                                                  \
    {                                                                                              \
        .kind = OPTION_END                                                                         \
    }
#define OPT_TEXT(text)                                                                             \
    {                                                                                              \
        .kind = OPTION_TEXT, .help = (text)                                                        \
    }
#define OPT_FLAG(s, l, v, h)                                                                       \
    {                                                                                              \
        .kind = OPTION_FLAG, .short_name = (s), .name = (l), .value = (v), .help = (h)             \
    }
#define OPT_INT(s, l, v, a, lo, hi, h)                                                             \
    {                                                                                              \
        .kind = OPTION_INT, .short_name = (s), .name = (l), .value = (v), .argh = (a),             \
        .help = (h), .min = (lo), .max = (hi)                                                      \
    }
#define OPT_LONG(s, l, v, a, lo, hi, h)                                                            \
    {                                                                                              \
        .kind = OPTION_LONG, .short_name = (s), .name = (l), .value = (v), .argh = (a),            \
        .help = (h), .min = (lo), .max = (hi)                                                      \
    }
#define OPT_INT64(s, l, v, a, lo, hi, h)                                                           \
    {                                                                                              \
        .kind = OPTION_INT64, .short_name = (s), .name = (l), .value = (v), .argh = (a),           \
        .help = (h), .min = (lo), .max = (hi)                                                      \
    }
#define OPT_DOUBLE(s, l, v, a, lo, hi, h)                                                          \
    {                                                                                              \
        .kind = OPTION_DOUBLE, .short_name = (s), .name = (l), .value = (v), .argh = (a),          \
        .help = (h), .dmin = (lo), .dmax = (hi)                                                    \
    }
#define OPT_STRING(s, l, v, a, h)                                                                  \
    {                                                                                              \
        .kind = OPTION_STRING, .short_name = (s), .name = (l), .value = (v), .argh = (a),          \
        .help = (h)                                                                                \
    }
#define OPT_CALLBACK(s, l, v, a, h, cb)                                                            \
    {                                                                                              \
        .kind = OPTION_CALLBACK, .short_name = (s), .name = (l), .value = (v), .argh = (a),        \
        .help = (h), .callback = (cb)                                                              \
    }
#define OPT_HELP(h)                                                                                \
    {                                                                                              \
        .kind = OPTION_HELP, .short_name = 'h', .name = "help", .help = (h)                        \
    }

/* One command's options: what options_parse() reads and options_usage() prints. */
struct options {
    const char *prog;              /* "orderd serve": the start of every message, and the hint */
    const char *usage;             /* --help's text before the rows ("Usage: ...\n\nOptions:\n") */
    const struct option_row *rows; /* ends with OPT_END() */
    int column;                    /* where the help texts start in --help (from 0) */
    void (*redact)(char *message); /* NULL, or masks secrets in a message before it is shown */
    void *ctx;                     /* the callbacks' own */
    int next;                      /* after options_parse(): the index of the first argument left */
};

/*
 * Parses argv[1..argc-1] with getopt_long() (arguments that are not options are moved to the
 * end, from o->next on).  Returns OPTIONS_CONTINUE when all went well, 0 after --help (or what a
 * callback printed), OPTIONS_EXIT_USAGE after saying what was wrong: an unknown option, a value
 * missing, a number that is not one or out of its row's bounds (the message names the flag).
 */
int options_parse(struct options *o, int argc, char **argv);

/* Prints o->usage, then a line (or lines) for each row with a help text, on `f`. */
void options_usage(const struct options *o, FILE *f);

/*
 * Says what is wrong on stderr, as "<o->prog>: <message>" and "Try '<o->prog> --help'.";
 * returns OPTIONS_EXIT_USAGE.
 */
int options_error(const struct options *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * The getopt_long() table of `rows` (the rows with a long name, in order), new: free() it.  For
 * what reads options elsewhere as the command line would (flag_file_load()).
 */
struct option *options_longopts(const struct option_row *rows);

#endif /* IDEM_UTIL_OPTIONS_H */
