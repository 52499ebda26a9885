/* SPDX-License-Identifier: Apache-2.0 */
/*
 * raw_http.c - raw HTTP exchanges over libcurl, one connection per request.  idem-check needs to
 * send exactly what a check describes (an empty header, a control character, a header twice), and
 * to send many requests at the same instant for the storm, so it drives libcurl's easy and multi
 * interfaces itself rather than libidem-client, whose job is to retry and hide such things.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "check.h"
#include "ascii.h"
#include "banned.h"

#define CK_BODY_LIMIT (1u << 20)
#define CK_HEAD_LIMIT (64u << 10)

struct exchange {
    CURL *easy;
    struct curl_slist *headers;
    struct ck_response *resp;
    char errbuf[CURL_ERROR_SIZE];
};

int ck_http_global_init(void)
{
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void ck_http_global_cleanup(void)
{
    curl_global_cleanup();
}

static size_t on_body(char *p, size_t size, size_t n, void *userdata)
{
    struct ck_response *r = userdata;
    ck_buf_add(&r->body, p, size * n);
    return size * n;
}

/* curl hands over every response's header block (a 100 Continue too): keep only the last one. */
static size_t on_header(char *p, size_t size, size_t n, void *userdata)
{
    struct ck_response *r = userdata;
    size_t len = size * n;

    if (len >= 5 && memcmp(p, "HTTP/", 5) == 0)
        strbuf_reset(&r->head.sb); /* a later response's head: keep the final one */
    ck_buf_add(&r->head, p, len);
    return len;
}

static struct curl_slist *xslist_append(struct curl_slist *l, const char *line)
{
    struct curl_slist *n = curl_slist_append(l, line);
    if (!n) {
        fputs("idem-check: out of memory\n", stderr);
        curl_slist_free_all(l);
        return NULL;
    }
    return n;
}

