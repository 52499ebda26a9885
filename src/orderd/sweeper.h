/*
 * sweeper.h - the retention sweeper: a thread that deletes idempotency records whose retention
 * ended, every few seconds, in small batches.
 */
#ifndef ORDERD_SWEEPER_H
#define ORDERD_SWEEPER_H

#include <pthread.h>

struct idem_engine;
struct logger;

struct sweeper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int inited; /* mutex and condition variable exist */
    int running;
    int interval_s;
    struct idem_engine *engine; /* borrowed */
    const struct logger *log;   /* borrowed */
};

/* Starts sweeping every `interval_s` seconds (0: does nothing).  Returns 0 or -1. */
int sweeper_start(struct sweeper *sw, struct idem_engine *engine, int interval_s,
                  const struct logger *log);

/* Wakes the thread, waits for it to end its current batch and exit.  Safe if never started. */
void sweeper_stop(struct sweeper *sw);

#endif /* ORDERD_SWEEPER_H */
