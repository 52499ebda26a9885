/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_scope.h - whose record a request is, from its header fields: the principal joined with
 * the route's scope headers, their values trimmed as RFC 9110 says (so `acct_1`, `acct_1 ` and
 * `acct_1<TAB>` are one account), and the refusal of a request whose Connection header names a
 * header the gateway reads -- the caller, the account, the key, an override, the body's type or
 * coding: a proxy on the way would drop it (hop-by-hop), so the upstream would act on another
 * request than the one the gateway judged and recorded.
 */
#ifndef IDEM_GATEWAY_REQUEST_SCOPE_H
#define IDEM_GATEWAY_REQUEST_SCOPE_H

#include <stddef.h>

#include "idem/idem.h"

#include "config.h"
#include "http_server.h"

/*
 * Appends the route's scope headers to `principal` (in place): ";<Name>=<value>" per header in
 * the route's order (";<Name>" when absent), the value trimmed of white space and
 * percent-encoded but for unreserved bytes, so no value can pass for another part.  Returns 0,
 * or -1 with `detail` saying why (a header sent twice, a scope too long).
 */
int request_scope_principal(const struct request *rq, const struct gw_route *r,
                            char principal[IDEM_SCOPE_PART_MAX + 1], char *detail,
                            size_t detail_len);

/*
 * The first header `rq` names in a Connection field among those the gateway reads of a request
 * on route `r`: the principal's header (or Authorization for the other sources), the key header,
 * the scope headers, the method-override headers, Content-Type and Content-Encoding.  NULL when
 * there is none; borrowed from `cfg` and `r` (or static).
 */
const char *request_scope_hidden(const struct request *rq, const struct gw_config *cfg,
                                 const struct gw_route *r);

/*
 * The first header the gateway reads of a request on route `r` -- the principal's, the key, the
 * scope headers -- that `rq` also sends under a name differing only by '_' for '-'
 * (`Stripe_Account`).  CGI, PHP and Rack read both names as one (HTTP_STRIPE_ACCOUNT), so such an
 * upstream could act on a value the gateway never read.  NULL when there is none; borrowed from
 * `cfg` and `r`.
 */
const char *request_scope_twin(const struct request *rq, const struct gw_config *cfg,
                               const struct gw_route *r);

#endif /* IDEM_GATEWAY_REQUEST_SCOPE_H */
