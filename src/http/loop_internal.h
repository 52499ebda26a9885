/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop_internal.h - what the HTTP layer's own client (http_client.c) needs of the event loops
 * (http_server.c): the loop of the calling thread, and a hook to close what it keeps on a loop
 * before the loop's handles are closed at stop.  Not for programs: they never see libuv.
 */
#ifndef IDEM_HTTP_LOOP_INTERNAL_H
#define IDEM_HTTP_LOOP_INTERNAL_H

#include <uv.h>

/* The libuv loop the calling thread runs (a server's loop thread), or NULL on any other thread. */
uv_loop_t *http_loop_current(void);

/*
 * Registers fn(arg) to run when the calling thread's loop stops, after its parked requests were
 * told and before its remaining handles are closed: close them there, with their callbacks (the
 * loop runs once more to call them).  Returns 0, or -1 off a loop thread or when full.
 */
int http_loop_at_stop(void (*fn)(void *arg), void *arg);

#endif /* IDEM_HTTP_LOOP_INTERNAL_H */
