/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_config.c - idem-gateway's config reader (src/gateway/config.c): examples/gateway.yaml
 * loads with the values it spells out, a minimal file gets every default, and each class of
 * mistake is refused with the file, the line of the node at fault and words that say what was
 * expected; every key of the reader's table is in docs/gateway.md's reference with its default,
 * and every bounded one is refused one past its bounds.  Inline text goes through gw_config_parse;
 * files (the example, JWT key files, a missing config) through gw_config_load in a temporary
 * directory.  Runs in tests/gateway.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"

/* What die() (src/util) calls this program, as every program linking idem_util defines it. */
const char program_name[] = "gateway_test_config";

#define EXAMPLE "../../examples/gateway.yaml"

/* The smallest config with a route: upstream url, principal, one route (line 6). */
#define MINIMAL                                                                                    \
    "upstream:\n"                                                                                  \
    "  url: http://127.0.0.1:9000\n"                                                               \
    "principal:\n"                                                                                 \
    "  header: X-Consumer-Id\n"                                                                    \
    "routes:\n"                                                                                    \
    "  - match: POST /v1/payments\n"                                                               \
    "    operation: payments.create\n"

static char tmpdir[64];

static struct gw_config *parse_ok(const char *text)
{
    struct gw_config *cfg = NULL;
    char err[512];

    if (gw_config_parse("t.yaml", text, strlen(text), &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "unexpected error: %s\n--- text:\n%s---\n", err, text);
        return NULL;
    }
    return cfg;
}

/*
 * 1 when `text` is refused with a message that starts with `prefix` (the file and line), holds
 * `part`, is one line and leaves *out NULL; says what it got otherwise.
 */
static int refused(const char *name, const char *text, size_t len, const char *prefix,
                   const char *part)
{
    static struct gw_config sentinel;
    struct gw_config *cfg = &sentinel; /* must be reset to NULL */
    char err[512];
    int rc;

    rc = gw_config_parse(name, text, len, &cfg, err, sizeof err);
    if (rc == 0) {
        fprintf(stderr, "accepted, expected \"%s...%s\"\n--- text:\n%s---\n", prefix, part, text);
        gw_config_free(cfg);
        return 0;
    }
    if (cfg != NULL || strncmp(err, prefix, strlen(prefix)) != 0 || strstr(err, part) == NULL ||
        strchr(err, '\n') != NULL) {
        fprintf(stderr, "error \"%s\", expected \"%s...%s\"\n", err, prefix, part);
        return 0;
    }
    return 1;
}

#define CHECK_REFUSED(text, prefix, part)                                                          \
    CHECK(refused("t.yaml", (text), strlen(text), (prefix), (part)))

/* Same for gw_config_load of `path`. */
static int load_refused(const char *path, const char *prefix, const char *part)
{
    struct gw_config *cfg = NULL;
    char err[512];

    if (gw_config_load(path, &cfg, err, sizeof err) == 0) {
        fprintf(stderr, "%s loaded, expected \"%s...%s\"\n", path, prefix, part);
        gw_config_free(cfg);
        return 0;
    }
    if (cfg != NULL || strncmp(err, prefix, strlen(prefix)) != 0 || strstr(err, part) == NULL) {
        fprintf(stderr, "error \"%s\", expected \"%s...%s\"\n", err, prefix, part);
        return 0;
    }
    return 1;
}

static void write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

/* The 1-based line of `path` that holds `needle`, 0 if none. */
static int line_holding(const char *path, const char *needle)
{
    char line[1024];
    FILE *f = fopen(path, "r");
    int n = 0, found = 0;

    if (f == NULL)
        return 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        n++;
        found = strstr(line, needle) != NULL;
    }
    fclose(f);
    return found ? n : 0;
}

/* ---- the example ----------------------------------------------------------------------------- */

static void test_example(void)
{
    struct gw_config *cfg = NULL;
    const struct gw_route *r;
    char err[512];

    err[0] = '\0';
    CHECK_INT(gw_config_load(EXAMPLE, &cfg, err, sizeof err), 0);
    if (cfg == NULL) {
        fprintf(stderr, "example: %s\n", err);
        return;
    }
    CHECK_STR(cfg->file, EXAMPLE);
    CHECK_STR(cfg->listen, "127.0.0.1:8180");
    CHECK_STR(cfg->admin_listen, "127.0.0.1:8181");
    CHECK_STR(cfg->store, "sqlite:/var/lib/idem-gateway/gateway.db");
    CHECK_STR(cfg->upstream_url, "http://127.0.0.1:9000");
    CHECK_STR(cfg->upstream_host, "127.0.0.1");
    CHECK_INT(cfg->upstream_port, 9000);
    CHECK_INT(cfg->upstream_connect_timeout_ms, 2000);
    CHECK_INT(cfg->upstream_timeout_ms, 30000);
    CHECK_INT(cfg->upstream_max_connections, 64);
    CHECK_INT(cfg->max_response_bytes, 16 << 20);
    CHECK_INT(cfg->max_body, 1 << 20);
    CHECK_INT(cfg->principal, GW_PRINCIPAL_HEADER);
    CHECK_STR(cfg->principal_header, "X-Consumer-Id");
    CHECK(cfg->jwt_key == NULL && cfg->jwt_issuer == NULL && cfg->jwt_audience == NULL);
    CHECK_INT(cfg->limits.max_connections, 10000);
    CHECK_INT(cfg->limits.max_connections_per_ip, 256);
    CHECK_INT(cfg->limits.head_timeout_ms, 10000);
    CHECK_INT(cfg->limits.workers, 64);
    CHECK_INT(cfg->unrouted_keys, GW_UNROUTED_REFUSE);
    CHECK_INT(cfg->limits.body_timeout_ms, 0); /* not set: the server's default */
    CHECK_INT(cfg->limits.loops, 0);
    CHECK_INT(cfg->nroutes, 3);
    if (cfg->nroutes != 3)
        goto out;

    r = &cfg->routes[0];
    CHECK_INT(r->line, line_holding(EXAMPLE, "- match: POST /v1/payments\n"));
    CHECK(r->line > 0);
    CHECK_STR(r->method, "POST");
    CHECK_STR(r->path, "/v1/payments");
    CHECK_STR(r->operation, "payments.create");
    CHECK_INT(r->key_required, 1);
    CHECK_INT(r->key_source, GW_KEY_HEADER);
    CHECK_STR(r->key_header, "Idempotency-Key");
    CHECK_INT(r->nkey_pointers, 0);
    CHECK_INT(r->fp_body, GW_FP_BODY_ALL);
    CHECK_INT(r->retention_ms, 24LL * 3600 * 1000);
    CHECK_INT(r->lease_ms, 40000);
    CHECK_INT(r->wait_ms, 2000);
    CHECK(r->store_status[200] && r->store_status[201] && r->store_status[299]);
    CHECK(r->store_status[404] && r->store_status[409] && r->store_status[422]);
    CHECK(!r->store_status[400] && !r->store_status[401] && !r->store_status[429]);
    CHECK(!r->store_status[500] && !r->store_status[302] && !r->store_status[100]);
    CHECK_INT(r->nstore_headers, 4);
    if (r->nstore_headers == 4) {
        CHECK_STR(r->store_headers[0], "Content-Type");
        CHECK_STR(r->store_headers[3], "Link");
    }
    CHECK_INT(r->max_stored_body, 1 << 20);
    CHECK_INT(r->unknown, GW_UNKNOWN_RECONCILE);
    CHECK_STR(r->reconcile_path, "/v1/payments?requestId={key}");

    r = &cfg->routes[1];
    CHECK_INT(r->line, line_holding(EXAMPLE, "- match: POST /v1/payments/{payment_id}/refunds"));
    CHECK_STR(r->path, "/v1/payments/{payment_id}/refunds");
    CHECK_STR(r->operation, "refunds.create");
    CHECK_INT(r->key_source, GW_KEY_BODY);
    CHECK(r->key_header == NULL);
    CHECK_INT(r->nkey_pointers, 2);
    if (r->nkey_pointers == 2) {
        CHECK_STR(r->key_pointers[0], "/requestId");
        CHECK_STR(r->key_pointers[1], "/refund/requestId");
    }
    CHECK_INT(r->fp_body, GW_FP_BODY_POINTERS);
    CHECK_INT(r->nfp_pointers, 2);
    if (r->nfp_pointers == 2) {
        CHECK_STR(r->fp_pointers[0], "/amount");
        CHECK_STR(r->fp_pointers[1], "/reason");
    }
    CHECK_INT(r->retention_ms, 7LL * 24 * 3600 * 1000);
    CHECK_INT(r->lease_ms, 40000); /* the default: upstream timeout + 10 s */
    CHECK(r->store_status[201] && !r->store_status[429]);
    CHECK_INT(r->unknown, GW_UNKNOWN_RECONCILE);
    CHECK_STR(r->reconcile_path, "/v1/payments/{payment_id}/refunds?requestId={key}");

    r = &cfg->routes[2];
    CHECK_STR(r->method, "PUT");
    CHECK_STR(r->path, "/v1/orders/{order_id}");
    CHECK_INT(r->key_required, 0);
    CHECK_STR(r->key_header, "Idempotency-Key");
    CHECK_INT(r->fp_body, GW_FP_BODY_NONE);
    CHECK_INT(r->retention_ms, 3600 * 1000);
    CHECK_INT(r->wait_ms, 500);
    CHECK_INT(r->nstore_headers, 2);
    if (r->nstore_headers == 2)
        CHECK_STR(r->store_headers[1], "ETag");
    CHECK_INT(r->unknown, GW_UNKNOWN_RESEND);
    CHECK(r->reconcile_path == NULL);
out:
    gw_config_free(cfg);
}

