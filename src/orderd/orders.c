/* SPDX-License-Identifier: Apache-2.0 */
/*
 * orders.c - the orders endpoints.  Creating an order is a list of atomic phases, each one
 * database transaction that also moves the idempotency record's recovery point:
 *
 *   phase 1 (""):              reserve stock with a conditional UPDATE, insert the order at
 *                              the product's price (pending_payment with a provider, else
 *                              created); advance to "order_created" with the order id.
 *   then (checkout.c):         the charge through the provider, between phases, and the phase
 *                              that settles the order and stores the response.
 *
 * Without a provider nothing external follows phase 1, so it is the only phase: the operation
 * is one-phase (idem_operation.one_phase), and its record is inserted already completed with the
 * 201, beside the order: four statements on SQLite (the price, the reservation, the order, the
 * record), two on PostgreSQL (the reservation and the order are one there).
 *
 * A request that takes over an expired lease resumes at the recorded point, so a finished phase
 * is never run twice.  The order row keeps (user, Idempotency-Key) unique for good: once the
 * record has been swept, a late retry still finds its order (200, replayed) or is refused (422)
 * if the body differs.  Cancel is in cancel.c.
 */
#include "orders.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idem/idem.h"

#include "app.h"
#include "checkout.h"
#include "cursor.h"
#include "db.h"
#include "intake.h"
#include "keyed_answer.h"
#include "idemcall.h"
#include "jdoc.h"
#include "order_doc.h"
#include "response.h"
#include "router.h"
#include "prices.h"
#include "stock.h"
#include "util.h"
#include "banned.h"

#define QUANTITY_MAX 1000
#define PRODUCT_ID_MAX 200
#define LIST_DEFAULT 20
#define LIST_MAX 100
#define TEST_DELAY_MAX_MS 600000
#define SOURCE_MAX 32

/*
 * Phase 1's business statements, shared with the --idempotency off baseline (place_order).  The
 * condition in the reservation, not a read before it, decides whether stock is left.  On SQLite
 * (these two) the price is read just before it under the same write lock; on PostgreSQL
 * (SQL_PLACE_PG) the reservation returns it.
 */
#define SQL_PRICE "SELECT unit_price, currency FROM products WHERE id = $1"
#define SQL_RESERVE_SQLITE                                                                         \
    "UPDATE products SET stock = stock - CAST($2 AS INTEGER) WHERE id = $1 AND "                   \
    "stock >= CAST($2 AS INTEGER)"
/*
 * An order of this (user, key) already there inserts nothing.  No RETURNING: every column of the
 * new order is known here (SQLite would gather returned rows in a temporary b-tree first).
 */
#define SQL_INSERT_ORDER                                                                           \
    "INSERT INTO orders (id, user_id, product_id, quantity, unit_price, amount, "                  \
    "currency, status, idem_key, request_fp, created_at, payment_source) VALUES ($1, "             \
    "$2, $3, CAST($4 AS BIGINT), CAST($5 AS BIGINT), CAST($6 AS BIGINT), $7, $8, $9, "             \
    "$10, $11, $12) ON CONFLICT (user_id, idem_key) DO NOTHING"
/* Gives a reservation back: the exact inverse of the reservation, in the same transaction. */
#define SQL_UNRESERVE "UPDATE products SET stock = stock + CAST($2 AS INTEGER) WHERE id = $1"
/* Why a reservation said no: the product is unknown, or its stock too low. */
#define SQL_PRODUCT "SELECT stock FROM products WHERE id = $1"

/* The validated body of POST /api/orders. */
struct create_input {
    const char *product;
    const char *source; /* paymentSource, "tok_ok" when absent */
    char quantity[24];
    int64_t qty;
    char fp_hex[2 * IDEM_FP_LEN + 1];
    /* On a shard set: the stock is reserved on the catalogue already, at this price. */
    int reserved;
    int64_t price;
    char currency[16];
};

/*
 * Who goes on with an order once its stock is reserved: its request, or the completer, which has
 * none -- no test hooks, no headers beside the stored answer, and a commit made before it moves
 * on, not deferred to the thread that makes it durable.
 */
struct create_ctx {
    struct app *app;
    const char *principal;
    const char *key;
    const struct call_ctx *cx; /* the request; NULL for the completer */
    struct response *resp; /* its answer (what is sent but not stored); NULL for the completer */
};

/* ---- shared ---------------------------------------------------------------------------------- */

static void validation_failed(struct response *resp, const char *detail)
{
    response_problem(resp, 400, "validation-failed", detail);
}

/* A JSON number that is a whole number in [min, max] (numbers are read as doubles). */
static int whole_number(const json_t *v, int64_t min, int64_t max, int64_t *out)
{
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    int ok = isfinite(d) && d >= (double)min && d <= (double)max && (double)(int64_t)d == d;

    if (ok)
        *out = (int64_t)d;
    return ok ? 0 : -1;
}

/* ---- POST /api/orders ------------------------------------------------------------------------ */

/* Whether the request asks a test hook (ORDERD_TEST_HOOKS=1) to act after phase 1 committed. */
static int wants_phase_hook(const struct call_ctx *cx)
{
    return cx->app->cfg->test_hooks && (request_header(cx->rq, "X-Test-Crash") != NULL ||
                                        request_header(cx->rq, "X-Test-Delay-Ms") != NULL);
}

/* The test hooks (ORDERD_TEST_HOOKS=1): crash or stall right after phase 1 committed. */
static void after_order_created(const struct call_ctx *cx)
{
    const char *crash;
    const char *delay;
    int64_t ms = 0;

    if (!cx->app->cfg->test_hooks)
        return;
    crash = request_header(cx->rq, "X-Test-Crash");
    if (crash != NULL && strcmp(crash, "after-order-created") == 0) {
        log_msg(&cx->app->log, "warn", "test hook: exiting with 137 after order_created");
        exit_at_once(137);
    }
    delay = request_header(cx->rq, "X-Test-Delay-Ms");
    if (delay != NULL && parse_int64(delay, 0, TEST_DELAY_MAX_MS, &ms) == 0 && ms > 0)
        clock_sleep_ms(ms);
}

/*
 * A late retry whose record was swept: the order row answers (200 with the order, or 422 if the
 * body differs).  An order whose payment never settled is not answered unpaid: its id goes to
 * *pending (new) and the caller goes on to settle its charge, as a resumed request would.
 * Returns 1 (with the call completed, or *pending set, or rc < 0 in *rc) when an order with this
 * key exists, 0 when not.
 */
