/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_request_scope.c - whose record a request is (src/gateway/request_scope.c): a scope header's
 * value is trimmed of white space (`acct_1`, `acct_1 `, `acct_1<TAB>` are one account) and
 * percent-encoded, absent and sent twice are told apart; and every header the gateway reads of a
 * request -- the principal's (or Authorization), the key, the scope, the overrides, the body's
 * type and coding -- is found when any Connection field names it, in any case and list position;
 * one sent also under a name with '_' for '-' is found.
 */
#include "request_scope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t.h"

/* What die() (src/util) calls this program, as every program linking idem_util defines it. */
const char program_name[] = "gateway_test_request_scope";

#define CONFIG                                                                                     \
    "upstream:\n"                                                                                  \
    "  url: http://127.0.0.1:9000\n"                                                               \
    "principal:\n"                                                                                 \
    "  header: X-Consumer-Id\n"                                                                    \
    "method_override_headers: [X-Verb]\n"                                                          \
    "routes:\n"                                                                                    \
    "  - match: POST /v1/charges\n"                                                                \
    "    operation: charges.create\n"                                                              \
    "    key: {header: Request-Key}\n"                                                             \
    "    scope_headers: [Stripe-Account, X-Tenant]\n"

static struct gw_config *cfg;

/* A request with the header fields of `headers` ("Name: value\n" each, values as sent). */
struct fake {
    struct request rq;
    struct request_field fields[16];
    char *copy;
};

static void fake_init(struct fake *f, const char *headers)
{
    char *line;
    size_t n = 0;

    memset(f, 0, sizeof *f);
    f->copy = strdup(headers);
    line = f->copy;
    while (*line && n < 16) {
        char *nl = strchr(line, '\n'), *colon = strchr(line, ':');
        *nl = '\0';
        *colon = '\0';
        f->fields[n].name = line;
        f->fields[n].value = colon + 1;
        f->fields[n].value_len = strlen(colon + 1);
        n++;
        line = nl + 1;
    }
    f->rq.method = "POST";
    f->rq.target = "/v1/charges";
    f->rq.fields = f->fields;
    f->rq.nfields = n;
}

/* The scope of a request with `headers` for principal "alice", or "refused: <detail>". */
static void scope_of(const char *headers, char out[IDEM_SCOPE_PART_MAX + 64])
{
    struct fake f;
    char principal[IDEM_SCOPE_PART_MAX + 1] = "alice", detail[300];

    fake_init(&f, headers);
    if (request_scope_principal(&f.rq, &cfg->routes[0], principal, detail, sizeof detail) != 0)
        snprintf(out, IDEM_SCOPE_PART_MAX + 64, "refused: %s", detail);
    else
        snprintf(out, IDEM_SCOPE_PART_MAX + 64, "%s", principal);
    free(f.copy);
}

static void test_scope_values_are_trimmed(void)
{
    static const char *const one_account[] = {
        "Stripe-Account: acct_1\n",        "Stripe-Account:acct_1\n",
        "Stripe-Account: acct_1 \n",       "Stripe-Account: acct_1\t\n",
        "Stripe-Account: \t acct_1 \t \n", "stripe-account: acct_1\n",
    };
    char got[IDEM_SCOPE_PART_MAX + 64];

    for (size_t i = 0; i < sizeof one_account / sizeof one_account[0]; i++) {
        scope_of(one_account[i], got);
        CHECK_STR(got, "alice;Stripe-Account=acct_1;X-Tenant");
    }
    scope_of("Stripe-Account: acct 1\nX-Tenant: t/1\n", got);
    CHECK_STR(got, "alice;Stripe-Account=acct%201;X-Tenant=t%2F1");
    /* Present but empty is not absent. */
    scope_of("Stripe-Account:  \n", got);
    CHECK_STR(got, "alice;Stripe-Account=;X-Tenant");
    scope_of("", got);
    CHECK_STR(got, "alice;Stripe-Account;X-Tenant");
    scope_of("Stripe-Account: acct_1\nStripe-Account: acct_1\n", got);
    CHECK(strncmp(got, "refused: Stripe-Account decides", 31) == 0);
}