/* ---- defaults -------------------------------------------------------------------------------- */

static void test_defaults(void)
{
    static const int stored[] = {200, 201, 204, 299, 402, 404, 409, 410, 422, 499};
    static const int not_stored[] = {100, 101, 199, 300, 302, 304, 399, 400, 401,
                                     403, 408, 413, 415, 429, 500, 502, 503, 599};
    struct gw_config *cfg = parse_ok(MINIMAL);
    const struct gw_route *r;
    size_t i;
    int s, count = 0;

    CHECK(cfg != NULL);
    if (cfg == NULL)
        return;
    CHECK_STR(cfg->file, "t.yaml");
    CHECK_STR(cfg->listen, "127.0.0.1:8180");
    CHECK_STR(cfg->admin_listen, "127.0.0.1:8181");
    CHECK_STR(cfg->store, "sqlite:gateway.db");
    CHECK_STR(cfg->upstream_url, "http://127.0.0.1:9000");
    CHECK_STR(cfg->upstream_host, "127.0.0.1");
    CHECK_INT(cfg->upstream_port, 9000);
    CHECK_INT(cfg->upstream_connect_timeout_ms, 2000);
    CHECK_INT(cfg->upstream_timeout_ms, 30000);
    CHECK_INT(cfg->upstream_max_connections, 64);
    CHECK_INT(cfg->max_response_bytes, 16 << 20);
    CHECK_INT(cfg->max_body, 1 << 20);
    CHECK_INT(cfg->principal, GW_PRINCIPAL_HEADER);
    CHECK_STR(cfg->principal_header, "X-Consumer-Id");
    CHECK(cfg->jwt_key == NULL && cfg->jwt_key_len == 0);
    CHECK(cfg->limits.max_connections == 0 && cfg->limits.max_connections_per_ip == 0 &&
          cfg->limits.head_timeout_ms == 0 && cfg->limits.loops == 0 && cfg->limits.workers == 0 &&
          cfg->limits.queue == 0);
    CHECK_INT(cfg->nroutes, 1);
    if (cfg->nroutes != 1)
        goto out;
    r = &cfg->routes[0];
    CHECK_INT(r->line, 6);
    CHECK_STR(r->method, "POST");
    CHECK_STR(r->path, "/v1/payments");
    CHECK_STR(r->operation, "payments.create");
    CHECK_INT(r->key_required, 1);
    CHECK_INT(r->key_source, GW_KEY_HEADER);
    CHECK_STR(r->key_header, "Idempotency-Key");
    CHECK(r->key_pointers == NULL && r->nkey_pointers == 0);
    CHECK_INT(r->fp_body, GW_FP_BODY_ALL);
    CHECK(r->fp_pointers == NULL && r->nfp_pointers == 0);
    CHECK_INT(r->fp_query, 1);
    CHECK_INT(r->retention_ms, 86400000);
    CHECK_INT(r->lease_ms, 40000);
    CHECK_INT(r->wait_ms, 2000);
    for (i = 0; i < sizeof stored / sizeof stored[0]; i++) {
        if (!r->store_status[stored[i]])
            fprintf(stderr, "status %d should be stored by default\n", stored[i]);
        CHECK(r->store_status[stored[i]]);
    }
    for (i = 0; i < sizeof not_stored / sizeof not_stored[0]; i++) {
        if (r->store_status[not_stored[i]])
            fprintf(stderr, "status %d should not be stored by default\n", not_stored[i]);
        CHECK(!r->store_status[not_stored[i]]);
    }
    for (s = 0; s < GW_STATUS_LIMIT; s++)
        count += r->store_status[s] != 0;
    CHECK_INT(count, 200 - 7); /* 2xx and 4xx but seven */
    CHECK_INT(r->nstore_headers, 4);
    if (r->nstore_headers == 4) {
        CHECK_STR(r->store_headers[0], "Content-Type");
        CHECK_STR(r->store_headers[1], "Location");
        CHECK_STR(r->store_headers[2], "ETag");
        CHECK_STR(r->store_headers[3], "Link");
    }
    CHECK_INT(r->max_stored_body, 1 << 20);
    CHECK_INT(r->unknown, GW_UNKNOWN_HOLD);
    CHECK(r->reconcile_path == NULL);
out:
    gw_config_free(cfg);

    /* No routes: no principal needed. */
    cfg = parse_ok("upstream: {url: 'http://backend.internal:80/'}\n");
    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_INT(cfg->nroutes, 0);
        CHECK_STR(cfg->upstream_url, "http://backend.internal:80");
        CHECK_STR(cfg->upstream_host, "backend.internal");
        CHECK_INT(cfg->upstream_port, 80);
        gw_config_free(cfg);
    }
}