static int complete_from_existing(const struct create_ctx *cc, struct idem_call *call,
                                  const struct create_input *in, int *rc, char **pending)
{
    struct idem_tx *tx = idem_call_tx(call);
    struct idem_rows *rows = NULL;
    const char *params[2] = {cc->principal, cc->key};
    char location[128];
    json_t *doc = NULL;
    int found = 0;

    *rc = db_exec(cc->app, tx,
                  "SELECT " ORDER_COLS ", request_fp FROM orders WHERE user_id = $1 AND "
                  "idem_key = $2",
                  2, params, &rows);
    if (*rc < 0 || idem_rows_count(rows) == 0)
        goto out;
    found = 1;
    if (strcmp(db_text(rows, 0, ORDER_NCOLS), in->fp_hex) != 0) {
        *rc = idemcall_complete_problem(
            call, 422, "idempotency-key-reused",
            "This Idempotency-Key already created an order with a different request. Use a new "
            "key for a new order.");
        if (cc->resp != NULL)
            cc->resp->outcome = "mismatch";
        goto out;
    }
    if (cc->app->provider != NULL && strcmp(db_text(rows, 0, 1), "pending_payment") == 0) {
        *pending = xstrdup(db_text(rows, 0, 0));
        goto out;
    }
    doc = order_json(rows, 0);
    order_location(db_text(rows, 0, 0), location, sizeof location);
    *rc = idemcall_complete_json(call, 200, doc, location);
    if (*rc == 0 && cc->resp != NULL) {
        response_set_header(cc->resp, "Idempotent-Replayed", "true");
        cc->resp->outcome = "replayed";
    }
out:
    json_decref(doc);
    idem_rows_free(rows);
    return found;
}

/* A business refusal met while placing an order: what to answer instead of an order. */
struct refusal {
    int status; /* 0: no refusal */
    const char *code;
    char detail[320];
};

/* The order row place_order() writes; the price, currency and amount are filled in there. */
struct order_row {
    char id[ORDER_ID_LEN + 1];
    char created[ISO8601_LEN + 1];
    const char *principal;
    const char *key;
    const char *status; /* "created", or "pending_payment" with a provider */
};

/*
 * Why the reservation of `in` said no, into *no: 422 unknown-product or 409 out-of-stock.
 * `product_known` is whether the product exists when the caller read it already, -1 if not.
 */
static int refuse_order(struct app *app, struct idem_tx *tx, const struct create_input *in,
                        int product_known, struct refusal *no)
{
    struct idem_rows *rows = NULL;
    const char *params[1] = {in->product};
    int rc = 0;

    if (product_known < 0) { /* the reservation alone cannot tell: ask */
        rc = db_exec(app, tx, SQL_PRODUCT, 1, params, &rows);
        if (rc < 0)
            goto out;
        product_known = idem_rows_count(rows) > 0;
    }
    if (!product_known) {
        no->status = 422;
        no->code = "unknown-product";
        snprintf(no->detail, sizeof no->detail, "There is no product '%.200s'.", in->product);
    } else {
        no->status = 409;
        no->code = "out-of-stock";
        snprintf(no->detail, sizeof no->detail, "Not enough stock of '%.200s' for %s.", in->product,
                 in->quantity);
    }
out:
    idem_rows_free(rows);
    return rc;
}

/* What placing an order did: the reservation (with its price) and whether the order went in. */
struct placed {
    int product_known; /* -1: not read; 0: no such product; 1: it exists */
    int reserved;
    int inserted;
    int64_t price;
    char currency[16];
};

/* The reservation's price, checked: an order of QUANTITY_MAX must not overflow its amount. */
static int placed_price(struct placed *pl, const char *price, const char *currency)
{
    int64_t p = 0;

    if (parse_int64(price, 0, INT64_MAX / QUANTITY_MAX, &p) != 0 || currency == NULL ||
        strlen(currency) >= sizeof pl->currency)
        return IDEM_ESTORE;
    pl->price = p;
    snprintf(pl->currency, sizeof pl->currency, "%s", currency);
    return 0;
}

/*
 * SQLite: the product's price read, the reservation, then the order.  The read cannot go stale
 * before the reservation: the transaction holds SQLite's write lock, and this connection is the
 * process's one writer.  (An UPDATE ... RETURNING would gather its row in a temporary b-tree of
 * its own, under the writer.)
 */
static int place_two_statements(struct app *app, struct idem_tx *tx, const struct create_input *in,
                                const struct order_row *o, struct placed *pl)
{
    struct idem_rows *product = NULL;
    struct idem_rows *rows = NULL;
    const char *params[12];
    char unit_price[24], amount[24];
    int rc;

    params[0] = in->product;
    params[1] = in->quantity;
    rc = db_exec(app, tx, SQL_PRICE, 1, params, &product);
    if (rc < 0)
        goto out;
    pl->product_known = idem_rows_count(product) == 1;
    if (!pl->product_known)
        goto out;
    rc = db_exec(app, tx, SQL_RESERVE_SQLITE, 2, params, &rows);
    if (rc < 0 || idem_rows_changed(rows) != 1)
        goto out;
    idem_rows_free(rows);
    rows = NULL;
    pl->reserved = 1;
    rc = placed_price(pl, idem_rows_get(product, 0, 0), idem_rows_get(product, 0, 1));
    if (rc < 0)
        goto out;
    snprintf(unit_price, sizeof unit_price, "%lld", (long long)pl->price);
    snprintf(amount, sizeof amount, "%lld", (long long)(pl->price * in->qty));
    params[0] = o->id;
    params[1] = o->principal;
    params[2] = in->product;
    params[3] = in->quantity;
    params[4] = unit_price;
    params[5] = amount;
    params[6] = pl->currency;
    params[7] = o->status;
    params[8] = o->key;
    params[9] = in->fp_hex;
    params[10] = o->created;
    params[11] = in->source;
    rc = db_exec(app, tx, SQL_INSERT_ORDER, 12, params, &rows);
    pl->inserted = rc == 0 && idem_rows_changed(rows) == 1;
out:
    idem_rows_free(rows);
    idem_rows_free(product);
    return rc;
}

/*
 * PostgreSQL: the reservation and the order in one statement, one round trip, so the product's
 * row is locked from there to the COMMIT only.  No row: nothing reserved; a row whose count is 0:
 * reserved, but an order of this (user, key) was there.
 */
