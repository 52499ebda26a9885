/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_send.c - idem_client_send() end to end against a scripted HTTP server on 127.0.0.1 (a
 * thread in this process).  The server answers each connection as the script says - a status
 * with headers, or a close without an answer - and keeps every request's raw bytes, so the tests
 * can check what the policy tables cannot: every attempt sends the very same bytes and key, the
 * pauses follow Retry-After, the caps stop the loop, the callback sees each attempt, the seed
 * makes the jitter reproducible, the journal holds the key before the first request arrives, and
 * the report tells a replayed answer (Idempotent-Replayed: true) from a fresh one.
 */
#include "client_internal.h"
#include "ascii.h"
#include "t.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_STEPS 8
#define REQ_MAX 65536

struct step {
    int status;          /* 0: read the request, then close without answering */
    const char *headers; /* extra header lines, each ending in \r\n */
    const char *body;
};

struct server {
    int fd;
    int port;
    pthread_t thread;
    struct step steps[MAX_STEPS];
    int nsteps;
    char *requests[MAX_STEPS];
    size_t request_len[MAX_STEPS];
    int served;
    const char *journal_path; /* if set: was the request's key in this file when it came? */
    int key_was_journaled[MAX_STEPS];
};

static size_t content_length(const char *req)
{
    const char *p = req;

    while ((p = strchr(p, '\n')) != NULL) {
        p++;
        if (ascii_ncaseeq(p, "Content-Length:", 15))
            return (size_t)strtoul(p + 15, NULL, 10);
    }
    return 0;
}

