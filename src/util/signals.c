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

const char *stop_signals_wait(const sigset_t *set)
{
    int sig = 0;

    while (sigwait(set, &sig) != 0)
        ;
    return sig == SIGINT ? "SIGINT" : "SIGTERM";
}
