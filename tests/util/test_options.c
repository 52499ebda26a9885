/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_options.c - the programs' option tables (src/util/options.c): values land where their row
 * says, every mistake is one line naming the flag with the way to --help and exit status 2, and
 * --help lists every row that has a help text.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options.h"
#include "t.h"

const char program_name[] = "test_options"; /* util.h: die()'s */

/* What a parse printed on stderr (or --help on stdout), captured through a temporary file. */
static char captured[8192];

static int parse_capturing(struct options *o, int argc, char **argv, int fd)
{
    FILE *tmp = tmpfile();
    int saved, status;
    size_t n;

    fflush(fd == 1 ? stdout : stderr);
    saved = dup(fd);
    dup2(fileno(tmp), fd);
    status = options_parse(o, argc, argv);
    fflush(fd == 1 ? stdout : stderr);
    dup2(saved, fd);
    close(saved);
    rewind(tmp);
    n = fread(captured, 1, sizeof captured - 1, tmp);
    captured[n] = '\0';
    fclose(tmp);
    return status;
}

/* Splits `line` (changed) at its spaces into argv; returns argc. */
static int split(char *line, char **argv, int cap)
{
    int argc = 0;
    char *p = line;

    while (*p != '\0' && argc < cap - 1) {
        argv[argc++] = p;
        p += strcspn(p, " ");
        if (*p == ' ')
            *p++ = '\0';
    }
    argv[argc] = NULL;
    return argc;
}

#define ARGV(name, text)                                                                           \
    char name##_line[] = text;                                                                     \
    char *name[16];                                                                                \
    int name##c = split(name##_line, name, 16)

struct values {
    int verbose, count;
    long wide;
    int64_t big;
    double rate;
    const char *name;
    int calls;
};

static int count_call(struct options *o, const struct option_row *row, const char *arg)
{
    struct values *v = row->value;

    if (strcmp(arg, "bad") == 0)
        return options_error(o, "--%s cannot be '%s'", row->name, arg);
    v->calls++;
    return OPTIONS_CONTINUE;
}

#define ROWS(v)                                                                                    \
    {                                                                                              \
        OPT_FLAG('v', "verbose", &(v)->verbose, "say more"),                                       \
            OPT_INT(0, "count", &(v)->count, "N", 1, 10, "how many, 1..10"),                       \
            OPT_TEXT("Numbers:\n"),                                                                \
            OPT_INT64(0, "big", &(v)->big, "N", -5, 5000000000LL, "a large one"),                  \
            OPT_LONG(0, "wide", &(v)->wide, "N", -3, 3, NULL),                                     \
            OPT_DOUBLE(0, "rate", &(v)->rate, "R", 0.0, 1.0, "a share\nof them all"),              \
            OPT_STRING('n', "name", &(v)->name, "NAME", "who"),                                    \
            OPT_CALLBACK(0, "call", (v), "X", "called for each", count_call),                      \
            OPT_STRING(0, "hidden", &(v)->name, "H", NULL), OPT_HELP("show this help"), OPT_END()  \
    }

static void test_values_land_where_their_rows_say(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct options o = {.prog = "prog cmd", .rows = rows, .column = 20};
    ARGV(argv, "cmd -v --count 3 --big=4000000000 --wide -3 --rate 0.25 arg -n al --call x "
               "--call=y");

    CHECK_INT(options_parse(&o, argvc, argv), OPTIONS_CONTINUE);
    CHECK_INT(v.verbose, 1);
    CHECK_INT(v.count, 3);
    CHECK_INT(v.big, 4000000000LL);
    CHECK_INT(v.wide, -3);
    CHECK(v.rate == 0.25);
    CHECK_STR(v.name, "al");
    CHECK_INT(v.calls, 2);
    /* The argument that is not an option is left, at o.next. */
    CHECK_INT(o.next, 14);
    CHECK_STR(argv[o.next], "arg");
}

