/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tls.c - the HTTP layer's TLS engine (tls.h), on OpenSSL's SSL objects with memory BIOs.
 *
 * Design.  Each connection is an SSL with two memory BIOs, none on a socket: `in` holds the
 * ciphertext the caller read from its socket and put in (tls_conn_put), SSL_read and
 * SSL_do_handshake consume it; `out` collects what SSL_write and the handshake produce, which the
 * caller takes (tls_conn_take) and writes as it writes anything (uv_write from a loop, write()
 * from a worker).  The engine never blocks and never calls back: every call returns at once with
 * TLS_WANT when it needs more ciphertext, so a libuv loop drives thousands of connections with
 * no thread per connection, a worker drives one with poll(), and a fuzzer drives it from a byte
 * array.  An empty `in` reads as "retry" (BIO_set_mem_eof_return -1), never as the end: the end
 * of the socket is said explicitly (tls_conn_put with len 0).
 *
 * Client side: SSL_VERIFY_PEER against the system store (SSL_CTX_set_default_verify_paths) or a
 * ca_file; the expected name set on every connection (SSL_set1_host, or the IP address), sent as
 * SNI; TLS 1.2 minimum; ALPN http/1.1; a client certificate when given.  A client never writes
 * plaintext before its handshake is done, and the handshake ends only once the server's
 * certificate and name are verified, so a verification failure means nothing was sent.  The one
 * exception is TLS 1.3's client certificate, which the server judges after the client's last
 * handshake flight: its refusal comes as an alert to the client's first read, and
 * tls_conn_failed_in_handshake() says so (the server never read the request).
 *
 * Sessions: a client context keeps the newest session its server gave (the new-session callback,
 * TLS 1.2 session ids and TLS 1.3 tickets alike) and offers it on every new connection, so a
 * keep-alive pool that opens connections again resumes instead of paying a full handshake.  One
 * client context talks to one server name, so one session slot is enough; a lock guards it,
 * since loops and workers open connections from several threads.
 *
 * Server side: the certificate chain and key files (ECDSA or RSA), TLS 1.2 minimum with the
 * ECDHE + AEAD suites only (TLS 1.3's are all AEAD), no renegotiation (a client could make the
 * server pay handshake after handshake on one connection), ALPN http/1.1 when the client offers
 * ALPN, and OpenSSL's stateless session tickets for resumption.
 *
 * OpenSSL's error queue is per thread: it is cleared before every SSL call and read into the
 * connection's message right after a failure, so no error leaks into another connection's.
 */
#include "tls.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "util.h"
#include "banned.h"

/* Mozilla's "intermediate" TLS 1.2 suites: forward secret, AEAD. */
#define SERVER_CIPHERS                                                                             \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                                   \
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"                                   \
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

static const unsigned char alpn_http11[] = "\x08http/1.1";

struct tls_ctx {
    SSL_CTX *ssl_ctx; /* replaced by a server's reload: read under mu */
    int server;
    char *server_name; /* a client's: verified and sent as SNI */
    int name_is_ip;
    char *cert_file, *key_file; /* a server's, for reloads */
    pthread_mutex_t mu;         /* guards ssl_ctx and session */
    SSL_SESSION *session;
};

struct tls_conn {
    SSL *ssl;
    BIO *in;  /* ciphertext put in, for OpenSSL to read */
    BIO *out; /* ciphertext OpenSSL wrote, for the caller to take */
    int handshake_done;
    int failed;
    int failed_in_handshake;
    int eof_put;
    unsigned long long bytes_read;
    char err[256];
};

static int ctx_index = -1;
static pthread_once_t ctx_index_once = PTHREAD_ONCE_INIT;

