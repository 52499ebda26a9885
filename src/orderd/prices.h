/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prices.h - the price each product last sold at, as this process saw it: what lets an order on
 * PostgreSQL be written without waiting for the database's answer (orders.c, "held back").  A
 * price here is a guess the database checks, never an answer: the held-back statement sells only
 * at this price, and fails otherwise.
 */
#ifndef ORDERD_PRICES_H
#define ORDERD_PRICES_H

#include <pthread.h>
#include <stdint.h>

#define PRICES_SLOTS 4096
#define PRICES_ID_MAX 64
#define PRICES_CURRENCY_MAX 16

struct price_slot {
    char product[PRICES_ID_MAX]; /* "" when empty */
    int64_t price;
    char currency[PRICES_CURRENCY_MAX];
};

/* One slot per hash of the product id: a product whose slot another took is simply not known. */
struct prices {
    pthread_mutex_t mu;
    struct price_slot slot[PRICES_SLOTS];
};

void prices_init(struct prices *p);
void prices_destroy(struct prices *p);

/* Notes that `product` sold at `price` in `currency` (ids or currencies too long: not noted). */
void prices_note(struct prices *p, const char *product, int64_t price, const char *currency);

/* Forgets `product`: its last order was refused (unknown, or not enough stock). */
void prices_forget(struct prices *p, const char *product);

/* 1 with *price and `currency` (PRICES_CURRENCY_MAX bytes) filled when known, else 0. */
int prices_get(struct prices *p, const char *product, int64_t *price, char *currency);

#endif
