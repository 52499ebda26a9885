/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli.h - what the idem command line (main.c) hands to the code that runs a request (run.c):
 * one explicit configuration struct, and the exit codes scripts rely on.
 */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

#include <stddef.h>
#include <stdint.h>

/* The exit codes; docs/idem.1 and `idem --help` list the same table. */
enum cli_exit {
    CLI_EXIT_OK = 0,        /* a final 2xx answer */
    CLI_EXIT_LOCAL = 1,     /* a local failure: body file unreadable, no memory, no libcurl */
    CLI_EXIT_USAGE = 2,     /* wrong command line */
    CLI_EXIT_4XX = 3,       /* a final 4xx answer: the request itself must change */
    CLI_EXIT_OTHER = 4,     /* a final answer that is neither 2xx nor 4xx (500, 501, 3xx...) */
    CLI_EXIT_EXHAUSTED = 5, /* retries exhausted: no final answer, outcome unknown */
    CLI_EXIT_TRANSPORT = 6, /* a transport failure retrying cannot fix (bad URL, TLS, cap) */
    CLI_EXIT_JOURNAL = 7,   /* the intent journal cannot be used (unreadable, corrupt, ...) */
};

struct cli_config {
    const char *method; /* "POST", "PUT", "GET", "DELETE" */
    const char *url;
    char *body; /* owned; NULL without -d */
    size_t body_len;
    const char **headers; /* owned array of borrowed strings (argv) plus `auth_header` */
    size_t nheaders;
    char *auth_header;  /* owned "Authorization: Bearer ..." built from --token, or NULL */
    const char *key;    /* --key */
    const char *intent; /* --intent */
    char *journal_path; /* owned, resolved: --journal, $IDEM_JOURNAL or the default */
    int max_attempts;
    int64_t max_time_ms;
    int64_t attempt_timeout_ms;
    int verbose;
    int include;
};

/* Runs the request the configuration describes; returns the process's exit code. */
int cli_run(const struct cli_config *cfg);

/* `idem journal`: lists the intents of the journal at `path`; returns the exit code. */
int cli_journal_list(const char *path);
/* `idem journal compact`: drops finished intents older than `older_than_ms`; an exit status. */
int cli_journal_compact(const char *path, int64_t older_than_ms);

#endif /* IDEM_CLI_H */