/* Reads one request (headers, then Content-Length bytes of body) into a new buffer. */
static char *read_request(int fd, size_t *len)
{
    char *buf = malloc(REQ_MAX + 1);
    size_t n = 0, want = 0;
    ssize_t got;
    char *end;

    if (!buf)
        return NULL;
    for (;;) {
        got = recv(fd, buf + n, REQ_MAX - n, 0);
        if (got <= 0)
            break;
        n += (size_t)got;
        buf[n] = '\0';
        end = strstr(buf, "\r\n\r\n");
        if (end && want == 0)
            want = (size_t)(end + 4 - buf) + content_length(buf);
        if (want && n >= want)
            break;
        if (n == REQ_MAX)
            break;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int file_contains(const char *path, const char *needle)
{
    char buf[65536];
    FILE *f = fopen(path, "rb");
    size_t n;

    if (!f)
        return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void *serve(void *arg)
{
    struct server *s = arg;
    char head[1024], key[300];
    const char *k;
    int i, c;
    size_t blen;

    for (i = 0; i < s->nsteps; i++) {
        c = accept(s->fd, NULL, NULL);
        if (c < 0)
            break;
        s->requests[i] = read_request(c, &s->request_len[i]);
        if (s->journal_path && s->requests[i]) {
            k = strstr(s->requests[i], "Idempotency-Key: ");
            if (k && sscanf(k + 17, "%299[^\r]", key) == 1)
                s->key_was_journaled[i] = file_contains(s->journal_path, key);
        }
        if (s->steps[i].status > 0) {
            blen = s->steps[i].body ? strlen(s->steps[i].body) : 0;
            snprintf(head, sizeof head,
                     "HTTP/1.1 %d Scripted\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                     s->steps[i].status, blen, s->steps[i].headers ? s->steps[i].headers : "");
            if (send(c, head, strlen(head), MSG_NOSIGNAL) < 0 ||
                (blen && send(c, s->steps[i].body, blen, MSG_NOSIGNAL) < 0))
                perror("send");
        }
        close(c);
        s->served = i + 1;
    }
    return NULL;
}

static int listen_loopback(int *port)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0) {
        perror("listen");
        exit(1);
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static void server_start(struct server *s, const struct step *steps, int n)
{
    memset(s, 0, sizeof *s);
    memcpy(s->steps, steps, (size_t)n * sizeof *steps);
    s->nsteps = n;
    s->fd = listen_loopback(&s->port);
    if (pthread_create(&s->thread, NULL, serve, s) != 0)
        exit(1);
}

/* Stops the server (waking its accept if the client made fewer attempts than scripted). */
static void server_stop(struct server *s)
{
    shutdown(s->fd, SHUT_RDWR);
    pthread_join(s->thread, NULL);
    close(s->fd);
}

/* Frees the requests the server kept. */
static void server_free(struct server *s)
{
    int i;

    for (i = 0; i < MAX_STEPS; i++) {
        free(s->requests[i]);
        s->requests[i] = NULL;
    }
}

/* What the attempt callback saw. */
struct seen {
    int n;
    struct idem_client_attempt a[16];
};

static void record_attempt(const struct idem_client_attempt *a, void *arg)
{
    struct seen *s = arg;

    if (s->n < 16) {
        s->a[s->n] = *a;
        s->a[s->n].error = NULL;
        s->a[s->n].reason = NULL;
    }
    s->n++;
}

static struct idem_client *client_with(struct idem_client_options *o, struct seen *seen)
{
    struct idem_client *c = NULL;

    o->on_attempt = record_attempt;
    o->on_attempt_arg = seen;
    CHECK_INT(idem_client_open(o, &c), 0);
    return c;
}

static void url_of(char *out, size_t cap, int port, const char *path)
{
    snprintf(out, cap, "http://127.0.0.1:%d%s", port, path);
}

static const char body[] = "{\"productId\":\"p-1024\",\"quantity\":2}";

/* 503 (Retry-After: 0), 503, a dropped answer, then 201: the same bytes every time. */
static void test_retries_send_same_bytes(void)
{
    static const struct step steps[] = {
        {503, "Retry-After: 0\r\n", "{\"code\":\"outcome-unknown\"}"},
        {503, NULL, NULL},
        {0, NULL, NULL},
        {201, "Content-Type: application/json\r\nLocation: /api/orders/o1\r\n", "{\"id\":\"o1\"}"},
    };
    struct server s;
    struct seen seen = {0};
    struct idem_client_options o = {0};
    struct idem_client *c;
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client_request req = {0};
    const char *hdrs[] = {"Authorization: Bearer t0k"};
    char url[128];
    size_t len;
    int i;

    server_start(&s, steps, 4);
    o.base_delay_ms = 20;
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/api/orders");
    req.method = "POST";
    req.url = url;
    req.headers = hdrs;
    req.nheaders = 1;
    req.body = body;
    req.body_len = strlen(body);
    req.key = "key-retry-1";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    server_stop(&s);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_FINAL);
    CHECK_INT(idem_client_response_status(r), 201);
    CHECK_INT(idem_client_response_attempts(r), 4);
    CHECK_STR(idem_client_response_key(r), "key-retry-1");
    CHECK_STR((const char *)idem_client_response_body(r, &len), "{\"id\":\"o1\"}");
    CHECK_INT(len, 11);
    CHECK_STR(idem_client_response_header(r, "location"), "/api/orders/o1");
    CHECK_STR(idem_client_response_status_line(r), "HTTP/1.1 201 Scripted");
    CHECK(idem_client_response_error(r) == NULL);
    CHECK(idem_client_response_journal_error(r) == NULL);

    /* Four requests, byte for byte the same, carrying the key, the body and the defaults. */
    CHECK_INT(s.served, 4);
    for (i = 0; i < 4; i++) {
        CHECK(s.requests[i] != NULL);
        if (!s.requests[i])
            continue;
        CHECK_INT(s.request_len[i], s.request_len[0]);
        CHECK(memcmp(s.requests[i], s.requests[0], s.request_len[0]) == 0);
    }
    CHECK(strncmp(s.requests[0], "POST /api/orders HTTP/1.1\r\n", 27) == 0);
    CHECK(strstr(s.requests[0], "\r\nIdempotency-Key: key-retry-1\r\n") != NULL);
    CHECK(strstr(s.requests[0], "\r\nContent-Type: application/json\r\n") != NULL);
    CHECK(strstr(s.requests[0], "\r\nAuthorization: Bearer t0k\r\n") != NULL);
    CHECK(strstr(s.requests[0], "Expect:") == NULL);
    CHECK(strstr(s.requests[0], body) != NULL);

    /* The callback saw every attempt, with its status, pause and decision. */
    CHECK_INT(seen.n, 4);
    CHECK_INT(seen.a[0].status, 503);
    CHECK_INT(seen.a[0].retry_after_ms, 0);
    CHECK_INT(seen.a[1].status, 503);
    CHECK_INT(seen.a[1].retry_after_ms, -1);
    CHECK_INT(seen.a[2].status, 0);
    CHECK(seen.a[2].transport_error != 0);
    CHECK_INT(seen.a[3].status, 201);
    for (i = 0; i < 3; i++) {
        CHECK_INT(seen.a[i].n, i + 1);
        CHECK_INT(seen.a[i].outcome, IDEM_CLIENT_OUTCOME_NONE);
        CHECK(seen.a[i].next_delay_ms >= 0);
        CHECK(seen.a[i].next_delay_ms <= idem_client__backoff_ceiling_ms(i + 1, 20, 10000));
        CHECK_INT(seen.a[i + 1].waited_ms, seen.a[i].next_delay_ms);
    }
    CHECK_INT(seen.a[0].waited_ms, 0);
    CHECK_INT(seen.a[3].outcome, IDEM_CLIENT_OUTCOME_FINAL);
    CHECK_INT(seen.a[3].next_delay_ms, -1);
    idem_client_response_free(r);
    server_free(&s);
    idem_client_close(c);
}

/* A final answer is not retried: one attempt, whatever Retry-After says. */
static void test_final_answers_not_retried(void)
{
    static const int statuses[] = {400, 401, 403, 404, 413, 415, 422, 500, 409};
    struct step steps[2] = {{0, "Retry-After: 1\r\n", "{\"code\":\"x\"}"}, {200, NULL, "{}"}};
    struct idem_client_request req = {0};
    struct idem_client_options o = {0};
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client *c;
    struct server s;
    struct seen seen;
    char url[128];
    size_t i;

    for (i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
        memset(&seen, 0, sizeof seen);
        steps[0].status = statuses[i];
        /* a 409 without Retry-After is a business conflict (out of stock) */
        steps[0].headers = statuses[i] == 409 ? NULL : "Retry-After: 1\r\n";
        server_start(&s, steps, 2);
        c = client_with(&o, &seen);
        url_of(url, sizeof url, s.port, "/x");
        req.method = "POST";
        req.url = url;
        req.body = "{}";
        req.body_len = 2;
        req.key = "k-final";
        CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
        server_stop(&s);
        CHECK_INT(oc, IDEM_CLIENT_OUTCOME_FINAL);
        CHECK_INT(idem_client_response_status(r), statuses[i]);
        CHECK_INT(idem_client_response_attempts(r), 1);
        CHECK_INT(s.served, 1);
        CHECK_INT(seen.n, 1);
        idem_client_response_free(r);
        server_free(&s);
        idem_client_close(c);
    }
}

/* 409 in progress with Retry-After: 1, then the replay: the pause is at least one second. */
static void test_retry_after_honoured(void)
{
    static const struct step steps[] = {
        {409, "Retry-After: 1\r\nContent-Type: application/problem+json\r\n",
         "{\"type\":\"/problems/idempotency-request-in-progress\"}"},
        {201, "Idempotent-Replayed: true\r\n", "{\"id\":\"o2\"}"},
    };
    struct server s;
    struct seen seen = {0};
    struct idem_client_options o = {0};
    struct idem_client *c;
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client_request req = {0};
    char url[128];

    server_start(&s, steps, 2);
    o.base_delay_ms = 10; /* the backoff alone would be far shorter than Retry-After */
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/api/orders");
    req.method = "POST";
    req.url = url;
    req.body = body;
    req.body_len = strlen(body);
    req.key = "k-409";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    server_stop(&s);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_FINAL);
    CHECK_INT(idem_client_response_status(r), 201);
    CHECK_INT(idem_client_response_attempts(r), 2);
    CHECK_INT(seen.n, 2);
    CHECK_INT(seen.a[0].status, 409);
    CHECK_INT(seen.a[0].retry_after_ms, 1000);
    CHECK_INT(seen.a[0].next_delay_ms, 1000);
    CHECK_INT(seen.a[1].waited_ms, 1000);
    CHECK(idem_client_response_elapsed_ms(r) >= 1000);
    CHECK_STR(idem_client_response_header(r, "Idempotent-Replayed"), "true");
    idem_client_response_free(r);
    server_free(&s);
    idem_client_close(c);
}

/* The caps: attempts, and time (a Retry-After past the limit stops at once). */
static void test_caps(void)
{
    static const struct step busy[] = {
        {503, NULL, "busy"}, {503, NULL, "busy"}, {503, NULL, "still busy"}, {201, NULL, "{}"}};
    static const struct step slow[] = {{503, "Retry-After: 5\r\n", "later"}, {201, NULL, "{}"}};
    struct server s;
    struct seen seen = {0};
    struct idem_client_options o = {0};
    struct idem_client *c;
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client_request req = {0};
    char url[128];

    server_start(&s, busy, 4);
    o.max_attempts = 3;
    o.base_delay_ms = 5;
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/x");
    req.method = "PUT";
    req.url = url;
    req.body = "{}";
    req.body_len = 2;
    req.key = "k-caps";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    server_stop(&s);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_EXHAUSTED);
    CHECK_INT(idem_client_response_attempts(r), 3);
    CHECK_INT(idem_client_response_status(r), 503); /* the last answer */
    CHECK_STR((const char *)idem_client_response_body(r, NULL), "still busy");
    CHECK(strstr(idem_client_response_reason(r), "no attempts left") != NULL);
    CHECK_INT(seen.a[2].outcome, IDEM_CLIENT_OUTCOME_EXHAUSTED);
    CHECK(strncmp(s.requests[0], "PUT /x ", 7) == 0);
    idem_client_response_free(r);
    server_free(&s);
    idem_client_close(c);

    memset(&seen, 0, sizeof seen);
    server_start(&s, slow, 2);
    memset(&o, 0, sizeof o);
    o.max_time_ms = 1500;
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/x");
    req.url = url;
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    server_stop(&s);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_EXHAUSTED);
    CHECK_INT(idem_client_response_attempts(r), 1);
    CHECK(idem_client_response_elapsed_ms(r) < 1000); /* no pointless 5 s wait */
    CHECK(strstr(idem_client_response_reason(r), "no time left") != NULL);
    idem_client_response_free(r);
    server_free(&s);
    idem_client_close(c);
}

