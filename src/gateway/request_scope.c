/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_scope.c - the scope of a request's record from its header fields, and the headers a
 * Connection field may not name (request_scope.h).
 */
#include "request_scope.h"

#include <stdio.h>
#include <string.h>

#include "ascii.h"
#include "strbuf.h"
#include "banned.h"

int request_scope_principal(const struct request *rq, const struct gw_route *r,
                            char principal[IDEM_SCOPE_PART_MAX + 1], char *detail,
                            size_t detail_len)
{
    struct strbuf sb = STRBUF_INIT;
    int rc = 0;

    if (r->nscope_headers == 0)
        return 0;
    strbuf_adds(&sb, principal);
    for (size_t i = 0; i < r->nscope_headers && rc == 0; i++) {
        const char *v = NULL;
        size_t vlen = 0;
        int count = request_header_count(rq, r->scope_headers[i], &v, &vlen);

        strbuf_addch(&sb, ';');
        strbuf_adds(&sb, r->scope_headers[i]);
        if (count > 1) {
            snprintf(detail, detail_len, "%s decides whose record this request is: send it once.",
                     r->scope_headers[i]);
            rc = -1;
        } else if (count == 1) {
            ascii_trim_ows(&v, &vlen);
            strbuf_addch(&sb, '=');
            strbuf_add_pct(&sb, v, vlen);
        }
    }
    if (rc == 0 && sb.len > IDEM_SCOPE_PART_MAX) {
        snprintf(detail, detail_len,
                 "The caller and its scope headers come to %zu bytes; at most %d.", sb.len,
                 IDEM_SCOPE_PART_MAX);
        rc = -1;
    }
    if (rc == 0)
        memcpy(principal, sb.buf, sb.len + 1);
    strbuf_release(&sb);
    return rc;
}

/* Whether field name `name` is `want` spelled with some '_' for '-' (ASCII case ignored). */
static int twin_of(const char *name, const char *want)
{
    int underscore = 0;

    for (; *name && *want; name++, want++) {
        if (*name == '_' && *want == '-')
            underscore = 1;
        else if (ascii_lower(*name) != ascii_lower(*want))
            return 0;
    }
    return underscore && *name == '\0' && *want == '\0';
}

static int has_twin(const struct request *rq, const char *want)
{
    for (size_t i = 0; i < rq->nfields; i++)
        if (twin_of(rq->fields[i].name, want))
            return 1;
    return 0;
}

const char *request_scope_twin(const struct request *rq, const struct gw_config *cfg,
                               const struct gw_route *r)
{
    if (cfg->principal == GW_PRINCIPAL_HEADER && has_twin(rq, cfg->principal_header))
        return cfg->principal_header;
    if (r->key_source == GW_KEY_HEADER && has_twin(rq, r->key_header))
        return r->key_header;
    for (size_t i = 0; i < r->nscope_headers; i++)
        if (has_twin(rq, r->scope_headers[i]))
            return r->scope_headers[i];
    return NULL;
}

const char *request_scope_hidden(const struct request *rq, const struct gw_config *cfg,
                                 const struct gw_route *r)
{
    static const char *const body[] = {"Content-Type", "Content-Encoding"};

    if (cfg->principal == GW_PRINCIPAL_HEADER) {
        if (request_connection_lists(rq, cfg->principal_header))
            return cfg->principal_header;
    } else if (request_connection_lists(rq, "Authorization")) {
        return "Authorization";
    }
    if (r->key_source == GW_KEY_HEADER && request_connection_lists(rq, r->key_header))
        return r->key_header;
    for (size_t i = 0; i < r->nscope_headers; i++)
        if (request_connection_lists(rq, r->scope_headers[i]))
            return r->scope_headers[i];
    for (size_t i = 0; i < cfg->nmethod_override_headers; i++)
        if (request_connection_lists(rq, cfg->method_override_headers[i]))
            return cfg->method_override_headers[i];
    for (size_t i = 0; i < sizeof body / sizeof body[0]; i++)
        if (request_connection_lists(rq, body[i]))
            return body[i];
    return NULL;
}
