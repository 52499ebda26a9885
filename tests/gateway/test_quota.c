/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_quota.c - the callers' limits (src/gateway/quota.c): keys in flight per caller and their
 * release; new keys a second, spent only by new keys and refilled with time; stored bytes per
 * caller and for all, falling as their records expire, with a Retry-After for when; the table
 * bounded, the least recently seen idle caller forgotten first (its bytes still in the budget),
 * and a new caller refused when every tracked one has a request in flight.
 */
#include "quota.h"

#include <stdlib.h>
#include <string.h>

#include "t.h"

const char program_name[] = "gateway_test_quota";

#define HOUR (3600 * 1000LL)
#define T0 (1000 * HOUR) /* a wall clock, ms */

static struct quota *make(int in_flight, int rate, uint64_t stored, uint64_t total, int tracked)
{
    struct quota_limits l = {in_flight, rate, stored, total, tracked, 24 * HOUR};
    return quota_new(&l);
}

static enum quota_verdict admit(struct quota *q, const char *who, int64_t now,
                                struct quota_slot **slot, int *after)
{
    return quota_admit(q, who, strlen(who), now, slot, after);
}

static void test_keys_in_flight(void)
{
    struct quota *q = make(2, 0, 0, 0, 10);
    struct quota_slot *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    int after = 0;

    CHECK_INT(admit(q, "alice", T0, &a, &after), QUOTA_OK);
    CHECK_INT(admit(q, "alice", T0, &b, &after), QUOTA_OK);
    CHECK_INT(admit(q, "alice", T0, &c, &after), QUOTA_IN_FLIGHT);
    CHECK(c == NULL);
    CHECK_INT(after, 1);
    CHECK_INT(admit(q, "bob", T0, &d, &after), QUOTA_OK); /* another caller is not held back */
    quota_put(q, a);
    CHECK_INT(admit(q, "alice", T0, &c, &after), QUOTA_OK);
    quota_put(q, b);
    quota_put(q, c);
    quota_put(q, d);
    quota_put(q, NULL);
    quota_free(q);
}

static void test_new_keys_a_second(void)
{
    struct quota *q = make(0, 2, 0, 0, 10);
    struct quota_slot *s = NULL;
    int after = 0;

    for (int i = 0; i < 2; i++) {
        CHECK_INT(admit(q, "alice", T0, &s, &after), QUOTA_OK);
        quota_new_key(q, s, T0);
        quota_put(q, s);
    }
    CHECK_INT(admit(q, "alice", T0, &s, &after), QUOTA_RATE);
    CHECK_INT(after, 1);
    /* Admitted but no new key (a retry that met its record): nothing spent. */
    CHECK_INT(admit(q, "alice", T0 + 500, &s, &after), QUOTA_OK);
    quota_put(q, s);
    CHECK_INT(admit(q, "alice", T0 + 500, &s, &after), QUOTA_OK);
    quota_new_key(q, s, T0 + 500);
    quota_put(q, s);
    CHECK_INT(admit(q, "alice", T0 + 500, &s, &after), QUOTA_RATE);
    CHECK_INT(admit(q, "alice", T0 + 1000, &s, &after), QUOTA_OK);
    quota_put(q, s);
    quota_free(q);
}

static void test_stored_bytes_expire(void)
{
    struct quota *q = make(0, 0, 1000, 0, 10);
    struct quota_slot *s = NULL;
    int after = 0;

    CHECK_INT(admit(q, "alice", T0, &s, &after), QUOTA_OK);
    quota_stored(q, s, 600, T0 + HOUR);
    quota_put(q, s);
    CHECK_INT(admit(q, "alice", T0, &s, &after), QUOTA_OK);
    quota_stored(q, s, 600, T0 + 2 * HOUR);
    quota_put(q, s);
    CHECK_INT(quota_total_stored(q, T0), 1200);
    CHECK_INT(admit(q, "alice", T0, &s, &after), QUOTA_STORED);
    /* Until the first record's bucket has expired: an hour, and at most a bucket more. */
    CHECK(after >= 3600 && after <= 3600 + 24 * 3600 / 14 + 1);
    CHECK_INT(admit(q, "bob", T0, &s, &after), QUOTA_OK);
    quota_put(q, s);
    /* Once the first has expired, 600 bytes are left: alice may store again. */
    CHECK_INT(admit(q, "alice", T0 + 3 * HOUR, &s, &after), QUOTA_OK);
    quota_put(q, s);
    CHECK_INT(quota_total_stored(q, T0 + 3 * HOUR), 0);
    quota_free(q);
}

static void test_budget_and_start(void)
{
    struct quota *q = make(0, 0, 0, 1000, 10);
    struct quota_slot *s = NULL;
    int after = 0;
    struct strbuf m = STRBUF_INIT;

    /* What the store holds at start: a caller's, and one no route names now. */
    quota_add_stored(q, "alice", 5, 700, T0 + HOUR, T0);
    quota_add_stored(q, NULL, 0, 300, T0 + HOUR, T0);
    CHECK_INT(admit(q, "bob", T0, &s, &after), QUOTA_TOTAL);
    CHECK(after >= 3600);
    quota_render(q, "gw", T0, &m);
    CHECK(strstr(m.buf, "gw_limited_total{reason=\"store_budget\"} 1\n") != NULL);
    CHECK(strstr(m.buf, "gw_stored_bytes 1000\n") != NULL);
    strbuf_release(&m);
    quota_free(q);
}

static void test_bounded_table(void)
{
    struct quota *q = make(0, 0, 1000, 0, 2);
    struct quota_slot *a = NULL, *b = NULL, *c = NULL;
    int after = 0;

    CHECK_INT(admit(q, "alice", T0, &a, &after), QUOTA_OK);
    quota_stored(q, a, 1000, T0 + HOUR);
    quota_put(q, a);
    CHECK_INT(admit(q, "bob", T0, &b, &after), QUOTA_OK);
    /* Alice, seen least recently with nothing in flight, is forgotten for carol. */
    CHECK_INT(admit(q, "carol", T0, &c, &after), QUOTA_OK);
    /* Both now in flight: a fourth caller cannot be tracked. */
    CHECK_INT(admit(q, "dave", T0, &a, &after), QUOTA_BUSY);
    quota_put(q, c);
    /* Alice comes back from zero; her bytes stayed in the total. */
    CHECK_INT(admit(q, "alice", T0, &a, &after), QUOTA_OK);
    CHECK_INT(quota_total_stored(q, T0), 1000);
    quota_put(q, a);
    quota_put(q, b);
    quota_free(q);
}

int main(void)
{
    test_keys_in_flight();
    test_new_keys_a_second();
    test_stored_bytes_expire();
    test_budget_and_start();
    test_bounded_table();
    return t_done();
}
