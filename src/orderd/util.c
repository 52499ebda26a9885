/*
 * util.c - small helpers shared by orderd's files.  They live apart so that each concept file
 * (orders, auth, metrics...) reads as that concept only.  Allocation failure ends the program:
 * the library must return IDEM_ENOMEM, but a program may die with a message (STYLE.md).
 */
#include "util.h"

#include <errno.h>
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
    fprintf(stderr, "orderd: fatal: %s\n", msg);
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

void *xcalloc(size_t n, size_t size)
{
    return xcheck(calloc(n ? n : 1, size ? size : 1));
}

void *xrealloc(void *p, size_t n)
{
    return xcheck(realloc(p, n ? n : 1));
}

char *xstrdup(const char *s)
{
    return xcheck(strdup(s));
}

char *xstrndup(const char *s, size_t n)
{
    return xcheck(strndup(s, n));
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

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int hex_decode(const char *in, unsigned char *out, size_t cap, size_t *out_len)
{
    size_t n = strlen(in);
    size_t i;
    int hi, lo;
    int rc = -1;

    if (n % 2 != 0 || n / 2 > cap)
        goto out;
    for (i = 0; i < n / 2; i++) {
        hi = hex_value(in[2 * i]);
        lo = hex_value(in[2 * i + 1]);
        if (hi < 0 || lo < 0)
            goto out;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    *out_len = n / 2;
    rc = 0;
out:
    return rc;
}

void random_bytes(unsigned char *buf, size_t n)
{
    if (n > 0 && RAND_bytes(buf, (int)n) != 1)
        die("OpenSSL RAND_bytes failed: no secure random numbers");
}

int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
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

void iso8601_ms(int64_t ms, char out[ISO8601_LEN + 1])
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    char text[64];
    size_t n;

    gmtime_r(&secs, &tm);
    n = strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(text + n, sizeof text - n, ".%03dZ", (int)(ms % 1000));
    n = strlen(text);
    if (n > ISO8601_LEN)
        n = ISO8601_LEN;
    memcpy(out, text, n);
    out[n] = '\0';
}

int parse_int64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    const char *p = s;
    uint64_t limit = (uint64_t)INT64_MAX;
    uint64_t v = 0;
    int64_t r;
    int neg = 0;
    int rc = -1;

    if (s == NULL)
        goto out;
    if (*p == '-') {
        neg = 1;
        limit = (uint64_t)INT64_MAX + 1;
        p++;
    }
    if (*p == '\0')
        goto out;
    for (; *p != '\0'; p++) {
        if (*p < '0' || *p > '9' || v > (limit - (uint64_t)(*p - '0')) / 10)
            goto out;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (neg)
        r = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    else
        r = (int64_t)v;
    if (r < min || r > max)
        goto out;
    *out = r;
    rc = 0;
out:
    return rc;
}

size_t utf8_length(const char *s)
{
    size_t n = 0;

    for (; *s != '\0'; s++) {
        if (((unsigned char)*s & 0xc0) != 0x80)
            n++;
    }
    return n;
}

static char ascii_lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

int ascii_ncaseeq(const char *a, const char *b, size_t n)
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
