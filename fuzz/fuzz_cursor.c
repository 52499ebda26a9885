/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_cursor.c - libFuzzer harness for orderd's page cursor (src/orderd/cursor.c): the
 * `cursor` query argument of GET /api/orders comes back from clients.  The input is the
 * argument's text (cut at a NUL, as the decoded query would be).
 *
 * Besides memory errors it checks: a decoded cursor has a creation time of exactly ISO8601_LEN
 * characters and a non-empty id, both within their buffers; and encoding what was decoded gives
 * back a cursor that decodes to the same pair.
 */
#include "cursor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "fuzz.h"

const char program_name[] = "fuzz_cursor";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    char created[ISO8601_LEN + 1], id[64], created2[ISO8601_LEN + 1], id2[64];

    CHECK(text != NULL, "malloc");
    memcpy(text, data, size);
    text[size] = '\0';
    if (cursor_decode(text, created, sizeof created, id, sizeof id) == 0) {
        char *again;
        CHECK(strlen(created) == ISO8601_LEN, "the time has its fixed length");
        CHECK(id[0] != '\0' && strlen(id) < sizeof id, "a non-empty id within its buffer");
        again = cursor_encode(created, id);
        CHECK(again != NULL, "what decodes, encodes");
        CHECK(cursor_decode(again, created2, sizeof created2, id2, sizeof id2) == 0 &&
                  strcmp(created, created2) == 0 && strcmp(id, id2) == 0,
              "encode(decode(c)) decodes to the same");
        free(again);
    }
    free(text);
    return 0;
}
