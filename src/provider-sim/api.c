/* SPDX-License-Identifier: Apache-2.0 */
/*
 * api.c - provider-sim's routes: each path and method to its handler (charges.c, emails.c), the
 * fault settings endpoint and /healthz.  The handlers' idempotent POSTs go through the one glue
 * in idempotent.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "faults.h"
#include "handlers.h"
#include "resource.h"
#include "sim_server.h"
#include "sim.h"
#include "sim_util.h"
#include "jdoc.h"
#include "banned.h"

/* ---- faults and health ------------------------------------------------------------------- */

/*
 * Whether the client at `peer` may use /v1/faults under `allowed` (struct sim_config's
 * faults_from): a test harness on the same machine, not whoever can reach the port.
 */
static int faults_allowed(const char *allowed, const char *peer)
{
    size_t n = peer ? strlen(peer) : 0;

    if (strcmp(allowed, "any") == 0)
        return 1;
    if (peer == NULL)
        return 0;
    if (strcmp(allowed, "loopback") == 0)
        return strncmp(peer, "127.", 4) == 0 || strcmp(peer, "::1") == 0 ||
               strncmp(peer, "::ffff:127.", 11) == 0;
    for (const char *p = allowed; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, peer, n) == 0)
            return 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

static void faults_endpoint(struct sim *sim, const struct request *rq, struct response *resp)
{
    struct fault_settings fs;
    json_error_t jerr;
    json_t *doc = NULL, *out = NULL;
    char err[256];

    if (!faults_allowed(sim->cfg->faults_from, rq->peer)) {
        response_problem(resp, 403, "forbidden",
                         "The faults of this provider-sim can only be changed from the clients "
                         "its --faults-from names (loopback by default).");
        goto out;
    }
    if (strcmp(rq->method, "POST") == 0) {
        doc =
            rq->body_len ? jdoc_load(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
        if (doc == NULL) {
            response_problem(resp, 400, "invalid-json", "Send a JSON object of settings.");
            goto out;
        }
        if (faults_update(&sim->faults, doc, err, sizeof err) != 0) {
            response_problem(resp, 400, "validation-failed", err);
            goto out;
        }
        log_msg(&sim_log, "info", "faults changed: %.*s",
                (int)(rq->body_len > 300 ? 300 : rq->body_len), rq->body);
    }
    faults_get(&sim->faults, &fs);
    out = faults_json(&fs);
    response_json(resp, 200, out);
out:
    json_decref(doc);
    json_decref(out);
}

static void healthz(struct sim *sim, struct response *resp)
{
    json_t *doc =
        xcheck(json_pack("{s:s, s:s}", "status", "ok", "store", idem_store_kind(sim->store)));

    response_json(resp, 200, doc);
    json_decref(doc);
}

/* ---- routing ------------------------------------------------------------------------------- */

/* The id of "/v1/<collection>/<id>" (one non-empty segment), or NULL. */
static const char *item_id(const char *path, const char *collection)
{
    size_t n = strlen(collection);
    const char *id;

    if (strncmp(path, collection, n) != 0 || path[n] != '/')
        return NULL;
    id = path + n + 1;
    return (*id != '\0' && strchr(id, '/') == NULL) ? id : NULL;
}

/* The objects: POST creates, GET lists the collection or reads one object. */
static const struct sim_resource *const resources[] = {&charges_resource, &refunds_resource,
                                                       &emails_resource};

/* Serves `p` if it is an object's collection or one object; 0 if it is neither. */
static int resource_route(struct sim *sim, const struct request *rq, struct response *resp, int get,
                          int post)
{
    const struct sim_resource *res;
    const char *id;
    size_t i;
    int collection;

    for (i = 0; i < sizeof resources / sizeof resources[0]; i++) {
        res = resources[i];
        collection = strcmp(rq->path, res->path) == 0;
        id = collection ? NULL : item_id(rq->path, res->path);
        if (!collection && id == NULL)
            continue;
        if (collection && post)
            res->create(sim, rq, resp);
        else if (collection && get)
            resource_list(sim, res, rq, resp);
        else if (id != NULL && get)
            resource_get(sim, res, resp, id);
        else
            response_problem(resp, 405, "method-not-allowed", "This method is not allowed here.");
        return 1;
    }
    return 0;
}

void api_dispatch(struct sim *sim, const struct request *rq, struct response *resp)
{
    const char *m = rq->method;
    const char *p = rq->path;
    int get = strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0;
    int post = strcmp(m, "POST") == 0;

    if (resource_route(sim, rq, resp, get, post))
        return;
    if (strcmp(p, "/v1/ledger") == 0 && get) {
        ledger_get(sim, rq, resp);
    } else if (strcmp(p, "/v1/ledger/references") == 0 && get) {
        ledger_references(sim, rq, resp);
    } else if (strcmp(p, "/v1/faults") == 0 && (get || post)) {
        faults_endpoint(sim, rq, resp);
    } else if (strcmp(p, "/healthz") == 0 && get) {
        healthz(sim, resp);
    } else if (strcmp(p, "/v1/faults") == 0 || strcmp(p, "/v1/ledger") == 0 ||
               strcmp(p, "/v1/ledger/references") == 0) {
        response_problem(resp, 405, "method-not-allowed", "This method is not allowed here.");
    } else {
        response_problem(resp, 404, "not-found", "There is nothing at this path.");
    }
}
