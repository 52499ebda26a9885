/* SPDX-License-Identifier: Apache-2.0 */
/*
 * method_override.h - whether a request asks the upstream to run it as another method than its
 * own.  Frameworks honour such a request from many places: a header (Express's method-override,
 * Symfony), a `_method` query argument or form field (Rails through Rack, Laravel, PHP), a
 * `_method` member of a JSON body (Laravel), in a body that body parsers inflate first (gzip,
 * deflate).  Each reads them its own way -- the first duplicate or the last, a comma list's first
 * item, field names decoded and PHP-mangled (`.method`, ` method`, `_method[]`) -- so the gateway
 * reads them all and refuses any that could name another method: on a path a keyed route covers,
 * an override would run a keyed handler unkeyed.
 */
#ifndef IDEM_GATEWAY_METHOD_OVERRIDE_H
#define IDEM_GATEWAY_METHOD_OVERRIDE_H

#include <stddef.h>

#include "http_server.h"

/*
 * Whether `rq` carries anything method_override_refuse() reads: a field of one of the `n`
 * `headers`, a query, a body.  Without any, it could only say 0, so a caller may skip what it
 * costs to decide whether the path is one to look at.
 */
int method_override_possible(const struct request *rq, char *const *headers, size_t n);

/*
 * Looks at every override source of `rq`: each field of the headers named in `headers` (`n` of
 * them, ASCII case ignored, '_' read as '-' as CGI, PHP and Rack do), every `_method` argument of
 * the query, and, in its body (inflated when its Content-Encoding is gzip or deflate, up to
 * `max_body` bytes), every `_method` field of a form (a body with no Content-Type is read as one)
 * or the top-level `_method` member of a JSON object.  A value is trimmed of white space and split
 * at commas; every item that is not empty must be `rq->method` (ASCII case ignored).
 *
 * Returns 0 when nothing asks for another method.  Otherwise the status of the refusal, with
 * `resp` the problem: 400 method-override-refused (a source names another method), 415
 * unsupported-media-type (a Content-Encoding the gateway cannot read), 413 body-too-large (the
 * body inflates past `max_body`), 400 bad-request (a compressed body that does not inflate, or a
 * JSON body the gateway cannot read that may hold `_method`).
 */
int method_override_refuse(const struct request *rq, char *const *headers, size_t n,
                           size_t max_body, struct response *resp);

#endif /* IDEM_GATEWAY_METHOD_OVERRIDE_H */
