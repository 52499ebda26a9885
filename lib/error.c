/*
 * error.c - the words behind libidem's error codes, and the small helpers every other file of the
 * library leans on (clocks, sleeping, bounded formatting, copying).  The texts come from the one
 * IDEM_ERRNO_MAP list in idem.h, so a new code cannot be added without its sentence and its name;
 * the helpers live here so that no file grows its own slightly different clock or strdup.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *idem_strerror(int err)
{
    const char *text = "unknown error";

    switch (err) {
    case IDEM_OK:
        text = "success";
        break;
#define IDEM__ERR_TEXT(name, code, sentence)                                                       \
    case IDEM_##name:                                                                              \
        text = sentence;                                                                           \
        break;
        IDEM_ERRNO_MAP(IDEM__ERR_TEXT)
#undef IDEM__ERR_TEXT
    default:
        break;
    }
    return text;
}

const char *idem_err_name(int err)
{
    const char *name = "IDEM_UNKNOWN";

    switch (err) {
    case IDEM_OK:
        name = "IDEM_OK";
        break;
#define IDEM__ERR_NAME(ename, code, sentence)                                                      \
    case IDEM_##ename:                                                                             \
        name = "IDEM_" #ename;                                                                     \
        break;
        IDEM_ERRNO_MAP(IDEM__ERR_NAME)
#undef IDEM__ERR_NAME
    default:
        break;
    }
    return name;
}

void idem_free(void *p)
{
    free(p);
}

/* Both clocks are read the same way; only the clock differs. */
static int64_t clock_ms(clockid_t id)
{
    struct timespec ts = {0, 0};

    /* clock_gettime cannot fail for these two clocks on POSIX; a zeroed ts is the fallback. */
    (void)clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + (int64_t)(ts.tv_nsec / 1000000);
}

int64_t idem__now_ms(void)
{
    return clock_ms(CLOCK_REALTIME);
}

int64_t idem__mono_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

void idem__sleep_ms(int64_t ms)
{
    struct timespec req, rem;

    if (ms <= 0)
        return;
    req.tv_sec = (time_t)(ms / 1000);
    req.tv_nsec = (long)(ms % 1000) * 1000000L;
    /* A signal cuts nanosleep short; sleep the rest, so callers get the pause they asked for. */
    while (nanosleep(&req, &rem) != 0 && errno == EINTR)
        req = rem;
}

void idem__fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (!buf || cap == 0)
        return;
    va_start(ap, fmt);
    /* vsnprintf truncates and terminates; a negative return leaves an encoding error, so clear. */
    if (vsnprintf(buf, cap, fmt, ap) < 0)
        buf[0] = '\0';
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
