/* SPDX-License-Identifier: Apache-2.0 */
/*
 * order_doc.c - the order's public JSON shape (see order_doc.h).  Payment fields appear only once
 * they have a value, so an order of a server without a provider looks exactly as it always did.
 */
#include "order_doc.h"

#include <stdio.h>

#include "app.h"
#include "db.h"
#include "idemcall.h"
#include "util.h"
#include "banned.h"

json_t *order_json_new(const char *id, const char *status, const char *product, int64_t quantity,
                       int64_t unit_price, int64_t amount, const char *currency,
                       const char *created_at)
{
    return xcheck(json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:s}", "orderId", id, "status",
                            status, "productId", product, "quantity", (json_int_t)quantity,
                            "unitPrice", (json_int_t)unit_price, "amount", (json_int_t)amount,
                            "currency", currency, "createdAt", created_at));
}

json_t *order_json(const struct idem_rows *rows, int row)
{
    const char *charge = idem_rows_get(rows, row, 8);
    const char *refund = idem_rows_get(rows, row, 9);
    json_t *doc = order_json_new(
        db_text(rows, row, 0), db_text(rows, row, 1), db_text(rows, row, 2), db_int(rows, row, 3),
        db_int(rows, row, 4), db_int(rows, row, 5), db_text(rows, row, 6), db_text(rows, row, 7));

    if (charge != NULL)
        json_object_set_new(doc, "chargeId", xcheck(json_string(charge)));
    if (refund != NULL)
        json_object_set_new(doc, "refundStatus", xcheck(json_string(refund)));
    return doc;
}

void order_location(const char *id, char *buf, size_t cap)
{
    snprintf(buf, cap, "/api/orders/%s", id);
}

int order_read(const struct app *app, struct idem_tx *tx, const char *id, json_t **doc)
{
    struct idem_rows *rows = NULL;
    const char *params[1] = {id};
    int rc;

    *doc = NULL;
    rc = db_exec(app, tx, "SELECT " ORDER_COLS " FROM orders WHERE id = $1", 1, params, &rows);
    if (rc == 0 && idem_rows_count(rows) > 0)
        *doc = order_json(rows, 0);
    idem_rows_free(rows);
    return rc;
}

int order_complete_call(struct app *app, struct idem_call *call, const char *id, int created)
{
    char location[128];
    json_t *doc = NULL;
    int rc = 0;

    if (idem_call_tx(call) == NULL)
        rc = idem_call_phase_begin(call);
    if (rc == 0)
        rc = order_read(app, idem_call_tx(call), id, &doc);
    if (rc == 0 && doc == NULL) {
        log_msg(&app->log, "error", "order %s of the record is missing", id);
        rc = IDEM_ESTATE;
    }
    if (rc == 0) {
        order_location(id, location, sizeof location);
        rc = idemcall_complete_json(call, created ? 201 : 200, doc, created ? location : NULL);
    }
    json_decref(doc);
    return rc;
}