#define SQL_PLACE_PG                                                                               \
    "WITH r AS (UPDATE products SET stock = stock - CAST($4 AS INTEGER) WHERE id = $3 AND "        \
    "stock >= CAST($4 AS INTEGER) RETURNING unit_price, currency), "                               \
    "i AS (INSERT INTO orders (id, user_id, product_id, quantity, unit_price, amount, currency, "  \
    "status, idem_key, request_fp, created_at, payment_source) SELECT $1, $2, $3, "                \
    "CAST($4 AS BIGINT), r.unit_price, r.unit_price * CAST($4 AS BIGINT), r.currency, $5, $6, "    \
    "$7, $8, $9 FROM r ON CONFLICT (user_id, idem_key) DO NOTHING RETURNING 1) "                   \
    "SELECT r.unit_price, r.currency, (SELECT count(*) FROM i) FROM r"

/*
 * The same, held back: in a transaction that idem_call_run_async() shares among several requests
 * (idem_tx_exec_deferred), at the price this process last sold the product at (prices.h), the
 * statement goes out with the batch's next one or its COMMIT.  The batch then pays no round trip
 * an order, and holds the product's row from its first order to its COMMIT in one pipeline
 * instead of one round trip an order: what bounds the orders of one product.  It fails itself (a
 * division by zero) unless it reserved at that price and inserted the order: the whole batch
 * rolls back, and each of its orders runs again alone, the waiting way above, which answers the
 * refusal or the order already there and notes the price it finds.
 */
#define SQL_PLACE_PG_HELD                                                                          \
    "WITH r AS (UPDATE products SET stock = stock - CAST($4 AS INTEGER) WHERE id = $3 AND "        \
    "stock >= CAST($4 AS INTEGER) AND unit_price = CAST($10 AS BIGINT) AND currency = $11 "        \
    "RETURNING unit_price, currency), "                                                            \
    "i AS (INSERT INTO orders (id, user_id, product_id, quantity, unit_price, amount, currency, "  \
    "status, idem_key, request_fp, created_at, payment_source) SELECT $1, $2, $3, "                \
    "CAST($4 AS BIGINT), r.unit_price, r.unit_price * CAST($4 AS BIGINT), r.currency, $5, $6, "    \
    "$7, $8, $9 FROM r ON CONFLICT (user_id, idem_key) DO NOTHING RETURNING 1) "                   \
    "SELECT 1 / (SELECT count(*) FROM i)"

/* 1 when the order was held back, as placed at the noted price; 0 when it was not (run it). */
static int place_held_back(struct app *app, struct idem_tx *tx, const struct create_input *in,
                           const struct order_row *o, struct placed *pl)
{
    char price[24];
    const char *params[11] = {o->id,      o->principal, in->product, in->quantity,
                              o->status,  o->key,       in->fp_hex,  o->created,
                              in->source, price,        pl->currency};
    int rc;

    if (!prices_get(app->prices, in->product, &pl->price, pl->currency))
        return 0;
    snprintf(price, sizeof price, "%lld", (long long)pl->price);
    rc = idem_tx_exec_deferred(tx, SQL_PLACE_PG_HELD, 11, params);
    if (rc < 0)
        log_msg(&app->log, "error", "orders.create: cannot hold the order back (%s): %s",
                idem_err_name(rc), idem_tx_errmsg(tx));
    if (rc != 1)
        return rc;
    pl->product_known = 1;
    pl->reserved = 1;
    pl->inserted = 1;
    return 1;
}

static int place_one_statement(struct app *app, struct idem_tx *tx, const struct create_input *in,
                               const struct order_row *o, struct placed *pl)
{
    struct idem_rows *rows = NULL;
    const char *params[9] = {o->id,  o->principal, in->product, in->quantity, o->status,
                             o->key, in->fp_hex,   o->created,  in->source};
    int rc = place_held_back(app, tx, in, o, pl);

    if (rc != 0)
        return rc < 0 ? rc : 0;
    rc = db_exec(app, tx, SQL_PLACE_PG, 9, params, &rows);
    if (rc == 0 && idem_rows_count(rows) == 1) {
        pl->reserved = 1;
        pl->inserted = strcmp(db_text(rows, 0, 2), "1") == 0;
        rc = placed_price(pl, idem_rows_get(rows, 0, 0), idem_rows_get(rows, 0, 1));
        if (rc == 0)
            prices_note(app->prices, in->product, pl->price, pl->currency);
    } else if (rc == 0) {
        prices_forget(app->prices, in->product); /* refused: its next orders wait for the answer */
    }
    idem_rows_free(rows);
    return rc;
}

/* A shard set: the stock was reserved on the catalogue (stock.c), the order goes in alone. */
static int place_reserved(struct app *app, struct idem_tx *tx, const struct create_input *in,
                          const struct order_row *o, struct placed *pl)
{
    struct idem_rows *rows = NULL;
    const char *params[12];
    char unit_price[24], amount[24];
    int rc;

    pl->product_known = 1;
    pl->reserved = 1;
    pl->price = in->price;
    snprintf(pl->currency, sizeof pl->currency, "%s", in->currency);
    snprintf(unit_price, sizeof unit_price, "%lld", (long long)in->price);
    snprintf(amount, sizeof amount, "%lld", (long long)(in->price * in->qty));
    params[0] = o->id;
    params[1] = o->principal;
    params[2] = in->product;
    params[3] = in->quantity;
    params[4] = unit_price;
    params[5] = amount;
    params[6] = in->currency;
    params[7] = o->status;
    params[8] = o->key;
    params[9] = in->fp_hex;
    params[10] = o->created;
    params[11] = in->source;
    rc = db_exec(app, tx, SQL_INSERT_ORDER, 12, params, &rows);
    pl->inserted = rc == 0 && idem_rows_changed(rows) == 1;
    idem_rows_free(rows);
    return rc;
}

/*
 * Places an order in `tx`, for the idempotent flow and the benchmark-only flow without a record
 * alike, so both sell stock the same way: reserves the stock and inserts the order at the
 * product's price (on PostgreSQL in one statement).  No
 * savepoint: the common path writes two rows, and the one path that must take a write back gives
 * the reservation back exactly.
 *
 * On success *order (new) is the inserted order as the API shows it, and no->status is 0.  When
 * the reservation finds too little stock or no product, nothing was written and *no says 409
 * out-of-stock or 422 unknown-product.  IDEM_ECONFLICT is an order that exists already with this
 * (user, key) -- the reservation given back -- or, logged by the caller, an id collision.
 */
