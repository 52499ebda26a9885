/* SPDX-License-Identifier: Apache-2.0 */
/*
 * profile.h - PUT /api/me/profile: set semantics, idempotent with or without a key.
 */
#ifndef ORDERD_PROFILE_H
#define ORDERD_PROFILE_H

struct call_ctx;
struct response;

void profile_update(const struct call_ctx *cx, struct response *resp);

#endif /* ORDERD_PROFILE_H */
