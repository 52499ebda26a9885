/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_key.c - libFuzzer harness for idem_key_parse().  The parser reads a header value from a
 * stranger into a fixed buffer, so besides memory errors it checks what callers rely on: an
 * accepted key is 1 to IDEM_KEY_MAX printable ASCII characters, a refusal always says why, and
 * quoting an accepted key as an sf-string parses back to the same key.
 */
#include "idem/idem.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Quotes `key` as an RFC 8941 sf-string; `buf` has room for the worst case (every char escaped). */
static size_t quote(const char *key, char *buf)
{
    size_t n = 0;

    buf[n++] = '"';
    for (; *key; key++) {
        if (*key == '"' || *key == '\\')
            buf[n++] = '\\';
        buf[n++] = *key;
    }
    buf[n++] = '"';
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char out[IDEM_KEY_MAX + 1], again[IDEM_KEY_MAX + 1], quoted[2 * IDEM_KEY_MAX + 3];
    const char *why = NULL;
    size_t n, i;
    int rc;

    /* A sentinel past the key shows any write beyond the documented buffer. */
    memset(out, 0x5a, sizeof out);
    rc = idem_key_parse((const char *)data, size, out, &why);
    if (rc != 0) {
        if (rc != IDEM_EKEY || !why || out[0] != '\0')
            abort();
        return 0;
    }
    if (why)
        abort();
    n = strnlen(out, sizeof out);
    if (n < 1 || n > IDEM_KEY_MAX)
        abort();
    for (i = 0; i < n; i++) {
        if ((unsigned char)out[i] < 0x20 || (unsigned char)out[i] > 0x7e)
            abort();
    }
    /* Re-quoting is lossless. */
    n = quote(out, quoted);
    if (idem_key_parse(quoted, n, again, NULL) != 0 || strcmp(again, out) != 0)
        abort();
    /* A key that is a valid bare token parses as itself. */
    if (out[0] != '"' && !strpbrk(out, " ,")) {
        if (idem_key_parse(out, strlen(out), again, NULL) != 0 || strcmp(again, out) != 0)
            abort();
    }
    return 0;
}
