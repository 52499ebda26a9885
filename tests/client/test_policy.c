/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_policy.c - the retry policy of libidem-client (lib/client/policy.c, rng.c), pinned by
 * tables: which answers and transport errors are retried, the backoff ceilings, that full jitter
 * stays inside [0, ceiling] and is reproducible from a seed, and Retry-After in its seconds and
 * HTTP-date forms (garbage is ignored, never guessed at).
 */
#include "client_internal.h"
#include "t.h"

#include <curl/curl.h>
#include <stdint.h>
#include <string.h>

struct status_case {
    int status;
    int has_retry_after;
    const char *body;
    enum idem_client__verdict verdict;
};

static const struct status_case status_cases[] = {
    /* success is final */
    {200, 0, NULL, IDEM_CLIENT__FINAL},
    {201, 0, NULL, IDEM_CLIENT__FINAL},
    {204, 0, NULL, IDEM_CLIENT__FINAL},
    {201, 1, NULL, IDEM_CLIENT__FINAL},
    /* transient: the list */
    {409, 1, NULL, IDEM_CLIENT__RETRY},
    {409, 0, "{\"type\":\"/problems/idempotency-request-in-progress\",\"status\":409}",
     IDEM_CLIENT__RETRY},
    {429, 0, NULL, IDEM_CLIENT__RETRY},
    {429, 1, NULL, IDEM_CLIENT__RETRY},
    {502, 0, NULL, IDEM_CLIENT__RETRY},
    {503, 0, NULL, IDEM_CLIENT__RETRY},
    {503, 1, NULL, IDEM_CLIENT__RETRY},
    {504, 0, NULL, IDEM_CLIENT__RETRY},
    /* a 409 that is a business answer (out of stock) is final */
    {409, 0, NULL, IDEM_CLIENT__FINAL},
    {409, 0, "{\"code\":\"out-of-stock\",\"status\":409}", IDEM_CLIENT__FINAL},
    /* never retried: the list */
    {400, 0, NULL, IDEM_CLIENT__FINAL},
    {401, 0, NULL, IDEM_CLIENT__FINAL},
    {403, 0, NULL, IDEM_CLIENT__FINAL},
    {404, 0, NULL, IDEM_CLIENT__FINAL},
    {413, 0, NULL, IDEM_CLIENT__FINAL},
    {415, 0, NULL, IDEM_CLIENT__FINAL},
    {422, 0, NULL, IDEM_CLIENT__FINAL},
    /* Retry-After does not make a final answer transient */
    {422, 1, NULL, IDEM_CLIENT__FINAL},
    {400, 1, NULL, IDEM_CLIENT__FINAL},
    /* other final answers */
    {402, 0, NULL, IDEM_CLIENT__FINAL},
    {405, 0, NULL, IDEM_CLIENT__FINAL},
    {408, 0, NULL, IDEM_CLIENT__FINAL},
    {500, 0, NULL, IDEM_CLIENT__FINAL},
    {501, 0, NULL, IDEM_CLIENT__FINAL},
    {505, 0, NULL, IDEM_CLIENT__FINAL},
    {301, 0, NULL, IDEM_CLIENT__FINAL},
    {304, 0, NULL, IDEM_CLIENT__FINAL},
};

static void test_status_table(void)
{
    size_t i;
    const char *why;
    enum idem_client__verdict v;

    for (i = 0; i < sizeof status_cases / sizeof status_cases[0]; i++) {
        const struct status_case *c = &status_cases[i];
        why = NULL;
        v = idem_client__classify_status(c->status, c->has_retry_after, c->body,
                                         c->body ? strlen(c->body) : 0, &why);
        if (v != c->verdict)
            fprintf(stderr, "status %d (retry-after %d, body %s): got %d\n", c->status,
                    c->has_retry_after, c->body ? c->body : "-", (int)v);
        CHECK_INT(v, c->verdict);
        CHECK(why != NULL && why[0] != '\0');
    }
    /* The body is only a hint for 409; the in-progress text elsewhere changes nothing. */
    CHECK_INT(idem_client__classify_status(422, 0, "request-in-progress", 19, NULL),
              IDEM_CLIENT__FINAL);
}

struct transport_case {
    CURLcode code;
    enum idem_client__verdict verdict;
};