/* Values other than the defaults, each through the form the format allows. */
static void test_values(void)
{
    struct gw_config *cfg;
    const struct gw_route *r;

    cfg = parse_ok("listen: '[::1]:8443'\n"
                   "admin_listen: 0.0.0.0:0\n"
                   "store: postgresql://gw@db/idem\n"
                   "upstream:\n"
                   "  url: http://[fd00::1]:9000/\n"
                   "  connect_timeout: 250ms\n"
                   "  timeout: 5s\n"
                   "  max_connections: 10000\n"
                   "  max_response_size: 512KiB\n"
                   "max_body_size: 65536\n"
                   "principal: authorization\n"
                   "limits: {http_threads: 4, max_connections_per_ip: -1, http_queue: 10,\n"
                   "         stream_min_rate: 65536, streams_per_ip: -1}\n"
                   "routes:\n"
                   "  - match: DELETE /v1/items/{item_id}/tags/{tag}\n"
                   "    operation: items.untag-1_0\n"
                   "    key: {header: X-Request-Id}\n"
                   "    wait: 60s\n"
                   "    retention: 366d\n"
                   "    store_statuses: [2XX, 100, 3xx, 499]\n"
                   "    store_headers: []\n"
                   "    on_unknown: {reconcile: 'GET /v1/items/{item_id}/tags?t={tag}&k={key}'}\n"
                   "  - match: DELETE /v1/items/{item_id}/tags/new\n" /* literal != parameter */
                   "    operation: items.untag-new\n"
                   "    key: {body: ['', /a~0b~1c]}\n"
                   "    fingerprint: [/x]\n"
                   "    fingerprint_query: false\n"
                   "    lease: 1m\n"
                   "    max_stored_body: 512KiB\n"
                   "  - match: POST /v1/items/{item_id}/tags/{tag}\n" /* another method */
                   "    operation: items.tag\n"
                   "    key: {required: false}\n");
    CHECK(cfg != NULL);
    if (cfg == NULL)
        return;
    CHECK_STR(cfg->listen, "[::1]:8443");
    CHECK_STR(cfg->admin_listen, "0.0.0.0:0");
    CHECK_STR(cfg->store, "postgresql://gw@db/idem");
    CHECK_STR(cfg->upstream_url, "http://[fd00::1]:9000");
    CHECK_STR(cfg->upstream_host, "fd00::1");
    CHECK_INT(cfg->upstream_port, 9000);
    CHECK_INT(cfg->upstream_connect_timeout_ms, 250);
    CHECK_INT(cfg->upstream_timeout_ms, 5000);
    CHECK_INT(cfg->upstream_max_connections, 10000);
    CHECK_INT(cfg->max_response_bytes, 512 * 1024);
    CHECK_INT(cfg->max_body, 65536);
    CHECK_INT(cfg->principal, GW_PRINCIPAL_AUTHORIZATION);
    CHECK(cfg->principal_header == NULL);
    CHECK_INT(cfg->limits.loops, 4);
    CHECK_INT(cfg->limits.max_connections_per_ip, -1);
    CHECK_INT(cfg->limits.queue, 10);
    CHECK_INT(cfg->limits.stream_min_rate, 65536);
    CHECK_INT(cfg->limits.streams_per_ip, -1);
    CHECK_INT(cfg->limits.max_connections, 0);
    CHECK_INT(cfg->nroutes, 3);
    if (cfg->nroutes != 3)
        goto out;
    r = &cfg->routes[0];
    CHECK_STR(r->method, "DELETE");
    CHECK_STR(r->key_header, "X-Request-Id");
    CHECK_INT(r->wait_ms, 60000);
    CHECK_INT(r->retention_ms, 366LL * 86400000);
    CHECK_INT(r->lease_ms, 15000); /* this upstream's 5 s + 10 s */
    CHECK(r->store_status[200] && r->store_status[299] && r->store_status[100]);
    CHECK(r->store_status[302] && r->store_status[499]);
    CHECK(!r->store_status[101] && !r->store_status[404] && !r->store_status[500]);
    CHECK_INT(r->nstore_headers, 0);
    CHECK_INT(r->max_stored_body, 512 * 1024); /* 1 MiB, capped by the largest answer */
    CHECK_STR(r->reconcile_path, "/v1/items/{item_id}/tags?t={tag}&k={key}");
    r = &cfg->routes[1];
    CHECK_INT(r->key_source, GW_KEY_BODY);
    CHECK_INT(r->nkey_pointers, 2);
    if (r->nkey_pointers == 2) {
        CHECK_STR(r->key_pointers[0], "");
        CHECK_STR(r->key_pointers[1], "/a~0b~1c");
    }
    CHECK_INT(r->fp_body, GW_FP_BODY_POINTERS);
    CHECK_INT(r->fp_query, 0);
    CHECK_INT(r->lease_ms, 60000);
    r = &cfg->routes[2];
    CHECK_INT(r->key_required, 0);
    CHECK_INT(r->key_source, GW_KEY_HEADER);
    CHECK_STR(r->key_header, "Idempotency-Key");
out:
    gw_config_free(cfg);

    cfg = parse_ok("upstream: {url: http://h:1, max_response_size: 1GiB}\n"
                   "store: host=db dbname=idem\n"
                   "principal: {authorization: sha256}\n");
    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_INT(cfg->max_response_bytes, 1 << 30);
        CHECK_STR(cfg->store, "host=db dbname=idem");
        CHECK_INT(cfg->principal, GW_PRINCIPAL_AUTHORIZATION);
        gw_config_free(cfg);
    }

    /* A shard set: the directory's URI after "shards:" (docs/shards.md). */
    cfg = parse_ok("upstream: {url: http://h:1}\n"
                   "store: 'shards:postgresql://dir-a,dir-b/idem_directory'\n");
    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_STR(cfg->store, "shards:postgresql://dir-a,dir-b/idem_directory");
        CHECK(cfg->store_file == NULL);
        gw_config_free(cfg);
    }
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void test_document_errors(void)
{
    char *big;
    size_t n;

    CHECK_REFUSED("", "t.yaml:1: ", "empty config; expected a mapping with at least upstream");
    CHECK_REFUSED("# nothing yet\n\n", "t.yaml:1: ", "empty config");
    CHECK_REFUSED("---\n", "t.yaml:1: ", "empty config");
    CHECK_REFUSED("- a\n- b\n", "t.yaml:1: ", "expected a mapping at the top level, not a list");
    CHECK_REFUSED("hello\n", "t.yaml:1: ", "expected a mapping at the top level");
    CHECK_REFUSED("{}\n", "t.yaml:1: ", "missing required key \"upstream\" at the top level");
    CHECK_REFUSED("listen: 127.0.0.1:1\n", "t.yaml:1: ", "missing required key \"upstream\"");
    CHECK_REFUSED("upstream: [\n", "t.yaml:2: ", "invalid YAML: ");
    CHECK_REFUSED("upstream:\n  url: x\n url: y\n", "t.yaml:3: ", "invalid YAML: ");
    /* key.forward: token or sf-string. */
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: {header: X}\nroutes:\n"
                  "  - {match: POST /a, operation: a, key: {forward: quoted}}\n",
                  "t.yaml:4: ", "routes[0].key.forward: expected token or sf-string");
    /* unrouted_keys: pass (default) or refuse, nothing else. */
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nunrouted_keys: warn\n",
                  "t.yaml:2: ", "unrouted_keys: expected pass or refuse, not \"warn\"");
    CHECK_REFUSED("a: 'unterminated\n", "t.yaml:2: ", "(a quote is not closed)");
    /* The two mistakes people make most, named as such. */
    CHECK_REFUSED("upstream:\n  url: x\n timeout: 3s\n",
                  "t.yaml:3: ", "(check the indentation of this line and of the one above it)");
    CHECK_REFUSED("upstream:\n\turl: x\n", "t.yaml:2: ",
                  "(this line is indented with a tab: YAML indents with spaces only)");
    CHECK(refused("t.yaml", "a: \xff\n", 6, "t.yaml:1: ", "invalid YAML: "));
    CHECK(refused("t.yaml", "a: 1\nb: \0\n", 10, "t.yaml:2: ", "invalid YAML: "));
    CHECK_REFUSED("---\nupstream: {url: 'http://h:1'}\n---\nlisten: x\n",
                  "t.yaml:3: ", "a second YAML document");
    CHECK_REFUSED("upstream: [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]\n",
                  "t.yaml:1: ", "nested deeper than 16 levels");

    /* Aliases are refused where they are written, even to a valid value. */
    CHECK_REFUSED(MINIMAL "  - match: &m POST /v1/refunds\n"
                          "    operation: *m\n",
                  "t.yaml:9: ", "aliases (*m) are not supported");
    CHECK_REFUSED("upstream: &u {url: 'http://h:1'}\nx: *u\n", "t.yaml:2: ", "aliases (*u)");
    CHECK_REFUSED("a: &a [*a]\n", "t.yaml:1: ", "aliases (*a)");

    /* Unknown keys: at their line, with where they are and what is allowed there. */
    CHECK_REFUSED(MINIMAL "    retries: 3\n", "t.yaml:8: ",
                  "unknown key \"retries\" in routes[0]; expected one of: match, operation, key, "
                  "fingerprint, retention, lease, wait, store_statuses, store_headers, "
                  "max_stored_body, on_unknown");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/refunds\n"
                          "    operation: refunds.create\n"
                          "    key:\n"
                          "      name: X\n",
                  "t.yaml:11: ",
                  "unknown key \"name\" in routes[1].key; expected one of: required, header, body");
    CHECK_REFUSED("upstreams: {}\n", "t.yaml:1: ",
                  "unknown key \"upstreams\" at the top level; expected one of: listen, "
                  "admin_listen, store, upstream, max_body_size, principal, limits, routes");
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  retries: 2\n", "t.yaml:3: ",
                  "unknown key \"retries\" in upstream; expected one of: url, connect_timeout");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: {cookie: sid}\n",
                  "t.yaml:2: ", "unknown key \"cookie\" in principal");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits: {max-connections: 5}\n", "t.yaml:2: ",
                  "unknown key \"max-connections\" in limits; expected one of: max_connections, "
                  "max_connections_per_ip, head_timeout_ms");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\n[a]: 1\n",
                  "t.yaml:2: ", "expected a key name at the top level, not a list");

    /* Duplicate keys name the first. */
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlisten: a:1\nlisten: b:2\n",
                  "t.yaml:3: ", "duplicate key \"listen\" at the top level (first at line 2)");
    CHECK_REFUSED(MINIMAL "    operation: again\n",
                  "t.yaml:8: ", "duplicate key \"operation\" in routes[0] (first at line 7)");

    /* The size cap, before any parsing. */
    n = (1 << 20) + 1;
    big = malloc(n);
    CHECK(big != NULL);
    if (big != NULL) {
        memset(big, '#', n);
        CHECK(refused("big.yaml", big, n, "big.yaml: ", "larger than 1MiB"));
        free(big);
    }
}