static void make_ctx_index(void)
{
    ctx_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

/* OpenSSL's last error as a sentence after `what`, the queue emptied. */
static void say_ssl_error(char *err, size_t errlen, const char *what)
{
    unsigned long e = ERR_peek_last_error();
    char buf[200];

    if (e == 0) {
        snprintf(err, errlen, "%s", what);
    } else {
        const char *reason = ERR_reason_error_string(e);
        if (reason == NULL) {
            ERR_error_string_n(e, buf, sizeof buf);
            reason = buf;
        }
        /* A reason longer than `err` is cut (the return used: gcc then trusts the cut). */
        if (snprintf(err, errlen, "%s: %s", what, reason) < 0)
            err[0] = '\0';
    }
    ERR_clear_error();
}

/* Keeps the newest session a server gave this client context (its reference taken: 1). */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    struct tls_ctx *ctx = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), ctx_index);
    SSL_SESSION *old;

    if (ctx == NULL)
        return 0;
    pthread_mutex_lock(&ctx->mu);
    old = ctx->session;
    ctx->session = sess;
    pthread_mutex_unlock(&ctx->mu);
    SSL_SESSION_free(old);
    return 1;
}

static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    unsigned char *chosen = NULL;

    (void)ssl;
    (void)arg;
    if (SSL_select_next_proto(&chosen, outlen, alpn_http11, sizeof alpn_http11 - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL; /* ALPN offered, but not HTTP/1.1 (h2 only) */
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
}

static struct tls_ctx *ctx_new(int server, char *err, size_t errlen)
{
    struct tls_ctx *ctx = xcalloc(1, sizeof *ctx);

    pthread_once(&ctx_index_once, make_ctx_index);
    ERR_clear_error();
    ctx->server = server;
    pthread_mutex_init(&ctx->mu, NULL);
    ctx->ssl_ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (ctx->ssl_ctx == NULL || ctx_index < 0 ||
        SSL_CTX_set_min_proto_version(ctx->ssl_ctx, TLS1_2_VERSION) != 1) {
        say_ssl_error(err, errlen, "TLS: cannot make a context");
        tls_ctx_free(ctx);
        return NULL;
    }
    SSL_CTX_set_ex_data(ctx->ssl_ctx, ctx_index, ctx);
    SSL_CTX_set_options(ctx->ssl_ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    /* The memory BIO takes whatever SSL_write gives: never a partial write to resume. */
    SSL_CTX_set_mode(ctx->ssl_ctx, SSL_MODE_RELEASE_BUFFERS);
    return ctx;
}

/* Loads a certificate chain and its key into `ssl_ctx`: 0, or -1 with `err`. */
static int load_pair(SSL_CTX *ssl_ctx, const char *cert_file, const char *key_file, char *err,
                     size_t errlen)
{
    char what[400];

    if (SSL_CTX_use_certificate_chain_file(ssl_ctx, cert_file) != 1) {
        snprintf(what, sizeof what, "TLS: cannot load the certificate %s", cert_file);
        say_ssl_error(err, errlen, what);
        return -1;
    }
    if (SSL_CTX_use_PrivateKey_file(ssl_ctx, key_file, SSL_FILETYPE_PEM) != 1) {
        snprintf(what, sizeof what, "TLS: cannot load the key %s", key_file);
        say_ssl_error(err, errlen, what);
        return -1;
    }
    if (SSL_CTX_check_private_key(ssl_ctx) != 1) {
        snprintf(what, sizeof what, "TLS: the key %s is not the certificate %s's", key_file,
                 cert_file);
        say_ssl_error(err, errlen, what);
        return -1;
    }
    return 0;
}

int tls_ctx_client_new(const struct tls_client_options *opts, struct tls_ctx **out, char *err,
                       size_t errlen)
{
    struct tls_ctx *ctx = NULL;
    unsigned char ip[16];
    char what[400];
    int rc = -1;

    *out = NULL;
    if (opts->server_name == NULL || opts->server_name[0] == '\0') {
        snprintf(err, errlen, "TLS: no server name to verify");
        goto out;
    }
    if ((opts->cert_file == NULL) != (opts->key_file == NULL)) {
        snprintf(err, errlen, "TLS: a client certificate needs its key, and a key its certificate");
        goto out;
    }
    ctx = ctx_new(0, err, errlen);
    if (ctx == NULL)
        goto out;
    ctx->server_name = xstrdup(opts->server_name);
    ctx->name_is_ip = inet_pton(AF_INET, opts->server_name, ip) == 1 ||
                      inet_pton(AF_INET6, opts->server_name, ip) == 1;
    SSL_CTX_set_verify(ctx->ssl_ctx, SSL_VERIFY_PEER, NULL);
    if (opts->ca_file != NULL) {
        if (SSL_CTX_load_verify_locations(ctx->ssl_ctx, opts->ca_file, NULL) != 1) {
            snprintf(what, sizeof what, "TLS: cannot load the CA certificates %s", opts->ca_file);
            say_ssl_error(err, errlen, what);
            goto out;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx->ssl_ctx) != 1) {
        say_ssl_error(err, errlen, "TLS: cannot load the system's CA certificates");
        goto out;
    }
    if (opts->cert_file != NULL &&
        load_pair(ctx->ssl_ctx, opts->cert_file, opts->key_file, err, errlen) != 0)
        goto out;
    if (SSL_CTX_set_alpn_protos(ctx->ssl_ctx, alpn_http11, sizeof alpn_http11 - 1) != 0) {
        say_ssl_error(err, errlen, "TLS: cannot set ALPN");
        goto out;
    }
    SSL_CTX_set_session_cache_mode(ctx->ssl_ctx,
                                   SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx->ssl_ctx, on_new_session);
    *out = ctx;
    ctx = NULL;
    rc = 0;
out:
    tls_ctx_free(ctx);
    return rc;
}

int tls_ctx_server_new(const struct tls_server_options *opts, struct tls_ctx **out, char *err,
                       size_t errlen)
{
    struct tls_ctx *ctx = NULL;
    int rc = -1;

    *out = NULL;
    ctx = ctx_new(1, err, errlen);
    if (ctx == NULL)
        goto out;
    ctx->cert_file = xstrdup(opts->cert_file);
    ctx->key_file = xstrdup(opts->key_file);
    if (SSL_CTX_set_cipher_list(ctx->ssl_ctx, SERVER_CIPHERS) != 1) {
        say_ssl_error(err, errlen, "TLS: cannot set the ciphers");
        goto out;
    }
    if (load_pair(ctx->ssl_ctx, opts->cert_file, opts->key_file, err, errlen) != 0)
        goto out;
    SSL_CTX_set_alpn_select_cb(ctx->ssl_ctx, select_alpn, NULL);
    *out = ctx;
    ctx = NULL;
    rc = 0;
out:
    tls_ctx_free(ctx);
    return rc;
}

int tls_ctx_server_reload(struct tls_ctx *ctx, char *err, size_t errlen)
{
    struct tls_server_options opts = {.cert_file = ctx->cert_file, .key_file = ctx->key_file};
    struct tls_ctx *fresh = NULL;
    SSL_CTX *old;

    if (!ctx->server || tls_ctx_server_new(&opts, &fresh, err, errlen) != 0)
        return -1;
    /* The new SSL_CTX moves over; SSLs made from the old one hold it until they are freed. */
    SSL_CTX_set_ex_data(fresh->ssl_ctx, ctx_index, ctx);
    pthread_mutex_lock(&ctx->mu);
    old = ctx->ssl_ctx;
    ctx->ssl_ctx = fresh->ssl_ctx;
    pthread_mutex_unlock(&ctx->mu);
    fresh->ssl_ctx = old;
    tls_ctx_free(fresh);
    return 0;
}

void tls_ctx_free(struct tls_ctx *ctx)
{
    if (ctx == NULL)
        return;
    SSL_CTX_free(ctx->ssl_ctx); /* connections hold their own reference */
    SSL_SESSION_free(ctx->session);
    pthread_mutex_destroy(&ctx->mu);
    free(ctx->server_name);
    free(ctx->cert_file);
    free(ctx->key_file);
    free(ctx);
}

struct tls_conn *tls_conn_new(struct tls_ctx *ctx)
{
    struct tls_conn *t = xcalloc(1, sizeof *t);

    ERR_clear_error();
    pthread_mutex_lock(&ctx->mu);
    t->ssl = SSL_new(ctx->ssl_ctx);
    pthread_mutex_unlock(&ctx->mu);
    t->in = BIO_new(BIO_s_mem());
    t->out = BIO_new(BIO_s_mem());
    if (t->ssl == NULL || t->in == NULL || t->out == NULL)
        die("TLS: out of memory");
    BIO_set_mem_eof_return(t->in, -1);  /* empty is "not yet", not the end */
    SSL_set_bio(t->ssl, t->in, t->out); /* the SSL owns both now */
    if (ctx->server) {
        SSL_set_accept_state(t->ssl);
        return t;
    }
    SSL_set_connect_state(t->ssl);
    if (ctx->name_is_ip) {
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), ctx->server_name) != 1)
            die("TLS: cannot set the address to verify");
    } else if (SSL_set1_host(t->ssl, ctx->server_name) != 1 ||
               SSL_set_tlsext_host_name(t->ssl, ctx->server_name) != 1) {
        die("TLS: cannot set the name to verify");
    }
    pthread_mutex_lock(&ctx->mu);
    if (ctx->session != NULL && SSL_SESSION_is_resumable(ctx->session))
        SSL_set_session(t->ssl, ctx->session); /* takes its own reference */
    pthread_mutex_unlock(&ctx->mu);
    return t;
}

