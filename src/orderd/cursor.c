/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cursor.c - the page cursor of GET /api/orders (cursor.h).
 */
#include "cursor.h"

#include <stdio.h>
#include <string.h>

#include "util.h"
#include "banned.h"

int cursor_decode(const char *text, char *created, size_t created_cap, char *id, size_t id_cap)
{
    unsigned char raw[128];
    const char *bar = NULL;
    size_t len = 0;
    size_t clen;
    int rc = -1;

    if (hex_decode(text, raw, sizeof raw - 1, &len) != 0 || len == 0)
        goto out;
    raw[len] = '\0';
    if (memchr(raw, '\0', len) == NULL)
        bar = strchr((const char *)raw, '|');
    if (bar == NULL)
        goto out;
    clen = (size_t)(bar - (const char *)raw);
    if (clen != ISO8601_LEN || clen >= created_cap || bar[1] == '\0' || strlen(bar + 1) >= id_cap)
        goto out;
    memcpy(created, raw, clen);
    created[clen] = '\0';
    snprintf(id, id_cap, "%s", bar + 1);
    rc = 0;
out:
    return rc;
}

char *cursor_encode(const char *created, const char *id)
{
    char raw[128];
    char *hex = NULL;
    int n;

    n = snprintf(raw, sizeof raw, "%s|%s", created, id);
    if (n > 0 && (size_t)n < sizeof raw) {
        hex = xmalloc(2 * (size_t)n + 1);
        hex_encode((const unsigned char *)raw, (size_t)n, hex);
    }
    return hex;
}
