/*
 * util.c - the small helpers every part of idem-check uses: allocation that dies with a message
 * (a checker that cannot allocate has nothing useful left to say), capped buffers for what a
 * server sends back, random keys from the CSPRNG so that every run uses keys no earlier run has
 * used, and a sleep.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "check.h"
#include "clock.h"
#include "banned.h"

static void die_oom(void)
{
    fputs("idem-check: out of memory\n", stderr);
    exit(CK_EXIT_FAIL);
}

void *ck_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die_oom();
    return p;
}

void *ck_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die_oom();
    return q;
}

char *ck_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = ck_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

char *ck_random_key(void)
{
    static const char hex[] = "0123456789abcdef";
    static const char prefix[] = "idem-check-";
    unsigned char raw[16];
    char *key = ck_xmalloc(sizeof(prefix) + 2 * sizeof(raw));
    size_t at = sizeof(prefix) - 1;

    if (RAND_bytes(raw, (int)sizeof(raw)) != 1) {
        fputs("idem-check: the OpenSSL random generator failed\n", stderr);
        exit(CK_EXIT_FAIL);
    }
    memcpy(key, prefix, at);
    for (size_t i = 0; i < sizeof(raw); i++) {
        key[at++] = hex[raw[i] >> 4];
        key[at++] = hex[raw[i] & 15];
    }
    key[at] = '\0';
    return key;
}

void ck_buf_add(struct ck_buf *b, const void *p, size_t n)
{
    size_t room = b->limit > b->len ? b->limit - b->len : 0;
    size_t take = n < room ? n : room;

    b->dropped += n - take;
    if (take == 0)
        return;
    if (b->len + take + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + take + 1)
            cap *= 2;
        b->data = ck_xrealloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, take);
    b->len += take;
    b->data[b->len] = '\0';
}

void ck_buf_release(struct ck_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = b->dropped = 0;
}

/* ---- random numbers ------------------------------------------------------------------------- */

void ck_rng_seed(struct ck_rng *r)
{
    uint64_t s = 0;
    if (RAND_bytes((unsigned char *)&s, (int)sizeof(s)) != 1)
        s = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    r->s = s ? s : 0x9E3779B97F4A7C15ull;
}

double ck_rng_double(struct ck_rng *r)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