static int setup(struct exchange *x, const struct ck_request *req, long timeout_ms)
{
    x->easy = curl_easy_init();
    if (!x->easy)
        return -1;
    x->resp->body.limit = CK_BODY_LIMIT;
    x->resp->head.limit = CK_HEAD_LIMIT;
    x->errbuf[0] = '\0';
    /* Expect: 100-continue would add a round trip and a header block to every POST. */
    x->headers = xslist_append(NULL, "Expect:");
    if (x->headers && req->who)
        x->headers = xslist_append(x->headers, req->who);
    if (x->headers && req->body)
        x->headers = xslist_append(x->headers, "Content-Type: application/json");
    for (size_t i = 0; x->headers && i < req->n_headers; i++)
        x->headers = xslist_append(x->headers, req->headers[i]);
    if (!x->headers)
        return -1;

    curl_easy_setopt(x->easy, CURLOPT_URL, req->url);
    curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(x->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(x->easy, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(x->easy, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(x->easy, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x->resp);
    curl_easy_setopt(x->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(x->easy, CURLOPT_HEADERDATA, x->resp);
    if (req->body) {
        curl_easy_setopt(x->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        curl_easy_setopt(x->easy, CURLOPT_POSTFIELDS, req->body);
    }
    if (strcmp(req->method, "GET") == 0)
        curl_easy_setopt(x->easy, CURLOPT_HTTPGET, 1L);
    else
        curl_easy_setopt(x->easy, CURLOPT_CUSTOMREQUEST, req->method);
    return 0;
}

static void finish(struct exchange *x, CURLcode rc)
{
    struct ck_response *r = x->resp;

    if (rc == CURLE_OK) {
        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &r->status);
        return;
    }
    r->status = 0;
    r->transport_failed = 1;
    r->unreachable = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                     rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT;
    snprintf(r->error, sizeof(r->error), "%s%s%s", curl_easy_strerror(rc), x->errbuf[0] ? ": " : "",
             x->errbuf);
}

void ck_http_perform(const struct ck_request *reqs, struct ck_response *out, size_t n,
                     long timeout_ms)
{
    struct exchange *xs = xmalloc(n * sizeof(*xs));
    CURLM *multi = curl_multi_init();
    int running = 0;
    CURLMsg *msg;
    int left;

    memset(xs, 0, n * sizeof(*xs));
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        xs[i].resp = &out[i];
        if (!multi || setup(&xs[i], &reqs[i], timeout_ms) < 0) {
            out[i].transport_failed = 1;
            snprintf(out[i].error, sizeof(out[i].error), "cannot set up a curl handle");
            continue;
        }
        curl_easy_setopt(xs[i].easy, CURLOPT_PRIVATE, (void *)&xs[i]);
        curl_multi_add_handle(multi, xs[i].easy);
    }
    if (multi) {
        do {
            CURLMcode mc = curl_multi_perform(multi, &running);
            if (mc == CURLM_OK && running)
                mc = curl_multi_poll(multi, NULL, 0, 200, NULL);
            if (mc != CURLM_OK)
                break;
        } while (running);
        while ((msg = curl_multi_info_read(multi, &left)) != NULL) {
            char *priv = NULL;
            if (msg->msg != CURLMSG_DONE)
                continue;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
            if (priv)
                finish((struct exchange *)(void *)priv, msg->data.result);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (xs[i].easy) {
            if (multi)
                curl_multi_remove_handle(multi, xs[i].easy);
            curl_easy_cleanup(xs[i].easy);
        }
        curl_slist_free_all(xs[i].headers);
    }
    curl_multi_cleanup(multi);
    free(xs);
}

void ck_response_release(struct ck_response *r)
{
    ck_buf_release(&r->body);
    ck_buf_release(&r->head);
}

int ck_response_header(const struct ck_response *r, const char *name, char *buf, size_t cap)
{
    size_t nlen = strlen(name);
    const char *p = r->head.sb.buf;
    const char *end = p ? p + r->head.sb.len : NULL;

    if (cap)
        buf[0] = '\0';
    while (p && p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        if ((size_t)(line_end - p) > nlen && p[nlen] == ':' && ascii_ncaseeq(p, name, nlen)) {
            const char *v = p + nlen + 1;
            const char *ve = line_end;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && isspace((unsigned char)ve[-1]))
                ve--;
            if (cap) {
                size_t len = (size_t)(ve - v) < cap - 1 ? (size_t)(ve - v) : cap - 1;
                memcpy(buf, v, len);
                buf[len] = '\0';
            }
            return 1;
        }
        p = eol ? eol + 1 : end;
    }
    return 0;
}

int ck_response_replayed(const struct ck_response *r)
{
    char v[32];
    return ck_response_header(r, "Idempotent-Replayed", v, sizeof(v)) && ascii_caseeq(v, "true");
}

int ck_response_same(const struct ck_response *a, const struct ck_response *b)
{
    if (a->status != b->status || a->body.sb.len != b->body.sb.len)
        return 0;
    return a->body.sb.len == 0 || memcmp(a->body.sb.buf, b->body.sb.buf, a->body.sb.len) == 0;
}

void ck_response_describe(const struct ck_response *r, char *buf, size_t cap)
{
    static const char *const shown[] = {"Content-Type", "Location", "Idempotent-Replayed",
                                        "Retry-After"};
    char excerpt[128];
    char hdrs[512];
    size_t at = 0;
    size_t take;

    if (r->transport_failed) {
        snprintf(buf, cap, "no HTTP answer (%s)", r->error);
        return;
    }
    hdrs[0] = '\0';
    for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
        char v[160];
        if (ck_response_header(r, shown[i], v, sizeof(v)) && at < sizeof(hdrs)) {
            int w = snprintf(hdrs + at, sizeof(hdrs) - at, "%s%s: %s", at ? "; " : "", shown[i], v);
            if (w > 0)
                at += (size_t)w;
        }
    }
    take = r->body.sb.len < 120 ? r->body.sb.len : 120;
    for (size_t i = 0; i < take; i++) {
        unsigned char c = (unsigned char)r->body.sb.buf[i];
        excerpt[i] = (c < 0x20 || c >= 0x7f) ? '.' : (char)c;
    }
    excerpt[take] = '\0';
    snprintf(buf, cap, "HTTP %ld [%s] %s%s", r->status, hdrs, excerpt,
             r->body.sb.len > take ? "..." : "");
}

size_t ck_body_limit(void)
{
    return CK_BODY_LIMIT;
}

int ck_url_escape(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t at = 0;

    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '.' || c == '_' || c == '~') {
            if (at + 1 >= cap)
                return -1;
            out[at++] = (char)c;
        } else {
            if (at + 3 >= cap)
                return -1;
            out[at++] = '%';
            out[at++] = hex[c >> 4];
            out[at++] = hex[c & 15];
        }
    }
    if (at >= cap)
        return -1;
    out[at] = '\0';
    return 0;
}
