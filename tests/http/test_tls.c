/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tls.c - the HTTP layer's TLS engine (src/http/tls.c), a client and a server connection
 * passing their ciphertext to each other in memory: the handshake, bytes both ways in pieces, the
 * second connection resuming the first's session, ALPN; and the refusals a client must make
 * before it writes a byte (an untrusted CA, another name, an expired certificate), each with a
 * reason a log can show.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tls.h"
#include "tls_fixture.h"
#include "t.h"

const char program_name[] = "test_tls"; /* util.h: die()'s */

static char dir[] = "/tmp/idem-tls-XXXXXX";

static char *in_dir(const char *file)
{
    static char paths[8][600];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", dir, file);
    return p;
}

/* Moves ciphertext from one side to the other, in pieces of `piece` bytes. */
static void pass(struct tls_conn *from, struct tls_conn *to, size_t piece)
{
    struct strbuf sb = STRBUF_INIT;
    tls_conn_take(from, &sb);
    for (size_t off = 0; off < sb.len; off += piece)
        tls_conn_put(to, sb.buf + off, sb.len - off < piece ? sb.len - off : piece);
    strbuf_release(&sb);
}

/* Runs both handshakes until neither moves: the client's result. */
static enum tls_step handshake(struct tls_conn *c, struct tls_conn *s, enum tls_step *server)
{
    enum tls_step cs = TLS_WANT, ss = TLS_WANT;
    for (int i = 0; i < 20 && (cs == TLS_WANT || ss == TLS_WANT); i++) {
        cs = tls_conn_handshake(c);
        pass(c, s, 7);
        ss = tls_conn_handshake(s);
        pass(s, c, 1000);
    }
    if (server)
        *server = ss;
    return cs;
}

static struct tls_ctx *client_ctx(const char *ca, const char *name)
{
    struct tls_client_options o = {.server_name = name, .ca_file = in_dir(ca)};
    struct tls_ctx *ctx = NULL;
    char err[300];
    if (tls_ctx_client_new(&o, &ctx, err, sizeof err) != 0)
        fprintf(stderr, "%s\n", err);
    return ctx;
}

static struct tls_ctx *server_ctx(const char *cert, const char *key)
{
    struct tls_server_options o = {.cert_file = in_dir(cert), .key_file = in_dir(key)};
    struct tls_ctx *ctx = NULL;
    char err[300];
    if (tls_ctx_server_new(&o, &ctx, err, sizeof err) != 0)
        fprintf(stderr, "%s\n", err);
    return ctx;
}

/* One connection: handshake, a request, an answer; whether it resumed. */
static int exchange(struct tls_ctx *cctx, struct tls_ctx *sctx)
{
    struct tls_conn *c = tls_conn_new(cctx), *s = tls_conn_new(sctx);
    struct strbuf got = STRBUF_INIT;
    int resumed;

    CHECK_INT(handshake(c, s, NULL), TLS_OK);
    resumed = tls_conn_resumed(c);
    CHECK_INT(tls_conn_write(c, "GET / HTTP/1.1\r\n\r\n", 18), 0);
    pass(c, s, 3);
    while (got.len < 18 && tls_conn_read(s, &got, 5) == TLS_OK)
        ;
    CHECK_STR(got.buf, "GET / HTTP/1.1\r\n\r\n");
    strbuf_reset(&got);
    CHECK_INT(tls_conn_write(s, "HTTP/1.1 200 OK\r\n", 17), 0);
    tls_conn_shutdown(s);
    pass(s, c, 11);
    CHECK_INT(tls_conn_read(c, &got, 1 << 16), TLS_OK); /* and the session tickets */
    CHECK_STR(got.buf, "HTTP/1.1 200 OK\r\n");
    CHECK_INT(tls_conn_read(c, &got, 1 << 16), TLS_EOF); /* close_notify */
    CHECK_INT(tls_conn_bytes_read(c), 17);
    strbuf_release(&got);
    tls_conn_free(c);
    tls_conn_free(s);
    return resumed;
}

