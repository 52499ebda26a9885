/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_jcs.c - libFuzzer harness for idem_jcs_canonicalize().  Canonical JSON is what request
 * fingerprints hash, so besides memory errors it checks the properties the fingerprint depends
 * on: the output is JSON, its length is what was reported, it has no white space outside strings
 * and no raw control bytes, and canonicalising it again gives the very same bytes (idempotence).
 */
#include "idem/idem.h"
#include "fuzz.h"

#include <jansson.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const size_t flags =
        JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES;
    char *out = NULL, *again = NULL;
    size_t out_len = 0, again_len = 0, i;
    const char *why = NULL;
    json_t *parsed;
    int rc, in_string = 0, escaped = 0;

    rc = idem_jcs_canonicalize(data, size, &out, &out_len, &why);
    if (rc != 0) {
        if (out || out_len || !why)
            abort();
        if (rc != IDEM_EJSON && rc != IDEM_EDUPKEY && rc != IDEM_EDEPTH && rc != IDEM_ETOOBIG)
            abort();
        return 0;
    }
    if (!out || why || strlen(out) != out_len)
        abort();
    for (i = 0; i < out_len; i++) {
        unsigned char c = (unsigned char)out[i];

        if (c < 0x20)
            abort();
        if (in_string) {
            if (escaped)
                escaped = 0;
            else if (c == '\\')
                escaped = 1;
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == ' ') {
            abort();
        }
    }
    /* Integers of 20 or 21 digits ("1e20") overflow jansson's json_int_t: read them as reals. */
    parsed = json_loadb(out, out_len, flags, NULL);
    if (!parsed)
        abort();
    json_decref(parsed);
    rc = idem_jcs_canonicalize(out, out_len, &again, &again_len, &why);
    if (rc != 0 || again_len != out_len || memcmp(again, out, out_len) != 0)
        abort();
    idem_free(again);
    idem_free(out);
    return 0;
}