static void test_type_errors(void)
{
    CHECK_REFUSED("upstream: http://h:1\n",
                  "t.yaml:1: ", "upstream: expected a mapping, not \"http://h:1\"");
    CHECK_REFUSED("upstream:\n", "t.yaml:1: ", "upstream: expected a mapping, not an empty value");
    CHECK_REFUSED("upstream: {connect_timeout: 1s}\n",
                  "t.yaml:1: ", "upstream: missing required key \"url\"");
    CHECK_REFUSED(
        "upstream: {url: [http://h:1]}\n", "t.yaml:1: ",
        "upstream.url: expected http://HOST:PORT, http://[V6]:PORT or https://HOST[:PORT], not "
        "a list");
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  max_connections: lots\n", "t.yaml:3: ",
                  "upstream.max_connections: expected an integer from 1 to 10000, not \"lots\"");
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  max_connections: 10001\n",
                  "t.yaml:3: ", "upstream.max_connections: expected an integer from 1 to 10000");
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  connect_timeout: 0\n", "t.yaml:3: ",
                  "upstream.connect_timeout: expected a duration from 1ms to 1h, not \"0\"");
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  timeout: 2 s\n",
                  "t.yaml:3: ", "upstream.timeout: expected a duration such as 30s, 15m or 24h");
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  max_response_size: 16MB\n", "t.yaml:3: ",
                  "upstream.max_response_size: expected a size such as 512KiB, 1MiB or 1GiB");
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  max_response_size: 2GiB\n",
                  "t.yaml:3: ", "expected a size from 1 byte to 1GiB, not \"2GiB\"");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nmax_body_size: 65MiB\n",
                  "t.yaml:2: ", "max_body_size: expected a size from 1 byte to 64MiB");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nmax_body_size: 0\n",
                  "t.yaml:2: ", "max_body_size: expected a size from 1 byte");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nmax_body_size: 99999999999999999999KiB\n",
                  "t.yaml:2: ", "max_body_size: expected a size such as");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlisten: 8080\n",
                  "t.yaml:2: ", "listen: bad listen address '8080': expected HOST:PORT");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nadmin_listen: '[::1]:99999'\n",
                  "t.yaml:2: ", "admin_listen: bad listen address");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nstore: mysql://db/x\n", "t.yaml:2: ",
                  "store: expected sqlite:PATH, a postgresql:// URI, a libpq key=value string, "
                  "or shards: and the URI of a shard directory");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nstore: 'shards:sqlite:x.db'\n",
                  "t.yaml:2: ", "store: expected");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nstore: ''\n", "t.yaml:2: ", "store: expected");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nroutes: {}\n",
                  "t.yaml:2: ", "routes: expected a list of routes");
    CHECK_REFUSED(MINIMAL "    key: {required: maybe}\n",
                  "t.yaml:8: ", "routes[0].key.required: expected true or false, not \"maybe\"");
    CHECK_REFUSED(MINIMAL "    key: Idempotency-Key\n",
                  "t.yaml:8: ", "routes[0].key: expected a mapping, not \"Idempotency-Key\"");
    CHECK_REFUSED(MINIMAL "    operation2: x\n", "t.yaml:8: ", "unknown key \"operation2\"");
    CHECK_REFUSED(
        "upstream: {url: 'http://h:1'}\nprincipal: {header: X}\nroutes:\n- operation: x\n",
        "t.yaml:4: ", "routes[0]: missing required key \"match\"");
    CHECK_REFUSED(
        "upstream: {url: 'http://h:1'}\nprincipal: {header: X}\nroutes:\n- match: GET /\n",
        "t.yaml:4: ", "routes[0]: missing required key \"operation\"");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: {header: X}\nroutes:\n- 1\n",
                  "t.yaml:4: ", "routes[0]: expected a mapping, not \"1\"");
    /* A NUL in a quoted value, and a message that stays one line whatever the value holds. */
    CHECK_REFUSED(MINIMAL "    fingerprint_query: 3\n",
                  "t.yaml:8: ", "routes[0].fingerprint_query: expected");
    CHECK_REFUSED(MINIMAL "    fingerprint: \"bo\\0dy\"\n", "t.yaml:8: ",
                  "routes[0].fingerprint: expected body, none or a list of JSON pointers");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: {header: \"X\\0Y\"}\n", "t.yaml:2: ",
                  "principal.header: expected a header name such as Idempotency-Key; the value "
                  "holds a NUL byte");
    CHECK_REFUSED(MINIMAL "    fingerprint: \"line one\\nline two\"\n",
                  "t.yaml:8: ", "not \"line one?line two\"");
}

/* https: the port 443 unless written, the URL's host verified unless another is named. */
static void test_upstream_tls(void)
{
    struct gw_config *cfg = parse_ok("upstream: {url: 'HTTPS://api.example.com/'}\n");

    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK(cfg->upstream_tls);
        CHECK_STR(cfg->upstream_host, "api.example.com");
        CHECK_INT(cfg->upstream_port, 443);
        CHECK(cfg->upstream_tls_ca_file == NULL && cfg->upstream_tls_server_name == NULL);
        gw_config_free(cfg);
    }
    cfg = parse_ok("upstream:\n  url: https://[::1]:8443\n  tls:\n    server_name: api.internal\n"
                   "    ca_file: /etc/hostname\n    cert_file: /etc/hostname\n"
                   "    key_file: /etc/hostname\n");
    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_STR(cfg->upstream_host, "::1");
        CHECK_INT(cfg->upstream_port, 8443);
        CHECK_STR(cfg->upstream_tls_server_name, "api.internal");
        CHECK_STR(cfg->upstream_tls_ca_file, "/etc/hostname");
        CHECK_STR(cfg->upstream_tls_cert_file, "/etc/hostname");
        CHECK_STR(cfg->upstream_tls_key_file, "/etc/hostname");
        gw_config_free(cfg);
    }
    cfg = parse_ok("upstream: {url: 'http://h:1'}\n");
    CHECK(cfg != NULL && !cfg->upstream_tls);
    gw_config_free(cfg);
}

/* listen_tls, admin_listen_tls: both files, readable; each listener speaks TLS on its own. */
static void test_listen_tls(void)
{
    static const char *const keys[] = {"listen_tls", "admin_listen_tls"};
    struct gw_config *cfg;
    char yaml[256], want[128];
    size_t i;

    for (i = 0; i < 2; i++) {
        snprintf(yaml, sizeof yaml,
                 "upstream: {url: 'http://h:1'}\n"
                 "%s: {cert_file: /etc/hostname, key_file: /etc/hostname}\n",
                 keys[i]);
        cfg = parse_ok(yaml);
        CHECK(cfg != NULL);
        if (cfg != NULL) {
            const struct gw_listen_tls *on = i == 0 ? &cfg->listen_tls : &cfg->admin_listen_tls;
            const struct gw_listen_tls *off = i == 0 ? &cfg->admin_listen_tls : &cfg->listen_tls;
            CHECK_STR(on->cert_file, "/etc/hostname");
            CHECK_STR(on->key_file, "/etc/hostname");
            CHECK(off->cert_file == NULL && off->key_file == NULL);
            gw_config_free(cfg);
        }
        snprintf(yaml, sizeof yaml,
                 "upstream: {url: 'http://h:1'}\n%s: {cert_file: /etc/hostname}\n", keys[i]);
        snprintf(want, sizeof want, "%s: expected cert_file and key_file", keys[i]);
        CHECK_REFUSED(yaml, "t.yaml:2: ", want);
        snprintf(yaml, sizeof yaml,
                 "upstream: {url: 'http://h:1'}\n%s:\n  cert_file: /nonexistent\n"
                 "  key_file: /etc/hostname\n",
                 keys[i]);
        snprintf(want, sizeof want, "%s.cert_file: cannot read /nonexistent", keys[i]);
        CHECK_REFUSED(yaml, "t.yaml:3: ", want);
    }
    cfg = parse_ok("upstream: {url: 'http://h:1'}\n");
    CHECK(cfg != NULL && cfg->listen_tls.cert_file == NULL &&
          cfg->admin_listen_tls.cert_file == NULL);
    gw_config_free(cfg);
}

static void test_upstream_errors(void)
{
    CHECK_REFUSED("upstream:\n  url: http://h:1\n  tls: {server_name: h}\n",
                  "t.yaml:3: ", "upstream: tls applies to an https url only");
    CHECK_REFUSED("upstream:\n  url: https://h\n  tls: {server_name: 'a b'}\n",
                  "t.yaml:3: ", "upstream.tls.server_name: expected a host name");
    CHECK_REFUSED("upstream:\n  url: https://h\n  tls:\n    cert_file: /etc/hostname\n",
                  "t.yaml:4: ", "upstream.tls: cert_file and key_file go together");
    CHECK_REFUSED("upstream:\n  url: https://h\n  tls: {ca_file: /nonexistent/ca.pem}\n",
                  "t.yaml:3: ", "upstream.tls.ca_file: cannot read /nonexistent/ca.pem: No such");
    CHECK_REFUSED("upstream:\n  url: https://h\n  tls: {ca_file: /tmp}\n",
                  "t.yaml:3: ", "not a regular file");
    CHECK_REFUSED("upstream:\n  url: https://[::1\n", "t.yaml:2: ", "with a port");
    CHECK_REFUSED("upstream:\n  url: ftp://h:1\n",
                  "t.yaml:2: ", "upstream.url: expected http://HOST:PORT");
    CHECK_REFUSED("upstream:\n  url: http://h:1/api\n",
                  "t.yaml:2: ", "without a path, query or fragment");
    CHECK_REFUSED("upstream:\n  url: http://h:1?x=1\n", "t.yaml:2: ", "without a path, query");
    CHECK_REFUSED("upstream:\n  url: http://h:1//\n", "t.yaml:2: ", "without a path");
    CHECK_REFUSED("upstream:\n  url: http://user:pw@h:1\n",
                  "t.yaml:2: ", "upstream.url: no user information (user@) is allowed");
    CHECK_REFUSED(
        "upstream:\n  url: http://h\n", "t.yaml:2: ",
        "upstream.url: expected http://HOST:PORT, http://[V6]:PORT or https://HOST[:PORT] "
        "with a port");
    CHECK_REFUSED("upstream:\n  url: http://h:0\n", "t.yaml:2: ", "with a port from 1 to 65535");
    CHECK_REFUSED("upstream:\n  url: http://h:65536\n", "t.yaml:2: ", "with a port");
    CHECK_REFUSED("upstream:\n  url: http://::1:80\n", "t.yaml:2: ", "with a port");
    CHECK_REFUSED("upstream:\n  url: http://:80\n", "t.yaml:2: ", "with a port");
    CHECK_REFUSED("upstream:\n  url: 'http://h%41:80'\n",
                  "t.yaml:2: ", "\"h%41\" is not a host name or an IP address");
    CHECK_REFUSED("upstream:\n  url: 'http://[zz]:80'\n", "t.yaml:2: ", "is not a host name");
}

