/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_gateway_config.c - libFuzzer harness for idem-gateway's config reader
 * (src/gateway/config.c): libyaml and the walk over its document, on text an operator writes but
 * that may come from anywhere (a template, a generator, a copy-paste).  The input is the file.
 *
 * Besides memory errors and leaks it checks what the program relies on once a config is accepted:
 * every string it reads is there, the upstream is a host and a non-zero port, no 5xx status is
 * ever stored, a route's key comes from exactly one place, the lease outlives the upstream
 * timeout, a stored body fits the largest answer; and of a refusal, that it is one line naming
 * the file, within the buffer, with nothing handed back.
 */
#include "config.h"
#include "ascii.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* What die() (src/util) calls this program, as every program linking idem_util defines it. */
const char program_name[] = "fuzz_gateway_config";

#define NAME "fuzz.yaml"

static void check_route(const struct gw_config *cfg, const struct gw_route *r)
{
    size_t i;
    int s;

    CHECK(r->line >= 1, "a route has a line");
    CHECK(r->method != NULL && r->method[0] != '\0', "a route has a method");
    CHECK(r->path != NULL && r->path[0] == '/', "a route's path starts with '/'");
    CHECK(strchr(r->path, '?') == NULL, "no query in a route's path");
    CHECK(r->operation != NULL && r->operation[0] != '\0' && strlen(r->operation) <= 64,
          "a route has an operation of at most 64 bytes");
    CHECK(r->key_required == 0 || r->key_required == 1, "key_required is 0 or 1");
    if (r->key_source == GW_KEY_HEADER)
        CHECK(r->key_header != NULL && r->key_header[0] != '\0' && r->nkey_pointers == 0,
              "a header key has a header and no pointers");
    else
        CHECK(r->key_source == GW_KEY_BODY && r->key_header == NULL && r->nkey_pointers > 0,
              "a body key has pointers and no header");
    for (i = 0; i < r->nkey_pointers; i++)
        CHECK(r->key_pointers[i][0] == '\0' || r->key_pointers[i][0] == '/',
              "a key pointer is \"\" or starts with '/'");
    CHECK((r->fp_body == GW_FP_BODY_POINTERS) == (r->nfp_pointers > 0),
          "fingerprint pointers exactly when asked for");
    CHECK(r->retention_ms >= 1000, "retention at least 1s");
    CHECK(r->lease_ms > cfg->upstream_timeout_ms, "the lease outlives the upstream timeout");
    CHECK(r->wait_ms >= 1 && r->wait_ms <= 60000, "wait within 1ms..60s");
    for (s = 500; s < GW_STATUS_LIMIT; s++)
        CHECK(!r->store_status[s], "no 5xx is stored");
    for (s = 0; s < 100; s++)
        CHECK(!r->store_status[s], "no status below 100 is stored");
    for (i = 0; i < r->nstore_headers; i++)
        CHECK(r->store_headers[i] != NULL && r->store_headers[i][0] != '\0' &&
                  !ascii_caseeq(r->store_headers[i], "Set-Cookie"),
              "stored headers are names, never Set-Cookie");
    CHECK(r->max_stored_body >= 1 && r->max_stored_body <= cfg->max_response_bytes,
          "a stored body fits the largest answer");
    CHECK((r->unknown == GW_UNKNOWN_RECONCILE) == (r->reconcile_path != NULL),
          "a reconcile path exactly when reconciling");
    CHECK(r->reconcile_path == NULL || r->reconcile_path[0] == '/', "a reconcile path is a path");
}

static void check_config(const struct gw_config *cfg)
{
    size_t i, j;

    CHECK(cfg->file != NULL && strcmp(cfg->file, NAME) == 0, "the file is the name given");
    CHECK(cfg->listen != NULL && cfg->admin_listen != NULL && cfg->store != NULL,
          "listeners and store are set");
    CHECK(cfg->upstream_url != NULL &&
              (cfg->upstream_tls ? ascii_ncaseeq(cfg->upstream_url, "https://", 8)
                                 : ascii_ncaseeq(cfg->upstream_url, "http://", 7)),
          "TLS to the upstream exactly when it is https://");
    CHECK(cfg->upstream_tls ||
              (cfg->upstream_tls_ca_file == NULL && cfg->upstream_tls_server_name == NULL &&
               cfg->upstream_tls_cert_file == NULL),
          "upstream.tls settings only for an https:// upstream");
    CHECK((cfg->upstream_tls_cert_file == NULL) == (cfg->upstream_tls_key_file == NULL),
          "a client certificate comes with its key");
    CHECK((cfg->listen_tls.cert_file == NULL) == (cfg->listen_tls.key_file == NULL),
          "a listener certificate comes with its key");
    CHECK((cfg->admin_listen_tls.cert_file == NULL) == (cfg->admin_listen_tls.key_file == NULL),
          "the admin listener's certificate comes with its key");
    CHECK(cfg->upstream_host != NULL && cfg->upstream_host[0] != '\0' && cfg->upstream_port > 0,
          "the upstream has a host and a port");
    CHECK(cfg->upstream_connect_timeout_ms > 0 && cfg->upstream_timeout_ms > 0,
          "upstream timeouts are positive");
    CHECK(cfg->upstream_max_connections >= 1 && cfg->upstream_max_connections <= 10000,
          "upstream connections within 1..10000");
    CHECK(cfg->max_response_bytes >= 1 && cfg->max_body >= 1 && cfg->max_body <= (64u << 20),
          "sizes within their bounds");
    if (cfg->principal == GW_PRINCIPAL_HEADER && cfg->nroutes > 0)
        CHECK(cfg->principal_header != NULL, "a header principal names its header");
    if (cfg->principal == GW_PRINCIPAL_JWT)
        CHECK(cfg->jwt_key != NULL && cfg->jwt_key_len > 0, "a JWT principal has its key");
    CHECK(cfg->nroutes <= 1000, "at most 1000 routes");
    for (i = 0; i < cfg->nroutes; i++) {
        check_route(cfg, &cfg->routes[i]);
        for (j = 0; j < i; j++)
            CHECK(strcmp(cfg->routes[i].operation, cfg->routes[j].operation) != 0,
                  "operations are unique");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct gw_config sentinel;
    struct gw_config *cfg = &sentinel; /* must come back NULL on refusal */
    char err[256];
    size_t len;

    memset(err, 'x', sizeof err);
    if (gw_config_parse(NAME, (const char *)data, size, &cfg, err, sizeof err) == 0) {
        CHECK(cfg != NULL, "a config on success");
        check_config(cfg);
        gw_config_free(cfg);
        return 0;
    }
    CHECK(cfg == NULL, "no config on refusal");
    len = strnlen(err, sizeof err);
    CHECK(len < sizeof err, "the message is terminated within the buffer");
    CHECK(strncmp(err, NAME ":", strlen(NAME) + 1) == 0, "the message names the file");
    CHECK(strchr(err, '\n') == NULL, "the message is one line");
    CHECK(len > strlen(NAME ":0: "), "the message says something");
    return 0;
}