/* Connection refused: retried; with a seed the pauses are the same on every run. */
static void test_seeded_jitter_and_refused(void)
{
    struct seen a = {0}, b = {0};
    struct idem_client_options o = {0};
    struct idem_client *c;
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client_request req = {0};
    char url[128];
    int port, fd, i, run;
    struct seen *seen;

    fd = listen_loopback(&port);
    close(fd); /* nobody listens there now */
    url_of(url, sizeof url, port, "/x");
    for (run = 0; run < 2; run++) {
        seen = run ? &b : &a;
        memset(&o, 0, sizeof o);
        o.max_attempts = 5;
        o.base_delay_ms = 8;
        c = client_with(&o, seen);
        idem_client_seed(c, 1234);
        req.method = "DELETE";
        req.url = url;
        req.key = "k-refused";
        CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
        CHECK_INT(oc, IDEM_CLIENT_OUTCOME_EXHAUSTED);
        CHECK_INT(idem_client_response_status(r), 0);
        CHECK(idem_client_response_error(r) != NULL);
        CHECK_INT(idem_client_response_attempts(r), 5);
        idem_client_response_free(r);
        idem_client_close(c);
    }
    CHECK_INT(a.n, 5);
    CHECK_INT(b.n, 5);
    for (i = 0; i < 4; i++) {
        CHECK_INT(a.a[i].next_delay_ms, b.a[i].next_delay_ms);
        CHECK(a.a[i].next_delay_ms >= 0 &&
              a.a[i].next_delay_ms <= idem_client__backoff_ceiling_ms(i + 1, 8, 10000));
        CHECK(a.a[i].transport_error != 0);
    }
}