static int place_order(struct app *app, struct idem_tx *tx, const struct create_input *in,
                       const struct order_row *o, json_t **order, struct refusal *no)
{
    struct placed pl = {-1, 0, 0, 0, ""};
    const char *params[2] = {in->product, in->quantity};
    int rc;

    *order = NULL;
    no->status = 0;
    if (in->reserved)
        rc = place_reserved(app, tx, in, o, &pl);
    else if (strcmp(idem_store_kind(app->store), "postgresql") == 0)
        rc = place_one_statement(app, tx, in, o, &pl);
    else
        rc = place_two_statements(app, tx, in, o, &pl);
    if (rc < 0)
        return rc;
    if (!pl.reserved)
        return refuse_order(app, tx, in, pl.product_known, no);
    if (pl.inserted) {
        *order = order_json_new(o->id, o->status, in->product, in->qty, pl.price,
                                pl.price * in->qty, pl.currency, o->created);
        return 0;
    }
    /* The catalogue's reservation is this key's, and its order's: it stays taken. */
    if (in->reserved)
        return IDEM_ECONFLICT;
    /* This (user, key) has its order already: what was reserved for a second one goes back. */
    rc = db_exec(app, tx, SQL_UNRESERVE, 2, params, NULL);
    return rc < 0 ? rc : IDEM_ECONFLICT;
}

/* The 201 with the order as the insert returned it (no second read of it), staged in the phase. */
static int stage_created(struct idem_call *call, const char *id, const json_t *order)
{
    char location[128];

    order_location(id, location, sizeof location);
    return idemcall_stage_json(call, 201, order, location);
}

/* A new order row of `principal`'s request with `key`: its id, creation time and owner. */
static void order_row_fill(struct app *app, const char *principal, const char *key,
                           const char *status, struct order_row *o)
{
    int64_t ms = 0;

    idgen_next(app->ids, o->id, &ms);
    iso8601_ms(ms, o->created);
    o->principal = principal;
    o->key = key;
    o->status = status;
}

static void order_row_init(struct app *app, const struct call_ctx *cx, const char *status,
                           struct order_row *o)
{
    order_row_fill(app, cx->principal, cx->key, status, o);
}

/* Whether `principal` has an order made with `key` (a failed read says yes: ask again). */
static int order_of_key(struct app *app, struct idem_tx *tx, const char *principal, const char *key)
{
    struct idem_rows *mine = NULL;
    const char *params[2] = {principal, key};
    int rc = db_exec(app, tx, "SELECT 1 FROM orders WHERE user_id = $1 AND idem_key = $2", 2,
                     params, &mine);
    int found = rc < 0 || idem_rows_count(mine) > 0;

    idem_rows_free(mine);
    return found;
}

/*
 * Phase 1 (on a shard set, the phase after the reservation), in the open phase's transaction.
 * Either completes the call with a business answer (*done = 1) or advances it to
 * "order_created" with the new id in *order_id (new).
 */
static int create_phase_reserve(const struct create_ctx *cc, struct idem_call *call,
                                const struct create_input *in, char **order_id, int *done,
                                int *late)
{
    struct app *app = cc->app;
    struct idem_tx *tx = idem_call_tx(call);
    json_t *order = NULL;
    struct order_row o;
    struct refusal no;
    int one_commit;
    int rc = 0;

    *done = 0;
    if (tx == NULL) {
        rc = IDEM_ESTATE;
        goto out;
    }
    /*
     * The recovery point must be durable before an external call (the charge).  Without a
     * provider nothing external follows: the phase stays open and the order, its stock and the
     * stored 201 commit together, one durable commit per order.
     */
    one_commit = app->provider == NULL && (cc->cx == NULL || !wants_phase_hook(cc->cx));
    /* With a provider the order waits for its charge; without one there is nothing to pay. */
    order_row_fill(app, cc->principal, cc->key,
                   app->provider != NULL ? "pending_payment" : "created", &o);
    rc = place_order(app, tx, in, &o, &order, &no);
    /*
     * A late retry whose record was swept finds its order: the insert meets UNIQUE (user, key),
     * and a refusal is checked against it too (the retry's body may differ, the stock may be
     * gone since).  The order row, not the refusal, answers.
     */
    if (rc == IDEM_ECONFLICT || (rc == 0 && no.status != 0)) {
        int found_rc = 0;
        char *pending = NULL;
        if (complete_from_existing(cc, call, in, &found_rc, &pending) || found_rc < 0) {
            if (pending != NULL && found_rc == 0) {
                /* Its charge is settled next, as after "order_created" (ask the provider first). */
                rc = idem_call_advance(call, POINT_ORDER_CREATED, pending);
                if (rc == 0) {
                    *order_id = pending;
                    pending = NULL;
                    *late = 1;
                }
                free(pending);
                goto out;
            }
            free(pending);
            rc = found_rc;
            *done = 1;
            goto out;
        }
    }
    if (rc == IDEM_ECONFLICT) {
        /* No order has this (user, key): only an id collision gets here. */
        log_msg(&app->log, "error", "orders.create: order insert conflicted for %s", o.id);
        goto out;
    }
    if (rc < 0)
        goto out;
    if (no.status != 0) {
        /* Stored; a 201 staged before is replaced (place_order rolled it back). */
        rc = idemcall_complete_problem(call, no.status, no.code, no.detail);
        *done = 1;
        goto out;
    }
    if (one_commit) {
        /* A request's 201 is sent by whichever thread makes the batch durable; it moves on. */
        rc = stage_created(call, o.id, order);
        if (rc == 0)
            rc = cc->cx != NULL ? idemcall_commit_deferred(cc->cx, call, cc->resp)
                                : idem_call_commit(call);
        *done = 1;
        goto out;
    }
    rc = idem_call_advance(call, POINT_ORDER_CREATED, o.id);
    if (rc < 0)
        goto out;
    *order_id = xstrdup(o.id);
out:
    json_decref(order);
    return rc;
}

/*
 * The order and its charge, in the open phase: phase 1 on one store; on a shard set the phase
 * after the reservation, where a request and the completer alike go on from "stock_reserved".
 * Returns 0 with the call completed, or with *unknown (the provider's answer was unknown: the
 * caller aborts the call); IDEMCALL_DEFERRED (a request's commit, deferred); or IDEM_E*.
 */
