/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prices.c - the price each product last sold at (see prices.h): a fixed table of slots, one per
 * hash of the product id, under one mutex.  Nothing here is ever answered from: it only lets
 * orders.c guess what the database will say, and the database checks the guess.
 */
#include "prices.h"

#include <string.h>

#include "banned.h"

/* FNV-1a of the id, folded to a slot. */
static struct price_slot *slot_of(struct prices *p, const char *product)
{
    uint32_t h = 2166136261u;

    for (const unsigned char *s = (const unsigned char *)product; *s; s++)
        h = (h ^ *s) * 16777619u;
    return &p->slot[h % PRICES_SLOTS];
}

void prices_init(struct prices *p)
{
    memset(p->slot, 0, sizeof p->slot);
    pthread_mutex_init(&p->mu, NULL);
}

void prices_destroy(struct prices *p)
{
    pthread_mutex_destroy(&p->mu);
}

void prices_note(struct prices *p, const char *product, int64_t price, const char *currency)
{
    struct price_slot *s = slot_of(p, product);
    size_t n = strlen(product), m = strlen(currency);

    if (n >= sizeof s->product || m >= sizeof s->currency)
        return;
    pthread_mutex_lock(&p->mu);
    memcpy(s->product, product, n + 1);
    s->price = price;
    memcpy(s->currency, currency, m + 1);
    pthread_mutex_unlock(&p->mu);
}

void prices_forget(struct prices *p, const char *product)
{
    struct price_slot *s = slot_of(p, product);

    pthread_mutex_lock(&p->mu);
    if (strcmp(s->product, product) == 0)
        s->product[0] = '\0';
    pthread_mutex_unlock(&p->mu);
}

int prices_get(struct prices *p, const char *product, int64_t *price, char *currency)
{
    struct price_slot *s = slot_of(p, product);
    int known;

    pthread_mutex_lock(&p->mu);
    known = s->product[0] != '\0' && strcmp(s->product, product) == 0;
    if (known) {
        *price = s->price;
        memcpy(currency, s->currency, sizeof s->currency);
    }
    pthread_mutex_unlock(&p->mu);
    return known;
}
