/* SPDX-License-Identifier: Apache-2.0 */
/*
 * health.h - the operator's endpoints: GET /healthz and GET /metrics (no auth).
 */
#ifndef ORDERD_HEALTH_H
#define ORDERD_HEALTH_H

struct call_ctx;
struct response;

void health_check(const struct call_ctx *cx, struct response *resp);
void health_metrics(const struct call_ctx *cx, struct response *resp);

#endif /* ORDERD_HEALTH_H */
