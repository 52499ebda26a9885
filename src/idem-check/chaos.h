/*
 * chaos.h - what the parts of `idem-check chaos` share: a small random generator (rand() is
 * banned; this one is seeded from the OpenSSL CSPRNG), the fault-injecting TCP proxy (proxy.c)
 * and the mode's entry point (chaos.c).
 */
#ifndef IDEM_CHECK_CHAOS_H
#define IDEM_CHECK_CHAOS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "check.h"

/* xorshift64*: not for secrets, only for deciding which fault hits what. */
struct ck_rng {
    uint64_t s;
};
void ck_rng_seed(struct ck_rng *r);
/* Uniform in [0, 1). */
double ck_rng_double(struct ck_rng *r);

struct ck_proxy {
    int listen_fd;
    int port; /* where clients connect (127.0.0.1) */
    atomic_int upstream_port;
    atomic_int stopping;
    double drop_rate, reset_rate; /* under rng_lock */
    pthread_mutex_t rng_lock;
    struct ck_rng rng;
    pthread_t thread;
    atomic_long connections, resets, drops, upstream_down;
};

/* Listens on 127.0.0.1:0 and forwards to 127.0.0.1:upstream_port; 0 or -1 (errno). */
int ck_proxy_start(struct ck_proxy *p, int upstream_port, double drop_rate, double reset_rate);
void ck_proxy_set_faults(struct ck_proxy *p, double drop_rate, double reset_rate);
/* Stops accepting; connections in flight end on their own. */
void ck_proxy_stop(struct ck_proxy *p);

/* `idem-check chaos ...` (argv[0] is "chaos"); returns the exit code. */
int ck_chaos_main(int argc, char **argv);

#endif /* IDEM_CHECK_CHAOS_H */
