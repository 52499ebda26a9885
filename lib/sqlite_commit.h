/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sqlite_commit.h - the SQLite store's group commit, as the store above it calls it:
 *
 *     store_sqlite.c       the store's tables: records, migrations, reads on pooled connections
 *        |       |
 *        |       v
 *        |    sqlite_commit.c    the group commit: the writer, batches, syncer, read gate
 *        |       |
 *        v       v
 *     sqlite_conn.c        a connection: opened and configured, its statements, its errors
 *
 * The write_* calls are struct idem_store_methods' members of the same names; the rest is what the
 * store's open and its reads need.  Only store_sqlite.c includes it.
 */
#ifndef IDEM_SQLITE_COMMIT_H
#define IDEM_SQLITE_COMMIT_H

#include "sqlite_conn.h"

/*
 * Makes the store's group if it has none; the store's open calls it before it opens a
 * connection, so the group is there before anyone may write.  The call that makes it, for a store
 * not opened with IDEM_SYNC_NORMAL, first fsyncs the database's -wal file, the database file and
 * their directory, as far as they exist: what a process killed before its fsync left in the page
 * cache is durable before anyone reads it.  Returns 1 when this call made the group, 0 when it was
 * there, or IDEM_ENOMEM, or IDEM_EUNAVAIL with why in `err`.
 */
int idem__sq_group_open(struct idem_store *st, char *err, size_t errlen);
/*
 * Starts the commit pipeline once the store's first connection opened and its schema is applied
 * (the call after the one idem__sq_group_open returned 1 for), unless the store was opened with
 * IDEM_SYNC_NORMAL or is not a plain file: 0, or IDEM_EUNAVAIL with why in `err`.
 */
int idem__sq_pipeline_open(struct idem_store *st, char *err, size_t errlen);
/* Commits what is open, stops the group's threads and frees it (idem_store_close). */
void idem__sq_group_free(struct idem_store *st);

/*
 * After every statement on connection `c` (and before a pooled connection's transaction ends):
 * returns once every commit the statement could have seen is durable (0), or IDEM_EUNAVAIL with
 * why in c->errmsg when the store stopped after a failed fsync -- on the writer too, whose reads
 * are otherwise gated by its batch.  A pooled connection's transaction starts with
 * c->snap_marked cleared.
 */
int idem__sq_read_gate(struct idem_conn *c);

int idem__sq_write_begin(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen);
int idem__sq_write_commit(struct idem_store *st, struct idem_conn *c, char *err, size_t errlen);
int idem__sq_write_rollback(struct idem_store *st, struct idem_conn *c);
int idem__sq_write_commit_async(struct idem_store *st, struct idem_conn *c,
                                struct idem__job_slot *slot, idem__commit_done done, void *arg,
                                char *err, size_t errlen);
int idem__sq_write_run(struct idem_store *st, idem__tx_fn fn, void *arg, unsigned flags, char *err,
                       size_t errlen);
int idem__sq_write_run_async(struct idem_store *st, struct idem__job_slot *slot, idem__tx_fn fn,
                             void *arg, unsigned flags, idem__commit_done done, void *done_arg,
                             char *err, size_t errlen);

#endif /* IDEM_SQLITE_COMMIT_H */
