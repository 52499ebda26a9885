/* SPDX-License-Identifier: Apache-2.0 */
/*
 * policy.c - when to retry and how long to wait, as pure functions.  The retry loop in client.c
 * only asks these questions, so the whole policy can be pinned by a table in the unit tests:
 * which answers are transient (a retry may get another answer) and which are final (the same
 * bytes will get the same answer, or worse, a second execution), the full-jitter backoff that
 * keeps a crowd of clients from retrying in lockstep, and Retry-After in both of its forms.
 */
#include "client_internal.h"

#include <curl/curl.h>
#include <string.h>

#include "banned.h"

/* A Retry-After larger than this is taken as this; --max-time cuts it shorter anyway. */
#define RETRY_AFTER_CAP_S 86400

/* Whether `needle` occurs in the `len` bytes of `hay` (which need not be NUL-terminated). */
static int contains(const char *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle), i;

    if (!hay || n == 0 || len < n)
        return 0;
    for (i = 0; i + n <= len; i++) {
        if (memcmp(hay + i, needle, n) == 0)
            return 1;
    }
    return 0;
}

enum idem_client__verdict idem_client__classify_status(int status, int has_retry_after,
                                                       const char *body, size_t body_len,
                                                       const char **reason)
{
    enum idem_client__verdict v = IDEM_CLIENT__FINAL;
    const char *why;

    if (status >= 200 && status <= 299) {
        why = "success";
    } else if (status == 409) {
        /*
         * 409 means two things: "the first request with this key still runs" (transient; an
         * idempotent server says so with Retry-After and an in-progress problem type) and a
         * business conflict such as out-of-stock, which is the stored, final answer.
         */
        if (has_retry_after || contains(body, body_len, "request-in-progress")) {
            v = IDEM_CLIENT__RETRY;
            why = "409: the first request with this key is still in progress";
        } else {
            why = "409 conflict without Retry-After: a final business answer";
        }
    } else if (status == 429) {
        v = IDEM_CLIENT__RETRY;
        why = "429: too many requests";
    } else if (status == 502 || status == 503 || status == 504) {
        v = IDEM_CLIENT__RETRY;
        why = status == 502   ? "502: bad gateway"
              : status == 503 ? "503: service unavailable"
                              : "504: gateway timeout";
    } else if (status >= 400 && status <= 499) {
        why = "client error: the same request would be refused again";
    } else if (status >= 500 && status <= 599) {
        why = "server error that is not transient (only 502, 503 and 504 are retried)";
    } else {
        why = "final answer";
    }
    if (reason)
        *reason = why;
    return v;
}

enum idem_client__verdict idem_client__classify_transport(int curl_code, const char **reason)
{
    enum idem_client__verdict v = IDEM_CLIENT__RETRY;
    const char *why;

    switch ((CURLcode)curl_code) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
        why = "name resolution failed";
        break;
    case CURLE_COULDNT_CONNECT:
        why = "connection failed";
        break;
    case CURLE_OPERATION_TIMEDOUT:
        why = "timed out";
        break;
    case CURLE_GOT_NOTHING:
        why = "connection closed before any answer";
        break;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
        why = "connection broken (reset?)";
        break;
    case CURLE_PARTIAL_FILE:
        why = "connection closed in the middle of the answer";
        break;
    case CURLE_WEIRD_SERVER_REPLY:
        why = "garbled answer (connection cut?)";
        break;
    case CURLE_SSL_CONNECT_ERROR:
        why = "TLS handshake failed";
        break;
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
    case CURLE_PROXY:
        why = "connection-level protocol error";
        break;
    default:
        /* A malformed URL, an unsupported scheme, a certificate that does not verify, the body
         * cap: the next attempt would fail the same way. */
        v = IDEM_CLIENT__FINAL;
        why = "a failure retrying cannot fix";
        break;
    }
    if (reason)
        *reason = why;
    return v;
}

int64_t idem_client__backoff_ceiling_ms(int n, int64_t base_ms, int64_t max_ms)
{
    int64_t c = base_ms;
    int i;

    if (base_ms <= 0 || max_ms <= 0)
        return 0;
    if (c >= max_ms)
        return max_ms;
    for (i = 1; i < n; i++) {
        /* Doubling stops at the cap, so it cannot overflow. */
        if (c > max_ms / 2)
            return max_ms;
        c *= 2;
    }
    return c < max_ms ? c : max_ms;
}

int64_t idem_client__backoff_ms(struct idem_client__rng *r, int n, int64_t base_ms, int64_t max_ms)
{
    int64_t ceiling = idem_client__backoff_ceiling_ms(n, base_ms, max_ms);

    if (ceiling <= 0)
        return 0;
    return (int64_t)idem_client__rng_upto(r, (uint64_t)ceiling);
}

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

int idem_client__retry_after_parse(const char *value, time_t now, int64_t *delay_ms)
{
    char text[128];
    size_t b, e, i;
    int64_t s = 0;
    time_t when;

    if (!value || !delay_ms)
        return -1;
    b = 0;
    e = strlen(value);
    while (b < e && is_ows(value[b]))
        b++;
    while (e > b && is_ows(value[e - 1]))
        e--;
    if (b == e || e - b >= sizeof text)
        return -1;
    if (value[b] >= '0' && value[b] <= '9') {
        for (i = b; i < e; i++) {
            if (value[i] < '0' || value[i] > '9')
                return -1; /* "1.5", "10s", "120abc": not delay-seconds, and not a date */
            if (s < RETRY_AFTER_CAP_S)
                s = s * 10 + (value[i] - '0');
        }
        if (s > RETRY_AFTER_CAP_S)
            s = RETRY_AFTER_CAP_S;
        *delay_ms = s * 1000;
        return 0;
    }
    memcpy(text, value + b, e - b);
    text[e - b] = '\0';
    /* IMF-fixdate, RFC 850 and asctime forms; curl_getdate refuses what is none of them. */
    when = curl_getdate(text, NULL);
    if (when == (time_t)-1)
        return -1;
    if (when <= now) {
        *delay_ms = 0;
        return 0;
    }
    s = (int64_t)(when - now);
    if (s > RETRY_AFTER_CAP_S)
        s = RETRY_AFTER_CAP_S;
    *delay_ms = s * 1000;
    return 0;
}
