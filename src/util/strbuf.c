/* SPDX-License-Identifier: Apache-2.0 */
/*
 * strbuf.c - the growable buffer of strbuf.h.  Every string the programs assemble piecewise goes
 * through here, so that no caller writes into a fixed array with an unchecked length.
 */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "banned.h"

void strbuf_grow(struct strbuf *sb, size_t extra)
{
    size_t need = sb->len + extra + 1;
    size_t cap = sb->cap ? sb->cap : 64;

    if (need <= sb->cap)
        return;
    while (cap < need) {
        if (cap > ((size_t)-1) / 2)
            die("string buffer too large");
        cap *= 2;
    }
    sb->buf = xrealloc(sb->buf, cap);
    sb->cap = cap;
}

void strbuf_add(struct strbuf *sb, const void *data, size_t len)
{
    strbuf_grow(sb, len);
    if (len > 0)
        memcpy(sb->buf + sb->len, data, len);
    sb->len += len;
    sb->buf[sb->len] = '\0';
}

size_t strbuf_add_capped(struct strbuf *sb, const void *data, size_t len, size_t limit)
{
    size_t room = limit > sb->len ? limit - sb->len : 0;
    size_t take = len < room ? len : room;

    if (take > 0)
        strbuf_add(sb, data, take);
    return len - take;
}

void strbuf_adds(struct strbuf *sb, const char *s)
{
    strbuf_add(sb, s, strlen(s));
}

void strbuf_addch(struct strbuf *sb, char c)
{
    strbuf_add(sb, &c, 1);
}

void strbuf_addf(struct strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        die("bad format string");
    strbuf_grow(sb, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

char *strbuf_detach(struct strbuf *sb, size_t *len)
{
    char *out;

    if (sb->buf == NULL) {
        strbuf_grow(sb, 0);
        sb->buf[0] = '\0';
    }
    out = sb->buf;
    if (len != NULL)
        *len = sb->len;
    sb->buf = NULL;
    sb->len = 0;
    sb->cap = 0;
    return out;
}

void strbuf_add_uint(struct strbuf *sb, unsigned long long v)
{
    char digits[24];
    size_t n = sizeof digits;

    do {
        digits[--n] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    strbuf_add(sb, digits + n, sizeof digits - n);
}

void strbuf_add_pct(struct strbuf *sb, const void *s, size_t len)
{
    static const char digits[] = "0123456789ABCDEF";
    const unsigned char *p = s;

    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '.' || c == '_' || c == '~') {
            strbuf_addch(sb, (char)c);
        } else {
            strbuf_addch(sb, '%');
            strbuf_addch(sb, digits[c >> 4]);
            strbuf_addch(sb, digits[c & 15]);
        }
    }
}

void strbuf_reset(struct strbuf *sb)
{
    sb->len = 0;
    if (sb->buf != NULL)
        sb->buf[0] = '\0';
}

void strbuf_release(struct strbuf *sb)
{
    free(sb->buf);
    sb->buf = NULL;
    sb->len = 0;
    sb->cap = 0;
}
