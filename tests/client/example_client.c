/* SPDX-License-Identifier: Apache-2.0 */
/*
 * example_client.c - the example of docs/client.md, built by tests/client/install_test.sh against
 * the installed libidem-client with pkg-config only, as a user would.  It places one order for the
 * intent named on the command line: run it twice with the same intent and the second run is a
 * retry (same key, the server replays), not a second order.
 *
 *     example_client URL TOKEN INTENT JOURNAL
 */
#include <idem/client.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    struct idem_client_options opts = {0};
    struct idem_client *client = NULL;
    struct idem_client_journal *journal = NULL;
    struct idem_client_response *resp = NULL;
    enum idem_client_outcome outcome;
    char auth[512], *err = NULL;
    const char *headers[1];
    const char body[] = "{\"productId\":\"p-1024\",\"quantity\":1}";
    struct idem_client_request req = {0};
    int rc, status = 1;

    if (argc != 5) {
        fprintf(stderr, "usage: %s URL TOKEN INTENT JOURNAL\n", argv[0]);
        return 2;
    }
    rc = idem_client_journal_open(argv[4], &journal, &err);
    if (rc < 0) {
        fprintf(stderr, "journal: %s\n", err ? err : idem_client_strerror(rc));
        idem_client_free(err);
        return 7;
    }
    opts.max_attempts = 5; /* the defaults, spelled out */
    opts.max_time_ms = 60000;
    rc = idem_client_open(&opts, &client);
    if (rc < 0)
        goto out;
    idem_client_set_journal(client, journal);

    snprintf(auth, sizeof auth, "Authorization: Bearer %s", argv[2]);
    headers[0] = auth;
    req.method = "POST";
    req.url = argv[1];
    req.headers = headers;
    req.nheaders = 1;
    req.body = body;
    req.body_len = sizeof body - 1;
    req.intent = argv[3]; /* the key is journaled (fsync'd) before the first attempt */
    rc = idem_client_send(client, &req, &resp, &outcome);
    if (rc < 0) {
        fprintf(stderr, "send: %s\n", idem_client_errmsg(client));
        goto out;
    }
    printf("%d %s %s\n", idem_client_response_status(resp), idem_client_response_key(resp),
           (const char *)idem_client_response_body(resp, NULL));
    status = outcome == IDEM_CLIENT_OUTCOME_FINAL ? 0 : 5;
out:
    idem_client_response_free(resp);
    idem_client_close(client);
    idem_client_journal_close(journal);
    return status;
}