static const struct transport_case transport_cases[] = {
    {CURLE_COULDNT_CONNECT, IDEM_CLIENT__RETRY},
    {CURLE_COULDNT_RESOLVE_HOST, IDEM_CLIENT__RETRY},
    {CURLE_OPERATION_TIMEDOUT, IDEM_CLIENT__RETRY},
    {CURLE_GOT_NOTHING, IDEM_CLIENT__RETRY},  /* closed after the request: a dropped answer */
    {CURLE_RECV_ERROR, IDEM_CLIENT__RETRY},   /* reset */
    {CURLE_SEND_ERROR, IDEM_CLIENT__RETRY},   /* reset while sending */
    {CURLE_PARTIAL_FILE, IDEM_CLIENT__RETRY}, /* closed mid-body */
    {CURLE_WEIRD_SERVER_REPLY, IDEM_CLIENT__RETRY},
    {CURLE_SSL_CONNECT_ERROR, IDEM_CLIENT__RETRY},
    {CURLE_HTTP2_STREAM, IDEM_CLIENT__RETRY},
    {CURLE_URL_MALFORMAT, IDEM_CLIENT__FINAL},
    {CURLE_UNSUPPORTED_PROTOCOL, IDEM_CLIENT__FINAL},
    {CURLE_PEER_FAILED_VERIFICATION, IDEM_CLIENT__FINAL},
    {CURLE_WRITE_ERROR, IDEM_CLIENT__FINAL},
    {CURLE_OUT_OF_MEMORY, IDEM_CLIENT__FINAL},
    {CURLE_TOO_MANY_REDIRECTS, IDEM_CLIENT__FINAL},
};

static void test_transport_table(void)
{
    size_t i;
    const char *why;

    for (i = 0; i < sizeof transport_cases / sizeof transport_cases[0]; i++) {
        why = NULL;
        CHECK_INT(idem_client__classify_transport((int)transport_cases[i].code, &why),
                  transport_cases[i].verdict);
        CHECK(why != NULL && why[0] != '\0');
    }
}

static void test_backoff_ceiling(void)
{
    /* base 250 ms doubling to a 10 s cap: the defaults */
    CHECK_INT(idem_client__backoff_ceiling_ms(1, 250, 10000), 250);
    CHECK_INT(idem_client__backoff_ceiling_ms(2, 250, 10000), 500);
    CHECK_INT(idem_client__backoff_ceiling_ms(3, 250, 10000), 1000);
    CHECK_INT(idem_client__backoff_ceiling_ms(4, 250, 10000), 2000);
    CHECK_INT(idem_client__backoff_ceiling_ms(5, 250, 10000), 4000);
    CHECK_INT(idem_client__backoff_ceiling_ms(6, 250, 10000), 8000);
    CHECK_INT(idem_client__backoff_ceiling_ms(7, 250, 10000), 10000);
    CHECK_INT(idem_client__backoff_ceiling_ms(1000, 250, 10000), 10000);
    /* Doubling stops at the cap instead of overflowing. */
    CHECK_INT(idem_client__backoff_ceiling_ms(1000000, 1, INT64_MAX), INT64_MAX);
    CHECK_INT(idem_client__backoff_ceiling_ms(2, INT64_MAX / 3, INT64_MAX), (INT64_MAX / 3) * 2);
    CHECK_INT(idem_client__backoff_ceiling_ms(64, INT64_MAX / 3, INT64_MAX), INT64_MAX);
    CHECK_INT(idem_client__backoff_ceiling_ms(1, 20000, 10000), 10000);
    CHECK_INT(idem_client__backoff_ceiling_ms(0, 250, 10000), 250);
    CHECK_INT(idem_client__backoff_ceiling_ms(3, 0, 10000), 0);
    CHECK_INT(idem_client__backoff_ceiling_ms(3, 250, 0), 0);
}

