/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_orderd_request.c - libFuzzer harness for a whole HTTP request through orderd: the request
 * parser of the HTTP layer, then orderd's router and handlers (src/orderd/), on a real SQLite
 * store in a temporary directory, with a real user.  The input is the request's bytes; when it
 * names no Authorization header, the user's bearer token is added after its request line, so
 * inputs reach the handlers (orders, cancels, profile, webhooks) and not only the 401.
 *
 * Besides memory errors and leaks it checks what every client relies on: every request that
 * parses gets one answer with a status of 100..599; an error (4xx or 5xx) is problem+json whose
 * body names its code; a 5xx is only 503 (the store, never a crash of a handler's logic as 500).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "auth.h"
#include "config.h"
#include "http_server.h"
#include "request_parser.h"
#include "router.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);

/* What die() and the log lines call this program (src/util/util.h). */
const char program_name[] = "fuzz_orderd_request";

static struct orderd_config cfg;
static struct app app;
static char dir[64], uri[128];
static char *token;

static void remove_dir(void)
{
    char cmd[160];
    app_close(&app);
    free(token);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[512];
    int applied = 0;

    (void)argc;
    (void)argv;
    snprintf(dir, sizeof dir, "/tmp/fuzz-orderd-XXXXXX");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(uri, sizeof uri, "sqlite:%s/orderd.db", dir);
    memset(&cfg, 0, sizeof cfg);
    cfg.db = uri;
    cfg.db_pool = 4;
    cfg.sync = IDEM_SYNC_NORMAL; /* speed: a fuzzer's store need not survive a power cut */
    cfg.log_format = LOG_JSON;
    cfg.lease_ms = ORDERD_DEFAULT_LEASE_MS;
    cfg.wait_ms = 50;
    cfg.replay_cache_mb = 1;
    cfg.webhook_secret = "whsec_fuzz";
    cfg.webhook_tolerance_s = ORDERD_DEFAULT_WEBHOOK_TOLERANCE_S;
    app_init(&app, &cfg);
    if (app_open_store(&app, &applied, err, sizeof err) != 0 ||
        auth_token_create(app.store, "fuzzer", &token, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_orderd_request: set-up: %s\n", err);
        abort();
    }
    atexit(remove_dir);
    return 0;
}

/* Whether `needle` (n bytes) occurs in `hay` (len bytes). */
static int contains(const void *hay, size_t len, const char *needle, size_t n)
{
    const char *h = hay;
    for (size_t i = 0; n <= len && i <= len - n; i++)
        if (memcmp(h + i, needle, n) == 0)
            return 1;
    return 0;
}

/* The input, with the user's token added after the request line when it carries none. */
static char *with_token(const uint8_t *data, size_t size, size_t *len)
{
    const char *eol = memchr(data, '\n', size);
    size_t head = eol ? (size_t)(eol - (const char *)data) + 1 : size;
    char auth[128];
    size_t alen;
    char *out;

    if (contains(data, size, "Authorization", 13) || !eol) {
        out = malloc(size ? size : 1);
        CHECK(out != NULL, "malloc");
        memcpy(out, data, size);
        *len = size;
        return out;
    }
    alen = (size_t)snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
    out = malloc(size + alen);
    CHECK(out != NULL, "malloc");
    memcpy(out, data, head);
    memcpy(out + head, auth, alen);
    memcpy(out + head + alen, data + head, size - head);
    *len = size + alen;
    return out;
}

static void check_answer(const struct response *resp)
{
    const char *ct = response_header(resp, "Content-Type");

    CHECK(resp->deferred == 0, "no deferred answer without a server");
    CHECK(resp->status >= 100 && resp->status <= 599, "a status of 100..599");
    CHECK(resp->status < 500 || resp->status == 503, "no 500 from a handler");
    if (resp->status >= 400) {
        CHECK(ct && strcmp(ct, "application/problem+json") == 0, "an error is problem+json");
        CHECK(resp->body && resp->body_len && contains(resp->body, resp->body_len, "\"code\"", 6),
              "a problem names its code");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct request_parser p;
    struct request_parser_limits lim;
    struct response resp;
    enum request_parse_result r;
    size_t len = 0, used = 0, off = 0;
    char *buf = with_token(data, size, &len);

    memset(&lim, 0, sizeof lim);
    lim.max_header_bytes = 8192;
    lim.max_body = HTTP_BODY_MAX;
    request_parser_init(&p, &lim);
    response_init(&resp);
    r = request_parser_feed(&p, buf, len, &used);
    off = used;
    if (r == REQUEST_PARSE_HEADERS) {
        struct request *rq = (struct request *)request_parser_request(&p);
        rq->peer = "127.0.0.1";
        if (router_check_head(&app, rq, &resp, 1) != HTTP_HEAD_CONTINUE) {
            check_answer(&resp);
            goto out;
        }
        r = request_parser_feed(&p, buf + off, len - off, &used);
        if (r == REQUEST_PARSE_MORE)
            r = request_parser_finish(&p);
    }
    if (r == REQUEST_PARSE_COMPLETE) {
        /* As the server does: what the head check left is not the answer's. */
        response_release(&resp);
        response_init(&resp);
        router_dispatch(&app, request_parser_request(&p), &resp);
        check_answer(&resp);
    }
out:
    response_release(&resp);
    request_parser_release(&p);
    free(buf);
    return 0;
}
