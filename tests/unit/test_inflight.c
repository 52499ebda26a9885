/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_inflight.c - lib/inflight.c on its own: a scope is in flight once, whoever comes next
 * waits for it to leave (up to a deadline), a watch is called once when its scope leaves and
 * never after it ended, and a change wakes whoever waits for one.
 */
#include "inflight.h"
#include "t.h"

#include <pthread.h>
#include <stdatomic.h>

static const struct idem_scope s_a = {"alice", "orders.create", "k1"};
static const struct idem_scope s_a_again = {"alice", "orders.create", "k1"}; /* equal, not same */
static const struct idem_scope s_other_key = {"alice", "orders.create", "k2"};
static const struct idem_scope s_other_op = {"alice", "orders.cancel", "k1"};
static const struct idem_scope s_split1 = {"ab", "c", "k"};
static const struct idem_scope s_split2 = {"a", "bc", "k"};

static struct idem__inflight *registry(void)
{
    struct idem__inflight *r = NULL;

    CHECK_INT(idem__inflight_new(&r), 0);
    CHECK(r != NULL);
    return r;
}

static void test_a_scope_is_in_flight_once(void)
{
    struct idem__inflight *r = registry();
    struct idem__inflight_entry e1 = {.scope = &s_a}, e2 = {.scope = &s_a_again},
                                e3 = {.scope = &s_other_key};
    struct idem__inflight_entry e4 = {.scope = &s_other_op}, e5 = {.scope = &s_split1},
                                e6 = {.scope = &s_split2};

    CHECK_INT(idem__inflight_try_enter(r, &e1), 1);
    CHECK_INT(e1.in, 1);
    /* Scopes are compared by value: another copy of the same scope is busy. */
    CHECK_INT(idem__inflight_try_enter(r, &e2), 0);
    CHECK_INT(e2.in, 0);
    /* Every part of the scope counts, and the parts cannot slide into each other. */
    CHECK_INT(idem__inflight_try_enter(r, &e3), 1);
    CHECK_INT(idem__inflight_try_enter(r, &e4), 1);
    CHECK_INT(idem__inflight_try_enter(r, &e5), 1);
    CHECK_INT(idem__inflight_try_enter(r, &e6), 1);
    idem__inflight_changed(r, &e1);
    idem__inflight_changed(r, &e3);
    idem__inflight_changed(r, &e4);
    idem__inflight_changed(r, &e5);
    idem__inflight_changed(r, &e6);
    idem__inflight_free(r);
}

static void test_leaving_lets_the_next_enter(void)
{
    struct idem__inflight *r = registry();
    struct idem__inflight_entry e1 = {.scope = &s_a}, e2 = {.scope = &s_a_again};
    int waited = -1;

    CHECK_INT(idem__inflight_try_enter(r, &e1), 1);
    idem__inflight_changed(r, &e1);
    CHECK_INT(e1.in, 0);
    idem__inflight_changed(r, &e1); /* leaving twice is leaving once */
    CHECK_INT(idem__inflight_try_enter(r, &e2), 1);
    idem__inflight_changed(r, &e2);
    /* A free scope is entered at once, without waiting. */
    idem__inflight_enter(r, &e1, clock_mono_ms() + 30000, &waited);
    CHECK_INT(waited, 0);
    CHECK_INT(e1.in, 1);
    idem__inflight_changed(r, &e1);
    idem__inflight_free(r);
}

struct enterer {
    struct idem__inflight *r;
    struct idem__inflight_entry e;
    int64_t deadline;
    int waited;
    atomic_int done;
};

static void *enter_thread(void *arg)
{
    struct enterer *t = arg;

    idem__inflight_enter(t->r, &t->e, t->deadline, &t->waited);
    atomic_store(&t->done, 1);
    return NULL;
}

