/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client.c - the retry loop over libcurl.  One call journals the intent's key (when there is an
 * intent), then sends the same method, URL, headers, key and body bytes until an answer is final,
 * a failure cannot be fixed by retrying, or the caps on attempts and time are reached.  The
 * decisions themselves (what is transient, how long to wait) are policy.c's; this file only
 * measures, sleeps, reports each attempt and keeps libcurl's handle.
 */
#include "client_internal.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "banned.h"

#define DEFAULT_MAX_ATTEMPTS 5
#define DEFAULT_MAX_TIME_MS 60000
#define DEFAULT_BASE_DELAY_MS 250
#define DEFAULT_MAX_DELAY_MS 10000
#define DEFAULT_CONNECT_TIMEOUT_MS 10000
#define DEFAULT_ATTEMPT_TIMEOUT_MS 30000
#define DEFAULT_MAX_RESPONSE_BYTES ((size_t)16 << 20)

struct idem_client {
    CURL *curl;
    struct idem_client_options opts; /* defaults applied; user_agent points at `user_agent` */
    char *user_agent;
    struct idem_client__rng rng;
    struct idem_client_journal *journal;
    char curl_err[CURL_ERROR_SIZE];
    char reason[IDEM_CLIENT_ERRMSG_MAX]; /* the attempt report's sentence */
    char errmsg[IDEM_CLIENT_ERRMSG_MAX];
};

/* What libcurl's callbacks write into during one attempt. */
struct attempt_ctx {
    struct idem_client_response *resp;
    int failed; /* a negative code from a callback: the cap was hit, or memory ran out */
};

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    struct attempt_ctx *ax = arg;
    int rc = idem_client__body_add(ax->resp, p, size * n);

    if (rc < 0) {
        ax->failed = rc;
        return 0; /* libcurl stops the transfer with CURLE_WRITE_ERROR */
    }
    return size * n;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    struct attempt_ctx *ax = arg;
    int rc = idem_client__response_add_header(ax->resp, p, size * n);

    if (rc < 0) {
        ax->failed = rc;
        return 0;
    }
    return size * n;
}

int idem_client_open(const struct idem_client_options *opts, struct idem_client **out)
{
    int rc = IDEM_CLIENT_EINVAL;
    struct idem_client *c = NULL;
    struct idem_client_options o;
    uint64_t seed = 0;
    int global = 0;

    if (!out)
        goto out;
    *out = NULL;
    memset(&o, 0, sizeof o);
    if (opts)
        o = *opts;
    if (o.max_attempts < 0 || o.max_time_ms < 0 || o.base_delay_ms < 0 || o.max_delay_ms < 0 ||
        o.connect_timeout_ms < 0 || o.attempt_timeout_ms < 0)
        goto out;
    if (o.max_attempts == 0)
        o.max_attempts = DEFAULT_MAX_ATTEMPTS;
    if (o.max_time_ms == 0)
        o.max_time_ms = DEFAULT_MAX_TIME_MS;
    if (o.base_delay_ms == 0)
        o.base_delay_ms = DEFAULT_BASE_DELAY_MS;
    if (o.max_delay_ms == 0)
        o.max_delay_ms = DEFAULT_MAX_DELAY_MS;
    if (o.connect_timeout_ms == 0)
        o.connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS;
    if (o.attempt_timeout_ms == 0)
        o.attempt_timeout_ms = DEFAULT_ATTEMPT_TIMEOUT_MS;
    if (o.max_response_bytes == 0)
        o.max_response_bytes = DEFAULT_MAX_RESPONSE_BYTES;

    rc = IDEM_CLIENT_ECURL;
    /* Reference-counted by libcurl (and thread-safe since 7.84): paired in idem_client_close. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        goto out;
    global = 1;
    rc = IDEM_CLIENT_ENOMEM;
    c = calloc(1, sizeof *c);
    if (!c)
        goto out;
    c->user_agent = idem_client__strdup(o.user_agent ? o.user_agent
                                                     : "idem-client/" IDEM_CLIENT_VERSION_STRING);
    if (!c->user_agent)
        goto out;
    o.user_agent = c->user_agent;
    c->opts = o;
    rc = IDEM_CLIENT_ECURL;
    c->curl = curl_easy_init();
    if (!c->curl)
        goto out;
    global = 0; /* owned by c from here on */
    /* Jitter needs no secrecy; if the kernel gives no bytes, the clock still spreads clients. */
    if (idem_client__random_bytes(&seed, sizeof seed) < 0)
        seed = (uint64_t)clock_wall_ms() ^ ((uint64_t)clock_mono_ms() << 20);
    idem_client__rng_seed(&c->rng, seed);
    *out = c;
    c = NULL;
    rc = 0;
out:
    if (c) {
        if (c->curl) {
            curl_easy_cleanup(c->curl);
            curl_global_cleanup();
        }
        free(c->user_agent);
        free(c);
    }
    if (global)
        curl_global_cleanup();
    return rc;
}

