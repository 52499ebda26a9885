/*
 * orders.h - the orders endpoints: create (idempotent, two phases), list, get, cancel
 * (idempotent state transition).
 */
#ifndef ORDERD_ORDERS_H
#define ORDERD_ORDERS_H

struct call_ctx;
struct response;

void orders_create(const struct call_ctx *cx, struct response *resp);
void orders_list(const struct call_ctx *cx, struct response *resp);
void orders_get(const struct call_ctx *cx, struct response *resp);
void orders_cancel(const struct call_ctx *cx, struct response *resp);

#endif /* ORDERD_ORDERS_H */
