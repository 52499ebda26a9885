/* SPDX-License-Identifier: Apache-2.0 */
/*
 * jdoc.c - JSON documents in and out of the programs (jdoc.h).
 */
#include "jdoc.h"

#include <stdio.h>
#include <string.h>

#include "idem/idem.h"
#include "util.h"
#include "banned.h"

char *jdoc_text(const json_t *doc, size_t *len)
{
    char *text = xcheck(json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER));

    if (len != NULL)
        *len = strlen(text);
    return text;
}

json_t *jdoc_load(const char *text, size_t len, size_t flags, json_error_t *err)
{
    if (idem_json_nesting(text, len) > IDEM_JSON_MAX_DEPTH) {
        if (err) {
            memset(err, 0, sizeof *err);
            snprintf(err->text, sizeof err->text, "JSON is nested more than %d levels deep",
                     IDEM_JSON_MAX_DEPTH);
        }
        return NULL;
    }
    return json_loadb(text, len, flags, err);
}
