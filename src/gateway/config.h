/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.h - idem-gateway's configuration: a YAML file (read with libyaml, Debian's libyaml-0-2)
 * that names the listeners, the store, the upstream, where the principal comes from, and the
 * routes whose writes are made idempotent, each with its policy.  docs/gateway.md is the reference
 * of every key; examples/gateway.yaml is a complete file.
 *
 * Loading is strict: an unknown key, a value of the wrong type or out of range, a duplicate route
 * or a route that can never be keyed is an error naming the file, the line and what was expected,
 * e.g. "gateway.yaml:12: routes[1].retention: expected a duration such as 30s, 15m or 24h".
 * Nothing here touches the network or the store: the program opens those once the file is good.
 */
#ifndef IDEM_GATEWAY_CONFIG_H
#define IDEM_GATEWAY_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "http_server.h" /* struct http_limits */

/* Where a route's idempotency key comes from. */
enum gw_key_source {
    GW_KEY_HEADER, /* a request header, "Idempotency-Key" unless `key.header` names another */
    GW_KEY_BODY,   /* JSON pointers into the body (`key.body`), first present one wins */
};

/* What of the body goes into the fingerprint (method, route template and path values always do). */
enum gw_fp_body {
    GW_FP_BODY_ALL,      /* the RFC 8785 form of the whole body (default) */
    GW_FP_BODY_POINTERS, /* the values at `fingerprint: [/a, /b]` only */
    GW_FP_BODY_NONE,     /* not the body at all */
};

/* What the gateway does when it cannot know whether the upstream acted. */
enum gw_unknown_mode {
    GW_UNKNOWN_HOLD,      /* default: 503 outcome-unknown to every retry until resolved */
    GW_UNKNOWN_RESEND,    /* forward again with the same key (upstreams that dedupe on it) */
    GW_UNKNOWN_RECONCILE, /* ask the upstream: GET reconcile_path; 2xx settles, 404 releases */
};

/* Where the principal (the scope's first part) comes from. */
enum gw_principal_source {
    GW_PRINCIPAL_HEADER,        /* a header set by an auth layer in front (`principal.header`) */
    GW_PRINCIPAL_AUTHORIZATION, /* SHA-256 of the Authorization header (`principal: authorization`)
                                 */
    GW_PRINCIPAL_JWT,           /* `sub` of a JWT in "Authorization: Bearer" (`principal.jwt`) */
};

enum gw_jwt_alg { GW_JWT_HS256, GW_JWT_RS256 };

/* How the gateway writes the errors it answers itself (error_format.h). */
enum gw_error_format {
    GW_ERRORS_PROBLEM, /* default: RFC 9457 application/problem+json */
    GW_ERRORS_STRIPE,  /* Stripe's {"error": {"type", "code", "message"}}, Stripe-Should-Retry */
};

/* Highest HTTP status + 1, for the per-status tables. */
#define GW_STATUS_LIMIT 600

struct gw_route {
    int line; /* where the route starts in the file, for messages */

    char *method;       /* upper-case, "POST" */
    char *path;         /* template as written, "/v1/orders/{id}/refunds" */
    char *operation;    /* the scope's operation name, "refunds.create" */
    int case_sensitive; /* 0 (default): literal path segments match ignoring ASCII case */

    int key_required; /* 1 (default): a request without a key is 400 */
    /*
     * `key.forward`: how the upstream gets the key as Idempotency-Key.  1 (token; the default
     * for a key from a header): bare, as a client sends it, when it reads back the same so
     * (no quote first, no space or comma), else as an sf-string; 0 (sf-string; the default for a
     * key from the body): always an RFC 8941 sf-string ("k-1").
     */
    int key_forward_token;
    enum gw_key_source key_source;
    char *key_header;    /* GW_KEY_HEADER: the header's name ("Idempotency-Key") */
    char **key_pointers; /* GW_KEY_BODY: RFC 6901 pointers, "/requestId" */
    size_t nkey_pointers;

