/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_schema.c - orderd's migrations (src/orderd/schema.c) on a store an older orderd left with
 * rows in it, where a step that backfills is only as good as what it makes of those rows.  A
 * store is migrated to step 5 and given a user's order with its payment, its refund, its
 * confirmation email, another user's "profile changed" email, a message and a webhook event that
 * name no user; step 6 then names the user of each row it can tell and leaves the others NULL.
 * A fresh store takes every step at once.  On SQLite in a temporary directory, or on the
 * PostgreSQL of IDEM_TEST_PG_URI when that is set (pg.orderd_schema runs it under with_pg.sh):
 * the two dialects of a step must agree.
 */
#include "idem/idem.h"
#include "schema.h"
#include "t.h"
#include "t_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/idem-unit-orderd-schema-XXXXXX";

/*
 * The rows an orderd at step 5 wrote: two users, one order each, and what hangs off them.  Each
 * statement spans several literals, in parentheses (clang's -Wstring-concatenation).
 */
static const char *const step5_rows[] = {
    "INSERT INTO users (id, name) VALUES ('u-ann', 'ann'), ('u-bob', 'bob')",
    ("INSERT INTO orders (id, user_id, product_id, quantity, unit_price, amount, currency, status, "
     "idem_key, request_fp, created_at) VALUES "
     "('ord-1', 'u-ann', 'p-1024', 1, 1999, 1999, 'EUR', 'cancelled', 'k-1', 'fp', "
     "'2026-01-01T00:00:00.000Z'), "
     "('ord-2', 'u-bob', 'p-2048', 1, 4999, 4999, 'EUR', 'paid', 'k-2', 'fp', "
     "'2026-01-01T00:00:01.000Z')"),
    ("INSERT INTO payments (order_id, charge_id, provider_key, amount, currency, status, "
     "created_at) VALUES "
     "('ord-1', 'ch-1', 'order-ord-1-charge', 1999, 'EUR', 'succeeded', '2026-01-01T00:00:02Z'), "
     "('ord-2', 'ch-2', 'order-ord-2-charge', 4999, 'EUR', 'succeeded', '2026-01-01T00:00:03Z')"),
    ("INSERT INTO refunds (order_id, provider_key, charge_id, amount, currency, status, "
     "requested_at, updated_at) VALUES ('ord-1', 'order-ord-1-refund', 'ch-1', 1999, 'EUR', "
     "'requested', '2026-01-01T00:00:04Z', '2026-01-01T00:00:04Z')"),
    ("INSERT INTO outbox (id, kind, dedupe_key, recipient, payload, status, next_attempt_ms, "
     "created_at) VALUES "
     "('obx_confirm', 'order_confirmation', 'order-ord-1-confirmation', 'ann@example.com', "
     "'{\"to\":\"ann@example.com\",\"template\":\"order_confirmation\","
     "\"metadata\":{\"orderId\":\"ord-1\",\"userId\":\"u-ann\"}}', 'sent', 0, "
     "'2026-01-01T00:00:05Z'), "
     "('obx_profile', 'profile_changed', 'obx_profile', 'bob@example.com', "
     "'{\"to\":\"bob@example.com\",\"template\":\"profile_changed\","
     "\"metadata\":{\"userId\":\"u-bob\"}}', 'pending', 0, '2026-01-01T00:00:06Z'), "
     "('obx_other', 'email', 'obx_other', 'ops@example.com', 'not JSON', 'parked', 0, "
     "'2026-01-01T00:00:07Z')"),
    ("INSERT INTO inbox (event_id, type, result, received_at) VALUES "
     "('evt_1', 'charge.succeeded', 'applied', '2026-01-01T00:00:08Z')"),
};

/* Runs each of `sql` in one write transaction and commits; 0 or the first failure. */
static int exec_all(struct idem_store *st, const char *const *sql, size_t n)
{
    struct idem_tx *tx = NULL;
    size_t i;
    int rc = idem_tx_begin(st, 1, &tx);

    for (i = 0; rc == 0 && i < n; i++) {
        rc = idem_tx_exec(tx, sql[i], 0, NULL, NULL);
        if (rc < 0)
            fprintf(stderr, "%s\n  failed: %s\n", sql[i], idem_tx_errmsg(tx));
    }
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
    idem_tx_rollback(tx);
    return rc;
}