static void test_enter_waits_until_the_scope_leaves(void)
{
    struct idem__inflight *r = registry();
    struct idem__inflight_entry first = {.scope = &s_a};
    struct enterer t = {r, {.scope = &s_a_again}, clock_mono_ms() + 60000, -1, 0};
    pthread_t th;

    CHECK_INT(idem__inflight_try_enter(r, &first), 1);
    CHECK_INT(pthread_create(&th, NULL, enter_thread, &t), 0);
    t_sleep_ms(50); /* a quiet period: the second must still be waiting */
    CHECK_INT(atomic_load(&t.done), 0);
    idem__inflight_changed(r, &first);
    T_WAIT_UNTIL(atomic_load(&t.done), "the second to enter once the first left");
    pthread_join(th, NULL);
    CHECK_INT(t.waited, 1);
    CHECK_INT(t.e.in, 1);
    idem__inflight_changed(r, &t.e);
    idem__inflight_free(r);
}

static void test_enter_past_its_deadline_goes_on_without_entering(void)
{
    struct idem__inflight *r = registry();
    struct idem__inflight_entry first = {.scope = &s_a}, late = {.scope = &s_a_again};
    int64_t t0 = clock_mono_ms();
    int waited = -1;

    CHECK_INT(idem__inflight_try_enter(r, &first), 1);
    idem__inflight_enter(r, &late, t0 + 30, &waited);
    CHECK(clock_mono_ms() - t0 >= 30);
    CHECK_INT(waited, 1);
    CHECK_INT(late.in, 0);
    /* A deadline already past: no wait at all. */
    idem__inflight_enter(r, &late, t0, &waited);
    CHECK_INT(waited, 0);
    CHECK_INT(late.in, 0);
    idem__inflight_changed(r, &first);
    idem__inflight_free(r);
}