    enum gw_fp_body fp_body;
    char **fp_pointers; /* GW_FP_BODY_POINTERS */
    size_t nfp_pointers;
    /*
     * 1 (default): the query string, as sent, is part of the fingerprint, so a retry with another
     * `?amount=` is a mismatch, not a replay.  0: left out (`fingerprint_query: false`).
     */
    int fp_query;

    int64_t retention_ms; /* record retention (24 h) */
    int64_t lease_ms;     /* lease of the gateway forwarding a request (upstream timeout + 10 s) */
    int64_t wait_ms;      /* how long a duplicate waits for the first before 409 (2 s) */

    /*
     * store_status[s] is 1 when an upstream answer with status s is stored and replayed.  Default:
     * 2xx and 4xx except 400, 401, 403, 408, 413, 415, 429.  1xx, 3xx... as listed; 5xx never
     * (a config that asks for one is an error).
     */
    unsigned char store_status[GW_STATUS_LIMIT];
    /* Response headers stored with the answer (default Content-Type, Location, ETag, Link);
     * Set-Cookie and hop-by-hop headers are refused at load. */
    char **store_headers;
    size_t nstore_headers;
    size_t max_stored_body; /* larger answers are passed through and not stored (1 MiB) */
    /*
     * 0 (default): an answer the upstream marks retryable (Stripe-Should-Retry: true, or any
     * Retry-After) is not stored, whatever its status: the record is released, a retry runs.
     */
    int store_retryable;
    /*
     * Request headers whose values join the principal in the record's scope (Stripe-Account: one
     * API key acting for several accounts).  Forwarded unchanged, and sent with reconcile queries.
     */
    char **scope_headers;
    size_t nscope_headers;

    enum gw_unknown_mode unknown;
    char *reconcile_path; /* GW_UNKNOWN_RECONCILE: "/v1/orders?requestId={key}" ({key} and the
                             route's {params} are substituted, percent-encoded) */
    /*
     * Headers of the retry the reconcile query carries besides the fixed set (Host, Authorization,
     * the principal's header): those that change what the upstream's lookup finds (a tenant, an
     * API version).  Every other header of the retry stays out of the query.
     */
    char **reconcile_headers;
    size_t nreconcile_headers;
};

/* A request that carries an idempotency key to a method and path no route takes. */
enum gw_unrouted {
    GW_UNROUTED_PASS,   /* passed through, with a warning in the log (default) */
    GW_UNROUTED_REFUSE, /* 400 idempotency-key-unrouted, naming the routes */
};

/*
 * A listener's HTTPS (listen_tls, admin_listen_tls): its certificate chain and key (PEM, paths
 * relative to the config's directory), both NULL when it speaks plain HTTP.
 */
struct gw_listen_tls {
    char *cert_file;
    char *key_file;
};

struct gw_config {
    char *file; /* as given to gw_config_load, for messages */

    char *listen;       /* "127.0.0.1:8180" (default) */
    char *admin_listen; /* "127.0.0.1:8181" (default); loopback unless written otherwise */
    char *admin_token;  /* admin_token_file's token, or NULL: the admin API asks for none */
    char *store;        /* "sqlite:gateway.db" (default) or a PostgreSQL URI */
    char *store_file; /* a SQLite store's file (beside the config when written relative), or NULL */
    /*
     * This gateway's name among those sharing a PostgreSQL store ("gw-a"), or NULL.  Leases are
     * written as "<instance>:<pid>:<random>", so a restarted instance knows its earlier process's
     * records (restart.c).  NULL: the host's name (only SQLite, which one gateway serves, frees
     * an earlier process's records at start without it).
     */
    char *instance;
    enum gw_error_format error_format;

    /* listen_tls, admin_listen_tls: each listener's certificate and key, or plain HTTP */
    struct gw_listen_tls listen_tls;
    struct gw_listen_tls admin_listen_tls;

