/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request.c - what handlers read of a request (http_server.h's accessors): header fields by name,
 * Connection's tokens, hop-by-hop names, query arguments.  Pure functions over what
 * request_parser.c filled, so the fuzzer of the parser checks them too.
 */
#include "http_server.h"
#include "ascii.h"

#include <string.h>

#include "banned.h"

int request_header_count(const struct request *rq, const char *name, const char **first,
                         size_t *first_len)
{
    size_t i;
    int count = 0;

    for (i = 0; i < rq->nfields; i++) {
        if (!ascii_caseeq(rq->fields[i].name, name))
            continue;
        if (count == 0 && first != NULL)
            *first = rq->fields[i].value;
        if (count == 0 && first_len != NULL)
            *first_len = rq->fields[i].value_len;
        count++;
    }
    if (count == 0 && first != NULL)
        *first = NULL;
    if (count == 0 && first_len != NULL)
        *first_len = 0;
    return count;
}

const char *request_header(const struct request *rq, const char *name)
{
    const char *v = NULL;

    request_header_count(rq, name, &v, NULL);
    return v;
}

int http_list_has_token(const char *list, const char *name)
{
    size_t n = strlen(name);

    while (list && *list) {
        size_t len;
        list += strspn(list, " \t,");
        len = strcspn(list, " \t,");
        if (len == n && ascii_ncaseeq(list, name, n))
            return 1;
        list += len;
    }
    return 0;
}

const char *http_hop_by_hop(const char *name)
{
    static const char *const names[] = {
        "Connection",        "Keep-Alive",         "Proxy-Connection",   "TE", "Trailer", "Upgrade",
        "Transfer-Encoding", "Proxy-Authenticate", "Proxy-Authorization"};

    return ascii_caseeq_any(name, names, sizeof names / sizeof names[0]);
}

int request_connection_lists(const struct request *rq, const char *name)
{
    for (size_t i = 0; i < rq->nfields; i++)
        if (ascii_caseeq(rq->fields[i].name, "Connection") &&
            http_list_has_token(rq->fields[i].value, name))
            return 1;
    return 0;
}

const char *request_query(const struct request *rq, const char *name)
{
    size_t i;

    for (i = 0; i < rq->nargs; i++) {
        if (strcmp(rq->args[i].name, name) == 0)
            return rq->args[i].value;
    }
    return NULL;
}