static void test_unknown_option_is_refused_with_the_hint(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct options o = {.prog = "prog cmd", .rows = rows, .column = 20};
    ARGV(argv, "cmd --bogus=1");
    ARGV(argv2, "cmd -x");
    ARGV(argv3, "cmd --verbose=1");

    CHECK_INT(parse_capturing(&o, argvc, argv, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured, "prog cmd: unknown option '--bogus'\nTry 'prog cmd --help'.\n");
    CHECK_INT(parse_capturing(&o, argv2c, argv2, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured, "prog cmd: unknown option '-x'\nTry 'prog cmd --help'.\n");
    CHECK_INT(parse_capturing(&o, argv3c, argv3, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured, "prog cmd: option '--verbose' takes no value\nTry 'prog cmd --help'.\n");
}

static void test_missing_value_names_the_flag(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct options o = {.prog = "prog", .rows = rows, .column = 20};
    ARGV(argv, "prog --count");
    ARGV(argv2, "prog -n");

    CHECK_INT(parse_capturing(&o, argvc, argv, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured, "prog: option '--count' needs a value\nTry 'prog --help'.\n");
    CHECK_INT(parse_capturing(&o, argv2c, argv2, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured, "prog: option '-n' needs a value\nTry 'prog --help'.\n");
}

static void test_number_out_of_bounds_names_its_flag(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct options o = {.prog = "prog", .rows = rows, .column = 20};
    ARGV(argv, "prog --count 11");
    ARGV(argv2, "prog --big -6");
    ARGV(argv3, "prog --rate 1.5");
    ARGV(argv4, "prog --count 3x");

    CHECK_INT(parse_capturing(&o, argvc, argv, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured,
              "prog: --count must be an integer from 1 to 10, not '11'\nTry 'prog --help'.\n");
    CHECK_INT(parse_capturing(&o, argv2c, argv2, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured, "prog: --big must be an integer from -5 to 5000000000, not '-6'\n"
                        "Try 'prog --help'.\n");
    CHECK_INT(parse_capturing(&o, argv3c, argv3, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured,
              "prog: --rate must be a number from 0 to 1, not '1.5'\nTry 'prog --help'.\n");
    CHECK_INT(parse_capturing(&o, argv4c, argv4, 2), OPTIONS_EXIT_USAGE);
    CHECK_INT(v.count, 0); /* a refused value is not kept */
}

static void test_callback_refusal_ends_the_parse(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct options o = {.prog = "prog", .rows = rows, .column = 20};
    ARGV(argv, "prog --call bad --count 2");

    CHECK_INT(parse_capturing(&o, argvc, argv, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured, "prog: --call cannot be 'bad'\nTry 'prog --help'.\n");
    CHECK_INT(v.count, 0);
}

static void redact_digits(char *msg)
{
    for (; *msg; msg++)
        if (*msg >= '0' && *msg <= '9')
            *msg = '*';
}

static void test_error_is_redacted_before_it_is_shown(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct options o = {.prog = "prog", .rows = rows, .column = 20, .redact = redact_digits};
    ARGV(argv, "prog --count 12");

    CHECK_INT(parse_capturing(&o, argvc, argv, 2), OPTIONS_EXIT_USAGE);
    CHECK_STR(captured,
              "prog: --count must be an integer from * to **, not '**'\nTry 'prog --help'.\n");
}

static void test_usage_text_lists_every_row(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct options o = {
        .prog = "prog", .usage = "Usage: prog\n\nOptions:\n", .rows = rows, .column = 20};
    ARGV(argv, "prog --count 2 --help --count 0");

    /* --help prints the usage and stops the parse with 0, before the bad value after it. */
    CHECK_INT(parse_capturing(&o, argvc, argv, 1), 0);
    CHECK_STR(captured, "Usage: prog\n"
                        "\n"
                        "Options:\n"
                        "  -v, --verbose     say more\n"
                        "  --count N         how many, 1..10\n"
                        "Numbers:\n"
                        "  --big N           a large one\n"
                        "  --rate R          a share\n"
                        "                    of them all\n"
                        "  -n, --name NAME   who\n"
                        "  --call X          called for each\n"
                        "  -h, --help        show this help\n");
    /* A name past the column: two spaces, then its help. */
    o.column = 10;
    o.usage = NULL;
    CHECK_INT(parse_capturing(&o, argvc, argv, 1), 0);
    CHECK(strstr(captured, "  --count N  how many, 1..10\n") != NULL);
    CHECK(strstr(captured, "  --rate R  a share\n          of them all\n") != NULL);
}

static void test_longopts_table_has_every_named_row(void)
{
    struct values v = {0};
    const struct option_row rows[] = ROWS(&v);
    struct option *t = options_longopts(rows);
    size_t n = 0;

    while (t[n].name != NULL)
        n++;
    CHECK_INT(n, 9);
    CHECK_STR(t[0].name, "verbose");
    CHECK_INT(t[0].has_arg, no_argument);
    CHECK_STR(t[1].name, "count");
    CHECK_INT(t[1].has_arg, required_argument);
    CHECK_STR(t[8].name, "help");
    free(t);
}

int main(void)
{
    test_values_land_where_their_rows_say();
    test_unknown_option_is_refused_with_the_hint();
    test_missing_value_names_the_flag();
    test_number_out_of_bounds_names_its_flag();
    test_callback_refusal_ends_the_parse();
    test_error_is_redacted_before_it_is_shown();
    test_usage_text_lists_every_row();
    test_longopts_table_has_every_named_row();
    return t_done();
}
