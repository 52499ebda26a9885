/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_key.h - the two things idem-gateway derives from a request's bytes before it may claim
 * a record: the idempotency key (from a header, or from JSON pointers into the body) and the
 * request fingerprint (method, route template, path parameters, and the body as the route's
 * policy says).  Pure and cheap: the event loop computes both to answer replays from memory.
 *
 * Bodies that are not JSON still have a fingerprint: a body whose Content-Type is not JSON, or that
 * does not parse as JSON, is fingerprinted by the SHA-256 of its bytes -- a gateway in front of any
 * API must not refuse what the upstream would take.  JSON bodies use RFC 8785, so key order and
 * white space do not make a retry look like a different request.
 */
#ifndef IDEM_GATEWAY_REQUEST_KEY_H
#define IDEM_GATEWAY_REQUEST_KEY_H

#include <stddef.h>

#include <jansson.h>

#include "idem/idem.h"

#include "route.h"

/*
 * The key of a GW_KEY_BODY route: the first of its pointers that names a string in the JSON body
 * (1..IDEM_KEY_MAX printable ASCII characters).  Returns 1 with `key` filled, 0 when no pointer
 * names a value (no key), or -1 with *why when the body is not JSON or the value is not a usable
 * key.
 */
int request_key_from_body(const struct gw_route *route, const char *body, size_t len,
                          char key[IDEM_KEY_MAX + 1], const char **why);

/*
 * The fingerprint of a request on `m`'s route.  `target` is the request target as sent (its query
 * string counts unless the route says fingerprint_query: false); `content_type` may be NULL.
 * Returns 0; -1 only when memory runs out (*why says so).
 */
int request_fingerprint(const struct route_match *m, const char *method, const char *target,
                        const char *content_type, const char *body, size_t len,
                        unsigned char fp[IDEM_FP_LEN], const char **why);

/*
 * The value at RFC 6901 pointer `ptr` in `doc` ("" is the whole document), or NULL.  Borrowed
 * from `doc`.
 */
json_t *json_pointer_get(json_t *doc, const char *ptr);

#endif /* IDEM_GATEWAY_REQUEST_KEY_H */
