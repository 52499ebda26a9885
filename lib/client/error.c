/* SPDX-License-Identifier: Apache-2.0 */
/*
 * error.c - the words behind libidem-client's error codes, and the few helpers every other file
 * of the client leans on (clocks, sleeping, bounded formatting, copying).  The texts come from
 * the one IDEM_CLIENT_ERRNO_MAP list in client.h, so a new code cannot be added without its
 * sentence and its name.
 */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ascii.h"
#include "clock.h"
#include "err_text.h"
#include "fmt.h"
#include "banned.h"

/* idem_client_strerror and idem_client_err_name, over IDEM_CLIENT_ERRNO_MAP (err_text.h). */
#define ERR_TEXT_PREFIX "IDEM_CLIENT_"
ERR_TEXT_DEFINE(IDEM_CLIENT_ERRNO_MAP, idem_client_strerror, idem_client_err_name)

void idem_client_free(void *p)
{
    free(p);
}

/* The formatting is common/fmt.h's (the clocks and the sleep: common/clock.h). */
void idem_client__fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fmt_message_v(buf, cap, fmt, ap);
    va_end(ap);
}

char *idem_client__strndup(const char *s, size_t n)
{
    char *copy = NULL;

    if (!s || n == (size_t)-1)
        goto out;
    copy = malloc(n + 1);
    if (!copy)
        goto out;
    memcpy(copy, s, n);
    copy[n] = '\0';
out:
    return copy;
}

char *idem_client__strdup(const char *s)
{
    return s ? idem_client__strndup(s, strlen(s)) : NULL;
}

int idem_client__strncaseeq(const char *a, const char *b, size_t n)
{
    return ascii_ncaseeq(a, b, n);
}

void idem_client__set_text(char **slot, const char *fmt, ...)
{
    va_list ap;
    char *text = NULL;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    text = malloc((size_t)n + 1);
    if (!text)
        return;
    va_start(ap, fmt);
    if (vsnprintf(text, (size_t)n + 1, fmt, ap) < 0)
        text[0] = '\0';
    va_end(ap);
    free(*slot);
    *slot = text;
}
