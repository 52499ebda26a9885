/* SPDX-License-Identifier: Apache-2.0 */
/*
 * provider_reply.c - what orderd makes of a provider's answer (provider.h): kept apart from the
 * libcurl client so that the part reading untrusted bytes is fuzzed alone
 * (fuzz/fuzz_provider_reply.c).
 */
#include "provider.h"

#include <stdio.h>
#include <string.h>

#include "util.h"
#include "jdoc.h"
#include "banned.h"

void provider_reply_clear(struct provider_reply *r)
{
    json_decref(r->doc);
    memset(r, 0, sizeof *r);
}

const json_t *provider_first(const struct provider_reply *r)
{
    const json_t *data = json_object_get(r->doc, "data");

    return json_is_array(data) && json_array_size(data) > 0 ? json_array_get(data, 0) : NULL;
}

/* What a status means for the caller: decided, or still unknown. */
static enum provider_outcome classify(long status, const json_t *doc)
{
    const json_t *code = json_object_get(doc, "code");
    const char *c = json_is_string(code) ? json_string_value(code) : "";

    if (status >= 200 && status < 300)
        return PROVIDER_OK;
    if (status >= 500 || status == 408 || status == 429)
        return PROVIDER_UNKNOWN;
    /* The provider is still working on this key: its answer is yet to come. */
    if (status == 409 && strcmp(c, "idempotency-request-in-progress") == 0)
        return PROVIDER_UNKNOWN;
    if (status >= 400)
        return PROVIDER_REFUSED;
    return PROVIDER_UNKNOWN;
}

void provider_reply_read(struct provider_reply *r, long status, const char *body, size_t len)
{
    r->status = status;
    json_decref(r->doc);
    r->doc = len > 0 ? jdoc_load(body, len, 0, NULL) : NULL;
    r->outcome = classify(status, r->doc);
    if (r->outcome != PROVIDER_OK)
        snprintf(r->detail, sizeof r->detail, "HTTP %ld %.*s", status, (int)(len < 180 ? len : 180),
                 len > 0 ? body : "");
}
