/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signals.c - the stop signals of signals.h.
 */
#include "signals.h"

#include <pthread.h>

#include "banned.h"

void stop_signals_block(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void reload_signal_block(sigset_t *set)
{
    sigaddset(set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, set, NULL);
}

const char *stop_signals_wait_reloading(const sigset_t *set, void (*reload)(void *arg), void *arg)
{
    int sig = 0;

    for (;;) {
        if (sigwait(set, &sig) != 0)
            continue;
        if (sig != SIGHUP)
            return sig == SIGINT ? "SIGINT" : "SIGTERM";
        reload(arg);
    }
}

const char *stop_signals_wait(const sigset_t *set)
{
    int sig = 0;

    while (sigwait(set, &sig) != 0)
        ;
    return sig == SIGINT ? "SIGINT" : "SIGTERM";
}
