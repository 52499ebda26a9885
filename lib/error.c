/* SPDX-License-Identifier: Apache-2.0 */
/*
 * error.c - the words behind libidem's error codes, and the small helpers every other file of the
 * library leans on (clocks, sleeping, bounded formatting, copying).  The texts come from the one
 * IDEM_ERRNO_MAP list in idem.h, so a new code cannot be added without its sentence and its name;
 * the helpers live here so that no file grows its own slightly different clock or strdup.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err_text.h"
#include "fmt.h"

/* idem_strerror and idem_err_name, over IDEM_ERRNO_MAP (common/err_text.h). */
#define ERR_TEXT_PREFIX "IDEM_"
ERR_TEXT_DEFINE(IDEM_ERRNO_MAP, idem_strerror, idem_err_name)

void idem_free(void *p)
{
    free(p);
}

/* The formatting is common/fmt.h's (the clocks and the sleep: common/clock.h). */
struct timespec idem__deadline_ms(int64_t ms)
{
    return clock_deadline(CLOCK_REALTIME, ms);
}

void idem__fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fmt_message_v(buf, cap, fmt, ap);
    va_end(ap);
}

char *idem__strdup(const char *s)
{
    char *copy = NULL;
    size_t n;

    if (!s)
        goto out;
    n = strlen(s) + 1;
    copy = malloc(n);
    if (!copy)
        goto out;
    memcpy(copy, s, n);
out:
    return copy;
}