static void test_connection_may_not_name_what_the_gateway_reads(void)
{
    static const struct {
        const char *headers;
        const char *hidden; /* NULL: nothing */
    } cases[] = {
        {"Connection: close\n", NULL},
        {"Connection: keep-alive, X-Other\n", NULL},
        {"Connection: X-Consumer-Id\n", "X-Consumer-Id"},
        {"Connection: close, x-consumer-id\n", "X-Consumer-Id"},
        {"Connection: close\nConnection: Stripe-Account\n", "Stripe-Account"},
        {"Connection: x-tenant\n", "X-Tenant"},
        {"Connection: Request-Key\n", "Request-Key"},
        {"Connection: X-Verb\n", "X-Verb"},
        {"Connection: Content-Type\n", "Content-Type"},
        {"Connection: Content-Encoding\n", "Content-Encoding"},
        /* The principal here is a header: Authorization is not read, a default key header neither.
         */
        {"Connection: Authorization, Idempotency-Key\n", NULL},
        {"Connection: Stripe-Account-Id\n", NULL},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fake f;
        const char *hidden;

        fake_init(&f, cases[i].headers);
        hidden = request_scope_hidden(&f.rq, cfg, &cfg->routes[0]);
        if (cases[i].hidden == NULL)
            CHECK(hidden == NULL);
        else
            CHECK(hidden != NULL && strcmp(hidden, cases[i].hidden) == 0);
        free(f.copy);
    }
}

/* A name with '_' for '-' is the same header to CGI, PHP and Rack. */
static void test_underscore_twins(void)
{
    static const struct {
        const char *headers;
        const char *twin; /* NULL: none */
    } cases[] = {
        {"Stripe_Account: acct_9\n", "Stripe-Account"},
        {"Stripe-Account: acct_1\nstripe_account: acct_9\n", "Stripe-Account"},
        {"X_Consumer-Id: bob\n", "X-Consumer-Id"},
        {"Request_Key: k\n", "Request-Key"},
        {"X_Tenant: t\n", "X-Tenant"},
        {"Stripe-Account: acct_1\nX-Consumer-Id: a\n", NULL},
        {"Stripe_Accounts: x\nStripe__Account: x\nIdempotency_Key: k\n", NULL},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fake f;
        const char *twin;

        fake_init(&f, cases[i].headers);
        twin = request_scope_twin(&f.rq, cfg, &cfg->routes[0]);
        if (cases[i].twin == NULL)
            CHECK(twin == NULL);
        else
            CHECK(twin != NULL && strcmp(twin, cases[i].twin) == 0);
        free(f.copy);
    }
}

/* With the Authorization source (or a JWT), Authorization is what says who is calling. */
static void test_authorization_principal(void)
{
    static const char text[] = "upstream:\n"
                               "  url: http://127.0.0.1:9000\n"
                               "principal: authorization\n"
                               "routes:\n"
                               "  - match: POST /v1/charges\n"
                               "    operation: charges.create\n";
    struct gw_config *auth = NULL;
    char err[512];
    struct fake f;

    CHECK_INT(gw_config_parse("auth.yaml", text, strlen(text), &auth, err, sizeof err), 0);
    fake_init(&f, "Connection: authorization\n");
    CHECK_STR(request_scope_hidden(&f.rq, auth, &auth->routes[0]), "Authorization");
    free(f.copy);
    fake_init(&f, "Connection: Idempotency-Key\n");
    CHECK_STR(request_scope_hidden(&f.rq, auth, &auth->routes[0]), "Idempotency-Key");
    free(f.copy);
    gw_config_free(auth);
}

int main(void)
{
    char err[512];

    if (gw_config_parse("t.yaml", CONFIG, strlen(CONFIG), &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        return 1;
    }
    test_scope_values_are_trimmed();
    test_connection_may_not_name_what_the_gateway_reads();
    test_underscore_twins();
    test_authorization_principal();
    gw_config_free(cfg);
    return t_done();
}