static void count_call(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_a_watch_fires_once_when_its_scope_leaves(void)
{
    struct idem__inflight *r = registry();
    struct idem__inflight_entry first = {.scope = &s_a}, other = {.scope = &s_other_key};
    struct idem_watch *w = (struct idem_watch *)&w;
    atomic_int fired = 0;

    /* Nothing to watch for a scope that is not in flight. */
    CHECK_INT(idem__inflight_watch(r, &s_a, count_call, &fired, &w), 0);
    CHECK(w == NULL);
    CHECK_INT(idem__inflight_try_enter(r, &first), 1);
    CHECK_INT(idem__inflight_try_enter(r, &other), 1);
    CHECK_INT(idem__inflight_watch(r, &s_a_again, count_call, &fired, &w), 1);
    CHECK(w != NULL);
    /* A change that takes no scope out of flight, or another scope's leaving, is not its. */
    idem__inflight_changed(r, NULL);
    idem__inflight_changed(r, &other);
    CHECK_INT(atomic_load(&fired), 0);
    idem__inflight_changed(r, &first);
    CHECK_INT(atomic_load(&fired), 1); /* called on the leaving thread, before it returns */
    /* Once: the scope entering and leaving again calls it no more. */
    CHECK_INT(idem__inflight_try_enter(r, &first), 1);
    idem__inflight_changed(r, &first);
    CHECK_INT(atomic_load(&fired), 1);
    idem__inflight_watch_end(w);
    idem__inflight_watch_end(NULL);
    idem__inflight_free(r);
}

static void test_an_ended_watch_never_fires(void)
{
    struct idem__inflight *r = registry();
    struct idem__inflight_entry first = {.scope = &s_a};
    struct idem_watch *w1 = NULL, *w2 = NULL;
    atomic_int fired1 = 0, fired2 = 0;

    CHECK_INT(idem__inflight_try_enter(r, &first), 1);
    CHECK_INT(idem__inflight_watch(r, &s_a, count_call, &fired1, &w1), 1);
    CHECK_INT(idem__inflight_watch(r, &s_a, count_call, &fired2, &w2), 1);
    idem__inflight_watch_end(w1);
    idem__inflight_changed(r, &first);
    CHECK_INT(atomic_load(&fired1), 0);
    CHECK_INT(atomic_load(&fired2), 1); /* the other watch of the scope still fires */
    idem__inflight_watch_end(w2);
    idem__inflight_free(r);
}

struct slow_watch {
    atomic_int running, release, returned, ended;
    struct idem__inflight *r;
    struct idem__inflight_entry *leaving;
    struct idem_watch *w;
};

static void slow_callback(void *arg)
{
    struct slow_watch *s = arg;

    atomic_store(&s->running, 1);
    /* Polled with a deadline, not T_WAIT_UNTIL: its counters belong to the test's thread. */
    const int64_t deadline = clock_mono_ms() + T_WAIT_MS;
    while (!atomic_load(&s->release) && clock_mono_ms() < deadline)
        t_sleep_ms(1);
    atomic_store(&s->returned, 1);
}

static void *leave_thread(void *arg)
{
    struct slow_watch *s = arg;

    idem__inflight_changed(s->r, s->leaving);
    return NULL;
}

static void *end_thread(void *arg)
{
    struct slow_watch *s = arg;

    idem__inflight_watch_end(s->w);
    atomic_store(&s->ended, 1);
    return NULL;
}

static void test_watch_end_waits_for_its_running_callback(void)
{
    struct idem__inflight *r = registry();
    struct idem__inflight_entry first = {.scope = &s_a};
    struct slow_watch s = {0};
    pthread_t leaver, ender;

    s.r = r;
    s.leaving = &first;
    CHECK_INT(idem__inflight_try_enter(r, &first), 1);
    CHECK_INT(idem__inflight_watch(r, &s_a, slow_callback, &s, &s.w), 1);
    CHECK_INT(pthread_create(&leaver, NULL, leave_thread, &s), 0);
    T_WAIT_UNTIL(atomic_load(&s.running), "the watch's callback to run");
    CHECK_INT(pthread_create(&ender, NULL, end_thread, &s), 0);
    t_sleep_ms(50); /* a quiet period: the end must wait for the callback */
    CHECK_INT(atomic_load(&s.ended), 0);
    atomic_store(&s.release, 1);
    T_WAIT_UNTIL(atomic_load(&s.ended), "the watch's end once its callback returned");
    CHECK_INT(atomic_load(&s.returned), 1);
    pthread_join(leaver, NULL);
    pthread_join(ender, NULL);
    idem__inflight_free(r);
}

struct waiter {
    struct idem__inflight *r;
    atomic_int woke;
};

static void *wait_thread(void *arg)
{
    struct waiter *w = arg;

    idem__inflight_wait_change(w->r, 60000);
    atomic_store(&w->woke, 1);
    return NULL;
}

static void test_a_change_wakes_who_waits_for_one(void)
{
    struct idem__inflight *r = registry();
    struct waiter w = {r, 0};
    int64_t t0 = clock_mono_ms();
    pthread_t th;

    /* With no change, the wait lasts its time. */
    idem__inflight_wait_change(r, 30);
    CHECK(clock_mono_ms() - t0 >= 30);
    CHECK_INT(pthread_create(&th, NULL, wait_thread, &w), 0);
    /* Changes until it wakes: one made before it began to wait would not count. */
    T_WAIT_UNTIL((idem__inflight_changed(r, NULL), atomic_load(&w.woke)),
                 "the waiter to wake at a change");
    pthread_join(th, NULL);
    idem__inflight_free(r);
}

int main(void)
{
    test_a_scope_is_in_flight_once();
    test_leaving_lets_the_next_enter();
    test_enter_waits_until_the_scope_leaves();
    test_enter_past_its_deadline_goes_on_without_entering();
    test_a_watch_fires_once_when_its_scope_leaves();
    test_an_ended_watch_never_fires();
    test_watch_end_waits_for_its_running_callback();
    test_a_change_wakes_who_waits_for_one();
    return t_done();
}
