/* SPDX-License-Identifier: Apache-2.0 */
/*
 * record.c - the stored response's headers, and freeing a record and a list of stalled ones.
 *
 * Only allow-listed headers are kept with a response (by default Content-Type and Location; an
 * operation may name its own list, struct idem_operation): a replay must say the same thing as the
 * first answer, but per-request headers (dates, request ids, cookies) must not be frozen into every
 * retry.  They are stored as "Name: value\n" lines.
 */
#include "internal.h"
#include "ascii.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const default_stored_headers[] = {"Content-Type", "Location"};

void idem__record_clear(struct idem_record *rec)
{
    free(rec->recovery_point);
    free(rec->recovery_data);
    free(rec->lease_owner);
    free(rec->response_headers);
    free(rec->response_body);
    memset(rec, 0, sizeof(*rec));
}

/*
 * Defined here, below the engine and the stores, so that a store's record_stalled frees a list it
 * could not finish without calling up into the engine.
 */
void idem_stalled_free(struct idem_stalled *list, size_t n)
{
    if (!list)
        return;
    for (size_t i = 0; i < n; i++) {
        free(list[i].principal);
        free(list[i].operation);
        free(list[i].key);
        free(list[i].recovery_point);
    }
    free(list);
}

/* The allow-listed spelling of `name`, or NULL when `allow` (NULL: the default list) lacks it. */
static const char *allowed_name(const char *name, const char *const *allow, size_t nallow)
{
    if (!allow) {
        allow = default_stored_headers;
        nallow = sizeof(default_stored_headers) / sizeof(default_stored_headers[0]);
    }
    for (size_t i = 0; i < nallow; i++)
        if (allow[i] && ascii_caseeq(name, allow[i]))
            return allow[i];
    return NULL;
}

/* A value that could split a header line is refused rather than stored. */
static int value_ok(const char *v)
{
    return v && !strpbrk(v, "\r\n");
}

int idem__headers_encode(const struct idem_header *h, size_t n, const char *const *allow,
                         size_t nallow, char **out)
{
    size_t cap = 1;
    char *buf = NULL;
    size_t used = 0;

    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (h[i].name && allowed_name(h[i].name, allow, nallow) && value_ok(h[i].value))
            cap += strlen(h[i].name) + strlen(h[i].value) + 3;
    buf = malloc(cap);
    if (!buf)
        return IDEM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const char *name = h[i].name ? allowed_name(h[i].name, allow, nallow) : NULL;
        size_t nl, vl;
        if (!name || !value_ok(h[i].value))
            continue;
        nl = strlen(name);
        vl = strlen(h[i].value);
        memcpy(buf + used, name, nl);
        used += nl;
        memcpy(buf + used, ": ", 2);
        used += 2;
        memcpy(buf + used, h[i].value, vl);
        used += vl;
        buf[used++] = '\n';
    }
    buf[used] = '\0';
    *out = buf;
    return 0;
}

size_t idem__headers_split(char *text, struct idem_header *h)
{
    size_t count = 0;

    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        char *colon = strstr(line, ": ");
        if (!nl)
            break;
        *nl = '\0';
        if (colon && colon < nl) {
            *colon = '\0';
            h[count].name = line;
            h[count].value = colon + 2;
            count++;
        }
        line = nl + 1;
    }
    return count;
}

int idem__headers_decode(char *text, struct idem_header **out, size_t *n)
{
    size_t count = 0;
    struct idem_header *h = NULL;

    *out = NULL;
    *n = 0;
    if (!text)
        return 0;
    for (const char *p = text; *p; p++)
        if (*p == '\n')
            count++;
    if (count == 0)
        return 0;
    h = calloc(count, sizeof(*h));
    if (!h)
        return IDEM_ENOMEM;
    *out = h;
    *n = idem__headers_split(text, h);
    return 0;
}
