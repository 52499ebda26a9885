/* SPDX-License-Identifier: Apache-2.0 */
/*
 * util.c - the small helpers of util.h, shared by orderd's and provider-sim's files.  They live
 * apart so that each concept file (orders, auth, charges...) reads as that concept only.
 * Allocation failure ends the program: the library must return IDEM_ENOMEM, but a program may die
 * with a message (STYLE.md).
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "clock.h"
#include "banned.h"

void die(const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: fatal: %s\n", program_name, msg);
    exit(1);
}

void exit_at_once(int status)
{
#ifdef SYS_exit_group
    /* The system call itself: ThreadSanitizer intercepts _exit(), not this. */
    syscall(SYS_exit_group, status);
#endif
    _exit(status);
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

static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_fetched;

static void sha256_fetch(void)
{
    sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

void sha256_bytes(const void *data, size_t len, unsigned char out[SHA256_BYTES])
{
    unsigned int n = 0;

    pthread_once(&sha256_once, sha256_fetch);
    if (EVP_Digest(data, len, out, &n, sha256_fetched ? sha256_fetched : EVP_sha256(), NULL) != 1 ||
        n != SHA256_BYTES)
        die("OpenSSL SHA-256 failed");
}

int read_fd_capped(int fd, size_t max, char **out, size_t *len)
{
    size_t have = 0, cap = max < 4096 ? max + 1 : 4096;
    char *buf = xmalloc(cap + 1);
    ssize_t r;
    int e = 0;

    for (;;) {
        if (have == cap) {
            cap = cap > max / 2 ? max + 1 : cap * 2;
            buf = xrealloc(buf, cap + 1);
        }
        r = read(fd, buf + have, cap - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            e = r < 0 ? errno : 0;
            break;
        }
        have += (size_t)r;
        if (have > max) {
            e = EFBIG;
            break;
        }
    }
    if (e != 0) {
        explicit_bzero(buf, have);
        free(buf);
        errno = e;
        return -1;
    }
    buf[have] = '\0';
    *out = buf;
    *len = have;
    return 0;
}

int read_file_capped(const char *path, size_t max, unsigned flags, char **out, size_t *len)
{
    int regular = (flags & READ_FILE_REGULAR) != 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (regular ? O_NONBLOCK : 0));
    struct stat st;
    int rc, e;

    if (fd < 0)
        return -1;
    if (regular && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        rc = -1;
        e = EINVAL;
    } else {
        rc = read_fd_capped(fd, max, out, len);
        e = errno;
    }
    close(fd);
    errno = e;
    return rc;
}

int fd_wait(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int64_t left = deadline_ms - clock_mono_ms();
        int n;

        if (left <= 0)
            return 0;
        n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

void iov_advance(struct iovec **iov, int *n, size_t done)
{
    while (*n > 0 && done >= (*iov)->iov_len) {
        done -= (*iov)->iov_len;
        (*iov)++;
        (*n)--;
    }
    if (*n > 0) {
        (*iov)->iov_base = (char *)(*iov)->iov_base + done;
        (*iov)->iov_len -= done;
    }
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

int parse_double(const char *s, double min, double max, double *out)
{
    char *end = NULL;
    double v;

    /* Decimal only: strtod would also skip white space and read "inf", "nan" and hex. */
    if (s == NULL || *s == '\0' || s[strspn(s, "0123456789.eE+-")] != '\0')
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < min || v > max)
        return -1;
    *out = v;
    return 0;
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
