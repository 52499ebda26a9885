/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tls.h - TLS for the HTTP layer's connections, with OpenSSL, as an engine that owns no socket:
 * ciphertext read from a socket is put in, plaintext comes out; plaintext written goes in,
 * ciphertext comes out for the caller to write (uv_write on a loop, write() on a worker).  So one
 * engine serves a libuv loop, a blocking worker and a fuzzer alike, and no thread waits on it.
 *
 * A struct tls_ctx is the configuration shared by many connections (OpenSSL's SSL_CTX): the
 * client's (whom to trust, the name to verify, a client certificate, the session kept for
 * resumption) or the server's (certificate chain and key, ALPN http/1.1).  A struct tls_conn is
 * one connection's state, used by one thread at a time.
 */
#ifndef IDEM_HTTP_TLS_H
#define IDEM_HTTP_TLS_H

#include <stddef.h>

#include "strbuf.h"

struct tls_ctx;
struct tls_conn;

struct tls_client_options {
    /*
     * The name the server's certificate must carry, also sent as SNI (a DNS name; an IP address
     * is checked against the certificate's IP addresses and sends no SNI).  Required.
     */
    const char *server_name;
    const char *ca_file;   /* PEM certificates to trust; NULL: the system's store */
    const char *cert_file; /* a client certificate chain (PEM), with key_file: mTLS */
    const char *key_file;
};

/*
 * A client context: TLS 1.2 at least, the peer's certificate and name always verified, and the
 * last session the server gave kept, so the next connection resumes it instead of a full
 * handshake.  Returns 0 with *out (new: tls_ctx_free), or -1 with a sentence in `err`.
 */
int tls_ctx_client_new(const struct tls_client_options *opts, struct tls_ctx **out, char *err,
                       size_t errlen);

struct tls_server_options {
    const char *cert_file; /* the certificate chain, leaf first (PEM; ECDSA or RSA) */
    const char *key_file;  /* its private key (PEM) */
};

/*
 * A server context: TLS 1.2 at least, forward-secret AEAD ciphers, no renegotiation, ALPN
 * http/1.1.  Returns 0 with *out (new: tls_ctx_free), or -1 with a sentence in `err`.
 */
int tls_ctx_server_new(const struct tls_server_options *opts, struct tls_ctx **out, char *err,
                       size_t errlen);

/*
 * Reads a server context's certificate and key files again (a renewed certificate), for the
 * connections made from now on; connections open go on with what they have.  Any thread, while
 * connections are made.  0, or -1 with a sentence in `err` (the context keeps the old pair).
 */
int tls_ctx_server_reload(struct tls_ctx *ctx, char *err, size_t errlen);

/* Frees the context; connections made from it keep what they need.  NULL is a no-op. */
void tls_ctx_free(struct tls_ctx *ctx);

/* A connection's state, client or server as its context is (new: tls_conn_free). */
struct tls_conn *tls_conn_new(struct tls_ctx *ctx);
void tls_conn_free(struct tls_conn *t);

enum tls_step {
    TLS_OK,   /* done (the handshake), or plaintext came (a read) */
    TLS_WANT, /* more ciphertext must come first: read the socket, put it in, call again */
    TLS_EOF,  /* the peer ended the stream (close_notify, or the socket's end put in) */
    TLS_FAIL, /* the connection is unusable: tls_conn_error() says why */
};

/* Ciphertext read from the socket (copied); len 0 is its end. */
void tls_conn_put(struct tls_conn *t, const void *data, size_t len);

/*
 * Moves the handshake on: TLS_OK once it is done (the peer's certificate and name verified, for
 * a client), TLS_WANT, TLS_EOF or TLS_FAIL.  Afterwards, tls_conn_take() has the ciphertext to
 * send, whatever the result (a failure's alert too).
 */
enum tls_step tls_conn_handshake(struct tls_conn *t);

/*
 * Appends the plaintext the ciphertext put in decrypts to (at most `max` bytes) to `into`: TLS_OK
 * when some came, TLS_WANT when none is whole yet, TLS_EOF, TLS_FAIL.  Runs the handshake first
 * if it is not done.  Then tls_conn_take() may have ciphertext to send too.
 */
enum tls_step tls_conn_read(struct tls_conn *t, struct strbuf *into, size_t max);

/* Encrypts all of `data` after a done handshake: 0, or -1 (TLS_FAIL's reason in tls_conn_error). */
int tls_conn_write(struct tls_conn *t, const void *data, size_t len);

/* Appends the ciphertext waiting to be sent to `out` and forgets it; returns its length. */
size_t tls_conn_take(struct tls_conn *t, struct strbuf *out);

/* Queues a close_notify (its ciphertext for tls_conn_take), once the handshake is done. */
void tls_conn_shutdown(struct tls_conn *t);

/* Why the last TLS_FAIL (borrowed, until the next call on `t`); "" before one. */
const char *tls_conn_error(const struct tls_conn *t);

/*
 * Whether the failure happened before the peer could act on a byte of plaintext: in the
 * handshake, or a certificate alert the server sent in answer to it (in TLS 1.3 a client learns
 * that its certificate was refused only after its first write, which the server never read).
 */
int tls_conn_failed_in_handshake(const struct tls_conn *t);

/* Whether the handshake resumed an earlier session (no certificate exchanged). */
int tls_conn_resumed(const struct tls_conn *t);

/* Plaintext bytes read so far. */
unsigned long long tls_conn_bytes_read(const struct tls_conn *t);

#endif /* IDEM_HTTP_TLS_H */
