/* SPDX-License-Identifier: Apache-2.0 */
/*
 * run.c - what one idem command does once its flags are parsed: open the journal (for an
 * intent), give the request its key, hand it to libidem-client, say what each attempt did (-v),
 * print the answer and turn the outcome into the documented exit code.  All retry decisions are
 * the library's; this file only talks to the person at the terminal.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "idem/client.h"

#include "cli.h"
#include "banned.h"

/* -v: one line per attempt, shaped for people and for the service tests' regular expressions. */
static void report_attempt(const struct idem_client_attempt *a, void *arg)
{
    char status[32], action[96], ra[48] = "";

    (void)arg;
    if (a->status > 0)
        snprintf(status, sizeof status, "HTTP %d", a->status);
    else
        snprintf(status, sizeof status, "no answer");
    if (a->retry_after_ms >= 0)
        snprintf(ra, sizeof ra, " (Retry-After %lld ms)", (long long)a->retry_after_ms);
    switch (a->outcome) {
    case IDEM_CLIENT_OUTCOME_NONE:
        snprintf(action, sizeof action, "retry in %lld ms%s", (long long)a->next_delay_ms, ra);
        break;
    case IDEM_CLIENT_OUTCOME_FINAL:
        snprintf(action, sizeof action, "final");
        break;
    case IDEM_CLIENT_OUTCOME_EXHAUSTED:
        snprintf(action, sizeof action, "giving up%s", ra);
        break;
    default:
        snprintf(action, sizeof action, "failed");
        break;
    }
    fprintf(stderr, "idem: attempt %d: %s, waited %lld ms, took %lld ms; %s: %s", a->n, status,
            (long long)a->waited_ms, (long long)a->took_ms, action, a->reason);
    if (a->error)
        fprintf(stderr, " (%s)", a->error);
    fputc('\n', stderr);
}

/*
 * A 422 idempotency-key-reused speaks of keys; the person at the terminal may never have chosen
 * one.  Say it in the terms of the command line: the intent (or --key) already ran another request.
 */
static void explain_key_reused(const struct idem_client_response *r, const struct cli_config *cfg,
                               const char *key)
{
    const char *body = idem_client_response_body(r, NULL); /* NUL-terminated */

    if (idem_client_response_status(r) != 422 || body == NULL ||
        strstr(body, "idempotency-key-reused") == NULL)
        return;
    if (cfg->intent)
        fprintf(stderr,
                "idem: intent \"%s\" already sent another request (its key %s is bound to the "
                "first one); to send this one, name a new --intent\n",
                cfg->intent, key);
    else
        fprintf(stderr,
                "idem: --key %s was already used for another request; to send this one, leave "
                "--key out (a new key is made) or give another\n",
                key);
}

static int exit_for_status(int status)
{
    if (status >= 200 && status <= 299)
        return CLI_EXIT_OK;
    if (status >= 400 && status <= 499)
        return CLI_EXIT_4XX;
    return CLI_EXIT_OTHER;
}

/* Prints the answer: status line and headers with -i (CRLF, as received), then the body. */
static void print_response(const struct idem_client_response *r, int include)
{
    const void *body;
    size_t len, i, n;

    if (include && idem_client_response_status_line(r)) {
        printf("%s\r\n", idem_client_response_status_line(r));
        n = idem_client_response_header_count(r);
        for (i = 0; i < n; i++)
            printf("%s\r\n", idem_client_response_header_line(r, i));
        fputs("\r\n", stdout);
    }
    body = idem_client_response_body(r, &len);
    if (len > 0)
        fwrite(body, 1, len, stdout);
    /* On a terminal, the prompt starts on a line of its own; a pipe gets the bytes as sent. */
    if (len > 0 && ((const char *)body)[len - 1] != '\n' && isatty(STDOUT_FILENO))
        putchar('\n');
    fflush(stdout);
}

/* What Ctrl-C prints before the CLI exits 130: where the intent stands (prepared beforehand). */
static char interrupted_msg[1024];

static void on_interrupt(int sig)
{
    ssize_t ignored = write(STDERR_FILENO, interrupted_msg, strlen(interrupted_msg));
    (void)ignored;
    (void)sig;
    _exit(130);
}

/*
 * Ctrl-C in the middle of retries: say what became of the request (its key is journaled before
 * anything is sent, so running the command again is a retry, never a second request).
 */
