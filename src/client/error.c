/*
 * error.c - the words behind libidem-client's error codes, and the few helpers every other file
 * of the client leans on (clocks, sleeping, bounded formatting, copying).  The texts come from
 * the one IDEM_CLIENT_ERRNO_MAP list in client.h, so a new code cannot be added without its
 * sentence and its name.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "banned.h"

const char *idem_client_strerror(int err)
{
    const char *text = "unknown error";

    switch (err) {
    case IDEM_CLIENT_OK:
        text = "success";
        break;
#define IDEM_CLIENT__ERR_TEXT(name, code, sentence)                                                \
    case IDEM_CLIENT_##name:                                                                       \
        text = sentence;                                                                           \
        break;
        IDEM_CLIENT_ERRNO_MAP(IDEM_CLIENT__ERR_TEXT)
#undef IDEM_CLIENT__ERR_TEXT
    default:
        break;
    }
    return text;
}

const char *idem_client_err_name(int err)
{
    const char *name = "IDEM_CLIENT_UNKNOWN";

    switch (err) {
    case IDEM_CLIENT_OK:
        name = "IDEM_CLIENT_OK";
        break;
#define IDEM_CLIENT__ERR_NAME(ename, code, sentence)                                               \
    case IDEM_CLIENT_##ename:                                                                      \
        name = "IDEM_CLIENT_" #ename;                                                              \
        break;
        IDEM_CLIENT_ERRNO_MAP(IDEM_CLIENT__ERR_NAME)
#undef IDEM_CLIENT__ERR_NAME
    default:
        break;
    }
    return name;
}

void idem_client_free(void *p)
{
    free(p);
}

static int64_t clock_ms(clockid_t id)
{
    struct timespec ts = {0, 0};

    /* clock_gettime cannot fail for these two clocks on POSIX; a zeroed ts is the fallback. */
    (void)clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + (int64_t)(ts.tv_nsec / 1000000);
}

int64_t idem_client__mono_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

int64_t idem_client__now_ms(void)
{
    return clock_ms(CLOCK_REALTIME);
}

void idem_client__sleep_ms(int64_t ms)
{
    struct timespec req, rem;

    if (ms <= 0)
        return;
    req.tv_sec = (time_t)(ms / 1000);
    req.tv_nsec = (long)(ms % 1000) * 1000000L;
    /* A signal cuts nanosleep short; sleep the rest, so the pause is the one the policy chose. */
    while (nanosleep(&req, &rem) != 0 && errno == EINTR)
        req = rem;
}

void idem_client__fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (!buf || cap == 0)
        return;
    va_start(ap, fmt);
    if (vsnprintf(buf, cap, fmt, ap) < 0)
        buf[0] = '\0';
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
    size_t i;
    unsigned char x, y;

    for (i = 0; i < n; i++) {
        x = (unsigned char)a[i];
        y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y - 'A' + 'a');
        if (x != y)
            return 0;
        if (x == '\0')
            return 1;
    }
    return 1;
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
