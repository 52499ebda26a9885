/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rng.c - the two sources of randomness of the client, kept apart on purpose.  Keys must be
 * unguessable and unique across machines, so they come from the kernel's CSPRNG.  Jitter only has
 * to spread clients apart, and tests must be able to replay it, so it comes from a small
 * seedable generator (xoshiro256**, seeded through splitmix64) that lives in each client handle:
 * no global rand() state that another library could disturb or that would tie threads together.
 */
#include "client_internal.h"

#include <errno.h>
#include <sys/random.h>

#include "banned.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));

    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void idem_client__rng_seed(struct idem_client__rng *r, uint64_t seed)
{
    uint64_t x = seed;
    int i;

    /* splitmix64 never yields four zero words, the one state xoshiro cannot leave. */
    for (i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

uint64_t idem_client__rng_next(struct idem_client__rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t idem_client__rng_upto(struct idem_client__rng *r, uint64_t n)
{
    uint64_t range, limit, x;

    if (n == UINT64_MAX)
        return idem_client__rng_next(r);
    range = n + 1;
    /* Reject the top sliver that would make small results more likely than large ones. */
    limit = UINT64_MAX - (UINT64_MAX % range);
    do {
        x = idem_client__rng_next(r);
    } while (x >= limit);
    return x % range;
}

int idem_client__random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    ssize_t got;

    while (len > 0) {
        got = getrandom(p, len, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return IDEM_CLIENT_ERANDOM;
        }
        p += got;
        len -= (size_t)got;
    }
    return 0;
}
