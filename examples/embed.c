/* SPDX-License-Identifier: Apache-2.0 */
/*
 * embed.c - the smallest service that embeds libidem: one idempotent "create payment" request,
 * handled twice with the same key.  The first run claims the key, writes the business row in the
 * same transaction and stores the response; the second is a replay, and nothing runs twice.
 * Build: cc embed.c $(pkg-config --cflags --libs idem) -o embed   Run: ./embed sqlite:/tmp/demo.db
 */
#include <idem/idem.h>
#include <stdio.h>
#include <string.h>

static const struct idem_migration schema[] = {
    {1, "payments", "CREATE TABLE payments (id TEXT PRIMARY KEY, amount TEXT)",
     "CREATE TABLE payments (id TEXT PRIMARY KEY, amount TEXT)"},
};
static const struct idem_operation create_payment = {.name = "payments.create"};

/* Handles one request; prints what the client would receive. */
static int handle(struct idem_engine *eng, const char *user, const char *key, const char *body)
{
    unsigned char fp[IDEM_FP_LEN];
    struct idem_call *call = NULL;
    enum idem_outcome outcome;
    int rc = idem_fingerprint("POST", "/payments", NULL, 0, body, strlen(body), fp, NULL);

    if (rc == 0)
        rc = idem_call_begin(eng, &create_payment, user, key, fp, &call, &outcome);
    if (rc < 0)
        goto out;
    if (outcome == IDEM_OUTCOME_EXECUTE) {
        /* The business write shares the transaction that claimed the key. */
        const char *params[] = {key, "42.00"};
        const char *reply = "{\"payment\":\"created\"}";
        struct idem_header h = {"Content-Type", "application/json"};
        rc = idem_tx_exec(idem_call_tx(call), "INSERT INTO payments VALUES ($1, $2)", 2, params,
                          NULL);
        if (rc == 0)
            rc = idem_call_complete(call, 201, &h, 1, reply, strlen(reply));
        if (rc < 0)
            goto out;
        printf("executed: ");
    } else if (outcome == IDEM_OUTCOME_REPLAY) {
        printf("replayed: ");
    } else {
        printf("refused (outcome %d)\n", (int)outcome);
        goto out;
    }
    size_t len = 0;
    const char *stored = idem_call_response_body(call, &len);
    printf("%d %.*s\n", idem_call_response_status(call), (int)len, stored);
out:
    idem_call_end(call);
    return rc;
}

int main(int argc, char **argv)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = NULL;
    char *err = NULL;
    int rc = idem_store_open(argc > 1 ? argv[1] : "sqlite:embed-demo.db", NULL, &st, &err);

    if (rc == 0)
        rc = idem_store_migrate(st, "embed", schema, 1, NULL, &err);
    if (rc == 0)
        rc = idem_engine_new(st, NULL, &eng);
    if (rc == 0)
        rc = handle(eng, "alice", "key-1", "{\"amount\": \"42.00\"}");
    if (rc == 0) /* the client retries: same key, same intent, keys in another order */
        rc = handle(eng, "alice", "key-1", "{ \"amount\":\"42.00\" }");
    if (rc < 0)
        fprintf(stderr, "embed: %s%s%s\n", idem_strerror(rc), err ? ": " : "", err ? err : "");
    idem_free(err);
    idem_engine_free(eng);
    idem_store_close(st);
    return rc < 0 ? 1 : 0;
}