    char *upstream_url;  /* "http://HOST:PORT" or "https://HOST[:PORT]" (required), no path */
    char *upstream_host; /* split from upstream_url */
    uint16_t upstream_port;
    int upstream_tls; /* https: TLS to the upstream, its certificate and name verified */
    /* upstream.tls: files (relative to the config's directory) and the name; NULL when absent */
    char *upstream_tls_ca_file;     /* NULL: the system's CA store */
    char *upstream_tls_server_name; /* NULL: the URL's host */
    char *upstream_tls_cert_file;   /* with key_file: a client certificate (mTLS) */
    char *upstream_tls_key_file;
    int upstream_connect_timeout_ms; /* 2000 */
    int upstream_timeout_ms;         /* request sent to the end of the answer (30000) */
    int upstream_max_connections;    /* kept open to the upstream (64) */
    int upstream_keyed_fresh;        /* keyed_connections: fresh (default): a new connection per
                                        keyed request, never reused; 0 with pooled */
    size_t max_response_bytes;       /* largest answer passed through (16 MiB) */
    size_t max_body;                 /* largest request body, 413 above (1 MiB) */

    enum gw_principal_source principal;
    char *principal_header;  /* GW_PRINCIPAL_HEADER, "X-Consumer-Id" */
    enum gw_jwt_alg jwt_alg; /* GW_PRINCIPAL_JWT */
    char *jwt_key;           /* HS256: the secret's bytes; RS256: the PEM public key's text */
    size_t jwt_key_len;
    char *jwt_issuer;    /* NULL: not checked */
    char *jwt_audience;  /* NULL: not checked */
    int jwt_require_exp; /* 1 (default): a token without `exp` gives no principal */

    struct http_limits limits; /* `limits:` mapping, same names as the serve flags with '_' */

    /*
     * `principal_limits:` what one caller may make the gateway keep (quota.h); 0: no limit.
     * `max_stored_bytes`: the stored answers of every caller together.
     */
    int limit_keys_in_flight;      /* keyed requests of one principal at once (128) */
    int limit_new_keys_per_second; /* records one principal starts a second (100) */
    uint64_t limit_stored_bytes;   /* stored answers of one principal (1 GiB) */
    int limit_tracked;             /* principals accounted at once (10000) */
    uint64_t max_stored_bytes;     /* stored answers of every principal (16 GiB) */

    struct gw_route *routes;
    size_t nroutes;
    enum gw_unrouted unrouted_keys; /* `unrouted_keys`: pass (default) or refuse */

    /*
     * Headers that ask the upstream to run another method (X-HTTP-Method-Override...): refused,
     * like a `_method` argument, on paths with a keyed route (proxy.c, refuse_method_override).
     */
    char **method_override_headers;
    size_t nmethod_override_headers;
};

/*
 * Reads and checks `path`.  Returns 0 with *out (new, free with gw_config_free), or -1 with one
 * line in `err`: "<file>:<line>: <what is wrong and what is expected>" ("<file>: ..." when the
 * file as a whole is at fault: it cannot be read, it is too large).
 */
int gw_config_load(const char *path, struct gw_config **out, char *err, size_t errlen);

/* The same from `len` bytes of YAML text; `name` stands for the file in messages. */
int gw_config_parse(const char *name, const char *text, size_t len, struct gw_config **out,
                    char *err, size_t errlen);

void gw_config_free(struct gw_config *cfg);

/*
 * One key a config file may hold, as config.c's table of rows has it: for the reference
 * (docs/gateway.md) and the tests that hold the two together.
 */
struct gw_config_key {
    char path[64];    /* "upstream.timeout", "routes[].key.header", "limits.*" */
    const char *type; /* "bool", "integer", "duration", "size", "text", "word" or "custom" */
    char def[160];    /* the default as the reference writes it: "30s", "required", "" for none */
    int bounded;      /* integer, duration (ms), size (bytes): in [min, max] */
    int64_t min, max;
    int has_value; /* def_value is the default (a number or a bool, not derived) */
    int64_t def_value;
    size_t field_size; /* of the struct field a number goes into (0: none) */
};

/* Fills at most `cap` of `out` (in the rows' order) and returns how many keys there are. */
size_t gw_config_keys(struct gw_config_key *out, size_t cap);

#endif /* IDEM_GATEWAY_CONFIG_H */