static void test_principal_errors(void)
{
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nroutes:\n  - match: POST /a\n"
                  "    operation: a\n",
                  "t.yaml:3: ", "routes need a principal");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: {}\n",
                  "t.yaml:2: ", "principal: expected one of header, authorization or jwt");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal:\n  header: X\n"
                  "  authorization: sha256\n",
                  "t.yaml:4: ", "principal: give only one of header, authorization and jwt");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal:\n  authorization: md5\n",
                  "t.yaml:3: ", "principal.authorization: expected sha256");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: bearer\n", "t.yaml:2: ",
                  "principal: expected a mapping with one of header, authorization or jwt");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: {header: authorization}\n",
                  "t.yaml:2: ", "principal.header: Authorization holds a credential");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal: {header: 'X Consumer'}\n",
                  "t.yaml:2: ", "principal.header: expected a header name");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal:\n  jwt:\n    alg: none\n",
                  "t.yaml:4: ", "principal.jwt.alg: expected HS256 or RS256, not \"none\"");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal:\n  jwt:\n    secret_file: s\n",
                  "t.yaml:4: ", "principal.jwt: missing required key \"alg\"");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal:\n  jwt:\n    alg: HS256\n",
                  "t.yaml:4: ", "principal.jwt: missing required key \"secret_file\"");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal:\n  jwt:\n    alg: RS256\n"
                  "    secret_file: s\n",
                  "t.yaml:5: ", "principal.jwt.secret_file: only for alg HS256");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal:\n  jwt:\n    alg: HS256\n"
                  "    public_key_file: k.pem\n",
                  "t.yaml:5: ", "principal.jwt.public_key_file: only for alg RS256");
}

static void test_limits_errors(void)
{
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits:\n  max_connections: 0\n",
                  "t.yaml:3: ", "limits.max_connections: must be an integer from 1 to 1000000");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits:\n  max_connections_per_ip: 0\n",
                  "t.yaml:3: ", "limits.max_connections_per_ip: must be an integer from -1");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits:\n  http_threads: 9\n",
                  "t.yaml:3: ", "limits.http_threads: must be an integer from 1 to 8, not '9'");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits:\n  http_threads:\n",
                  "t.yaml:3: ", "limits.http_threads: expected an integer, not an empty value");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits:\n  stream_min_rate: 0\n", "t.yaml:3: ",
                  "limits.stream_min_rate: must be an integer from -1 to 1000000000 other than 0");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits:\n  streams_per_ip: 1.5\n", "t.yaml:3: ",
                  "limits.streams_per_ip: must be an integer from -1 to 1000000 other than 0");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nlimits: 5\n",
                  "t.yaml:2: ", "limits: expected a mapping");
}

/* principal_limits and max_stored_bytes: their defaults, values, 0 for none, and refusals. */
static void test_principal_limits(void)
{
    struct gw_config *cfg = parse_ok("upstream: {url: 'http://h:1'}\n");

    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_INT(cfg->upstream_keyed_fresh, 1);
        CHECK_INT(cfg->limit_keys_in_flight, 512);
        CHECK_INT(cfg->limit_new_keys_per_second, 1000);
        CHECK_INT(cfg->limit_stored_bytes, 1 << 30);
        CHECK_INT(cfg->limit_tracked, 10000);
        CHECK_INT(cfg->max_stored_bytes, 16LL << 30);
        gw_config_free(cfg);
    }
    cfg = parse_ok("upstream: {url: 'http://h:1', keyed_connections: pooled}\n"
                   "principal_limits: {keys_in_flight: 0, new_keys_per_second: 7,\n"
                   "                   stored_bytes: 20KiB, tracked: 3}\n"
                   "max_stored_bytes: 0\n");
    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_INT(cfg->upstream_keyed_fresh, 0);
        CHECK_INT(cfg->limit_keys_in_flight, 0);
        CHECK_INT(cfg->limit_new_keys_per_second, 7);
        CHECK_INT(cfg->limit_stored_bytes, 20 * 1024);
        CHECK_INT(cfg->limit_tracked, 3);
        CHECK_INT(cfg->max_stored_bytes, 0);
        gw_config_free(cfg);
    }
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal_limits:\n  keys_in_flight: -1\n",
                  "t.yaml:3: ", "principal_limits.keys_in_flight: ");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal_limits:\n  tracked: 0\n",
                  "t.yaml:3: ", "principal_limits.tracked: ");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nprincipal_limits:\n  per_hour: 5\n",
                  "t.yaml:3: ", "per_hour");
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\nmax_stored_bytes: lots\n",
                  "t.yaml:2: ", "max_stored_bytes: expected a size");
}