/* With an intent, the key is in the journal (fsync'd) before the first request arrives. */
static void test_journal_before_first_send(void)
{
    static const struct step steps[] = {
        {0, NULL, NULL}, {201, NULL, "{\"id\":\"o3\"}"}, {201, NULL, "{\"id\":\"o3\"}"}};
    struct server s;
    struct seen seen = {0};
    struct idem_client_options o = {0};
    struct idem_client *c;
    struct idem_client_journal *j = NULL;
    struct idem_client_response *r = NULL;
    const struct idem_client_intent *it = NULL;
    enum idem_client_outcome oc;
    struct idem_client_request req = {0};
    char url[128], path[] = "/tmp/idem-send-journal-XXXXXX", key[IDEM_CLIENT_KEY_MAX + 1];
    int fd = mkstemp(path);

    CHECK(fd >= 0);
    close(fd);
    CHECK_INT(idem_client_journal_open(path, &j, NULL), 0);
    server_start(&s, steps, 3);
    s.journal_path = path;
    o.base_delay_ms = 5;
    c = client_with(&o, &seen);
    idem_client_set_journal(c, j);
    url_of(url, sizeof url, s.port, "/api/orders");
    req.method = "POST";
    req.url = url;
    req.body = body;
    req.body_len = strlen(body);
    req.intent = "buy-order-3";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_FINAL);
    CHECK_INT(idem_client_response_attempts(r), 2);
    CHECK_INT(s.key_was_journaled[0], 1);
    CHECK_INT(s.key_was_journaled[1], 1);
    snprintf(key, sizeof key, "%s", idem_client_response_key(r));
    CHECK_INT(strlen(key), IDEM_CLIENT_UUID_LEN);
    idem_client_response_free(r);
    r = NULL;
    CHECK_INT(idem_client_journal_lookup(j, "buy-order-3", &it), 0);
    CHECK(it != NULL && strcmp(it->key, key) == 0 && it->final_status == 201);

    /* The same intent again (a re-run): the same key on the wire. */
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    CHECK_STR(idem_client_response_key(r), key);
    idem_client_response_free(r);
    r = NULL;
    server_stop(&s);
    CHECK(s.requests[2] && strstr(s.requests[2], key) != NULL);

    /* A key that contradicts the journal is refused before anything is sent. */
    req.key = "another-key";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), IDEM_CLIENT_EINTENT);
    CHECK(r == NULL);
    CHECK(strstr(idem_client_errmsg(c), key) != NULL);
    server_free(&s);
    idem_client_close(c);
    idem_client_journal_close(j);
    unlink(path);
}

