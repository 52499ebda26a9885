/* SPDX-License-Identifier: Apache-2.0 */
/*
 * unrouted.h - requests that carry an idempotency key to a path no route takes.  A client only
 * sends a key where it means the write to be safe to retry, so such a request is the clearest
 * sign of a mistyped route (`POST /tickets` for an API at `/api/tickets`): without a word, every
 * retry of it would run again.  The gateway says so in its log, once per method and path, counts
 * it in /metrics, and with `unrouted_keys: refuse` turns it away.
 */
#ifndef IDEM_GATEWAY_UNROUTED_H
#define IDEM_GATEWAY_UNROUTED_H

#include <stddef.h>
#include <stdint.h>

struct logger;
struct gw_config;
struct request;
struct response;
struct strbuf;

struct unrouted;

/* For `cfg` (its routes' key headers, its `unrouted_keys`); never NULL. */
struct unrouted *unrouted_new(const struct gw_config *cfg);
void unrouted_free(struct unrouted *u);

/*
 * For a request no route takes: the name of the key header it carries (one a route reads its key
 * from), or NULL for a request without one or for a read (GET, HEAD, OPTIONS, TRACE), which is
 * passed through as always.
 */
const char *unrouted_key_header(const struct unrouted *u, const struct request *rq);

/*
 * Notes a request no route takes that carries `header`: counted, and logged as a warning the
 * first time its method and path are seen (at most UNROUTED_PATHS of them; beyond those, one
 * warning a minute).  Thread-safe.  Returns 1 with `resp` the refusal when the config says
 * `unrouted_keys: refuse` (400 idempotency-key-unrouted, naming the routes there are), else 0:
 * the request is passed through.
 */
int unrouted_note(struct unrouted *u, const struct logger *lg, const struct request *rq,
                  const char *header, struct response *resp);

/* The counter, for /metrics. */
uint64_t unrouted_count(const struct unrouted *u);
void unrouted_render(const struct unrouted *u, struct strbuf *out);

#endif /* IDEM_GATEWAY_UNROUTED_H */
