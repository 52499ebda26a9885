/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keyed_answer.h - libidem's outcomes as HTTP answers, the same in every program that keeps
 * records (orderd, idem-gateway): a replay is the stored response byte for byte with
 * Idempotent-Replayed: true; a key reused with another request is 422 idempotency-key-reused; a
 * request whose first attempt still runs is 409 with Retry-After; a store that cannot be reached
 * is 503 idempotency-store-unavailable; an outcome nobody can know yet is 503 outcome-unknown.
 * docs/http-api.md lists the problem documents.
 */
#ifndef IDEM_HTTP_KEYED_ANSWER_H
#define IDEM_HTTP_KEYED_ANSWER_H

#include "idem/idem.h"

#include "response.h"

/* The stored response of a REPLAY or a completed call, with its stored headers. */
void keyed_answer_stored(const struct idem_call *call, struct response *resp);

/*
 * The outcomes that run nothing -- REPLAY, MISMATCH, IN_PROGRESS -- answered into `resp`
 * (resp->outcome "replayed", "waited", "mismatch", "in_progress").  Returns 1 when `outcome` was
 * one of them, 0 otherwise.
 */
int keyed_answer_settled(const struct idem_call *call, enum idem_outcome outcome,
                         const struct idem_operation *op, struct response *resp);

/*
 * The replay cache's answer for (principal, op, key, fp), without the store and without waiting
 * (an event-loop thread may call it): 1 when it answered into `resp` (a replay or a reused key),
 * 0 when only idem_call_begin() can tell.
 */
int keyed_answer_lookup(struct idem_engine *eng, const struct idem_operation *op,
                        const char *principal, const char *key, const unsigned char fp[IDEM_FP_LEN],
                        struct response *resp);

/*
 * 409 idempotency-request-in-progress with Retry-After, while another owner holds the lease; with
 * `recovering`, the owner is a background worker finishing an earlier attempt.
 */
void keyed_answer_in_progress(struct response *resp, int retry_after_s, int recovering);

/* 503 idempotency-store-unavailable with Retry-After: 1 (nothing ran, nothing is stored). */
void keyed_answer_unavailable(struct response *resp, const char *detail);

/* Answers a failure `rc` of a path that stores nothing: 503 for an unreachable store, else 500. */
void keyed_answer_fail(struct response *resp, int rc);

/*
 * `status` (503, or 502/504 for the attempt that lost its answer) outcome-unknown with
 * Retry-After: 1 -- an external step gave no answer; nothing is stored, and the record says so.
 */
void keyed_answer_outcome_unknown(struct response *resp, int status, const char *detail);

#endif /* IDEM_HTTP_KEYED_ANSWER_H */