static void test_route_errors(void)
{
    /* Durations. */
    CHECK_REFUSED(MINIMAL "    retention: 1y\n",
                  "t.yaml:8: ", "routes[0].retention: expected a duration such as 30s, 15m or 24h");
    CHECK_REFUSED(MINIMAL "    retention: 500ms\n", "t.yaml:8: ",
                  "routes[0].retention: expected a duration from 1s to 366d, not \"500ms\"");
    CHECK_REFUSED(MINIMAL "    retention: 367d\n", "t.yaml:8: ", "from 1s to 366d");
    CHECK_REFUSED(MINIMAL "    retention: -5s\n", "t.yaml:8: ", "expected a duration such as");
    CHECK_REFUSED(MINIMAL "    retention: 1.5h\n", "t.yaml:8: ", "expected a duration such as");
    CHECK_REFUSED(MINIMAL "    wait: 0\n",
                  "t.yaml:8: ", "routes[0].wait: expected a duration from 1ms to 1m");
    CHECK_REFUSED(MINIMAL "    wait: 61s\n", "t.yaml:8: ", "routes[0].wait: expected a duration");
    CHECK_REFUSED(MINIMAL "    lease: 99999999999999999999d\n",
                  "t.yaml:8: ", "routes[0].lease: expected a duration such as");

    /* The lease against the upstream timeout, whichever comes first in the file. */
    CHECK_REFUSED(MINIMAL "    lease: 30s\n", "t.yaml:8: ",
                  "routes[0].lease: 30s is not longer than upstream.timeout (30s): the lease must "
                  "outlive the upstream timeout");
    CHECK_REFUSED("principal: {header: X}\n"
                  "routes:\n"
                  "  - match: POST /a\n"
                  "    operation: a\n"
                  "    lease: 5s\n"
                  "upstream: {url: 'http://h:1', timeout: 1m}\n",
                  "t.yaml:5: ", "routes[0].lease: 5s is not longer than upstream.timeout (1m)");

    /* Statuses. */
    CHECK_REFUSED(MINIMAL "    store_statuses: [2xx, 503]\n", "t.yaml:8: ",
                  "routes[0].store_statuses[1]: 5xx answers are never stored: a retry must be "
                  "able to run again");
    CHECK_REFUSED(MINIMAL "    store_statuses:\n      - 2xx\n      - 5xx\n",
                  "t.yaml:10: ", "routes[0].store_statuses[1]: 5xx answers are never stored");
    CHECK_REFUSED(MINIMAL "    store_statuses: [599]\n", "t.yaml:8: ", "5xx answers are never");
    CHECK_REFUSED(MINIMAL "    store_statuses: [600]\n", "t.yaml:8: ",
                  "routes[0].store_statuses[0]: expected a status class such as 2xx or a status "
                  "from 100 to 499, not \"600\"");
    CHECK_REFUSED(MINIMAL "    store_statuses: [99, 2xx]\n", "t.yaml:8: ", "expected a status");
    CHECK_REFUSED(MINIMAL "    store_statuses: [6xx]\n", "t.yaml:8: ", "expected a status");
    CHECK_REFUSED(MINIMAL "    store_statuses: [2x]\n", "t.yaml:8: ", "expected a status");
    CHECK_REFUSED(MINIMAL "    store_statuses: []\n",
                  "t.yaml:8: ", "routes[0].store_statuses: expected a non-empty list");
    CHECK_REFUSED(MINIMAL "    store_statuses: 2xx\n",
                  "t.yaml:8: ", "routes[0].store_statuses: expected a non-empty list");

    /* Stored headers. */
    CHECK_REFUSED(MINIMAL "    store_headers: [Content-Type, Set-Cookie]\n",
                  "t.yaml:8: ", "routes[0].store_headers[1]: Set-Cookie is never stored");
    CHECK_REFUSED(MINIMAL "    store_headers: [set-cookie]\n",
                  "t.yaml:8: ", "Set-Cookie is never stored");
    CHECK_REFUSED(MINIMAL "    store_headers:\n      - ETag\n      - Connection\n", "t.yaml:10: ",
                  "routes[0].store_headers[1]: Connection is a hop-by-hop header: it describes "
                  "one connection");
    CHECK_REFUSED(MINIMAL "    store_headers: [transfer-encoding]\n",
                  "t.yaml:8: ", "Transfer-Encoding is a hop-by-hop header");
    CHECK_REFUSED(MINIMAL "    store_headers: [TE]\n", "t.yaml:8: ", "TE is a hop-by-hop header");
    CHECK_REFUSED(MINIMAL "    store_headers: [Proxy-Authenticate]\n",
                  "t.yaml:8: ", "Proxy-Authenticate is a hop-by-hop header");
    CHECK_REFUSED(MINIMAL "    store_headers: [Content-Length]\n",
                  "t.yaml:8: ", "routes[0].store_headers[0]: Content-Length is not stored");
    CHECK_REFUSED(MINIMAL "    store_headers: ['Content Type']\n",
                  "t.yaml:8: ", "routes[0].store_headers[0]: expected a header name");
    CHECK_REFUSED(MINIMAL "    store_headers: [ETag, etag]\n",
                  "t.yaml:8: ", "routes[0].store_headers[1]: etag is listed twice");

    /* Stored bodies. */
    CHECK_REFUSED(MINIMAL "    max_stored_body: 32MiB\n", "t.yaml:8: ",
                  "routes[0].max_stored_body: 32MiB is more than upstream.max_response_size "
                  "(16MiB)");
    CHECK_REFUSED(MINIMAL "    max_stored_body: 0\n",
                  "t.yaml:8: ", "routes[0].max_stored_body: expected a size from 1 byte");

    /* Templates. */
    CHECK_REFUSED(MINIMAL "  - match: POST v1/refunds\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: the path must start with '/'");
    CHECK_REFUSED(MINIMAL "  - match: post /v1/refunds\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: expected \"METHOD /path\"");
    CHECK_REFUSED(MINIMAL "  - match: /v1/refunds\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: expected \"METHOD /path\"");
    CHECK_REFUSED(MINIMAL "  - match: POST  /v1/refunds\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: the path must start with '/'");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/refunds?x=1\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: no query string ('?') in a route's path");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/refunds/{id}x\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: a path parameter is a whole segment {name}");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/{1id}\n    operation: r\n",
                  "t.yaml:8: ", "a path parameter is a whole segment");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/{}\n    operation: r\n",
                  "t.yaml:8: ", "a path parameter is a whole segment");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/{id}/x/{id}\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: the parameter {id} appears twice");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/a b\n    operation: r\n",
                  "t.yaml:8: ", "routes[1].match: byte 0x20 is not allowed in a path");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/%zz\n    operation: r\n",
                  "t.yaml:8: ", "byte 0x25 is not allowed in a path");

    /* Duplicate routes and operations name both lines. */
    CHECK_REFUSED("upstream: {url: 'http://h:1'}\n"
                  "principal: {header: X}\n"
                  "routes:\n"
                  "  - match: POST /v1/orders/{id}/refunds\n"
                  "    operation: a\n"
                  "  - match: POST /v1/orders\n"
                  "    operation: b\n"
                  "  - operation: c\n"
                  "    match: POST /v1/orders/{order}/refunds\n",
                  "t.yaml:9: ",
                  "routes[2].match: \"POST /v1/orders/{order}/refunds\" is the same route as "
                  "routes[0] at line 4");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/refunds\n    operation: payments.create\n",
                  "t.yaml:9: ",
                  "routes[1].operation: \"payments.create\" is already the operation of "
                  "routes[0] at line 7");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/refunds\n    operation: 'payments create'\n",
                  "t.yaml:9: ", "routes[1].operation: expected an operation name");
    CHECK_REFUSED(MINIMAL "  - match: POST /v1/refunds\n    operation: "
                          "a234567890123456789012345678901234567890123456789012345678901234x\n",
                  "t.yaml:9: ", "routes[1].operation: expected an operation name");

    /* Keys and fingerprints. */
    CHECK_REFUSED(MINIMAL "    key:\n      header: X-Key\n      body: [/id]\n",
                  "t.yaml:10: ", "routes[0].key: header and body are mutually exclusive");
    CHECK_REFUSED(MINIMAL "    key:\n      body: [requestId]\n", "t.yaml:9: ",
                  "routes[0].key.body[0]: expected a JSON pointer such as /requestId");
    CHECK_REFUSED(MINIMAL "    key:\n      body: [/a, /b~2]\n",
                  "t.yaml:9: ", "routes[0].key.body[1]: expected a JSON pointer");
    CHECK_REFUSED(MINIMAL "    key:\n      body: [/a~]\n", "t.yaml:9: ", "expected a JSON pointer");
    CHECK_REFUSED(MINIMAL "    key:\n      body: /requestId\n",
                  "t.yaml:9: ", "routes[0].key.body: expected a list of 1 to 16 JSON pointers");
    CHECK_REFUSED(MINIMAL "    key:\n      body: []\n", "t.yaml:9: ", "not an empty list");
    CHECK_REFUSED(MINIMAL "    key:\n      body: [~]\n",
                  "t.yaml:9: ", "routes[0].key.body[0]: expected a JSON pointer");
    CHECK_REFUSED(MINIMAL "    key: {header: 'Idempotency Key'}\n",
                  "t.yaml:8: ", "routes[0].key.header: expected a header name");
    CHECK_REFUSED(MINIMAL "    fingerprint: all\n", "t.yaml:8: ",
                  "routes[0].fingerprint: expected body, none or a list of JSON pointers");
    CHECK_REFUSED(MINIMAL "    fingerprint: [/a, b]\n",
                  "t.yaml:8: ", "routes[0].fingerprint[1]: expected a JSON pointer");

    /* Unknown outcomes. */
    CHECK_REFUSED(MINIMAL "    on_unknown: retry\n", "t.yaml:8: ",
                  "routes[0].on_unknown: expected hold, resend or {reconcile: \"GET /path\"}");
    CHECK_REFUSED(MINIMAL "    on_unknown: {}\n",
                  "t.yaml:8: ", "routes[0].on_unknown: missing required key \"reconcile\"");
    CHECK_REFUSED(MINIMAL "    on_unknown: {resend: true}\n", "t.yaml:8: ",
                  "unknown key \"resend\" in routes[0].on_unknown; expected one of: reconcile");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: POST /v1/payments/check\n",
                  "t.yaml:9: ", "routes[0].on_unknown.reconcile: expected \"GET /path\"");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: GET v1/payments\n",
                  "t.yaml:9: ", "routes[0].on_unknown.reconcile: expected \"GET /path\"");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: 'GET /v1/payments?id={id}'\n",
                  "t.yaml:9: ",
                  "routes[0].on_unknown.reconcile: {id} is neither {key} nor a parameter of "
                  "/v1/payments");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: 'GET /v1/payments?id={KEY}'\n",
                  "t.yaml:9: ", "{KEY} is neither {key} nor a parameter");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: 'GET /v1/payments?id={}'\n",
                  "t.yaml:9: ", "{} is neither {key} nor a parameter");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: 'GET /v1/payments?id={key'\n",
                  "t.yaml:9: ", "routes[0].on_unknown.reconcile: a '{' without its '}'");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: 'GET /v1/payments?id={{key}}'\n",
                  "t.yaml:9: ", "a '{' without its '}'");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: 'GET /v1/payments?id=key}'\n",
                  "t.yaml:9: ", "a '}' without its '{'");
    CHECK_REFUSED(MINIMAL "    on_unknown:\n      reconcile: 'GET /v1/payments?id={key} x'\n",
                  "t.yaml:9: ", "byte 0x20 is not allowed; percent-encode it");
}

/* The route cap: 1000 routes load, 1001 do not. */
static void test_route_cap(void)
{
    struct gw_config *cfg = NULL;
    size_t cap = 128 * 1024, len;
    char *text = malloc(cap);
    char err[512];
    int i;

    CHECK(text != NULL);
    if (text == NULL)
        return;
    len = (size_t)snprintf(text, cap,
                           "upstream: {url: 'http://h:1'}\nprincipal: {header: X}\n"
                           "routes:\n");
    for (i = 0; i < 1001; i++)
        len +=
            (size_t)snprintf(text + len, cap - len, "- {match: POST /r%d, operation: o%d}\n", i, i);
    CHECK(len < cap);
    CHECK(refused("t.yaml", text, len, "t.yaml:4: ", "routes: 1001 routes; at most 1000"));
    len -= strlen("- {match: POST /r1000, operation: o1000}\n");
    CHECK_INT(gw_config_parse("t.yaml", text, len, &cfg, err, sizeof err), 0);
    if (cfg != NULL) {
        CHECK_INT(cfg->nroutes, 1000);
        CHECK_INT(cfg->routes[999].line, 1003);
        CHECK_STR(cfg->routes[999].operation, "o999");
    }
    gw_config_free(cfg);
    free(text);
}

/* A message never overflows the caller's buffer and is always terminated. */
static void test_truncation(void)
{
    static const char text[] = "upstreams: 1\n";
    struct gw_config *cfg = NULL;
    char err[16];

    memset(err, 'x', sizeof err);
    CHECK_INT(gw_config_parse("t.yaml", text, strlen(text), &cfg, err, 10), -1);
    CHECK(cfg == NULL);
    CHECK_STR(err, "t.yaml:1:");
    CHECK(err[10] == 'x');
    CHECK_INT(gw_config_parse("t.yaml", text, strlen(text), &cfg, NULL, 0), -1);
    CHECK_INT(gw_config_parse("t.yaml", text, strlen(text), &cfg, err, 1), -1);
    CHECK_STR(err, "");
    /* A cut through a multi-byte character drops the whole character. */
    CHECK_INT(gw_config_parse("\xc3\xa9t\xc3\xa9.yaml", text, strlen(text), &cfg, err, 5), -1);
    CHECK_STR(err, "\xc3\xa9t");
    CHECK_INT(gw_config_parse("\xc3\xa9t\xc3\xa9.yaml", text, strlen(text), &cfg, err, 6), -1);
    CHECK_STR(err, "\xc3\xa9t\xc3\xa9");
}

/* ---- files ----------------------------------------------------------------------------------- */

