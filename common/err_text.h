/* SPDX-License-Identifier: Apache-2.0 */
/*
 * err_text.h - an error code's name and sentence, looked up in a table built from a library's
 * X-macro list (IDEM_ERRNO_MAP, IDEM_CLIENT_ERRNO_MAP).  Both libraries define their strerror and
 * err_name with ERR_TEXT_DEFINE, so the two stay one piece of code; static inline for the reason
 * clock.h gives: the libraries must not share a symbol.
 */
#ifndef IDEM_COMMON_ERR_TEXT_H
#define IDEM_COMMON_ERR_TEXT_H

#include <stddef.h>

struct err_text {
    int code;
    const char *name;
    const char *sentence;
};

/* The row of `code` in t[1..n-1], or t[0], the row that answers for any other code. */
static inline const struct err_text *err_text_find(const struct err_text *t, size_t n, int code)
{
    size_t i;

    for (i = 1; i < n; i++)
        if (t[i].code == code)
            return &t[i];
    return &t[0];
}

/* One row per XX(name, code, sentence) of a map; ERR_TEXT_PREFIX is the names' prefix. */
#define ERR_TEXT_ROW(name, code, sentence) {code, ERR_TEXT_PREFIX #name, sentence},

/*
 * Defines `const char *strerror_fn(int)` and `const char *name_fn(int)` over `map`, with 0 as
 * "success" (ERR_TEXT_PREFIX "OK") and every code not in the map as "unknown error"
 * (ERR_TEXT_PREFIX "UNKNOWN").  Define ERR_TEXT_PREFIX, a string literal, first.
 */
#define ERR_TEXT_DEFINE(map, strerror_fn, name_fn)                                                 \
    static const struct err_text err_texts[] = {{0, ERR_TEXT_PREFIX "UNKNOWN", "unknown error"},   \
                                                {0, ERR_TEXT_PREFIX "OK", "success"},              \
                                                map(ERR_TEXT_ROW)};                                \
    const char *strerror_fn(int err)                                                               \
    {                                                                                              \
        return err_text_find(err_texts, sizeof err_texts / sizeof err_texts[0], err)->sentence;    \
    }                                                                                              \
    const char *name_fn(int err)                                                                   \
    {                                                                                              \
        return err_text_find(err_texts, sizeof err_texts / sizeof err_texts[0], err)->name;        \
    }

#endif