void tls_conn_free(struct tls_conn *t)
{
    if (t == NULL)
        return;
    /*
     * A connection freed without a close_notify sent has its session forgotten by OpenSSL (marked
     * not resumable): right after a failure, wrong for a keep-alive connection simply closed.
     */
    if (t->handshake_done && !t->failed)
        SSL_set_shutdown(t->ssl, SSL_SENT_SHUTDOWN | SSL_get_shutdown(t->ssl));
    SSL_free(t->ssl); /* and its BIOs */
    free(t);
}

void tls_conn_put(struct tls_conn *t, const void *data, size_t len)
{
    if (len == 0) {
        t->eof_put = 1;
        BIO_set_mem_eof_return(t->in, 0); /* once what is in is read, the end */
        return;
    }
    if (BIO_write(t->in, data, (int)len) != (int)len)
        die("TLS: out of memory");
}

/* A TLS 1.3 server's refusal of the handshake's last flight: an alert about certificates. */
static int certificate_alert(unsigned long e)
{
    switch (ERR_GET_REASON(e)) {
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        return 1;
    default:
        return 0;
    }
}

/* Turns the result `rc` of an SSL call into a step, with the reason of a failure. */
static enum tls_step step_of(struct tls_conn *t, int rc, const char *what)
{
    int e = SSL_get_error(t->ssl, rc);
    long verify;
    char buf[200];

