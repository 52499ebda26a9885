/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_tls_server.c - libFuzzer harness for the HTTP layer's TLS engine (src/http/tls.c) on the
 * server side, where a stranger's bytes arrive first.  OpenSSL parses the records; what is ours is
 * the framing glue around it: ciphertext put in in pieces of any size, the handshake and reads
 * driven to TLS_WANT, the output taken, the end of the stream said.  The first byte picks a mode
 * and the piece size:
 *
 *   0  the bytes are a client's ciphertext, straight to a server connection;
 *   1  a real client (the engine's other side) completes a handshake in memory, then the bytes
 *      are its plaintext, written in pieces: the server must read exactly them;
 *   2  after such a handshake the client sends a fixed request whose ciphertext the bytes alter
 *      (XOR from the start): the server must fail, or read a prefix of the request, never other
 *      bytes.
 *
 * Besides memory errors and leaks it checks: a failure stays a failure and has a reason; the
 * server never reads more plaintext than was put in; a step result is one of the four.
 */
#include "tls.h"
#include "fuzz.h"
#include "../tests/http/tls_fixture.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char program_name[] = "fuzz_tls_server";

static struct tls_ctx *server_ctx, *client_ctx;

static const char request[] = "POST /v1/payments HTTP/1.1\r\nHost: localhost\r\n"
                              "Idempotency-Key: k1\r\nContent-Length: 2\r\n\r\n{}";

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char dir[] = "/tmp/idem-fuzz-tls-XXXXXX", cert[600], key[600], ca[600], err[300];
    struct tls_server_options so = {.cert_file = cert, .key_file = key};
    struct tls_client_options co = {.server_name = "localhost", .ca_file = ca};

    (void)argc;
    (void)argv;
    CHECK(mkdtemp(dir) != NULL && fixture_make(dir) == 0, "certificates made");
    snprintf(cert, sizeof cert, "%s/leaf.pem", dir);
    snprintf(key, sizeof key, "%s/leaf.key", dir);
    snprintf(ca, sizeof ca, "%s/ca.pem", dir);
    CHECK(tls_ctx_server_new(&so, &server_ctx, err, sizeof err) == 0, err);
    CHECK(tls_ctx_client_new(&co, &client_ctx, err, sizeof err) == 0, err);
    return 0;
}

/* Puts `data` into `t` in pieces of `piece` bytes, each followed by a handshake or read step. */
static enum tls_step feed(struct tls_conn *t, const uint8_t *data, size_t size, size_t piece,
                          struct strbuf *plain, size_t *put)
{
    struct strbuf out = STRBUF_INIT;
    enum tls_step s = TLS_WANT;

    for (size_t off = 0; off < size && s != TLS_FAIL && s != TLS_EOF; off += piece) {
        size_t n = size - off < piece ? size - off : piece;
        tls_conn_put(t, data + off, n);
        *put += n;
        do {
            s = tls_conn_read(t, plain, 4096);
            CHECK(s == TLS_OK || s == TLS_WANT || s == TLS_EOF || s == TLS_FAIL, "a step");
        } while (s == TLS_OK);
        tls_conn_take(t, &out);
        strbuf_reset(&out);
    }
    strbuf_release(&out);
    return s;
}

/* Moves the ciphertext `from` made into `to`. */
static void pass(struct tls_conn *from, struct tls_conn *to)
{
    struct strbuf sb = STRBUF_INIT;
    if (tls_conn_take(from, &sb) > 0)
        tls_conn_put(to, sb.buf, sb.len);
    strbuf_release(&sb);
}

static int handshake(struct tls_conn *c, struct tls_conn *s)
{
    enum tls_step cs = TLS_WANT, ss = TLS_WANT;
    for (int i = 0; i < 10 && (cs == TLS_WANT || ss == TLS_WANT); i++) {
        cs = tls_conn_handshake(c);
        pass(c, s);
        ss = tls_conn_handshake(s);
        pass(s, c);
    }
    return cs == TLS_OK && ss == TLS_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tls_conn *s, *c = NULL;
    struct strbuf plain = STRBUF_INIT, cipher = STRBUF_INIT;
    enum tls_step step;
    size_t piece, put = 0;
    unsigned mode;

    if (size < 1)
        return 0;
    mode = data[0] % 3;
    piece = 1 + (size_t)(data[0] / 3) * 61;
    data++;
    size--;
    s = tls_conn_new(server_ctx);
    if (mode == 0) {
        step = feed(s, data, size, piece, &plain, &put);
        CHECK(plain.len <= put, "no more plaintext than bytes put in");
        if (step != TLS_FAIL) {
            tls_conn_put(s, NULL, 0);
            step = tls_conn_read(s, &plain, 4096);
            CHECK(step == TLS_FAIL || step == TLS_EOF, "the end of the stream ends the reads");
        }
    } else {
        c = tls_conn_new(client_ctx);
        CHECK(handshake(c, s), "the engine's own client and server agree");
        if (mode == 1) {
            for (size_t off = 0; off < size; off += piece) {
                size_t n = size - off < piece ? size - off : piece;
                CHECK(tls_conn_write(c, data + off, n) == 0, "writing after the handshake");
            }
            tls_conn_take(c, &cipher);
            step = feed(s, (const uint8_t *)cipher.buf, cipher.len, piece, &plain, &put);
            CHECK(step == TLS_WANT, "a clean stream keeps the connection open");
            CHECK(plain.len == size && (size == 0 || memcmp(plain.buf, data, size) == 0),
                  "the server reads exactly what the client wrote");
        } else {
            CHECK(tls_conn_write(c, request, sizeof request - 1) == 0, "writing the request");
            tls_conn_take(c, &cipher);
            for (size_t i = 0; i < size && i < cipher.len; i++)
                cipher.buf[i] ^= (char)data[i];
            step = feed(s, (const uint8_t *)cipher.buf, cipher.len, piece, &plain, &put);
            CHECK(plain.len <= sizeof request - 1 &&
                      (plain.len == 0 || memcmp(plain.buf, request, plain.len) == 0),
                  "altered records never decrypt to other bytes");
        }
    }
    if (step == TLS_FAIL) {
        CHECK(tls_conn_error(s)[0] != '\0', "a failure has a reason");
        CHECK(tls_conn_read(s, &plain, 4096) == TLS_FAIL, "a failure stays a failure");
    }
    strbuf_release(&plain);
    strbuf_release(&cipher);
    tls_conn_free(c);
    tls_conn_free(s);
    return 0;
}
