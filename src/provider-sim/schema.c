/* SPDX-License-Identifier: Apache-2.0 */
/*
 * schema.c - provider-sim's tables, next to libidem's records in the same store so that an effect
 * (a charge row, its webhook event and deliveries) commits in the same transaction as the stored
 * response of its Idempotency-Key.  The effect tables carry the key without a unique constraint
 * on purpose: uniqueness is libidem's job, and the ledger counts rows per key to prove it held.
 * The text is valid for SQLite and PostgreSQL alike (BIGINT is an integer type in both).
 */
#include "schema.h"

#include <stddef.h>

#include "banned.h"

static const char tables[] = "CREATE TABLE charges ("
                             "  id TEXT PRIMARY KEY,"
                             "  idem_key TEXT NOT NULL,"
                             "  amount BIGINT NOT NULL,"
                             "  currency TEXT NOT NULL,"
                             "  source TEXT NOT NULL,"
                             "  status TEXT NOT NULL,"
                             "  failure_code TEXT,"
                             "  description TEXT,"
                             "  metadata TEXT NOT NULL,"
                             "  reference TEXT,"
                             "  created_ms BIGINT NOT NULL"
                             ");"
                             "CREATE INDEX charges_key ON charges (idem_key);"
                             "CREATE TABLE refunds ("
                             "  id TEXT PRIMARY KEY,"
                             "  idem_key TEXT NOT NULL,"
                             "  charge_id TEXT NOT NULL REFERENCES charges (id),"
                             "  amount BIGINT NOT NULL,"
                             "  currency TEXT NOT NULL,"
                             "  metadata TEXT NOT NULL,"
                             "  created_ms BIGINT NOT NULL"
                             ");"
                             "CREATE INDEX refunds_key ON refunds (idem_key);"
                             "CREATE INDEX refunds_charge ON refunds (charge_id);"
                             "CREATE TABLE emails ("
                             "  id TEXT PRIMARY KEY,"
                             "  idem_key TEXT NOT NULL,"
                             "  recipient TEXT NOT NULL,"
                             "  subject TEXT NOT NULL,"
                             "  template TEXT NOT NULL,"
                             "  body_text TEXT NOT NULL,"
                             "  metadata TEXT NOT NULL,"
                             "  reference TEXT,"
                             "  created_ms BIGINT NOT NULL"
                             ");"
                             "CREATE INDEX emails_key ON emails (idem_key);"
                             "CREATE TABLE events ("
                             "  id TEXT PRIMARY KEY,"
                             "  type TEXT NOT NULL,"
                             "  payload TEXT NOT NULL,"
                             "  created_ms BIGINT NOT NULL"
                             ");"
                             "CREATE TABLE deliveries ("
                             "  id TEXT PRIMARY KEY,"
                             "  event_id TEXT NOT NULL REFERENCES events (id),"
                             "  shard BIGINT NOT NULL,"
                             "  status TEXT NOT NULL,"
                             "  attempts BIGINT NOT NULL,"
                             "  due_ms BIGINT NOT NULL,"
                             "  last_status BIGINT,"
                             "  last_error TEXT,"
                             "  delivered_ms BIGINT"
                             ");"
                             "CREATE INDEX deliveries_due ON deliveries (status, shard, due_ms)";

/*
 * The ledger's audit reads (ledger.c) group charges and emails by reference, and emails by
 * template: with these indexes the store walks each group in order from the index alone, so a
 * page of GET /v1/ledger/references stops after its rows and the duplicate checks of
 * GET /v1/ledger need no sort of the whole table.  `status` rides along so that counting the
 * successful charges of a reference never touches the table.
 */
static const char ledger_indexes[] =
    "CREATE INDEX charges_reference ON charges (reference, status);"
    "CREATE INDEX emails_reference ON emails (reference);"
    "CREATE INDEX emails_template ON emails (template)";

static const struct idem_migration steps[] = {
    {1, "charges, refunds, emails, webhook events", tables, tables},
    {2, "indexes of the ledger's audit by reference", ledger_indexes, ledger_indexes},
};

int schema_migrate(struct idem_store *st, int *applied, char **errmsg)
{
    return idem_store_migrate(st, "provider-sim", steps, sizeof steps / sizeof steps[0], applied,
                              errmsg);
}