    switch (e) {
    case SSL_ERROR_WANT_READ:
        if (!t->eof_put)
            return TLS_WANT;
        if (t->handshake_done)
            return TLS_EOF; /* closed without close_notify: the reader decides */
        snprintf(t->err, sizeof t->err, "TLS: %s: the peer closed the connection", what);
        break;
    case SSL_ERROR_WANT_WRITE:
        return TLS_WANT; /* a memory BIO takes everything: not reached */
    case SSL_ERROR_ZERO_RETURN:
        return TLS_EOF;
    case SSL_ERROR_SYSCALL:
        if (t->handshake_done && ERR_peek_error() == 0)
            return TLS_EOF;
        /* fall through */
    default:
        verify = SSL_get_verify_result(t->ssl);
        if (!t->handshake_done && verify != X509_V_OK) {
            snprintf(t->err, sizeof t->err, "TLS: certificate verify failed: %s",
                     X509_verify_cert_error_string(verify));
            ERR_clear_error();
        } else {
            snprintf(buf, sizeof buf, "TLS: %s", what);
            say_ssl_error(t->err, sizeof t->err, buf);
        }
        break;
    }
    t->failed = 1;
    return TLS_FAIL;
}

enum tls_step tls_conn_handshake(struct tls_conn *t)
{
    int rc;

