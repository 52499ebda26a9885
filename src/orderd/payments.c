/* SPDX-License-Identifier: Apache-2.0 */
/*
 * payments.c - the state transitions of payments.h.  SQL is written once for SQLite and
 * PostgreSQL: text parameters, CAST where a number is meant, ON CONFLICT DO NOTHING for rows that
 * must exist once.
 */
#include "payments.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "app.h"
#include "db.h"
#include "outbox.h"
#include "stock.h"
#include "util.h"
#include "banned.h"

#define CHECK_BACKOFF_MAX_MS 60000

void payments_charge_key(const char *order_id, char out[PAYMENT_KEY_MAX])
{
    snprintf(out, PAYMENT_KEY_MAX, "order-%s-charge", order_id);
}

void payments_refund_key(const char *order_id, char out[PAYMENT_KEY_MAX])
{
    snprintf(out, PAYMENT_KEY_MAX, "order-%s-refund", order_id);
}

static void copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

int payments_load(const struct app *app, struct idem_tx *tx, const char *order_id,
                  struct order_pay *o)
{
    struct idem_rows *rows = NULL;
    const char *params[1] = {order_id};
    int rc;

    memset(o, 0, sizeof *o);
    rc = db_read(app, tx,
                 "SELECT id, user_id, idem_key, status, product_id, currency, "
                 "payment_source, charge_id, refund_status, quantity, amount FROM orders "
                 "WHERE id = $1",
                 1, params, &rows);
    if (rc == 0 && idem_rows_count(rows) > 0) {
        o->found = 1;
        copy(o->id, sizeof o->id, db_text(rows, 0, 0));
        copy(o->user_id, sizeof o->user_id, db_text(rows, 0, 1));
        copy(o->idem_key, sizeof o->idem_key, db_text(rows, 0, 2));
        copy(o->status, sizeof o->status, db_text(rows, 0, 3));
        copy(o->product_id, sizeof o->product_id, db_text(rows, 0, 4));
        copy(o->currency, sizeof o->currency, db_text(rows, 0, 5));
        copy(o->source, sizeof o->source, db_text(rows, 0, 6));
        copy(o->charge_id, sizeof o->charge_id, db_text(rows, 0, 7));
        copy(o->refund_status, sizeof o->refund_status, db_text(rows, 0, 8));
        o->quantity = db_int(rows, 0, 9);
        o->amount = db_int(rows, 0, 10);
    }
    idem_rows_free(rows);
    return rc;
}

/* The confirmation email of a paid order, to the user's profile address (or a stand-in). */
static int queue_confirmation(const struct app *app, struct idem_tx *tx, const struct order_pay *o)
{
    struct idem_rows *rows = NULL;
    const char *params[1] = {o->user_id};
    char subject[160], text[600], dedupe[128];
    json_t *email = NULL;
    int rc;

    rc = db_exec(app, tx,
                 "SELECT COALESCE(p.email, u.name || '@example.com') FROM users u LEFT JOIN "
                 "profiles p ON p.user_id = u.id WHERE u.id = $1",
                 1, params, &rows);
    if (rc < 0)
        goto out;
    snprintf(subject, sizeof subject, "Your order %s is confirmed", o->id);
    snprintf(text, sizeof text,
             "Thank you for your order %s: %" PRId64 " x %.200s, %" PRId64 " %s (minor units) "
             "charged.",
             o->id, o->quantity, o->product_id, o->amount, o->currency);
    snprintf(dedupe, sizeof dedupe, "order-%s-confirmation", o->id);
    email =
        xcheck(json_pack("{s:s, s:s, s:s, s:s, s:{s:s, s:s}}", "to",
                         idem_rows_count(rows) > 0 ? db_text(rows, 0, 0) : "unknown@example.com",
                         "subject", subject, "template", "order_confirmation", "text", text,
                         "metadata", "orderId", o->id, "userId", o->user_id));
    rc = outbox_enqueue(app, tx, o->user_id, dedupe, email);
out:
    json_decref(email);
    idem_rows_free(rows);
    return rc;
}