static int create_order_and_charge(const struct create_ctx *cc, struct idem_call *call,
                                   const struct create_input *in, int *unknown)
{
    struct checkout_opts opts = {0, cc->cx};
    char *order_id = NULL;
    int done = 0, late = 0;
    int rc;

    *unknown = 0;
    rc = create_phase_reserve(cc, call, in, &order_id, &done, &late);
    if (rc < 0 || done)
        goto out;
    /* A late retry's order may have been charged before its record went: ask first. */
    opts.ask_first = late;
    if (!late && cc->cx != NULL)
        after_order_created(cc->cx);
    rc = checkout_settle(cc->app, call, order_id, &opts, unknown);
out:
    free(order_id);
    return rc;
}

/*
 * The test hooks (ORDERD_TEST_HOOKS=1) of a shard set: crash once the catalogue's reservation
 * committed, the record at "stock_reserving" ("after-stock-reserved"), or once the record's
 * point "stock_reserved" committed too ("after-stock-reserved-point").
 */
static void stock_crash_hook(const struct call_ctx *cx, const char *when)
{
    const char *crash =
        cx != NULL && cx->app->cfg->test_hooks ? request_header(cx->rq, "X-Test-Crash") : NULL;

    if (crash != NULL && strcmp(crash, when) == 0) {
        log_msg(&cx->app->log, "warn", "test hook: exiting with 137 %s", when);
        exit_at_once(137);
    }
}

/*
 * The data of "stock_reserved": the reservation's price and what the order is made of, so that
 * the next phase needs nothing of the request -- the completer makes the order without the client
 * (the fingerprint is the record's).  A JSON object, members in this order:
 * {"unitPrice":1999,"currency":"EUR","productId":"p-1","quantity":2,"paymentSource":"tok_ok"}.
 * Returns new text (free()).
 */
static char *stock_reserved_data(const struct create_input *in, const struct stock_reservation *res)
{
    json_t *doc =
        xcheck(json_pack("{s:I, s:s, s:s, s:I, s:s}", "unitPrice", (json_int_t)res->unit_price,
                         "currency", res->currency, "productId", in->product, "quantity",
                         (json_int_t)in->qty, "paymentSource", in->source));
    char *data = jdoc_text(doc, NULL);

    json_decref(doc);
    return data;
}

/*
 * The data of "stock_reserving": what the order is made of, as in "stock_reserved" without the
 * price, {"productId":"p-1","quantity":2,"paymentSource":"tok_ok"}.  Returns new text (free()).
 */
static char *stock_reserving_data(const struct create_input *in)
{
    json_t *doc = xcheck(json_pack("{s:s, s:I, s:s}", "productId", in->product, "quantity",
                                   (json_int_t)in->qty, "paymentSource", in->source));
    char *data = jdoc_text(doc, NULL);

    json_decref(doc);
    return data;
}

/*
 * A shard set's first steps, in the open phase: the record made durable at "stock_reserving"
 * with the order's input (unless it is there already, `reserving`), then the stock reserved on
 * the catalogue under a key derived from the request (stock.c), then the recovery point
 * "stock_reserved" with its price and the order's input committed, and the next phase begun for
 * the order.  A refusal completes the call (*done).
 */
static int create_phase_stock(const struct create_ctx *cc, struct idem_call *call,
                              struct create_input *in, int reserving, int *done)
{
    struct app *app = cc->app;
    const struct call_ctx *cx = cc->cx;
    struct stock_reservation res;
    enum stock_refusal refused = STOCK_OK;
    struct refusal no;
    char *data = NULL;
    int rc;

    if (!reserving) {
        data = stock_reserving_data(in);
        rc = idem_call_advance(call, POINT_STOCK_RESERVING, data);
        free(data);
        data = NULL;
        if (rc == 0)
            rc = idem_call_phase_begin(call);
        if (rc < 0)
            goto out;
    }
    rc = stock_reserve(app, cc->principal, app->op_orders_create.name, cc->key, in->product,
                       in->quantity, &res, &refused);
    if (rc < 0)
        goto out;
    if (refused != STOCK_OK) {
        no.status = 0;
        rc = refuse_order(app, NULL, in, refused == STOCK_OUT, &no);
        if (rc == 0)
            rc = idemcall_complete_problem(call, no.status, no.code, no.detail);
        *done = 1;
        goto out;
    }
    stock_crash_hook(cx, "after-stock-reserved");
    data = stock_reserved_data(in, &res);
    rc = idem_call_advance(call, POINT_STOCK_RESERVED, data);
    if (rc == 0) {
        stock_crash_hook(cx, "after-stock-reserved-point");
        rc = idem_call_phase_begin(call);
    }
    in->reserved = rc == 0;
    in->price = res.unit_price;
    snprintf(in->currency, sizeof in->currency, "%s", res.currency);
out:
    free(data);
    return rc;
}

/* The price in "stock_reserved" data of the first form, "PRICE CURRENCY", into `in`. */
static int stock_reserved_read_price(const char *data, struct create_input *in)
{
    const char *sp = strchr(data, ' ');
    char price[24];

    if (sp == NULL || (size_t)(sp - data) >= sizeof price || strlen(sp + 1) == 0 ||
        strlen(sp + 1) >= sizeof in->currency)
        return IDEM_ESTATE;
    memcpy(price, data, (size_t)(sp - data));
    price[sp - data] = '\0';
    if (parse_int64(price, 0, INT64_MAX / QUANTITY_MAX, &in->price) != 0)
        return IDEM_ESTATE;
    snprintf(in->currency, sizeof in->currency, "%s", sp + 1);
    return 0;
}

/* A string member of `doc` of 1 to `max` bytes without a NUL, or NULL. */
static const char *short_string(const json_t *doc, const char *name, size_t max)
{
    const json_t *v = json_object_get(doc, name);
    size_t len = json_is_string(v) ? json_string_length(v) : 0;

    if (len == 0 || len > max || strlen(json_string_value(v)) != len)
        return NULL;
    return json_string_value(v);
}

/*
 * The order's input in a point's data `doc` (productId, quantity, paymentSource) into `in`,
 * borrowed from doc; 0, or IDEM_ESTATE when a member is missing or out of range.
 */
static int order_input_read(const json_t *doc, struct create_input *in)
{
    const char *product = short_string(doc, "productId", PRODUCT_ID_MAX);
    const char *source = short_string(doc, "paymentSource", SOURCE_MAX);
    int64_t qty = 0;

    if (product == NULL || source == NULL ||
        whole_number(json_object_get(doc, "quantity"), 1, QUANTITY_MAX, &qty) != 0)
        return IDEM_ESTATE;
    in->product = product;
    in->source = source;
    in->qty = qty;
    snprintf(in->quantity, sizeof in->quantity, "%lld", (long long)qty);
    return 0;
}

