/* SPDX-License-Identifier: Apache-2.0 */
/*
 * util.c - the small helpers every part of idem-check uses: capped buffers for what a server
 * sends back, random keys from the CSPRNG so that every run uses keys no earlier run has
 * used, and the chaos run's seeded random numbers.
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

int ck_parse_long(const char *s, long lo, long hi, long *out)
{
    int64_t v;

    if (parse_int64(s, lo, hi, &v) < 0)
        return -1;
    *out = (long)v;
    return 0;
}

char *ck_random_key(void)
{
    static const char hex[] = "0123456789abcdef";
    static const char prefix[] = "idem-check-";
    unsigned char raw[16];
    char *key = xmalloc(sizeof(prefix) + 2 * sizeof(raw));
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
    b->dropped += strbuf_add_capped(&b->sb, p, n, b->limit);
}

void ck_buf_release(struct ck_buf *b)
{
    strbuf_release(&b->sb);
    b->dropped = 0;
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