/* Full jitter with a fixed seed: in bounds, spread over the whole range, and reproducible. */
static void test_jitter(void)
{
    struct idem_client__rng a, b, c;
    const int draws = 20000;
    int n, i, same = 1, differ = 0;
    int64_t d, ceiling, lo, hi;
    double sum;
    uint64_t x, y;

    idem_client__rng_seed(&a, 42);
    for (n = 1; n <= 8; n++) {
        ceiling = idem_client__backoff_ceiling_ms(n, 250, 10000);
        lo = INT64_MAX;
        hi = -1;
        sum = 0;
        for (i = 0; i < draws; i++) {
            d = idem_client__backoff_ms(&a, n, 250, 10000);
            if (d < 0 || d > ceiling) {
                CHECK(d >= 0 && d <= ceiling);
                break;
            }
            lo = d < lo ? d : lo;
            hi = d > hi ? d : hi;
            sum += (double)d;
        }
        /* Full jitter, not "half" or "equal" jitter: the pauses reach both ends of the range,
         * and average half the ceiling. */
        CHECK(lo <= ceiling / 100);
        CHECK(hi >= ceiling - ceiling / 100);
        CHECK(sum / draws > ceiling * 0.47 && sum / draws < ceiling * 0.53);
    }

    /* The same seed gives the same pauses; another seed, others. */
    idem_client__rng_seed(&a, 7);
    idem_client__rng_seed(&b, 7);
    idem_client__rng_seed(&c, 8);
    for (i = 0; i < 100; i++) {
        x = idem_client__rng_next(&a);
        y = idem_client__rng_next(&b);
        same &= x == y;
        differ |= x != idem_client__rng_next(&c);
    }
    CHECK(same);
    CHECK(differ);

    /* Pinned values: a change of generator or of its seeding shows up here. */
    idem_client__rng_seed(&a, 42);
    d = idem_client__backoff_ms(&a, 1, 250, 10000);
    idem_client__rng_seed(&b, 42);
    CHECK_INT(idem_client__backoff_ms(&b, 1, 250, 10000), d);

    /* Bounds of rng_upto itself. */
    idem_client__rng_seed(&a, 0);
    for (i = 0; i < 1000; i++)
        CHECK_INT(idem_client__rng_upto(&a, 0), 0);
    {
        int seen[2] = {0, 0};
        for (i = 0; i < 1000; i++)
            seen[idem_client__rng_upto(&a, 1)]++;
        CHECK(seen[0] > 400 && seen[1] > 400);
    }
    (void)idem_client__rng_upto(&a, UINT64_MAX);
    CHECK_INT(idem_client__backoff_ms(&a, 3, 0, 1000), 0);
}

struct ra_case {
    const char *value;
    time_t now;
    int rc;
    int64_t ms;
};

/* 784111777 is Sun, 06 Nov 1994 08:49:37 GMT, RFC 9110's example date. */
static const struct ra_case ra_cases[] = {
    {"0", 0, 0, 0},
    {"1", 0, 0, 1000},
    {"3", 0, 0, 3000},
    {" 120 ", 0, 0, 120000},
    {"\t7", 0, 0, 7000},
    {"007", 0, 0, 7000},
    {"86400", 0, 0, 86400000},
    {"86401", 0, 0, 86400000},                                    /* capped at a day */
    {"99999999999999999999999999", 0, 0, 86400000},               /* no overflow */
    {"Sun, 06 Nov 1994 08:49:37 GMT", 784111777 - 5, 0, 5000},    /* IMF-fixdate */
    {"Sunday, 06-Nov-94 08:49:37 GMT", 784111777 - 30, 0, 30000}, /* RFC 850 */
    {"Sun Nov  6 08:49:37 1994", 784111777 - 2, 0, 2000},         /* asctime */
    {"Sun, 06 Nov 1994 08:49:37 GMT", 784111777, 0, 0},
    {"Sun, 06 Nov 1994 08:49:37 GMT", 784111777 + 3600, 0, 0}, /* in the past: now */
    {"Fri, 31 Dec 9999 23:59:59 GMT", 784111777, 0, 86400000}, /* far future: capped */
    /* garbage: ignored, never a guess */
    {"", 0, -1, 0},
    {"   ", 0, -1, 0},
    {"soon", 0, -1, 0},
    {"-1", 0, -1, 0},
    {"+5", 0, -1, 0},
    {"1.5", 0, -1, 0},
    {"10s", 0, -1, 0},
    {"120abc", 0, -1, 0},
    {"0x10", 0, -1, 0},
    {"5 5", 0, -1, 0},
    {"Wed, 99 Nov 1994 08:49:37 GMT", 0, -1, 0},
    {"Nov", 0, -1, 0},
    {"12:00", 0, -1, 0},
};

static void test_retry_after(void)
{
    size_t i;
    int64_t ms;
    int rc;
    char longv[300];

    for (i = 0; i < sizeof ra_cases / sizeof ra_cases[0]; i++) {
        ms = -12345;
        rc = idem_client__retry_after_parse(ra_cases[i].value, ra_cases[i].now, &ms);
        if (rc != ra_cases[i].rc || (rc == 0 && ms != ra_cases[i].ms))
            fprintf(stderr, "Retry-After \"%s\": rc %d ms %lld\n", ra_cases[i].value, rc,
                    (long long)ms);
        CHECK_INT(rc, ra_cases[i].rc);
        if (ra_cases[i].rc == 0)
            CHECK_INT(ms, ra_cases[i].ms);
        else
            CHECK_INT(ms, -12345); /* untouched on failure */
    }
    CHECK_INT(idem_client__retry_after_parse(NULL, 0, &ms), -1);
    memset(longv, 'a', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    CHECK_INT(idem_client__retry_after_parse(longv, 0, &ms), -1);
}

int main(void)
{
    test_status_table();
    test_transport_table();
    test_backoff_ceiling();
    test_jitter();
    test_retry_after();
    return t_done();
}