/* Requests refused before anything is sent, and failures no retry can fix. */
static void test_refusals(void)
{
    static const struct step big[] = {{200, NULL, "0123456789012345678901234567890123456789"},
                                      {200, NULL, "x"}};
    struct idem_client_options o = {0};
    struct idem_client *c = NULL;
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client_request req = {0};
    const char *dup[] = {"Idempotency-Key: x"};
    const char *broken[] = {"no colon"};
    struct seen seen = {0};
    struct server s;
    char url[128];

    CHECK_INT(idem_client_open(NULL, &c), 0);
    req.method = "POST";
    req.url = "http://127.0.0.1:1/";
    req.key = "k";
    req.headers = dup;
    req.nheaders = 1;
    CHECK_INT(idem_client_send(c, &req, &r, &oc), IDEM_CLIENT_EINVAL);
    CHECK(r == NULL);
    CHECK(strstr(idem_client_errmsg(c), "Idempotency-Key") != NULL);
    req.headers = broken;
    CHECK_INT(idem_client_send(c, &req, &r, &oc), IDEM_CLIENT_EINVAL);
    req.headers = NULL;
    req.nheaders = 0;
    req.key = "bad key";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), IDEM_CLIENT_EKEY);
    req.key = NULL;
    req.intent = "needs-a-journal";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), IDEM_CLIENT_EINVAL);
    req.intent = NULL;
    req.method = "PO ST";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), IDEM_CLIENT_EINVAL);
    CHECK_INT(idem_client_send(c, NULL, &r, &oc), IDEM_CLIENT_EINVAL);

    /* An unsupported scheme fails at once: no retry can fix it. */
    req.method = "GET";
    req.url = "ftp://127.0.0.1/x";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_FAILED);
    CHECK_INT(idem_client_response_attempts(r), 1);
    idem_client_response_free(r);
    r = NULL;
    idem_client_close(c);
    c = NULL;

    /* An answer over the body cap fails, without a retry. */
    server_start(&s, big, 2);
    o.max_response_bytes = 10;
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/big");
    req.url = url;
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    server_stop(&s);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_FAILED);
    CHECK_INT(idem_client_response_attempts(r), 1);
    CHECK(idem_client_response_error(r) && strstr(idem_client_response_error(r), "cap"));
    CHECK(strncmp(s.requests[0], "GET /big ", 9) == 0);
    CHECK(strstr(s.requests[0], "Idempotency-Key") == NULL);
    idem_client_response_free(r);
    server_free(&s);
    idem_client_close(c);

    o.max_attempts = -1;
    CHECK_INT(idem_client_open(&o, &c), IDEM_CLIENT_EINVAL);
    idem_client_close(NULL);
    idem_client_response_free(NULL);
}