    if (t->failed)
        return TLS_FAIL;
    if (t->handshake_done)
        return TLS_OK;
    ERR_clear_error();
    rc = SSL_do_handshake(t->ssl);
    if (rc == 1) {
        t->handshake_done = 1;
        return TLS_OK;
    }
    {
        enum tls_step s = step_of(t, rc, "handshake");
        if (s == TLS_FAIL || s == TLS_EOF) {
            t->failed_in_handshake = 1;
            if (s == TLS_EOF) {
                snprintf(t->err, sizeof t->err, "TLS: handshake: the peer closed the connection");
                t->failed = 1;
                s = TLS_FAIL;
            }
        }
        return s;
    }
}

enum tls_step tls_conn_read(struct tls_conn *t, struct strbuf *into, size_t max)
{
    enum tls_step s = tls_conn_handshake(t);
    size_t got = 0;
    int rc;

    if (s != TLS_OK)
        return s;
    if (max > (size_t)1 << 30)
        max = (size_t)1 << 30;
    while (got < max) {
        size_t room = max - got < 16384 ? max - got : 16384;
        unsigned long e;
        strbuf_grow(into, room);
        ERR_clear_error();
        rc = SSL_read(t->ssl, into->buf + into->len, (int)room);
        if (rc > 0) {
            into->len += (size_t)rc;
            into->buf[into->len] = '\0';
            got += (size_t)rc;
            t->bytes_read += (unsigned long long)rc;
            continue;
        }
        if (got > 0)
            return TLS_OK; /* what stopped it is seen by the next call */
        e = ERR_peek_error();
        s = step_of(t, rc, "reading");
        if (s == TLS_FAIL && t->bytes_read == 0 && !SSL_session_reused(t->ssl) &&
            certificate_alert(e))
            t->failed_in_handshake = 1;
        return s;
    }
    return TLS_OK;
}

int tls_conn_write(struct tls_conn *t, const void *data, size_t len)
{
    const char *p = data;

    if (t->failed || !t->handshake_done) {
        if (!t->failed)
            snprintf(t->err, sizeof t->err, "TLS: writing before the handshake is done");
        t->failed = 1;
        return -1;
    }
    while (len > 0) {
        int n = len > (size_t)1 << 30 ? 1 << 30 : (int)len;
        int rc;
        ERR_clear_error();
        rc = SSL_write(t->ssl, p, n);
        if (rc <= 0) {
            (void)step_of(t, rc, "writing");
            t->failed = 1;
            return -1;
        }
        p += rc;
        len -= (size_t)rc;
    }
    return 0;
}

size_t tls_conn_take(struct tls_conn *t, struct strbuf *out)
{
    char *data = NULL;
    long n = BIO_get_mem_data(t->out, &data);

    if (n <= 0)
        return 0;
    strbuf_add(out, data, (size_t)n);
    (void)BIO_reset(t->out);
    return (size_t)n;
}

void tls_conn_shutdown(struct tls_conn *t)
{
    if (t->handshake_done && !t->failed) {
        ERR_clear_error();
        (void)SSL_shutdown(t->ssl);
        ERR_clear_error();
    }
}

const char *tls_conn_error(const struct tls_conn *t)
{
    return t->err;
}

int tls_conn_failed_in_handshake(const struct tls_conn *t)
{
    return t->failed && t->failed_in_handshake;
}

int tls_conn_resumed(const struct tls_conn *t)
{
    return t->handshake_done && SSL_session_reused(t->ssl);
}

unsigned long long tls_conn_bytes_read(const struct tls_conn *t)
{
    return t->bytes_read;
}
