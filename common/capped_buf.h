/* SPDX-License-Identifier: Apache-2.0 */
/*
 * capped_buf.h - a growable byte buffer with a cap, always NUL-terminated, written once for the
 * two libraries: libidem's canonical JSON (jcs.c) and libidem-client's response bodies.  It
 * reports what went wrong instead of dying, as a library must; the programs' strbuf (src/util)
 * dies on a failed allocation instead.  Static inline for the reason clock.h gives: the libraries
 * must not share a symbol.
 */
#ifndef IDEM_COMMON_CAPPED_BUF_H
#define IDEM_COMMON_CAPPED_BUF_H

#include <stdlib.h>
#include <string.h>

struct capped_buf {
    char *data;   /* NULL until the first byte; then len bytes and a NUL */
    size_t len;   /* bytes held, the NUL not counted */
    size_t cap;   /* bytes allocated */
    size_t limit; /* most bytes it may hold */
};

#define CAPPED_BUF_TOO_BIG (-1)   /* the bytes would pass the limit: nothing was added */
#define CAPPED_BUF_NO_MEMORY (-2) /* the allocation failed: nothing was added */

/* Appends `len` bytes of `p`.  Returns 0, CAPPED_BUF_TOO_BIG or CAPPED_BUF_NO_MEMORY. */
static inline int capped_buf_add(struct capped_buf *b, const void *p, size_t len)
{
    size_t need, ncap;
    char *d;

    if (len > b->limit || b->len > b->limit - len)
        return CAPPED_BUF_TOO_BIG;
    need = b->len + len + 1;
    if (need > b->cap) {
        ncap = b->cap ? b->cap : 256;
        while (ncap < need)
            ncap *= 2;
        if (ncap > b->limit + 1)
            ncap = b->limit + 1;
        d = realloc(b->data, ncap);
        if (d == NULL)
            return CAPPED_BUF_NO_MEMORY;
        b->data = d;
        b->cap = ncap;
    }
    if (len > 0)
        memcpy(b->data + b->len, p, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

/* Empties the buffer, keeping its memory and its limit. */
static inline void capped_buf_reset(struct capped_buf *b)
{
    b->len = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
}

/* Frees the bytes; the limit stays, so the buffer can be filled again. */
static inline void capped_buf_clear(struct capped_buf *b)
{
    free(b->data);
    *b = (struct capped_buf){.limit = b->limit};
}

#endif
