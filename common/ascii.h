/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ascii.h - locale-free ASCII helpers, written once for every part of idem: hex digits both
 * ways, and case-insensitive comparisons for header names and keywords (strcasecmp and
 * strncasecmp follow the locale, and banned.h bans them).  Static inline for the reason clock.h
 * gives: the libraries must not share a symbol.
 */
#ifndef IDEM_COMMON_ASCII_H
#define IDEM_COMMON_ASCII_H

#include <stddef.h>

/* Writes 2*n lowercase hex digits of `in` and a NUL into `out` (2*n+1 bytes). */
static inline void hex_encode(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    size_t i;

    for (i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 0x0f];
    }
    out[2 * n] = '\0';
}

/* The value of the hex digit `c` (either case), or -1. */
static inline int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static inline char ascii_lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

static inline char ascii_upper(char c)
{
    return (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : c;
}

/* 1 when the first `n` bytes of `a` and `b` match ignoring ASCII case (up to a common NUL). */
static inline int ascii_ncaseeq(const char *a, const char *b, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        if (ascii_lower(a[i]) != ascii_lower(b[i]))
            return 0;
        if (a[i] == '\0')
            return 1;
    }
    return 1;
}

/* 1 when `a` and `b` are the same string ignoring ASCII case (strcasecmp follows the locale). */
static inline int ascii_caseeq(const char *a, const char *b)
{
    for (; ascii_lower(*a) == ascii_lower(*b); a++, b++)
        if (*a == '\0')
            return 1;
    return 0;
}

/* The entry of `names` (`n` of them) that is `name` ignoring ASCII case, or NULL. */
static inline const char *ascii_caseeq_any(const char *name, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ascii_caseeq(name, names[i]))
            return names[i];
    return NULL;
}

/*
 * Narrows [*s, *s + *len) to the field value RFC 9110 (section 5.5) means: without the optional
 * white space (SP, HTAB) around it.  A header value as sent may carry it; the value does not.
 */
static inline void ascii_trim_ows(const char **s, size_t *len)
{
    while (*len > 0 && (**s == ' ' || **s == '\t')) {
        (*s)++;
        (*len)--;
    }
    while (*len > 0 && ((*s)[*len - 1] == ' ' || (*s)[*len - 1] == '\t'))
        (*len)--;
}

#endif /* IDEM_COMMON_ASCII_H */