/*
 * The data of "stock_reserved" into `in`: the reservation's price; with `whole` (not NULL) the
 * order's input too (product, quantity, payment source; borrowed from *whole, new), which the
 * completer goes on with -- a request has its own body.  Data of the first form, "PRICE
 * CURRENCY" (written by versions before the completer made such orders), has no input: *whole
 * is NULL then, and only the client's retry can go on.
 */
static int stock_reserved_read(const char *data, struct create_input *in, json_t **whole)
{
    const char *currency;
    json_t *doc = NULL;
    int64_t price = 0;
    int rc = IDEM_ESTATE;

    if (whole != NULL)
        *whole = NULL;
    if (data == NULL)
        goto out;
    if (data[0] != '{') {
        rc = stock_reserved_read_price(data, in);
        in->reserved = rc == 0;
        goto out;
    }
    doc = jdoc_load(data, strlen(data), 0, NULL);
    currency = short_string(doc, "currency", sizeof in->currency - 1);
    if (!json_is_object(doc) || currency == NULL ||
        whole_number(json_object_get(doc, "unitPrice"), 0, INT64_MAX / QUANTITY_MAX, &price) != 0)
        goto out;
    /* A request keeps its own body; the completer takes the input (checked either way). */
    if (whole != NULL)
        rc = order_input_read(doc, in);
    else {
        struct create_input check = *in;
        rc = order_input_read(doc, &check);
    }
    if (rc < 0)
        goto out;
    in->price = price;
    snprintf(in->currency, sizeof in->currency, "%s", currency);
    in->reserved = 1;
    if (whole == NULL)
        goto out;
    *whole = doc;
    doc = NULL;
out:
    json_decref(doc);
    return rc;
}

static int create_run(const struct call_ctx *cx, struct idem_call *call, enum idem_outcome outcome,
                      void *arg, struct response *resp)
{
    struct create_input *in = arg;
    struct create_ctx cc = {cx->app, cx->principal, cx->key, cx, resp};
    struct checkout_opts opts = {0, cx};
    const char *point = "";
    char *order_id = NULL;
    int done = 0, unknown = 0;
    int rc = 0;

    if (outcome == IDEM_OUTCOME_RESUME)
        point = idem_call_recovery_point(call);
    if (point == NULL)
        point = "";
    if (strcmp(point, POINT_STOCK_RESERVED) == 0) {
        rc = stock_reserved_read(idem_call_recovery_data(call), in, NULL);
        if (rc == 0)
            rc = idem_call_phase_begin(call);
        if (rc < 0)
            goto out;
        point = ""; /* the order's phase, as below */
    } else if (strcmp(point, POINT_STOCK_RESERVING) == 0 || point[0] == '\0') {
        int reserving = point[0] != '\0';
        if (outcome == IDEM_OUTCOME_RESUME) {
            rc = idem_call_phase_begin(call);
            if (rc < 0)
                goto out;
        }
        /* At "stock_reserving" the request's own body goes on; the reservation is found again. */
        if (cx->app->shards != NULL) {
            rc = create_phase_stock(&cc, call, in, reserving, &done);
            if (rc < 0 || done)
                goto out;
        }
        point = "";
    }
    if (point[0] == '\0') {
        rc = create_order_and_charge(&cc, call, in, &unknown);
    } else if (strcmp(point, POINT_ORDER_CREATED) == 0 && idem_call_recovery_data(call) != NULL) {
        order_id = xstrdup(idem_call_recovery_data(call));
        rc = checkout_settle(cx->app, call, order_id, &opts, &unknown);
    } else {
        log_msg(&cx->app->log, "error", "orders.create: unknown recovery point '%s'", point);
        rc = IDEM_ESTATE;
        goto out;
    }
    if (rc == 0 && unknown)
        rc = idemcall_outcome_unknown(resp, "The order exists, but the payment provider did not "
                                            "confirm its charge. Nothing was stored: retry with "
                                            "the same Idempotency-Key; the charge is made once.");
out:
    free(order_id);
    return rc;
}

int orders_create_from_reserved(struct app *app, struct idem_call *call, const char *principal,
                                const char *key, int *unknown, int *skipped)
{
    struct create_ctx cc = {app, principal, key, NULL, NULL};
    struct idem_record_info info;
    struct create_input in;
    json_t *whole = NULL;
    int reserving, done = 0;
    int rc = 0;

    *unknown = 0;
    *skipped = 0;
    memset(&in, 0, sizeof in);
    reserving = strcmp(idem_call_recovery_point(call), POINT_STOCK_RESERVING) == 0;
    /* Data it cannot read is passed by too (a retry answers 500 for it, as it always has). */
    if (reserving) {
        const char *data = idem_call_recovery_data(call);
        whole = data != NULL ? jdoc_load(data, strlen(data), 0, NULL) : NULL;
        if (whole == NULL || order_input_read(whole, &in) < 0)
            rc = IDEM_ESTATE;
    } else {
        rc = stock_reserved_read(idem_call_recovery_data(call), &in, &whole);
    }
    if (rc < 0) {
        log_msg(&app->log, "error", "orders.create: %s/%s: unreadable data at %s", principal, key,
                idem_call_recovery_point(call));
        rc = 0;
        *skipped = 1;
        goto out;
    }
    if (whole == NULL) {
        *skipped = 1;
        goto out;
    }
    /* The order row keeps the request's fingerprint, which only the record holds now. */
    rc = idem_record_inspect(app->engine, principal, app->op_orders_create.name, key, &info);
    if (rc < 0)
        goto out;
    if (!info.found || info.completed) {
        rc = IDEM_ELEASE; /* swept or completed meanwhile: not ours to go on with */
        goto out;
    }
    memcpy(in.fp_hex, info.fingerprint_hex, sizeof in.fp_hex);
    rc = idem_call_phase_begin(call);
    if (rc == 0 && reserving)
        rc = create_phase_stock(&cc, call, &in, 1, &done);
    if (rc == 0 && !done)
        rc = create_order_and_charge(&cc, call, &in, unknown);
out:
    json_decref(whole);
    return rc;
}

/*
 * --idempotency off, the baseline of docs/bench.md: phase 1's business writes (place_order, as
 * the idempotent flow) and the order document of the stored 201, in one transaction and without
 * libidem's record, so that the benchmark prices the record and nothing else.  The order row
 * keeps its key, so a retry hits UNIQUE (user, key) and gets 409 instead of a second order;
 * nothing is ever replayed.
 */
