/* SPDX-License-Identifier: Apache-2.0 */
/*
 * recovery.h - the two workers that finish what requests started (docs/orderd.md, and
 * docs/libidem.md on phases and recovery points):
 *
 * - the completer takes over records left `processing` with an expired lease (the process that
 *   owned them died, or nobody retried) and runs their remaining phases exactly as a retry would;
 * - the reconciler handles what met an unknown outcome at the provider: it takes the record over,
 *   asks the provider by the derived key what happened, and rolls the order forward (paid,
 *   refunded) or back (payment_failed, stock released) - or, if the provider never saw the call,
 *   makes it now with the same key.
 *
 * Both take records with idem_call_recover(), so a client's retry meanwhile gets 409 with
 * "state": "recovering".  Records the reconciler owns (flagged unknown) are left to it while it
 * runs; with the reconciler off, the completer takes those too (calling again with the same key).
 */
#ifndef ORDERD_RECOVERY_H
#define ORDERD_RECOVERY_H

struct app;

#define RECOVERY_BATCH 16

/* One completer run (a worker_fn): at most RECOVERY_BATCH records; *items = settled. */
int completer_run(struct app *app, int *items);

/* One reconciler run (a worker_fn): at most RECOVERY_BATCH orders and refunds; *items = settled. */
int reconciler_run(struct app *app, int *items);

#endif /* ORDERD_RECOVERY_H */