static void say_on_interrupt(const struct cli_config *cfg, const char *key)
{
    struct sigaction sa;

    if (cfg->intent)
        snprintf(interrupted_msg, sizeof interrupted_msg,
                 "\nidem: interrupted; intent \"%s\" keeps its key %s in %s: run the same "
                 "command again to retry it (the server runs it at most once)\n",
                 cfg->intent, key, cfg->journal_path);
    else if (key)
        snprintf(interrupted_msg, sizeof interrupted_msg,
                 "\nidem: interrupted; the request may have reached the server. To retry it "
                 "safely, send it again with --key %s\n",
                 key);
    else
        snprintf(interrupted_msg, sizeof interrupted_msg, "\nidem: interrupted\n");
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* Creates the parent directories of `path` (mode 0700), as mkdir -p: 0, or -1 with errno. */
static int mkdir_parents(const char *path)
{
    char buf[4096];
    size_t n = strlen(path), i;

    if (n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (i = 1; i < n; i++) {
        if (buf[i] != '/')
            continue;
        buf[i] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return -1;
        buf[i] = '/';
    }
    return 0;
}

/* Opens (creating its directories) the journal of an intent; returns 0 or an exit code. */
static int open_journal(const char *path, struct idem_client_journal **j)
{
    char *errmsg = NULL;
    int rc;

    if (mkdir_parents(path) != 0) {
        fprintf(stderr, "idem: journal error: cannot create the directories of %s: %s\n", path,
                strerror(errno));
        return CLI_EXIT_JOURNAL;
    }
    rc = idem_client_journal_open(path, j, &errmsg);
    if (rc < 0) {
        fprintf(stderr, "idem: journal error: %s\n", errmsg ? errmsg : idem_client_strerror(rc));
        idem_client_free(errmsg);
        return rc == IDEM_CLIENT_ENOMEM ? CLI_EXIT_LOCAL : CLI_EXIT_JOURNAL;
    }
    return 0;
}

int cli_run(const struct cli_config *cfg)
{
    int rc = CLI_EXIT_LOCAL;
    struct idem_client *c = NULL;
    struct idem_client_journal *j = NULL;
    struct idem_client_response *resp = NULL;
    struct idem_client_options opts;
    struct idem_client_request req;
    const struct idem_client_intent *it = NULL;
    enum idem_client_outcome outcome = IDEM_CLIENT_OUTCOME_NONE;
    char uuid[IDEM_CLIENT_UUID_LEN + 1], keybuf[IDEM_CLIENT_KEY_MAX + 1];
    const char *key = cfg->key;
    int err;

    memset(&opts, 0, sizeof opts);
    opts.max_attempts = cfg->max_attempts;
    opts.max_time_ms = cfg->max_time_ms;
    opts.attempt_timeout_ms = cfg->attempt_timeout_ms;
    opts.user_agent = "idem/" IDEM_CLIENT_VERSION_STRING;
    if (cfg->verbose)
        opts.on_attempt = report_attempt;

    if (cfg->intent) {
        rc = open_journal(cfg->journal_path, &j);
        if (rc != 0)
            goto out;
        /* The key is journaled (and fsync'd) here, before anything is sent. */
        err = idem_client_journal_begin(j, cfg->intent, NULL, &it);
        if (err < 0) {
            fprintf(stderr, "idem: journal error: %s\n",
                    idem_client_journal_errmsg(j)[0] ? idem_client_journal_errmsg(j)
                                                     : idem_client_strerror(err));
            rc = err == IDEM_CLIENT_ENOMEM ? CLI_EXIT_LOCAL : CLI_EXIT_JOURNAL;
            goto out;
        }
        /* Copied: `it` is borrowed only until the next call on the journal. */
        snprintf(keybuf, sizeof keybuf, "%s", it->key);
        key = keybuf;
        if (cfg->verbose) {
            if (it->created)
                fprintf(stderr, "idem: intent \"%s\": new key %s journaled in %s\n", cfg->intent,
                        key, cfg->journal_path);
            else if (it->final_status)
                fprintf(stderr,
                        "idem: intent \"%s\": reusing key %s from %s; it was answered %d "
                        "before, so the server should replay that answer\n",
                        cfg->intent, key, cfg->journal_path, it->final_status);
            else
                fprintf(stderr,
                        "idem: intent \"%s\": reusing key %s from %s; this run is a retry\n",
                        cfg->intent, key, cfg->journal_path);
        }
    } else if (!key && strcmp(cfg->method, "GET") != 0) {
        err = idem_client_key_new(uuid);
        if (err < 0) {
            fprintf(stderr, "idem: %s\n", idem_client_strerror(err));
            rc = CLI_EXIT_LOCAL;
            goto out;
        }
        key = uuid;
    }
    if (cfg->verbose)
        fprintf(stderr, "idem: %s %s%s%s\n", cfg->method, cfg->url, key ? " with key " : "",
                key ? key : "");

    err = idem_client_open(&opts, &c);
    if (err < 0) {
        fprintf(stderr, "idem: cannot set up the client: %s\n", idem_client_strerror(err));
        rc = CLI_EXIT_LOCAL;
        goto out;
    }
    idem_client_set_journal(c, j);
    memset(&req, 0, sizeof req);
    req.method = cfg->method;
    req.url = cfg->url;
    req.headers = cfg->headers;
    req.nheaders = cfg->nheaders;
    req.body = cfg->body;
    req.body_len = cfg->body_len;
    req.key = key;
    req.intent = cfg->intent;
    say_on_interrupt(cfg, key);
    err = idem_client_send(c, &req, &resp, &outcome);
    if (err < 0) {
        fprintf(stderr, "idem: %s%s\n",
                err == IDEM_CLIENT_EJOURNAL || err == IDEM_CLIENT_ECORRUPT ||
                        err == IDEM_CLIENT_EINTENT
                    ? "journal error: "
                    : "",
                idem_client_errmsg(c)[0] ? idem_client_errmsg(c) : idem_client_strerror(err));
        switch (err) {
        case IDEM_CLIENT_EJOURNAL:
        case IDEM_CLIENT_ECORRUPT:
        case IDEM_CLIENT_EINTENT:
        case IDEM_CLIENT_ETOOBIG:
            rc = CLI_EXIT_JOURNAL;
            break;
        case IDEM_CLIENT_EINVAL:
        case IDEM_CLIENT_EKEY:
            rc = CLI_EXIT_USAGE;
            break;
        default:
            rc = CLI_EXIT_LOCAL;
            break;
        }
        goto out;
    }
    print_response(resp, cfg->include);
    if (cfg->verbose && outcome == IDEM_CLIENT_OUTCOME_FINAL)
        fprintf(stderr, "idem: %s in %lld ms\n", idem_client_response_reason(resp),
                (long long)idem_client_response_elapsed_ms(resp));
    switch (outcome) {
    case IDEM_CLIENT_OUTCOME_FINAL:
        explain_key_reused(resp, cfg, key);
        rc = exit_for_status(idem_client_response_status(resp));
        break;
    case IDEM_CLIENT_OUTCOME_EXHAUSTED:
        fprintf(stderr,
                "idem: %s.  The outcome is unknown: run the same command again%s%s%s to "
                "retry with the same key.\n",
                idem_client_response_reason(resp), cfg->intent ? "" : " with --key ",
                cfg->intent ? "" : (key ? key : ""), cfg->intent ? " (same --intent)" : "");
        rc = CLI_EXIT_EXHAUSTED;
        break;
    default:
        fprintf(stderr, "idem: %s\n", idem_client_response_reason(resp));
        rc = CLI_EXIT_TRANSPORT;
        break;
    }
    if (idem_client_response_journal_error(resp)) {
        fprintf(stderr, "idem: journal error: the final status was not recorded: %s\n",
                idem_client_response_journal_error(resp));
        rc = CLI_EXIT_JOURNAL;
    }
out:
    idem_client_response_free(resp);
    idem_client_close(c);
    idem_client_journal_close(j);
    return rc;
}

int cli_journal_list(const char *path)
{
    struct idem_client_journal *j = NULL;
    const struct idem_client_intent *it;
    char *errmsg = NULL, when[32];
    struct tm tm;
    time_t t;
    size_t i, n;
    struct stat st;
    int rc;

    /* Listing must not create a journal that was never written. */
    if (stat(path, &st) != 0 && errno == ENOENT)
        return CLI_EXIT_OK;
    rc = idem_client_journal_open(path, &j, &errmsg);
    if (rc < 0) {
        fprintf(stderr, "idem: journal error: %s\n", errmsg ? errmsg : idem_client_strerror(rc));
        idem_client_free(errmsg);
        return rc == IDEM_CLIENT_ENOMEM ? CLI_EXIT_LOCAL : CLI_EXIT_JOURNAL;
    }
    n = idem_client_journal_count(j);
    for (i = 0; i < n; i++) {
        it = idem_client_journal_at(j, i);
        t = (time_t)(it->created_ms / 1000);
        if (!gmtime_r(&t, &tm) || strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
            snprintf(when, sizeof when, "-");
        if (it->final_status)
            printf("%s\t%s\t%d\t%s\n", it->name, it->key, it->final_status, when);
        else
            printf("%s\t%s\t-\t%s\n", it->name, it->key, when);
    }
    idem_client_journal_close(j);
    return CLI_EXIT_OK;
}

int cli_journal_compact(const char *path, int64_t older_than_ms)
{
    struct idem_client_journal *j = NULL;
    char *errmsg = NULL;
    size_t dropped = 0, kept = 0;
    struct stat st;
    int rc;

    if (stat(path, &st) != 0 && errno == ENOENT) {
        printf("%s: no journal, nothing to compact\n", path);
        return CLI_EXIT_OK;
    }
    rc = idem_client_journal_open(path, &j, &errmsg);
    if (rc == 0)
        rc = idem_client_journal_compact(j, older_than_ms, &dropped, &kept);
    if (rc < 0) {
        fprintf(stderr, "idem: journal error: %s\n",
                errmsg                                  ? errmsg
                : j && idem_client_journal_errmsg(j)[0] ? idem_client_journal_errmsg(j)
                                                        : idem_client_strerror(rc));
        idem_client_free(errmsg);
        idem_client_journal_close(j);
        return rc == IDEM_CLIENT_ENOMEM ? CLI_EXIT_LOCAL : CLI_EXIT_JOURNAL;
    }
    if (stat(path, &st) != 0)
        st.st_size = 0;
    printf("%s: %zu intents dropped, %zu kept (%lld bytes)\n", path, dropped, kept,
           (long long)st.st_size);
    idem_client_journal_close(j);
    return CLI_EXIT_OK;
}