void idem_client_close(struct idem_client *c)
{
    if (!c)
        return;
    curl_easy_cleanup(c->curl);
    curl_global_cleanup();
    free(c->user_agent);
    free(c);
}

void idem_client_seed(struct idem_client *c, uint64_t seed)
{
    if (c)
        idem_client__rng_seed(&c->rng, seed);
}

void idem_client_set_journal(struct idem_client *c, struct idem_client_journal *j)
{
    if (c)
        c->journal = j;
}

const char *idem_client_errmsg(const struct idem_client *c)
{
    return c ? c->errmsg : "";
}

/* Whether one of the caller's "Name: value" lines names `name`. */
static int has_header(const struct idem_client_request *req, const char *name)
{
    size_t i, n = strlen(name);

    for (i = 0; i < req->nheaders; i++) {
        if (idem_client__strncaseeq(req->headers[i], name, n) &&
            (req->headers[i][n] == ':' || req->headers[i][n] == ';'))
            return 1;
    }
    return 0;
}

static int is_tchar(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Checks the request's fields; says what is wrong in c->errmsg. */
static int check_request(struct idem_client *c, const struct idem_client_request *req)
{
    const char *p;
    size_t i;

    if (!req->method || !req->method[0] || !req->url || !req->url[0]) {
        idem_client__fmt(c->errmsg, sizeof c->errmsg, "a request needs a method and a URL");
        return IDEM_CLIENT_EINVAL;
    }
    for (p = req->method; *p; p++) {
        if (!is_tchar((unsigned char)*p)) {
            idem_client__fmt(c->errmsg, sizeof c->errmsg, "bad method \"%s\"", req->method);
            return IDEM_CLIENT_EINVAL;
        }
    }
    if (!req->body && req->body_len > 0) {
        idem_client__fmt(c->errmsg, sizeof c->errmsg, "body_len without a body");
        return IDEM_CLIENT_EINVAL;
    }
    if (req->nheaders > 0 && !req->headers) {
        idem_client__fmt(c->errmsg, sizeof c->errmsg, "nheaders without headers");
        return IDEM_CLIENT_EINVAL;
    }
    for (i = 0; i < req->nheaders; i++) {
        p = req->headers[i];
        if (!p || !strchr(p, ':') || strchr(p, '\r') || strchr(p, '\n')) {
            idem_client__fmt(c->errmsg, sizeof c->errmsg,
                             "header %zu is not one \"Name: value\" line", i + 1);
            return IDEM_CLIENT_EINVAL;
        }
    }
    if ((req->key || req->intent) && has_header(req, "Idempotency-Key")) {
        idem_client__fmt(c->errmsg, sizeof c->errmsg,
                         "Idempotency-Key given both as a header and as the request's key");
        return IDEM_CLIENT_EINVAL;
    }
    if (req->intent && !c->journal) {
        idem_client__fmt(c->errmsg, sizeof c->errmsg, "an intent needs a journal");
        return IDEM_CLIENT_EINVAL;
    }
    return 0;
}

static int add_line(struct curl_slist **list, const char *line)
{
    struct curl_slist *l = curl_slist_append(*list, line);

    if (!l)
        return IDEM_CLIENT_ENOMEM;
    *list = l;
    return 0;
}

/* The header list every attempt sends: the caller's, then the key and the defaults. */
static int build_headers(const struct idem_client_request *req, const char *key,
                         struct curl_slist **out)
{
    int rc = 0;
    struct curl_slist *list = NULL;
    char line[IDEM_CLIENT_KEY_MAX + 32];
    size_t i;
    int sends_body = req->body != NULL || strcmp(req->method, "POST") == 0 ||
                     strcmp(req->method, "PUT") == 0 || strcmp(req->method, "PATCH") == 0;

    for (i = 0; i < req->nheaders && rc == 0; i++)
        rc = add_line(&list, req->headers[i]);
    if (rc == 0 && key) {
        idem_client__fmt(line, sizeof line, "Idempotency-Key: %s", key);
        rc = add_line(&list, line);
    }
    if (rc == 0 && sends_body && !has_header(req, "Content-Type")) {
        /* Without a body, "Content-Type:" removes libcurl's form-urlencoded default. */
        rc = add_line(&list, req->body ? "Content-Type: application/json" : "Content-Type:");
    }
    /* "Expect: 100-continue" would add a round trip (and a second status line) to large bodies. */
    if (rc == 0 && !has_header(req, "Expect"))
        rc = add_line(&list, "Expect:");
    if (rc < 0) {
        curl_slist_free_all(list);
        return rc;
    }
    *out = list;
    return 0;
}

/* Sets what stays the same for every attempt of one send. */
static int setup_curl(struct idem_client *c, const struct idem_client_request *req,
                      struct curl_slist *headers, struct attempt_ctx *ax)
{
    CURL *h = c->curl;
    CURLcode e = CURLE_OK;
    int is_post = strcmp(req->method, "POST") == 0;
    int no_body_method = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0 ||
                         strcmp(req->method, "DELETE") == 0 || strcmp(req->method, "OPTIONS") == 0;

    /* curl_easy_reset keeps the connection cache: a retry may reuse a live connection. */
    curl_easy_reset(h);
#define SET(opt, val)                                                                              \
    do {                                                                                           \
        if (e == CURLE_OK)                                                                         \
            e = curl_easy_setopt(h, opt, val);                                                     \
    } while (0)
    SET(CURLOPT_URL, req->url);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
#else
    SET(CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    SET(CURLOPT_USERAGENT, c->opts.user_agent);
    SET(CURLOPT_HTTPHEADER, headers);
    SET(CURLOPT_ERRORBUFFER, c->curl_err);
    SET(CURLOPT_WRITEFUNCTION, on_body);
    SET(CURLOPT_WRITEDATA, ax);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, ax);
    if (strcmp(req->method, "HEAD") == 0) {
        SET(CURLOPT_NOBODY, 1L);
    } else if (req->body || !no_body_method) {
        /* The same bytes on every attempt: libcurl reads them from our buffer each time. */
        SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        SET(CURLOPT_POSTFIELDS, req->body ? (const char *)req->body : "");
        if (!is_post)
            SET(CURLOPT_CUSTOMREQUEST, req->method);
    } else {
        SET(CURLOPT_HTTPGET, 1L);
        if (strcmp(req->method, "GET") != 0)
            SET(CURLOPT_CUSTOMREQUEST, req->method);
    }
#undef SET
    if (e != CURLE_OK) {
        idem_client__fmt(c->errmsg, sizeof c->errmsg, "libcurl refused an option: %s",
                         curl_easy_strerror(e));
        return e == CURLE_OUT_OF_MEMORY ? IDEM_CLIENT_ENOMEM : IDEM_CLIENT_ECURL;
    }
    return 0;
}

/* An Idempotent-Replayed value that says "true", in any case, white space after it allowed. */
static int is_replay(const char *v)
{
    if (!v || !idem_client__strncaseeq(v, "true", 4))
        return 0;
    for (v += 4; *v == ' ' || *v == '\t'; v++)
        ;
    return *v == '\0';
}

/* One attempt: sends, and fills `a` with what happened.  Returns the verdict. */
static enum idem_client__verdict attempt(struct idem_client *c, struct attempt_ctx *ax,
                                         int64_t timeout_ms, struct idem_client_attempt *a)
{
    struct idem_client_response *r = ax->resp;
    enum idem_client__verdict v;
    const char *why = NULL, *ra;
    int64_t t0, ra_ms;
    CURLcode cc;

    idem_client__response_reset(r);
    ax->failed = 0;
    c->curl_err[0] = '\0';
    (void)curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    (void)curl_easy_setopt(
        c->curl, CURLOPT_CONNECTTIMEOUT_MS,
        (long)(timeout_ms < c->opts.connect_timeout_ms ? timeout_ms : c->opts.connect_timeout_ms));
    t0 = clock_mono_ms();
    cc = curl_easy_perform(c->curl);
    a->took_ms = clock_mono_ms() - t0;
    a->retry_after_ms = -1;
    if (cc == CURLE_OK) {
        a->status = r->status;
        ra = idem_client_response_header(r, "Retry-After");
        if (ra && idem_client__retry_after_parse(ra, time(NULL), &ra_ms) == 0)
            a->retry_after_ms = ra_ms;
        a->replayed = is_replay(idem_client_response_header(r, "Idempotent-Replayed"));
        v = idem_client__classify_status(r->status, ra != NULL, r->body.data, r->body.len, &why);
    } else {
        /* An answer cut short is no answer: forget its status, the retry gets the whole one. */
        idem_client__response_reset(r);
        a->transport_error = (int)cc;
        if (ax->failed == IDEM_CLIENT_ETOOBIG) {
            v = IDEM_CLIENT__FINAL;
            why = "the answer is larger than the response cap";
            idem_client__set_text(&r->error, "answer larger than the %zu-byte cap",
                                  c->opts.max_response_bytes);
        } else if (ax->failed == IDEM_CLIENT_ENOMEM) {
            v = IDEM_CLIENT__FINAL;
            why = "out of memory";
            idem_client__set_text(&r->error, "out of memory while receiving the answer");
        } else {
            v = idem_client__classify_transport((int)cc, &why);
            idem_client__set_text(&r->error, "%s",
                                  c->curl_err[0] ? c->curl_err : curl_easy_strerror(cc));
        }
        a->error = r->error ? r->error : curl_easy_strerror(cc);
    }
    a->reason = why;
    return v;
}

int idem_client_send(struct idem_client *c, const struct idem_client_request *req,
                     struct idem_client_response **resp, enum idem_client_outcome *outcome)
{
    int rc = IDEM_CLIENT_EINVAL;
    struct idem_client_response *r = NULL;
    struct curl_slist *headers = NULL;
    const struct idem_client_intent *it = NULL;
    const char *why = NULL;
    struct attempt_ctx ax = {NULL, 0};
    struct idem_client_attempt a;
    enum idem_client__verdict v;
    enum idem_client_outcome oc = IDEM_CLIENT_OUTCOME_NONE;
    int64_t start, deadline, now, left, delay = 0, timeout;
    int n;

    if (resp)
        *resp = NULL;
    if (outcome)
        *outcome = IDEM_CLIENT_OUTCOME_NONE;
    if (!c || !req || !resp || !outcome)
        goto out;
    c->errmsg[0] = '\0';
    rc = check_request(c, req);
    if (rc < 0)
        goto out;
    if (req->key && idem_client_key_check(req->key, &why) < 0) {
        idem_client__fmt(c->errmsg, sizeof c->errmsg, "%s", why);
        rc = IDEM_CLIENT_EKEY;
        goto out;
    }
    rc = IDEM_CLIENT_ENOMEM;
    r = idem_client__response_new(c->opts.max_response_bytes);
    if (!r)
        goto out;
    ax.resp = r;
    /* Copied first: the caller's key may be one the journal lent it, which the next journal
     * call frees. */
    if (req->key) {
        r->key = idem_client__strdup(req->key);
        if (!r->key)
            goto out;
    }
    if (req->intent) {
        /* The key is on disk before the first byte leaves: a killed process finds it again. */
        rc = idem_client_journal_begin(c->journal, req->intent, r->key, &it);
        if (rc < 0) {
            idem_client__fmt(c->errmsg, sizeof c->errmsg, "%s",
                             idem_client_journal_errmsg(c->journal));
            goto out;
        }
        if (!r->key) {
            rc = IDEM_CLIENT_ENOMEM;
            r->key = idem_client__strdup(it->key);
            if (!r->key)
                goto out;
        }
    }
    rc = build_headers(req, r->key, &headers);
    if (rc < 0)
        goto out;
    rc = setup_curl(c, req, headers, &ax);
    if (rc < 0)
        goto out;

    start = clock_mono_ms();
    deadline = start + c->opts.max_time_ms;
    for (n = 1;; n++) {
        memset(&a, 0, sizeof a);
        a.n = n;
        if (n > 1) {
            clock_sleep_ms(delay);
            a.waited_ms = delay;
        }
        left = deadline - clock_mono_ms();
        timeout = left < c->opts.attempt_timeout_ms ? left : c->opts.attempt_timeout_ms;
        if (timeout < 1)
            timeout = 1;
        v = attempt(c, &ax, timeout, &a);
        r->attempts = n;
        a.next_delay_ms = -1;
        if (v == IDEM_CLIENT__FINAL) {
            oc = a.transport_error ? IDEM_CLIENT_OUTCOME_FAILED : IDEM_CLIENT_OUTCOME_FINAL;
            idem_client__fmt(c->reason, sizeof c->reason, "%s", a.reason);
        } else if (n >= c->opts.max_attempts) {
            oc = IDEM_CLIENT_OUTCOME_EXHAUSTED;
            idem_client__fmt(c->reason, sizeof c->reason, "%s; no attempts left (%d made)",
                             a.reason, n);
        } else {
            delay =
                idem_client__backoff_ms(&c->rng, n, c->opts.base_delay_ms, c->opts.max_delay_ms);
            if (a.retry_after_ms > delay)
                delay = a.retry_after_ms;
            now = clock_mono_ms();
            if (now + delay >= deadline) {
                oc = IDEM_CLIENT_OUTCOME_EXHAUSTED;
                idem_client__fmt(c->reason, sizeof c->reason,
                                 "%s; no time left (a %lld ms pause would pass the %lld ms limit)",
                                 a.reason, (long long)delay, (long long)c->opts.max_time_ms);
            } else {
                a.next_delay_ms = delay;
                idem_client__fmt(c->reason, sizeof c->reason, "%s", a.reason);
            }
        }
        a.outcome = oc;
        a.reason = c->reason;
        if (c->opts.on_attempt)
            c->opts.on_attempt(&a, c->opts.on_attempt_arg);
        if (oc != IDEM_CLIENT_OUTCOME_NONE)
            break;
    }
    r->elapsed_ms = clock_mono_ms() - start;
    if (oc == IDEM_CLIENT_OUTCOME_FINAL)
        idem_client__set_text(&r->reason, "final answer %d after %d attempt%s", r->status,
                              r->attempts, r->attempts == 1 ? "" : "s");
    else if (oc == IDEM_CLIENT_OUTCOME_EXHAUSTED)
        idem_client__set_text(&r->reason, "gave up after %d attempt%s: %s", r->attempts,
                              r->attempts == 1 ? "" : "s", c->reason);
    else
        idem_client__set_text(&r->reason, "failed: %s (%s)", c->reason,
                              r->error ? r->error : "transport error");
    if (oc == IDEM_CLIENT_OUTCOME_FINAL && req->intent &&
        idem_client_journal_finish(c->journal, req->intent, r->status) < 0)
        idem_client__set_text(&r->journal_error, "%s", idem_client_journal_errmsg(c->journal));
    *resp = r;
    *outcome = oc;
    r = NULL;
    rc = 0;
out:
    if (c && c->curl)
        (void)curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(headers);
    idem_client_response_free(r);
    return rc;
}
