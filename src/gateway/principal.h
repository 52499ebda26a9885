/* SPDX-License-Identifier: Apache-2.0 */
/*
 * principal.h - who is calling, for idem-gateway's scopes (principal + operation + key): one
 * caller can never be answered with another's stored response.  Three sources, chosen in the
 * config (config.h, docs/gateway.md):
 *
 *   - a header an auth layer in front sets ("X-Consumer-Id"): its value, as sent;
 *   - the Authorization header itself: "sha256:" and the hex SHA-256 of its value, so the store
 *     never holds a credential;
 *   - a JWT in "Authorization: Bearer <jwt>", verified with the configured HS256 secret or RS256
 *     public key (OpenSSL): "jwt:" and its `sub`.  The signature, `alg` (exactly the configured
 *     one; "none" never), `exp` and `nbf` (60 s leeway), and `iss` / `aud` when configured are
 *     checked; a token that fails any of them gives no principal.
 *
 * The prefixes keep the three spaces apart should a deployment change its source.  Everything
 * here is pure and cheap enough for an event-loop thread (an RS256 verify is ~30 µs).
 */
#ifndef IDEM_GATEWAY_PRINCIPAL_H
#define IDEM_GATEWAY_PRINCIPAL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* The longest principal produced; longer header values are refused. */
#define PRINCIPAL_MAX 256

struct principal_verifier;

/*
 * Prepares the source `cfg` names (for RS256: parses the PEM key once).  Returns 0 with *out (new,
 * free with principal_verifier_free), or -1 with a sentence in `err` (a key that does not parse).
 */
int principal_verifier_new(const struct gw_config *cfg, struct principal_verifier **out, char *err,
                           size_t errlen);
void principal_verifier_free(struct principal_verifier *v);

/*
 * The principal of a request, given a lookup of its header values (first value of a header, NULL
 * when absent; `value_len` receives its length).  `now_s` is the current Unix time (for exp/nbf).
 * Returns 0 with the NUL-terminated principal in `out`, or -1 with a short static reason in *why
 * ("no X-Consumer-Id header", "token expired", "bad signature"...) for the 401's detail.
 */
typedef const char *(*principal_header_fn)(void *arg, const char *name, size_t *value_len);
int principal_of(const struct principal_verifier *v, principal_header_fn header, void *arg,
                 int64_t now_s, char out[PRINCIPAL_MAX + 1], const char **why);

#endif /* IDEM_GATEWAY_PRINCIPAL_H */