int payments_mark_paid(const struct app *app, struct idem_tx *tx, const struct order_pay *o,
                       const char *charge_id, int *changed)
{
    struct idem_rows *rows = NULL;
    const char *params[8];
    char key[PAYMENT_KEY_MAX], amount[24], now[ISO8601_LEN + 1];
    int64_t n = 0;
    int rc;

    params[0] = o->id;
    params[1] = charge_id;
    rc = db_exec(app, tx,
                 "UPDATE orders SET status = 'paid', charge_id = $2, payment_check_ms = NULL "
                 "WHERE id = $1 AND status = 'pending_payment'",
                 2, params, &rows);
    if (rc < 0)
        goto out;
    n = idem_rows_changed(rows);
    if (n == 0)
        goto out;
    payments_charge_key(o->id, key);
    snprintf(amount, sizeof amount, "%" PRId64, o->amount);
    iso8601_ms(clock_wall_ms(), now);
    params[2] = key;
    params[3] = amount;
    params[4] = o->currency;
    params[5] = "succeeded";
    params[6] = now;
    params[7] = o->user_id;
    rc = db_exec(app, tx,
                 "INSERT INTO payments (order_id, charge_id, provider_key, amount, currency, "
                 "status, created_at, user_id) VALUES ($1, $2, $3, CAST($4 AS BIGINT), $5, $6, "
                 "$7, $8) ON CONFLICT (order_id) DO NOTHING",
                 8, params, NULL);
    if (rc == 0)
        rc = queue_confirmation(app, tx, o);
out:
    if (changed != NULL)
        *changed = rc == 0 && n > 0;
    idem_rows_free(rows);
    return rc;
}

int payments_mark_declined(const struct app *app, struct idem_tx *tx, const struct order_pay *o,
                           int *changed)
{
    struct idem_rows *rows = NULL;
    const char *params[2];
    char qty[24];
    int64_t n = 0;
    int rc;

    params[0] = o->id;
    rc = db_exec(app, tx,
                 "UPDATE orders SET status = 'payment_failed', payment_check_ms = NULL WHERE id = "
                 "$1 AND status = 'pending_payment'",
                 1, params, &rows);
    if (rc < 0)
        goto out;
    n = idem_rows_changed(rows);
    if (n == 0)
        goto out;
    if (app->shards != NULL) {
        /* A shard set's stock is the catalogue's: its reservation is released, once. */
        rc = stock_release(app, o->user_id, app->op_orders_create.name, o->idem_key, NULL);
        goto out;
    }
    snprintf(qty, sizeof qty, "%" PRId64, o->quantity);
    params[0] = o->product_id;
    params[1] = qty;
    rc = db_exec(app, tx, "UPDATE products SET stock = stock + CAST($2 AS BIGINT) WHERE id = $1", 2,
                 params, NULL);
out:
    if (changed != NULL)
        *changed = rc == 0 && n > 0;
    idem_rows_free(rows);
    return rc;
}

/* reconcile_after_ms, doubled per earlier check, capped, with up to 25% jitter. */
static int64_t check_delay_ms(const struct app *app, int64_t checks)
{
    int64_t ms = app->cfg->reconcile_after_ms;
    unsigned char r = 0;

    while (checks-- > 0 && ms < CHECK_BACKOFF_MAX_MS)
        ms *= 2;
    if (ms > CHECK_BACKOFF_MAX_MS)
        ms = CHECK_BACKOFF_MAX_MS;
    random_bytes(&r, 1);
    return ms + ms / 4 * r / 255;
}

/*
 * One UPDATE that schedules the next check, in a write transaction of its own.  `update_sql`
 * takes `nparams`: $1 the id, $2 the time of the check, then p3 and p4 (NULL: SQL NULL).
 */
static int flag(const struct app *app, const char *select_sql, const char *update_sql, int nparams,
                const char *id, const char *p3, const char *p4)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[4];
    char when[24];
    int rc;

    params[0] = id;
    rc = idem_tx_begin(app->store, 1, &tx);
    if (rc == 0)
        rc = db_exec(app, tx, select_sql, 1, params, &rows);
    if (rc < 0 || idem_rows_count(rows) == 0)
        goto out;
    snprintf(when, sizeof when, "%" PRId64,
             clock_wall_ms() + check_delay_ms(app, db_int(rows, 0, 0)));
    params[1] = when;
    params[2] = p3;
    params[3] = p4;
    rc = db_exec(app, tx, update_sql, nparams, params, NULL);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}

