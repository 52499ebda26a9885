/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sweeper.h - the retention sweeper, a background worker (worker.h): deletes idempotency records,
 * sent outbox messages and webhook inbox entries whose retention ended, in small batches.
 */
#ifndef ORDERD_SWEEPER_H
#define ORDERD_SWEEPER_H

struct app;

#define SWEEP_BATCH 500

/* One run (a worker_fn): for each kind, batches of SWEEP_BATCH until fewer come back, at most a
 * few; *items = rows deleted. */
int sweeper_run(struct app *app, int *items);

#endif /* ORDERD_SWEEPER_H */
