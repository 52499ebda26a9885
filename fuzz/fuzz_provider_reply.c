/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_provider_reply.c - libFuzzer harness for what orderd makes of a payment provider's answer
 * (src/orderd/provider_reply.c): a provider is another party, and a proxy or a fault between the
 * two can hand back anything.  The first two bytes pick the status (100..599), the rest is the
 * body.
 *
 * Besides memory errors and leaks it checks the rules the payment flows rely on: a 2xx is OK, a
 * 5xx, 408 or 429 is unknown (never a refusal: the charge may have happened), a 409 the provider
 * says is in progress is unknown, another 4xx is a refusal; a reply that is not OK carries a
 * one-line-or-more detail starting with its status; provider_first() gives an element of the
 * body's "data" array or nothing.
 */
#include "provider.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char program_name[] = "fuzz_provider_reply";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct provider_reply r;
    const json_t *first, *arr;
    long status;
    char *body;
    size_t len;
    char head[16];

    if (size < 2)
        return 0;
    status = 100 + (long)(((unsigned)data[0] << 8 | data[1]) % 500);
    len = size - 2;
    body = malloc(len + 1);
    CHECK(body != NULL, "malloc");
    memcpy(body, data + 2, len);
    body[len] = '\0';
    memset(&r, 0, sizeof r);
    provider_reply_read(&r, status, body, len);
    CHECK(r.status == status, "the status is kept");
    if (status >= 200 && status < 300)
        CHECK(r.outcome == PROVIDER_OK, "a 2xx is OK");
    else if (status >= 500 || status == 408 || status == 429)
        CHECK(r.outcome == PROVIDER_UNKNOWN, "a 5xx, 408 or 429 is unknown, never a refusal");
    else if (status >= 400 && status != 409)
        CHECK(r.outcome == PROVIDER_REFUSED, "another 4xx is a refusal");
    if (r.outcome != PROVIDER_OK) {
        snprintf(head, sizeof head, "HTTP %ld", status);
        CHECK(strncmp(r.detail, head, strlen(head)) == 0 && memchr(r.detail, '\0', sizeof r.detail),
              "a detail that starts with the status, within its buffer");
    }
    first = provider_first(&r);
    arr = json_object_get(r.doc, "data");
    CHECK(first == NULL || (json_is_array(arr) && json_array_get(arr, 0) == first),
          "provider_first is the first element of data");
    provider_reply_clear(&r);
    free(body);
    return 0;
}