/* A POST without a body sends Content-Length: 0 and no Content-Type; a caller's type wins. */
static void test_default_headers(void)
{
    static const struct step ok[] = {{200, NULL, "{}"}, {200, NULL, "{}"}};
    struct idem_client_options o = {0};
    struct idem_client *c;
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client_request req = {0};
    const char *ct[] = {"Content-Type: application/merge-patch+json"};
    struct seen seen = {0};
    struct server s;
    char url[128];

    server_start(&s, ok, 2);
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/api/orders/o1/cancel");
    req.method = "POST";
    req.url = url;
    req.key = "k-cancel";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    idem_client_response_free(r);
    req.headers = ct;
    req.nheaders = 1;
    req.body = "{}";
    req.body_len = 2;
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    idem_client_response_free(r);
    server_stop(&s);
    CHECK(s.requests[0] && strstr(s.requests[0], "Content-Length: 0\r\n") != NULL);
    CHECK(s.requests[0] && strstr(s.requests[0], "Content-Type") == NULL);
    CHECK(s.requests[1] &&
          strstr(s.requests[1], "Content-Type: application/merge-patch+json\r\n") != NULL);
    CHECK(s.requests[1] && strstr(s.requests[1], "application/json") == NULL);
    server_free(&s);
    idem_client_close(c);
}

/*
 * The attempt report says which answers were replays: a 503, then a 200 that carries
 * Idempotent-Replayed: true; then, one attempt each, the header's other spellings and values.
 */
static void test_replayed_reported(void)
{
    static const struct step retried[] = {
        {503, "Retry-After: 0\r\n", "{\"code\":\"idempotency-store-unavailable\"}"},
        {200, "Idempotent-Replayed: true\r\n", "{\"id\":\"o1\"}"},
    };
    static const struct {
        int status;
        const char *headers;
        int replayed;
    } cases[] = {
        {201, NULL, 0},
        {201, "Idempotent-Replayed: false\r\n", 0},
        {201, "Idempotent-Replayed: trueish\r\n", 0},
        {201, "Idempotent-Replayed:\r\n", 0},
        {201, "Idempotent-Replay: true\r\n", 0},
        {200, "idempotent-replayed:TRUE \r\n", 1},
        {402, "Idempotent-Replayed: true\r\n", 1}, /* a stored refusal, replayed */
    };
    struct idem_client_request req = {0};
    struct idem_client_options o = {0};
    struct idem_client_response *r = NULL;
    enum idem_client_outcome oc;
    struct idem_client *c;
    struct server s;
    struct seen seen = {0};
    struct step one;
    char url[128];
    size_t i;

    server_start(&s, retried, 2);
    o.base_delay_ms = 1;
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/api/orders");
    req.method = "POST";
    req.url = url;
    req.body = body;
    req.body_len = strlen(body);
    req.key = "k-replayed";
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    server_stop(&s);
    CHECK_INT(oc, IDEM_CLIENT_OUTCOME_FINAL);
    CHECK_INT(seen.n, 2);
    CHECK_INT(seen.a[0].status, 503);
    CHECK_INT(seen.a[0].replayed, 0);
    CHECK_INT(seen.a[1].status, 200);
    CHECK_INT(seen.a[1].replayed, 1);
    idem_client_response_free(r);
    server_free(&s);
    idem_client_close(c);

    /* No answer: not a replay. */
    memset(&seen, 0, sizeof seen);
    memset(&one, 0, sizeof one);
    server_start(&s, &one, 1);
    o.max_attempts = 1;
    c = client_with(&o, &seen);
    url_of(url, sizeof url, s.port, "/api/orders");
    CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
    server_stop(&s);
    CHECK_INT(seen.n, 1);
    CHECK_INT(seen.a[0].status, 0);
    CHECK_INT(seen.a[0].replayed, 0);
    idem_client_response_free(r);
    server_free(&s);
    idem_client_close(c);

    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&seen, 0, sizeof seen);
        one.status = cases[i].status;
        one.headers = cases[i].headers;
        one.body = "{}";
        server_start(&s, &one, 1);
        c = client_with(&o, &seen);
        url_of(url, sizeof url, s.port, "/api/orders");
        CHECK_INT(idem_client_send(c, &req, &r, &oc), 0);
        server_stop(&s);
        CHECK_INT(seen.n, 1);
        CHECK_INT(seen.a[0].status, cases[i].status);
        if (seen.a[0].replayed != cases[i].replayed)
            fprintf(stderr, "case %zu: %s", i, cases[i].headers ? cases[i].headers : "(none)\n");
        CHECK_INT(seen.a[0].replayed, cases[i].replayed);
        idem_client_response_free(r);
        server_free(&s);
        idem_client_close(c);
    }
}

int main(void)
{
    test_retries_send_same_bytes();
    test_final_answers_not_retried();
    test_retry_after_honoured();
    test_caps();
    test_seeded_jitter_and_refused();
    test_journal_before_first_send();
    test_refusals();
    test_default_headers();
    test_replayed_reported();
    return t_done();
}