static struct idem_store *open_store(const char *uri)
{
    struct idem_store_options o = {.pool_size = 2, .busy_timeout_ms = 30000};
    struct idem_store *st = NULL;
    char *err = NULL;

    if (idem_store_open(uri, &o, &st, &err) < 0) {
        fprintf(stderr, "cannot open %s: %s\n", uri, err ? err : "?");
        exit(1);
    }
    return st;
}

/* What step 6 leaves of those rows: each statement's first cell. */
static const struct {
    const char *sql, *want;
} after_step6[] = {
    {"SELECT user_id FROM payments WHERE order_id = 'ord-1'", "u-ann"},
    {"SELECT user_id FROM payments WHERE order_id = 'ord-2'", "u-bob"},
    {"SELECT user_id FROM refunds WHERE order_id = 'ord-1'", "u-ann"},
    /* The confirmation through the order its dedupe key names; the profile email by its payload. */
    {"SELECT user_id FROM outbox WHERE id = 'obx_confirm'", "u-ann"},
    {"SELECT user_id FROM outbox WHERE id = 'obx_profile'", "u-bob"},
    {"SELECT user_id FROM outbox WHERE id = 'obx_other'", "(null)"},
    {"SELECT user_id FROM inbox WHERE event_id = 'evt_1'", "(null)"},
    /* The counts the triggers keep saw no change of status or result. */
    {"SELECT sum(value) FROM counts WHERE name = 'outbox:sent'", "1"},
    {"SELECT sum(value) FROM counts WHERE name = 'inbox:charge.succeeded:applied'", "1"},
};

static void test_step6_names_the_user_of_rows_made_at_step5(const char *uri)
{
    struct idem_store *st = open_store(uri);
    int applied = -1;
    char *err = NULL, buf[128];

    CHECK_INT(schema_migrate_to(st, 5, &applied, &err), 0);
    CHECK_INT(applied, 5);
    CHECK_INT(exec_all(st, step5_rows, sizeof step5_rows / sizeof step5_rows[0]), 0);
    CHECK_STR(t_store_cell(st, "SELECT count(*) FROM payments", NULL, buf, sizeof buf), "2");

    CHECK_INT(schema_migrate(st, &applied, &err), 0);
    if (err != NULL)
        fprintf(stderr, "schema_migrate: %s\n", err);
    CHECK_INT(applied, 1);
    for (size_t i = 0; i < sizeof after_step6 / sizeof after_step6[0]; i++)
        CHECK_STR(t_store_cell(st, after_step6[i].sql, NULL, buf, sizeof buf), after_step6[i].want);

    applied = -1;
    CHECK_INT(schema_migrate(st, &applied, &err), 0);
    CHECK_INT(applied, 0);
    idem_free(err);
    idem_store_close(st);
}

static void test_a_fresh_store_takes_every_step(const char *uri)
{
    struct idem_store *st = open_store(uri);
    int applied = -1;
    char *err = NULL, buf[128];

    CHECK_INT(schema_migrate(st, &applied, &err), 0);
    CHECK_INT(applied, 6);
    CHECK_STR(t_store_cell(st, "SELECT count(user_id) FROM outbox", NULL, buf, sizeof buf), "0");
    idem_free(err);
    idem_store_close(st);
}

int main(void)
{
    const char *pg = getenv("IDEM_TEST_PG_URI");
    char uri[256], cmd[300];

    if (pg != NULL) {
        /* One database, so the older store only; every service-pg test migrates a fresh one. */
        test_step6_names_the_user_of_rows_made_at_step5(pg);
        return t_done();
    }
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(uri, sizeof uri, "sqlite:%s/old.db", dir);
    test_step6_names_the_user_of_rows_made_at_step5(uri);
    snprintf(uri, sizeof uri, "sqlite:%s/fresh.db", dir);
    test_a_fresh_store_takes_every_step(uri);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
