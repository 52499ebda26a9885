/* SPDX-License-Identifier: Apache-2.0 */
/*
 * schema.h - orderd's business tables, as versioned libidem migrations of component "orderd".
 */
#ifndef ORDERD_SCHEMA_H
#define ORDERD_SCHEMA_H

struct idem_store;

/*
 * Applies every orderd migration newer than the store's.  Returns 0 and *applied (may be NULL),
 * or a negative IDEM_E* with detail in *errmsg (new, free with idem_free).
 */
int schema_migrate(struct idem_store *st, int *applied, char **errmsg);

/*
 * As schema_migrate(), up to and including step `version` only: how a test builds the store an
 * older orderd left, to see what a later step makes of its rows.
 */
int schema_migrate_to(struct idem_store *st, int version, int *applied, char **errmsg);

/*
 * On each cluster of a shard set, after schema_migrate(): users and products live in the
 * catalogue, so the cluster's rows refer to them by value, without a foreign key.  As
 * schema_migrate() otherwise.
 */
int schema_migrate_cluster(struct idem_store *st, int *applied, char **errmsg);

/* The catalogue of a shard set, after schema_migrate(): its stock reservations (stock.c). */
int schema_migrate_catalogue(struct idem_store *st, int *applied, char **errmsg);

#endif /* ORDERD_SCHEMA_H */
