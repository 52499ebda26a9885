/* SPDX-License-Identifier: Apache-2.0 */
/*
 * provider.c - the provider client (see provider.h) on libcurl.  One easy handle per call keeps
 * the client free of shared state between connection threads; connection reuse does not matter
 * at these rates, a clear outcome does.  Responses are read into a capped buffer: a provider that
 * talks too much is an unknown outcome, not a crash.
 */
#include "provider.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "strbuf.h"
#include "util.h"
#include "banned.h"

#define REPLY_MAX ((size_t)1 << 20)
#define CONNECT_TIMEOUT_MS 2000L

struct provider {
    char *base;
    char *ca_file; /* NULL: the system's CA store */
    int64_t timeout_ms;
};

struct sink {
    struct strbuf sb;
    int too_big;
};

int provider_open(const char *base_url, const char *ca_file, int64_t timeout_ms,
                  struct provider **out)
{
    struct provider *p = xcalloc(1, sizeof *p);
    size_t n;

    p->base = xstrdup(base_url);
    p->ca_file = ca_file != NULL ? xstrdup(ca_file) : NULL;
    n = strlen(p->base);
    while (n > 0 && p->base[n - 1] == '/')
        p->base[--n] = '\0';
    p->timeout_ms = timeout_ms;
    *out = p;
    return 0;
}

void provider_close(struct provider *p)
{
    if (p == NULL)
        return;
    free(p->base);
    free(p->ca_file);
    free(p);
}

const char *provider_url(const struct provider *p)
{
    return p->base;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    struct sink *s = userdata;
    size_t n = size * nmemb;

    if (s->too_big || s->sb.len + n > REPLY_MAX) {
        s->too_big = 1;
        return 0; /* curl stops with CURLE_WRITE_ERROR */
    }
    strbuf_add(&s->sb, ptr, n);
    return n;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *userdata)
{
    static const char name[] = "idempotent-replayed:";
    struct provider_reply *r = userdata;
    size_t n = size * nitems;
    size_t i;

    if (n > sizeof name - 1 && ascii_ncaseeq(buf, name, sizeof name - 1)) {
        for (i = sizeof name - 1; i < n && (buf[i] == ' ' || buf[i] == '\t'); i++)
            ;
        if (n - i >= 4 && ascii_ncaseeq(buf + i, "true", 4))
            r->replayed = 1;
    }
    return n;
}

/* Whether `cc` ended the call in its TLS handshake, before a byte of the request was sent. */
static int tls_refused(CURLcode cc)
{
    switch (cc) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
        return 1;
    default:
        return 0;
    }
}

static void perform(struct provider *p, const char *url, const char *key, const char *body,
                    struct provider_reply *r)
{
    struct sink sink;
    struct curl_slist *hdrs = NULL;
    char errbuf[CURL_ERROR_SIZE];
    char line[320];
    CURL *curl = NULL;
    CURLcode cc;

    memset(r, 0, sizeof *r);
    memset(&sink, 0, sizeof sink);
    r->outcome = PROVIDER_UNKNOWN;
    curl = curl_easy_init();
    if (curl == NULL) {
        snprintf(r->detail, sizeof r->detail, "curl_easy_init failed");
        goto out;
    }
    errbuf[0] = '\0';
    hdrs = curl_slist_append(hdrs, "Accept: application/json");
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (body != NULL)
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    if (key != NULL) {
        snprintf(line, sizeof line, "Idempotency-Key: %s", key);
        hdrs = curl_slist_append(hdrs, line);
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)p->timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     p->timeout_ms < CONNECT_TIMEOUT_MS ? (long)p->timeout_ms : CONNECT_TIMEOUT_MS);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    /*
     * The peer and its name are always verified (libcurl's defaults, said here so that no one
     * drops them); the name goes out as SNI.
     */
    curl_easy_setopt(curl, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
    if (p->ca_file != NULL)
        curl_easy_setopt(curl, CURLOPT_CAINFO, p->ca_file);
    if (body != NULL) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    cc = curl_easy_perform(curl);
    if (cc != CURLE_OK) {
        /*
         * Refused, reset, timed out, or closed with no answer: nobody can say what happened.  A
         * refused TLS handshake has sent nothing, but is left to the same retries as a refused
         * connection; the log says which it was.
         */
        snprintf(r->detail, sizeof r->detail, "%s%s",
                 tls_refused(cc) ? "TLS with the provider "
                                   "failed, nothing sent: "
                                 : "",
                 errbuf[0] ? errbuf : curl_easy_strerror(cc));
        goto out;
    }
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->status);
    provider_reply_read(r, r->status, sink.sb.buf, sink.sb.len);
out:
    strbuf_release(&sink.sb);
    curl_slist_free_all(hdrs);
    if (curl != NULL)
        curl_easy_cleanup(curl);
}

void provider_post(struct provider *p, const char *path, const char *key, const json_t *body,
                   struct provider_reply *r)
{
    struct strbuf url = STRBUF_INIT;
    char *text = xcheck(json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER));

    strbuf_addf(&url, "%s%s", p->base, path);
    perform(p, url.buf, key, text, r);
    free(text);
    strbuf_release(&url);
}

void provider_get_by_key(struct provider *p, const char *path, const char *key,
                         struct provider_reply *r)
{
    struct strbuf url = STRBUF_INIT;
    char *escaped = curl_easy_escape(NULL, key, 0);

    if (escaped == NULL)
        die("out of memory");
    strbuf_addf(&url, "%s%s?idempotency_key=%s", p->base, path, escaped);
    perform(p, url.buf, NULL, NULL, r);
    curl_free(escaped);
    strbuf_release(&url);
}