static void test_files(void)
{
    static const char secret40[] = "0123456789abcdef0123456789abcdef01234567\n";
    static const char pem[] = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n"
                              "-----END PUBLIC KEY-----\n";
    struct gw_config *cfg = NULL;
    char path[256], other[256], prefix[300], part[400], text[1024], err[512];

    /* A file that is not there: the file's name, no line. */
    tmp_path(path, sizeof path, "missing.yaml");
    snprintf(prefix, sizeof prefix, "%s: ", path);
    CHECK(load_refused(path, prefix, "cannot read: No such file or directory"));
    CHECK(load_refused(tmpdir, "", ": cannot read: Is a directory"));

    /* HS256: the secret relative to the config's directory, its newline dropped. */
    tmp_path(path, sizeof path, "jwt.secret");
    write_file(path, secret40, strlen(secret40));
    tmp_path(path, sizeof path, "hs.yaml");
    snprintf(text, sizeof text,
             "upstream: {url: 'http://h:1'}\n"
             "principal:\n"
             "  jwt:\n"
             "    alg: HS256\n"
             "    secret_file: jwt.secret\n"
             "    issuer: https://auth.example\n"
             "    audience: payments\n");
    write_file(path, text, strlen(text));
    CHECK_INT(gw_config_load(path, &cfg, err, sizeof err), 0);
    if (cfg != NULL) {
        CHECK_STR(cfg->file, path);
        CHECK_INT(cfg->jwt_require_exp, 1); /* the default: a token without exp names no one */
        CHECK_INT(cfg->principal, GW_PRINCIPAL_JWT);
        CHECK_INT(cfg->jwt_alg, GW_JWT_HS256);
        CHECK_INT(cfg->jwt_key_len, 40);
        CHECK(cfg->jwt_key != NULL && memcmp(cfg->jwt_key, secret40, 40) == 0 &&
              cfg->jwt_key[40] == '\0');
        CHECK_STR(cfg->jwt_issuer, "https://auth.example");
        CHECK_STR(cfg->jwt_audience, "payments");
        gw_config_free(cfg);
        cfg = NULL;
    } else {
        fprintf(stderr, "hs.yaml: %s\n", err);
    }

    /* An absolute secret path, a secret with bytes a text file would not have. */
    tmp_path(other, sizeof other, "binary.secret");
    memset(text, 0, 32);
    text[5] = '\n';
    write_file(other, text, 32);
    snprintf(text, sizeof text,
             "upstream: {url: 'http://h:1'}\n"
             "principal: {jwt: {alg: HS256, secret_file: '%s'}}\n",
             other);
    CHECK_INT(gw_config_parse("elsewhere/x.yaml", text, strlen(text), &cfg, err, sizeof err), 0);
    if (cfg != NULL) {
        CHECK_INT(cfg->jwt_key_len, 32);
        gw_config_free(cfg);
        cfg = NULL;
    }

    /* Too short, even with its newline. */
    tmp_path(other, sizeof other, "short.secret");
    write_file(other, "0123456789abcdef0123456789abcde\n", 32);
    snprintf(text, sizeof text,
             "upstream: {url: 'http://h:1'}\n"
             "principal:\n"
             "  jwt:\n"
             "    alg: HS256\n"
             "    secret_file: short.secret\n");
    write_file(path, text, strlen(text));
    snprintf(prefix, sizeof prefix, "%s:5: ", path);
    snprintf(part, sizeof part,
             "principal.jwt.secret_file: %s holds 31 bytes; an HS256 secret needs at least 32",
             other);
    CHECK(load_refused(path, prefix, part));

    /* Missing. */
    snprintf(text, sizeof text,
             "upstream: {url: 'http://h:1'}\n"
             "principal:\n"
             "  jwt:\n"
             "    alg: HS256\n"
             "    secret_file: nowhere.secret\n");
    write_file(path, text, strlen(text));
    tmp_path(other, sizeof other, "nowhere.secret");
    snprintf(part, sizeof part,
             "principal.jwt.secret_file: cannot read %s: No such file or directory", other);
    CHECK(load_refused(path, prefix, part));

    /* Not a regular file. */
    snprintf(text, sizeof text,
             "upstream: {url: 'http://h:1'}\n"
             "principal:\n"
             "  jwt:\n"
             "    alg: HS256\n"
             "    secret_file: /dev/null\n");
    write_file(path, text, strlen(text));
    CHECK(load_refused(path, prefix, "cannot read /dev/null: not a regular file"));

    /* RS256: a PEM public key; anything else is refused. */
    tmp_path(other, sizeof other, "jwt.pem");
    write_file(other, pem, strlen(pem));
    snprintf(text, sizeof text,
             "upstream: {url: 'http://h:1'}\n"
             "principal:\n"
             "  jwt:\n"
             "    alg: RS256\n"
             "    public_key_file: jwt.pem\n"
             "    require_exp: false\n");
    write_file(path, text, strlen(text));
    CHECK_INT(gw_config_load(path, &cfg, err, sizeof err), 0);
    if (cfg != NULL) {
        CHECK_INT(cfg->jwt_require_exp, 0);
        CHECK_INT(cfg->jwt_alg, GW_JWT_RS256);
        CHECK_STR(cfg->jwt_key, pem);
        CHECK_INT(cfg->jwt_key_len, strlen(pem));
        CHECK(cfg->jwt_issuer == NULL && cfg->jwt_audience == NULL);
        gw_config_free(cfg);
        cfg = NULL;
    } else {
        fprintf(stderr, "rs.yaml: %s\n", err);
    }
    write_file(other, "-----BEGIN RSA PRIVATE KEY-----\n", 32);
    snprintf(part, sizeof part,
             "principal.jwt.public_key_file: %s is not a PEM public key (-----BEGIN PUBLIC KEY",
             other);
    CHECK(load_refused(path, prefix, part));

    tmp_path(path, sizeof path, "hs.yaml");
    unlink(path);
    tmp_path(path, sizeof path, "jwt.secret");
    unlink(path);
    tmp_path(path, sizeof path, "binary.secret");
    unlink(path);
    tmp_path(path, sizeof path, "short.secret");
    unlink(path);
    tmp_path(path, sizeof path, "jwt.pem");
    unlink(path);
}

/* ---- client conventions: error_format, instance, scope_headers, store_retryable ------------- */

static void test_client_conventions(void)
{
    struct gw_config *cfg = parse_ok(MINIMAL);

    /* Defaults: problem+json, no instance name, no scope header, retryable answers not stored. */
    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_INT(cfg->error_format, GW_ERRORS_PROBLEM);
        CHECK(cfg->instance == NULL);
        CHECK_INT(cfg->routes[0].nscope_headers, 0);
        CHECK_INT(cfg->routes[0].store_retryable, 0);
        CHECK_INT(cfg->routes[0].nstore_headers, 4);
    }
    gw_config_free(cfg);

    /* Stripe's format (written after the routes, still their default store_headers). */
    cfg = parse_ok(MINIMAL "    scope_headers: [Stripe-Account]\n"
                           "    store_retryable: true\n"
                           "  - match: POST /v1/refunds\n"
                           "    operation: refunds.create\n"
                           "    store_headers: [Content-Type]\n"
                           "error_format: stripe\n"
                           "instance: gw-a.1\n");
    CHECK(cfg != NULL);
    if (cfg != NULL) {
        CHECK_INT(cfg->error_format, GW_ERRORS_STRIPE);
        CHECK_STR(cfg->instance, "gw-a.1");
        CHECK_INT(cfg->routes[0].nscope_headers, 1);
        CHECK_STR(cfg->routes[0].scope_headers[0], "Stripe-Account");
        CHECK_INT(cfg->routes[0].store_retryable, 1);
        CHECK_INT(cfg->routes[0].nstore_headers, 6);
        CHECK_STR(cfg->routes[0].store_headers[4], "Request-Id");
        CHECK_STR(cfg->routes[0].store_headers[5], "Stripe-Version");
        CHECK_INT(cfg->routes[1].nstore_headers, 1); /* written: as written */
        CHECK_INT(cfg->routes[1].nscope_headers, 0);
    }
    gw_config_free(cfg);

    CHECK_REFUSED(MINIMAL "error_format: json\n",
                  "t.yaml:8: ", "error_format: expected problem or stripe, not \"json\"");
    CHECK_REFUSED(MINIMAL "instance: gw:a\n",
                  "t.yaml:8: ", "instance: expected a name of letters, digits, '.', '_' and '-'");
    CHECK_REFUSED(MINIMAL "instance: ''\n", "t.yaml:8: ", "instance: expected a name");
    CHECK_REFUSED(MINIMAL "    scope_headers: [Authorization]\n", "t.yaml:8: ",
                  "routes[0].scope_headers[0]: Authorization cannot be a scope header");
    CHECK_REFUSED(MINIMAL "    scope_headers: [Stripe-Account, stripe-account]\n",
                  "t.yaml:8: ", "routes[0].scope_headers[1]: stripe-account is listed twice");
    CHECK_REFUSED(MINIMAL "    scope_headers: Stripe-Account\n",
                  "t.yaml:8: ", "routes[0].scope_headers: expected a list of at most");
    CHECK_REFUSED(MINIMAL "    store_retryable: maybe\n",
                  "t.yaml:8: ", "routes[0].store_retryable: expected");
}