static void create_without_record(const struct call_ctx *cx, const struct create_input *in,
                                  struct response *resp)
{
    struct app *app = cx->app;
    struct idem_tx *tx = NULL;
    struct order_row o;
    char location[128];
    json_t *doc = NULL;
    struct refusal no;
    int rc;

    resp->outcome = "none";
    rc = app_tx_begin(app, cx->principal, 1, &tx);
    if (rc < 0)
        goto out;
    order_row_init(app, cx, "created", &o);
    rc = place_order(app, tx, in, &o, &doc, &no);
    /* As the idempotent flow: a key that made its order is told so before any refusal. */
    if (rc == 0 && no.status != 0 && order_of_key(app, tx, cx->principal, cx->key))
        rc = IDEM_ECONFLICT;
    if (rc == IDEM_ECONFLICT) {
        rc = 0;
        response_problem(resp, 409, "order-exists",
                         "This Idempotency-Key already made an order, and orderd runs with "
                         "--idempotency off: nothing is replayed.");
        goto out;
    }
    if (rc < 0)
        goto out;
    if (no.status != 0) {
        response_problem(resp, no.status, no.code, no.detail);
        goto out;
    }
    rc = idem_tx_commit(tx);
    tx = NULL;
    if (rc < 0)
        goto out;
    order_location(o.id, location, sizeof location);
    response_json(resp, 201, doc);
    response_set_header(resp, "Location", location);
out:
    /* A refusal read in the write transaction is given once what it read is durable. */
    if (idem_tx_rollback(tx) < 0 && rc == 0)
        rc = IDEM_EUNAVAIL;
    if (rc < 0)
        keyed_answer_fail(resp, rc);
    json_decref(doc);
}

/*
 * Reads and checks the body of POST /api/orders into *in (pointing into cx->body), or answers
 * 400 into `resp` and returns -1.
 */
static int create_input_read(const struct call_ctx *cx, struct create_input *in,
                             struct response *resp)
{
    const json_t *product, *quantity, *source;

    memset(in, 0, sizeof *in);
    if (!json_is_object(cx->body)) {
        validation_failed(resp, "The body must be a JSON object {\"productId\": string, "
                                "\"quantity\": integer}.");
        return -1;
    }
    product = json_object_get(cx->body, "productId");
    quantity = json_object_get(cx->body, "quantity");
    if (!json_is_string(product) || json_string_length(product) == 0 ||
        json_string_length(product) > PRODUCT_ID_MAX ||
        strlen(json_string_value(product)) != json_string_length(product)) {
        validation_failed(resp, "productId must be a non-empty string.");
        return -1;
    }
    if (whole_number(quantity, 1, QUANTITY_MAX, &in->qty) != 0) {
        validation_failed(resp, "quantity must be an integer from 1 to 1000.");
        return -1;
    }
    source = json_object_get(cx->body, "paymentSource");
    if (source != NULL && (!json_is_string(source) || json_string_length(source) == 0 ||
                           json_string_length(source) > SOURCE_MAX ||
                           strlen(json_string_value(source)) != json_string_length(source))) {
        validation_failed(resp, "paymentSource, if given, must be a string of 1 to 32 "
                                "characters (e.g. \"tok_ok\").");
        return -1;
    }
    in->source = source != NULL ? json_string_value(source) : "tok_ok";
    in->product = json_string_value(product);
    snprintf(in->quantity, sizeof in->quantity, "%lld", (long long)in->qty);
    idem_fingerprint_hex(cx->fp, in->fp_hex);
    return 0;
}

void orders_create(const struct call_ctx *cx, struct response *resp)
{
    struct create_input in;

    if (create_input_read(cx, &in, resp) != 0)
        return;
    if (cx->app->cfg->idempotency_off)
        create_without_record(cx, &in, resp);
    else
        idemcall_handle(cx, &cx->app->op_orders_create, create_run, &in, resp);
}

/* ---- POST /api/orders from the event loop ------------------------------------------------------
 *
 * Without a provider, a new order needs nothing but the store: the loop hands it to the store's
 * writer whole (idem_call_run_async), which runs create_on_writer() among the other requests of
 * its batch, and wakes the request once the batch is durable.  No worker waits for the writer or
 * the disk.  Every other turn -- a key with a record, an order of the key already there (a late
 * retry), a failure -- goes to a worker, which answers the blocking way.
 */

struct create_async {
    struct app *app;
    json_t *body; /* the parsed body, which `in` points into (owned) */
    struct create_input in;
    char *principal, *key;
    void (*wake)(void *arg);
    void *wake_arg;
    /* Set once on the store's thread, under created_mu; read on the loop. */
    int ended;
    int rc;
    struct idem_call *call;
};

/*
 * One lock for every order's end, not one each: the loop frees an order as soon as it saw it
 * end, while the store's thread may still be inside the unlock that published it.
 */
static pthread_mutex_t created_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t created_cv = PTHREAD_COND_INITIALIZER;

/* Phase 1 and the stored answer, on the store's writer: the order, or its refusal, staged. */
static int create_on_writer(struct idem_call *call, void *arg)
{
    struct create_async *ca = arg;
    json_t *order = NULL;
    struct order_row o;
    struct refusal no;
    int rc;

    order_row_fill(ca->app, ca->principal, ca->key, "created", &o);
    rc = place_order(ca->app, idem_call_tx(call), &ca->in, &o, &order, &no);
    if (rc == 0 && no.status != 0)
        rc = order_of_key(ca->app, idem_call_tx(call), ca->principal, ca->key)
                 ? IDEM_ECONFLICT
                 : idemcall_stage_problem(call, no.status, no.code, no.detail);
    else if (rc == 0)
        rc = stage_created(call, o.id, order);
    json_decref(order);
    return rc;
}

/* The store's word (its thread): hand it to the request's loop. */
static void create_async_done(struct idem_call *call, int rc, void *arg)
{
    struct create_async *ca = arg;

    pthread_mutex_lock(&created_mu);
    ca->call = call;
    ca->rc = rc;
    ca->ended = 1;
    /* Under the mutex: once the loop sees `ended`, the wake-up is already on its way. */
    ca->wake(ca->wake_arg);
    pthread_cond_broadcast(&created_cv);
    pthread_mutex_unlock(&created_mu);
}

static void create_async_free(struct create_async *ca)
{
    json_decref(ca->body);
    free(ca->principal);
    free(ca->key);
    free(ca);
}

