/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_sqlite.h - what the SQLite store's two upper files share: the store's open of a pooled
 * connection (store_sqlite.c), and the group commit that every write goes through
 * (sqlite_commit.c).  Both stand on one connection layer (sqlite_conn.h).  Nothing outside the
 * store's files includes it; the engine sees the store only through idem__sqlite_vtab.
 */
#ifndef IDEM_STORE_SQLITE_H
#define IDEM_STORE_SQLITE_H

#include "sqlite_conn.h"

/* ---- store_sqlite.c ------------------------------------------------------------------------ */

/* Opens a connection to st's file (made if missing, schema applied): 0 or IDEM_E*, why in err. */
int idem__sq_open(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen);
/* The directory holding the file `path` ("." for a bare name) into `out`. */
void idem__sq_dir_of(const char *path, char *out, size_t n);

/* ---- sqlite_commit.c: the group commit (struct idem_store_vtab's write_* members) ------------ */

/*
 * Makes the store's group (the first connection opened does, before anyone may write): 1 when
 * this call made it, 0 when it was there, or an IDEM_E* code.
 */
int idem__sq_group_get(struct idem_store *st);
/* Commits what is open, stops the group's threads and frees it (idem_store_close). */
void idem__sq_group_free(struct idem_store *st);
/*
 * Sets up the commit pipeline once the store's first connection opened (sqlite_commit.c, at the
 * top): 0, or IDEM_EUNAVAIL with why in `err`.  Not called for IDEM_SYNC_NORMAL.
 */
int idem__sq_pipeline_open(struct idem_store *st, char *err, size_t errlen);
/*
 * After every statement on connection `c` (and before a pooled connection's transaction ends):
 * returns once every commit the statement could have seen is durable (0), or IDEM_EUNAVAIL with
 * why in c->errmsg when the store stopped after a failed fsync -- on the writer too, whose reads
 * are otherwise gated by its batch.
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

#endif /* IDEM_STORE_SQLITE_H */
