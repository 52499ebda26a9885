/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signals.h - how the programs stop: SIGINT and SIGTERM are blocked in every thread and taken
 * synchronously by the main thread with sigwait(), so no signal handler and no global flag are
 * needed, and the stop unwinds in the main thread's own order.  SIGPIPE is ignored: a peer that
 * hangs up must cost a write error, not the process.
 */
#ifndef IDEM_UTIL_SIGNALS_H
#define IDEM_UTIL_SIGNALS_H

#include <signal.h>

/*
 * Blocks the stop signals in the calling thread, fills `set` with them, and ignores SIGPIPE.
 * Call it before any other thread exists, so every thread inherits the mask.
 */
void stop_signals_block(sigset_t *set);

/* Waits for one of the stop signals in `set`; returns its name ("SIGINT", "SIGTERM"), static. */
const char *stop_signals_wait(const sigset_t *set);

/*
 * Adds SIGHUP to `set` and blocks it in the calling thread, for a program that reloads on it
 * (before any other thread exists, as stop_signals_block).
 */
void reload_signal_block(sigset_t *set);

/*
 * Waits for a stop signal in `set` as stop_signals_wait(); each SIGHUP meanwhile (when the set
 * has it: reload_signal_block) calls reload(arg) on the calling thread, and the wait goes on.
 */
const char *stop_signals_wait_reloading(const sigset_t *set, void (*reload)(void *arg), void *arg);

#endif /* IDEM_UTIL_SIGNALS_H */