/* ---- the table of keys ----------------------------------------------------------------------- */

#define REFERENCE "../../docs/gateway.md"
#define MAX_TABLE_KEYS 128

/* A row of the reference's table: the key and its default cell, as written. */
struct doc_row {
    char path[64];
    char def[400];
    int used;
};

/* The rows of docs/gateway.md's "Config reference" table; how many, -1 if it cannot be read. */
static int read_reference(struct doc_row *rows, int cap)
{
    char line[4096];
    FILE *f = fopen(REFERENCE, "r");
    int in_section = 0, n = 0;

    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL) {
        char *path, *path_end, *cell, *cell_end;

        if (strncmp(line, "## ", 3) == 0)
            in_section = strncmp(line, "## Config reference", 19) == 0;
        if (!in_section || strncmp(line, "| `", 3) != 0 || n == cap)
            continue;
        path = line + 3;
        path_end = strchr(path, '`');
        cell = path_end != NULL ? strchr(path_end, '|') : NULL;
        cell_end = cell != NULL ? strchr(cell + 1, '|') : NULL;
        if (cell_end == NULL)
            continue;
        snprintf(rows[n].path, sizeof rows[n].path, "%.*s", (int)(path_end - path), path);
        cell++;
        while (*cell == ' ')
            cell++;
        while (cell_end > cell && cell_end[-1] == ' ')
            cell_end--;
        snprintf(rows[n].def, sizeof rows[n].def, "%.*s", (int)(cell_end - cell), cell);
        rows[n].used = 0;
        n++;
    }
    fclose(f);
    return n;
}

/* "30s", "24h", "500ms", "1MiB", "16GiB", "64" as the config reads them; -1 if none of those. */
static long long scaled(const char *s)
{
    static const struct {
        const char *suffix;
        long long scale;
    } units[] = {{"ms", 1},          {"s", 1000},        {"m", 60000},
                 {"h", 3600000},     {"d", 86400000},    {"KiB", 1LL << 10},
                 {"MiB", 1LL << 20}, {"GiB", 1LL << 30}, {"", 1}};
    char *end;
    long long v = strtoll(s, &end, 10);
    size_t i;

    if (end == s)
        return -1;
    for (i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0)
            return v * units[i].scale;
    }
    return -1;
}

/* Whether the reference's default cell says what the row's default is. */
static int same_default(const struct gw_config_key *k, const char *cell)
{
    char quoted[200], value[200];
    size_t n;

    if (strcmp(cell, k->def) == 0)
        return 1;
    snprintf(quoted, sizeof quoted, "`%s`", k->def);
    n = strlen(quoted);
    if (strcmp(cell, quoted) == 0 || (strncmp(cell, quoted, n) == 0 && cell[n] == ' '))
        return 1;
    /* A number may be written in another unit: 24h is 1d. */
    if (k->has_value && (strcmp(k->type, "duration") == 0 || strcmp(k->type, "size") == 0) &&
        cell[0] == '`' && strlen(cell) > 2 && strlen(cell) < sizeof value) {
        snprintf(value, sizeof value, "%.*s", (int)strlen(cell) - 2, cell + 1);
        return scaled(value) == (long long)k->def_value;
    }
    return 0;
}

/*
 * Every row's default is within its bounds and goes into a field of a size the reader writes;
 * every key is a row of the reference's table with the same default, and the table names no key
 * the reader does not take.
 */
static void test_key_table(void)
{
    struct gw_config_key keys[MAX_TABLE_KEYS];
    struct doc_row doc[MAX_TABLE_KEYS];
    size_t n = gw_config_keys(keys, MAX_TABLE_KEYS), i;
    int ndoc = read_reference(doc, MAX_TABLE_KEYS), j, found;

    CHECK(n > 40 && n <= MAX_TABLE_KEYS);
    CHECK(ndoc > 40);
    if (n > MAX_TABLE_KEYS)
        n = MAX_TABLE_KEYS;
    for (i = 0; i < n; i++) {
        const struct gw_config_key *k = &keys[i];

        if (k->bounded && k->has_value && (k->def_value < k->min || k->def_value > k->max)) {
            fprintf(stderr, "%s: default %lld not in [%lld, %lld]\n", k->path,
                    (long long)k->def_value, (long long)k->min, (long long)k->max);
            CHECK(0);
        }
        if (k->has_value)
            CHECK(k->field_size == 4 || k->field_size == 8);
        found = 0;
        for (j = 0; j < ndoc && !found; j++) {
            if (strcmp(doc[j].path, k->path) != 0)
                continue;
            found = doc[j].used = 1;
            if (!same_default(k, doc[j].def)) {
                fprintf(stderr, "%s: the reference's default is \"%s\", the row's \"%s\"\n",
                        k->path, doc[j].def, k->def);
                CHECK(0);
            }
        }
        if (!found) {
            fprintf(stderr, "%s: not in the reference (%s)\n", k->path, REFERENCE);
            CHECK(0);
        }
    }
    for (j = 0; j < ndoc; j++) {
        if (!doc[j].used) {
            fprintf(stderr, "%s: in the reference, but no key of the reader\n", doc[j].path);
            CHECK(0);
        }
    }
}

/*
 * `value` written for key `path` ("upstream.timeout", "routes[].wait") in the smallest file that
 * has that section: the text, the line of the value and the key's path in messages.
 */
static int key_file(const char *path, const char *value, char *text, size_t cap, int *line,
                    char *shown, size_t shown_cap)
{
    const char *dot = strrchr(path, '.');

    if (strncmp(path, "routes[].", 9) == 0 && strchr(path + 9, '.') == NULL) {
        snprintf(text, cap, MINIMAL "    %s: %s\n", path + 9, value);
        snprintf(shown, shown_cap, "routes[0].%s", path + 9);
        *line = 8;
    } else if (strncmp(path, "upstream.", 9) == 0) {
        snprintf(text, cap, "upstream:\n  url: http://h:1\n  %s: %s\n", path + 9, value);
        snprintf(shown, shown_cap, "%s", path);
        *line = 3;
    } else if (dot == NULL) {
        snprintf(text, cap, "upstream: {url: 'http://h:1'}\n%s: %s\n", path, value);
        snprintf(shown, shown_cap, "%s", path);
        *line = 2;
    } else if (strchr(path, '.') == dot && strchr(path, '[') == NULL) {
        snprintf(text, cap, "upstream: {url: 'http://h:1'}\n%.*s:\n  %s: %s\n", (int)(dot - path),
                 path, dot + 1, value);
        snprintf(shown, shown_cap, "%s", path);
        *line = 3;
    } else {
        return 0;
    }
    return 1;
}

/*
 * Every bounded key: its default written out is taken, one past either bound is refused with the
 * line and the key's path, and so is a value of the wrong type.
 */
static void test_key_bounds(void)
{
    struct gw_config_key keys[MAX_TABLE_KEYS];
    size_t n = gw_config_keys(keys, MAX_TABLE_KEYS), i, tried = 0;
    char text[1024], shown[96], value[32], prefix[32], part[160];
    struct gw_config *cfg;
    int line;

    if (n > MAX_TABLE_KEYS)
        n = MAX_TABLE_KEYS;
    for (i = 0; i < n; i++) {
        const struct gw_config_key *k = &keys[i];

        if (!k->bounded)
            continue;
        if (k->has_value) {
            snprintf(value, sizeof value, "%lld", (long long)k->def_value);
            if (key_file(k->path, value, text, sizeof text, &line, shown, sizeof shown)) {
                cfg = parse_ok(text);
                CHECK(cfg != NULL);
                gw_config_free(cfg);
            }
        }
        if (!key_file(k->path, "x", text, sizeof text, &line, shown, sizeof shown))
            continue;
        tried++;
        snprintf(prefix, sizeof prefix, "t.yaml:%d: ", line);
        snprintf(part, sizeof part, "%s: expected a", shown);
        CHECK_REFUSED(text, prefix, part);
        snprintf(value, sizeof value, "%lld", (long long)k->max + 1);
        key_file(k->path, value, text, sizeof text, &line, shown, sizeof shown);
        snprintf(part, sizeof part, "%s: expected a%s %s from ", shown,
                 strcmp(k->type, "integer") == 0 ? "n" : "", k->type);
        CHECK_REFUSED(text, prefix, part);
        CHECK_REFUSED(text, prefix, value);
        if (k->min > 0) {
            snprintf(value, sizeof value, "%lld", (long long)k->min - 1);
            key_file(k->path, value, text, sizeof text, &line, shown, sizeof shown);
            CHECK_REFUSED(text, prefix, part);
        }
    }
    CHECK(tried >= 14);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gateway_test_config.XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_example();
    test_defaults();
    test_values();
    test_document_errors();
    test_type_errors();
    test_upstream_tls();
    test_listen_tls();
    test_upstream_errors();
    test_principal_errors();
    test_limits_errors();
    test_principal_limits();
    test_route_errors();
    test_client_conventions();
    test_route_cap();
    test_truncation();
    test_files();
    test_key_table();
    test_key_bounds();
    if (rmdir(tmpdir) != 0)
        perror(tmpdir);
    return t_done();
}
