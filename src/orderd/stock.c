/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stock.c - reservations of stock in the catalogue of a shard set (stock.h).  The row goes in
 * first: its primary key makes a second attempt of the same request wait for the first one's
 * commit and then find its row, so the decrement that follows an insert is made once per request
 * whatever crashes and retries come between.
 */
#include "stock.h"

#include <stdio.h>
#include <string.h>

#include "idem/idem.h"

#include "app.h"
#include "db.h"
#include "util.h"
#include "banned.h"

#define SQL_RESERVATION_INSERT                                                                     \
    "INSERT INTO stock_reservations (user_id, operation, idem_key, product_id, quantity, "         \
    "unit_price, currency, released, created_at) SELECT $1, $2, $3, id, CAST($5 AS BIGINT), "      \
    "unit_price, currency, 0, $6 FROM products WHERE id = $4 "                                     \
    "ON CONFLICT (user_id, operation, idem_key) DO NOTHING RETURNING unit_price, currency"
#define SQL_RESERVATION_READ                                                                       \
    "SELECT unit_price, currency FROM stock_reservations WHERE user_id = $1 AND operation = $2 "   \
    "AND idem_key = $3"
#define SQL_STOCK_TAKE                                                                             \
    "UPDATE products SET stock = stock - CAST($2 AS BIGINT) WHERE id = $1 AND "                    \
    "stock >= CAST($2 AS BIGINT)"
#define SQL_RESERVATION_RELEASE                                                                    \
    "UPDATE stock_reservations SET released = 1 WHERE user_id = $1 AND operation = $2 AND "        \
    "idem_key = $3 AND released = 0 RETURNING product_id, quantity"
#define SQL_STOCK_GIVE "UPDATE products SET stock = stock + CAST($2 AS BIGINT) WHERE id = $1"

static int read_price(const struct idem_rows *rows, struct stock_reservation *res)
{
    const char *currency = db_text(rows, 0, 1);

    if (strlen(currency) >= sizeof res->currency)
        return IDEM_ESTORE;
    res->unit_price = db_int(rows, 0, 0);
    snprintf(res->currency, sizeof res->currency, "%s", currency);
    return 0;
}

int stock_reserve(const struct app *app, const char *user, const char *operation, const char *key,
                  const char *product, const char *quantity, struct stock_reservation *res,
                  enum stock_refusal *refused)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    struct idem_rows *taken = NULL;
    char now[ISO8601_LEN + 1];
    const char *params[6] = {user, operation, key, product, quantity, now};
    int rc;

    memset(res, 0, sizeof *res);
    *refused = STOCK_OK;
    iso8601_ms(clock_wall_ms(), now);
    rc = idem_tx_begin(app->catalogue, 1, &tx);
    if (rc < 0)
        goto out;
    rc = db_exec(app, tx, SQL_RESERVATION_INSERT, 6, params, &rows);
    if (rc < 0)
        goto out;
    if (idem_rows_count(rows) == 1) {
        rc = read_price(rows, res);
        if (rc == 0)
            rc = db_exec(app, tx, SQL_STOCK_TAKE, 2, params + 3, &taken);
        if (rc < 0)
            goto out;
        if (idem_rows_changed(taken) != 1) {
            *refused = STOCK_OUT; /* the rollback takes the row back out */
            goto out;
        }
        rc = idem_tx_commit(tx);
        tx = NULL;
        goto out;
    }
    /* No row inserted: an earlier attempt's row is there, or the product is not. */
    idem_rows_free(rows);
    rows = NULL;
    rc = db_exec(app, tx, SQL_RESERVATION_READ, 3, params, &rows);
    if (rc < 0)
        goto out;
    if (idem_rows_count(rows) == 0) {
        *refused = STOCK_UNKNOWN_PRODUCT;
        goto out;
    }
    res->earlier = 1;
    rc = read_price(rows, res);
out:
    /* A refusal or an earlier row is answered once what it read is durable. */
    if (idem_tx_rollback(tx) < 0 && rc == 0)
        rc = IDEM_EUNAVAIL;
    idem_rows_free(taken);
    idem_rows_free(rows);
    return rc;
}

int stock_release(const struct app *app, const char *user, const char *operation, const char *key,
                  int *released)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[3] = {user, operation, key};
    const char *give[2];
    int rc;

    if (released != NULL)
        *released = 0;
    rc = idem_tx_begin(app->catalogue, 1, &tx);
    if (rc < 0)
        goto out;
    rc = db_exec(app, tx, SQL_RESERVATION_RELEASE, 3, params, &rows);
    if (rc < 0 || idem_rows_count(rows) == 0)
        goto out;
    give[0] = db_text(rows, 0, 0);
    give[1] = db_text(rows, 0, 1);
    rc = db_exec(app, tx, SQL_STOCK_GIVE, 2, give, NULL);
    if (rc < 0)
        goto out;
    rc = idem_tx_commit(tx);
    tx = NULL;
    if (rc == 0 && released != NULL)
        *released = 1;
out:
    idem_tx_rollback(tx);
    idem_rows_free(rows);
    return rc;
}