static void test_exchange_and_resumption(void)
{
    struct tls_ctx *cctx = client_ctx("ca.pem", "localhost");
    struct tls_ctx *sctx = server_ctx("leaf.pem", "leaf.key");

    CHECK(cctx && sctx);
    if (!cctx || !sctx)
        return;
    CHECK_INT(exchange(cctx, sctx), 0);
    CHECK_INT(exchange(cctx, sctx), 1);
    CHECK_INT(exchange(cctx, sctx), 1);
    tls_ctx_free(cctx);
    tls_ctx_free(sctx);
}

/* The client refuses the server's certificate: `why` is in its reason, and nothing was sent. */
static void refused(const char *ca, const char *name, const char *cert, const char *why)
{
    struct tls_ctx *cctx = client_ctx(ca, name), *sctx = server_ctx(cert, "leaf.key");
    struct tls_conn *c, *s;

    CHECK(cctx && sctx);
    if (!cctx || !sctx)
        return;
    c = tls_conn_new(cctx);
    s = tls_conn_new(sctx);
    CHECK_INT(handshake(c, s, NULL), TLS_FAIL);
    CHECK(tls_conn_failed_in_handshake(c));
    CHECK(strstr(tls_conn_error(c), why) != NULL);
    if (strstr(tls_conn_error(c), why) == NULL)
        fprintf(stderr, "  the reason: %s\n", tls_conn_error(c));
    CHECK_INT(tls_conn_write(c, "x", 1), -1);
    tls_conn_free(c);
    tls_conn_free(s);
    tls_ctx_free(cctx);
    tls_ctx_free(sctx);
}

static void test_refusals(void)
{
    refused("other-ca.pem", "localhost", "leaf.pem", "unable to get local issuer certificate");
    refused("ca.pem", "api.example.com", "leaf.pem", "hostname mismatch");
    refused("ca.pem", "127.0.0.2", "leaf.pem", "IP address mismatch");
    refused("ca.pem", "localhost", "expired.pem", "certificate has expired");
}

static void test_by_address(void)
{
    struct tls_ctx *cctx = client_ctx("ca.pem", "127.0.0.1");
    struct tls_ctx *sctx = server_ctx("leaf.pem", "leaf.key");
    if (cctx && sctx)
        exchange(cctx, sctx);
    tls_ctx_free(cctx);
    tls_ctx_free(sctx);
}

static void test_garbage_to_server(void)
{
    struct tls_ctx *sctx = server_ctx("leaf.pem", "leaf.key");
    struct tls_conn *s = tls_conn_new(sctx);
    struct strbuf out = STRBUF_INIT;

    tls_conn_put(s, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    CHECK_INT(tls_conn_handshake(s), TLS_FAIL);
    CHECK(tls_conn_error(s)[0] != '\0');
    CHECK_INT(tls_conn_handshake(s), TLS_FAIL); /* and stays so */
    tls_conn_take(s, &out);
    strbuf_release(&out);
    tls_conn_free(s);
    tls_ctx_free(sctx);
}

static void test_bad_files(void)
{
    struct tls_server_options so = {.cert_file = in_dir("leaf.pem"), .key_file = "/nonexistent"};
    struct tls_client_options co = {.server_name = "x", .ca_file = "/nonexistent"};
    struct tls_ctx *ctx = NULL;
    char err[300];

    CHECK_INT(tls_ctx_server_new(&so, &ctx, err, sizeof err), -1);
    CHECK(strstr(err, "/nonexistent") != NULL);
    CHECK_INT(tls_ctx_client_new(&co, &ctx, err, sizeof err), -1);
    CHECK(strstr(err, "/nonexistent") != NULL);
    CHECK(ctx == NULL);
}

int main(void)
{
    if (mkdtemp(dir) == NULL || fixture_make(dir) != 0) {
        fprintf(stderr, "cannot make the certificates\n");
        return 1;
    }
    test_exchange_and_resumption();
    test_refusals();
    test_by_address();
    test_garbage_to_server();
    test_bad_files();
    {
        const char *files[] = {"ca.pem",   "other-ca.pem", "leaf.pem",
                               "leaf.key", "expired.pem",  "expired.key"};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
            unlink(in_dir(files[i]));
        rmdir(dir);
    }
    return t_done();
}
