/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cursor.h - the page cursor of GET /api/orders: the hex of "created_at|id" of the last order of
 * the previous page.  It comes back from clients, so the decoder treats it as untrusted bytes
 * (fuzz/fuzz_cursor.c).
 */
#ifndef ORDERD_CURSOR_H
#define ORDERD_CURSOR_H

#include <stddef.h>

/*
 * Decodes `text` into the creation time (ISO8601_LEN characters) and the order id.  Returns 0,
 * or -1 for anything this server did not hand out.
 */
int cursor_decode(const char *text, char *created, size_t created_cap, char *id, size_t id_cap);

/* The cursor of (created, id) (new, free()), or NULL when they do not fit one. */
char *cursor_encode(const char *created, const char *id);

#endif /* ORDERD_CURSOR_H */
