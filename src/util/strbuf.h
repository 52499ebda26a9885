/* SPDX-License-Identifier: Apache-2.0 */
/*
 * strbuf.h - a growable byte buffer (git's strbuf), for text whose size is not known up front:
 * the Prometheus page, log lines, request bodies.  Growth dies on allocation failure; callers
 * that take bytes from strangers enforce their own cap before appending (http_server.c does, at
 * HTTP_BODY_MAX).  Part of idem_util (src/util/), the programs' static library.
 */
#ifndef IDEM_UTIL_STRBUF_H
#define IDEM_UTIL_STRBUF_H

#include <stddef.h>

struct strbuf {
    char *buf; /* always NUL-terminated once anything was added; NULL before */
    size_t len;
    size_t cap;
};

#define STRBUF_INIT                                                                                \
    {                                                                                              \
        NULL, 0, 0                                                                                 \
    }

/* Makes room for `extra` more bytes (and the NUL): the buffer does not move while they come. */
void strbuf_grow(struct strbuf *sb, size_t extra);
void strbuf_add(struct strbuf *sb, const void *data, size_t len);
/*
 * strbuf_add() of what fits while the buffer holds at most `limit` bytes, for bytes from
 * strangers; returns how many of `len` did not fit (and were not added).
 */
size_t strbuf_add_capped(struct strbuf *sb, const void *data, size_t len, size_t limit);
void strbuf_adds(struct strbuf *sb, const char *s);
void strbuf_addch(struct strbuf *sb, char c);
void strbuf_addf(struct strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * Appends `len` bytes of `s` percent-encoded for a path segment, a query value or a name's part:
 * unreserved bytes (RFC 3986) stay, every other byte is %XX.
 */
void strbuf_add_pct(struct strbuf *sb, const void *s, size_t len);
/* Appends `v` in decimal, without printf's cost (response heads and log lines, per request). */
void strbuf_add_uint(struct strbuf *sb, unsigned long long v);
/* Hands the bytes out (new, free with free(); never NULL) and empties `sb`. */
char *strbuf_detach(struct strbuf *sb, size_t *len);
/* Empties `sb`, keeping its memory for what comes next. */
void strbuf_reset(struct strbuf *sb);
/* Frees the bytes; `sb` may be reused. */
void strbuf_release(struct strbuf *sb);

#endif /* IDEM_UTIL_STRBUF_H */
