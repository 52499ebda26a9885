/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fmt.h - bounded formatting into a fixed message buffer, written once for libidem (idem__fmt)
 * and libidem-client (idem_client__fmt), which wrap it under their own names (see clock.h for
 * why the code is shared inline rather than as one linked symbol).
 */
#ifndef IDEM_COMMON_FMT_H
#define IDEM_COMMON_FMT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* vsnprintf into `buf`: never overflows, always NUL-terminates; NULL or cap 0 writes nothing. */
static inline void fmt_message_v(char *buf, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static inline void fmt_message_v(char *buf, size_t cap, const char *fmt, va_list ap)
{
    if (!buf || cap == 0)
        return;
    /* vsnprintf truncates and terminates; a negative return leaves an encoding error, so clear. */
    if (vsnprintf(buf, cap, fmt, ap) < 0)
        buf[0] = '\0';
}

#endif /* IDEM_COMMON_FMT_H */