int payments_flag_unknown(const struct app *app, const char *order_id)
{
    return flag(app,
                "SELECT payment_checks FROM orders WHERE id = $1 AND status = 'pending_payment'",
                "UPDATE orders SET payment_checks = payment_checks + 1, payment_check_ms = "
                "CAST($2 AS BIGINT) WHERE id = $1 AND status = 'pending_payment'",
                2, order_id, NULL, NULL);
}

int refunds_load(const struct app *app, struct idem_tx *tx, const char *order_id,
                 struct refund_row *r)
{
    struct idem_rows *rows = NULL;
    const char *params[1] = {order_id};
    int rc;

    memset(r, 0, sizeof *r);
    rc = db_read(app, tx,
                 "SELECT status, charge_id, currency, amount FROM refunds WHERE order_id = $1", 1,
                 params, &rows);
    if (rc == 0 && idem_rows_count(rows) > 0) {
        r->found = 1;
        copy(r->status, sizeof r->status, db_text(rows, 0, 0));
        copy(r->charge_id, sizeof r->charge_id, db_text(rows, 0, 1));
        copy(r->currency, sizeof r->currency, db_text(rows, 0, 2));
        r->amount = db_int(rows, 0, 3);
    }
    idem_rows_free(rows);
    return rc;
}

int refunds_request(const struct app *app, struct idem_tx *tx, const struct order_pay *o)
{
    const char *params[7];
    char key[PAYMENT_KEY_MAX], amount[24], now[ISO8601_LEN + 1];
    int rc;

    params[0] = o->id;
    rc = db_exec(app, tx,
                 "UPDATE orders SET status = 'cancelled', refund_status = 'requested' WHERE id = "
                 "$1 AND status = 'paid'",
                 1, params, NULL);
    if (rc < 0)
        return rc;
    payments_refund_key(o->id, key);
    snprintf(amount, sizeof amount, "%" PRId64, o->amount);
    iso8601_ms(clock_wall_ms(), now);
    params[1] = key;
    params[2] = o->charge_id;
    params[3] = amount;
    params[4] = o->currency;
    params[5] = now;
    params[6] = o->user_id;
    return db_exec(app, tx,
                   "INSERT INTO refunds (order_id, provider_key, charge_id, amount, currency, "
                   "status, requested_at, updated_at, user_id) VALUES ($1, $2, $3, CAST($4 AS "
                   "BIGINT), $5, 'requested', $6, $6, $7) ON CONFLICT (order_id) DO NOTHING",
                   7, params, NULL);
}

int refunds_mark_done(const struct app *app, struct idem_tx *tx, const char *order_id, int ok,
                      const char *refund_id, const char *detail, int *changed)
{
    struct idem_rows *rows = NULL;
    const char *params[5];
    char now[ISO8601_LEN + 1];
    const char *state = ok ? "refunded" : "refund_failed";
    int64_t n = 0;
    int rc;

    iso8601_ms(clock_wall_ms(), now);
    params[0] = order_id;
    params[1] = state;
    params[2] = refund_id;
    params[3] = detail;
    params[4] = now;
    rc = db_exec(app, tx,
                 "UPDATE refunds SET status = $2, refund_id = $3, detail = $4, check_ms = NULL, "
                 "updated_at = $5 WHERE order_id = $1 AND status = 'requested'",
                 5, params, &rows);
    if (rc < 0)
        goto out;
    n = idem_rows_changed(rows);
    if (n > 0)
        rc =
            db_exec(app, tx, "UPDATE orders SET refund_status = $2 WHERE id = $1", 2, params, NULL);
out:
    if (changed != NULL)
        *changed = rc == 0 && n > 0;
    idem_rows_free(rows);
    return rc;
}

int refunds_flag_unknown(const struct app *app, const char *order_id, const char *principal,
                         const char *key)
{
    return flag(app, "SELECT checks FROM refunds WHERE order_id = $1 AND status = 'requested'",
                "UPDATE refunds SET checks = checks + 1, check_ms = CAST($2 AS BIGINT), "
                "flag_principal = $3, flag_key = $4 WHERE order_id = $1 AND status = 'requested'",
                4, order_id, principal, key);
}
