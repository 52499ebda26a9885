/*
 * util.c - helpers shared by provider-sim's files (see util.h), kept apart so each concept file
 * (charges, webhooks, faults) reads as that concept only.
 */
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "banned.h"

void die(const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "provider-sim: fatal: %s\n", msg);
    exit(1);
}

void *xcheck(void *p)
{
    if (p == NULL)
        die("out of memory");
    return p;
}

void *xmalloc(size_t n)
{
    return xcheck(malloc(n ? n : 1));
}

void *xrealloc(void *p, size_t n)
{
    return xcheck(realloc(p, n ? n : 1));
}

char *xstrdup(const char *s)
{
    return xcheck(strdup(s));
}

void log_msg(const char *level, const char *fmt, ...)
{
    char msg[1024];
    char line[1100];
    va_list ap;
    int n;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    n = snprintf(line, sizeof line, "provider-sim: %s: %s\n", level, msg);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line)
        n = (int)sizeof line - 1;
    fwrite(line, 1, (size_t)n, stderr);
    fflush(stderr);
}

void hex_encode(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    size_t i;

    for (i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 0x0f];
    }
    out[2 * n] = '\0';
}

void new_id(const char *prefix, char *out, size_t cap)
{
    unsigned char raw[12];
    char hex[2 * sizeof raw + 1];

    if (RAND_bytes(raw, (int)sizeof raw) != 1)
        die("OpenSSL RAND_bytes failed");
    hex_encode(raw, sizeof raw, hex);
    snprintf(out, cap, "%s%s", prefix, hex);
}

double random_unit(void)
{
    uint64_t v = 0;

    if (RAND_bytes((unsigned char *)&v, (int)sizeof v) != 1)
        die("OpenSSL RAND_bytes failed");
    return (double)(v >> 11) / 9007199254740992.0; /* 53 random bits / 2^53 */
}

int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int64_t ms)
{
    struct timespec req, rem;

    if (ms <= 0)
        return;
    req.tv_sec = (time_t)(ms / 1000);
    req.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&req, &rem) != 0 && errno == EINTR)
        req = rem;
}

int parse_int64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end = NULL;
    long long v;

    if (s == NULL || *s == '\0' || *s == ' ' || *s == '+')
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || end == NULL || *end != '\0' || v < min || v > max)
        return -1;
    *out = (int64_t)v;
    return 0;
}

int parse_rate(const char *s, double *out)
{
    char *end = NULL;
    double v;

    if (s == NULL || *s == '\0' || *s == ' ')
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == NULL || *end != '\0' || !isfinite(v) || v < 0.0 || v > 1.0)
        return -1;
    *out = v;
    return 0;
}

char *json_text(const json_t *doc, size_t *len)
{
    char *text = xcheck(json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER));

    if (len != NULL)
        *len = strlen(text);
    return text;
}

int json_whole(const json_t *v, int64_t min, int64_t max, int64_t *out)
{
    double d;

    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < min || i > max)
            return -1;
        *out = (int64_t)i;
        return 0;
    }
    if (!json_is_real(v))
        return -1;
    d = json_real_value(v);
    if (!isfinite(d) || d < (double)min || d > (double)max || (double)(int64_t)d != d)
        return -1;
    *out = (int64_t)d;
    return 0;
}