int orders_create_start(const struct call_ctx *cx, json_t *body, void (*wake)(void *arg),
                        void *wake_arg, struct response *resp, struct create_async **out)
{
    struct app *app = cx->app;
    struct create_async *ca;
    struct call_ctx own = *cx;
    int rc;

    *out = NULL;
    if (app->cfg->idempotency_off || app->provider != NULL || wants_phase_hook(cx) ||
        app->shards != NULL || cx->principal == NULL || cx->key == NULL) {
        json_decref(body);
        return 0;
    }
    ca = xcalloc(1, sizeof *ca);
    ca->app = app;
    ca->body = body;
    own.body = body;
    if (create_input_read(&own, &ca->in, resp) != 0) {
        create_async_free(ca);
        return -1;
    }
    ca->principal = xstrdup(cx->principal);
    ca->key = xstrdup(cx->key);
    ca->wake = wake;
    ca->wake_arg = wake_arg;
    rc = idem_call_run_async(app->engine, &app->op_orders_create, ca->principal, ca->key, cx->fp,
                             create_on_writer, create_async_done, ca);
    if (rc != 1) {
        if (rc < 0)
            log_msg(&app->log, "warn", "orders.create: cannot run on the store's writer: %s",
                    idem_err_name(rc));
        create_async_free(ca);
        return 0;
    }
    *out = ca;
    return 1;
}

int orders_create_ended(struct create_async *ca, int wait)
{
    int ended;

    pthread_mutex_lock(&created_mu);
    while (wait && !ca->ended)
        pthread_cond_wait(&created_cv, &created_mu);
    ended = ca->ended;
    pthread_mutex_unlock(&created_mu);
    return ended;
}

int orders_create_finish(struct create_async *ca, struct response *resp)
{
    int answered = 1;

    if (ca->rc == 0) {
        resp->outcome = "executed";
        keyed_answer_stored(ca->call, resp);
    } else if (ca->rc == IDEM_CALL_ASK_BEGIN || ca->rc == IDEM_ECONFLICT || ca->rc == IDEM_EMOVED) {
        /* A record, or an order of the key, is there, or the bucket moved: the blocking way. */
        app_store_failed(ca->app, ca->rc);
        answered = 0;
    } else {
        log_msg(&ca->app->log, "error", "orders.create: %s: %s", idem_err_name(ca->rc),
                idem_call_errmsg(ca->call) ? idem_call_errmsg(ca->call) : "");
        keyed_answer_fail(resp, ca->rc);
    }
    idem_call_end(ca->call);
    create_async_free(ca);
    return answered;
}

/* ---- GET /api/orders/{id} -------------------------------------------------------------------- */

void orders_get(const struct call_ctx *cx, struct response *resp)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[2] = {cx->params[0], cx->principal};
    json_t *doc = NULL;
    int rc;

    rc = app_tx_begin(cx->app, cx->principal, 0, &tx);
    if (rc == 0)
        rc =
            db_exec(cx->app, tx, "SELECT " ORDER_COLS " FROM orders WHERE id = $1 AND user_id = $2",
                    2, params, &rows);
    if (rc < 0) {
        keyed_answer_fail(resp, rc);
        goto out;
    }
    if (idem_rows_count(rows) == 0) {
        response_problem(resp, 404, "order-not-found", "You have no order with this id.");
        goto out;
    }
    doc = order_json(rows, 0);
    response_json(resp, 200, doc);
out:
    /* The answer stands only if what it was read from is durable (an fsync may have failed). */
    if (idem_tx_rollback(tx) < 0)
        keyed_answer_fail(resp, IDEM_EUNAVAIL);
    json_decref(doc);
    idem_rows_free(rows);
}

/* ---- GET /api/orders ------------------------------------------------------------------------- */

void orders_list(const struct call_ctx *cx, struct response *resp)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *limit_text = request_query(cx->rq, "limit");
    const char *cursor = request_query(cx->rq, "cursor");
    const char *params[4];
    char created[ISO8601_LEN + 1];
    char after_id[96];
    char fetch[24];
    char *next = NULL;
    json_t *doc = NULL, *list = NULL;
    int64_t limit = LIST_DEFAULT;
    int i, n, rc;

    if (limit_text != NULL && parse_int64(limit_text, 1, LIST_MAX, &limit) != 0) {
        validation_failed(resp, "limit must be an integer from 1 to 100.");
        goto out;
    }
    if (cursor != NULL &&
        cursor_decode(cursor, created, sizeof created, after_id, sizeof after_id) != 0) {
        validation_failed(resp, "cursor is not a value this server handed out as nextCursor.");
        goto out;
    }
    /* One more than asked for says whether there is a next page. */
    snprintf(fetch, sizeof fetch, "%lld", (long long)limit + 1);
    rc = app_tx_begin(cx->app, cx->principal, 0, &tx);
    if (rc < 0) {
        keyed_answer_fail(resp, rc);
        goto out;
    }
    params[0] = cx->principal;
    if (cursor == NULL) {
        params[1] = fetch;
        rc = db_exec(cx->app, tx,
                     "SELECT " ORDER_COLS " FROM orders WHERE user_id = $1 ORDER BY created_at "
                     "DESC, id DESC LIMIT CAST($2 AS INTEGER)",
                     2, params, &rows);
    } else {
        params[1] = created;
        params[2] = after_id;
        params[3] = fetch;
        rc = db_exec(cx->app, tx,
                     "SELECT " ORDER_COLS " FROM orders WHERE user_id = $1 AND (created_at < $2 "
                     "OR (created_at = $2 AND id < $3)) ORDER BY created_at DESC, id DESC LIMIT "
                     "CAST($4 AS INTEGER)",
                     4, params, &rows);
    }
    if (rc < 0) {
        keyed_answer_fail(resp, rc);
        goto out;
    }
    n = idem_rows_count(rows);
    list = xcheck(json_array());
    for (i = 0; i < n && i < limit; i++)
        json_array_append_new(list, order_json(rows, i));
    if (n > limit)
        next = cursor_encode(db_text(rows, (int)limit - 1, 7), db_text(rows, (int)limit - 1, 0));
    doc = xcheck(json_object());
    json_object_set(doc, "orders", list);
    json_object_set_new(doc, "nextCursor", next ? xcheck(json_string(next)) : json_null());
    response_json(resp, 200, doc);
out:
    if (idem_tx_rollback(tx) < 0)
        keyed_answer_fail(resp, IDEM_EUNAVAIL);
    free(next);
    json_decref(list);
    json_decref(doc);
    idem_rows_free(rows);
}
